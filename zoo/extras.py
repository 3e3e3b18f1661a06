"""The distribution's name on PyPI and the install command for an optional extra, in one place.

`zoo` on PyPI is an unrelated project, so this package is distributed as `jax-transformer-zoo`
(pyproject.toml) while the import package and the command stay `zoo`. Error messages that ask
for an optional dependency say `pip_install("hf")`: `pip install 'jax-transformer-zoo[hf]'`.
"""

from __future__ import annotations

DISTRIBUTION = "jax-transformer-zoo"


def pip_install(extra: str) -> str:
    """The pip command that installs the optional extra `extra` (one in pyproject.toml)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
