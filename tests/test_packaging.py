"""The wheel: its distribution name, license, the `zoo` command, and every module of the package.

Built the way `pip install` builds it: `pip wheel --no-deps` with build isolation, so pip fetches
`[build-system] requires` (setuptools>=77 reads the PEP 639 `license = "Apache-2.0"`) into a
fresh build environment and the setuptools of the running one does not matter (a Python 3.11
venv brings setuptools 65, 3.12 and 3.13 none). From a copy of the sources, so the checkout gets
no build/ or egg-info folders. Offline, where pip cannot fetch the build backend, the tests skip
and say so.
"""

from __future__ import annotations

import configparser
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from zoo.extras import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]

# What pip prints when the index cannot give it the build requirements (offline, no mirror).
BACKEND_UNAVAILABLE = (
    "No matching distribution found for",
    "Could not find a version that satisfies the requirement",
)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of what the wheel is built from (the checkout's state when the module started)."""
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "zoo", source / "zoo", ignore=shutil.ignore_patterns("__pycache__"))
    return source


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> zipfile.ZipFile:
    if importlib.util.find_spec("pip") is None:
        pytest.skip("building the wheel needs pip: python -m ensurepip")
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check"]
    command += ["-q", "-w", str(out), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if built.returncode != 0 and any(line in built.stderr for line in BACKEND_UNAVAILABLE):
        pytest.skip(
            "pip could not fetch the build backend ([build-system] requires setuptools>=77) "
            "from its index; building the wheel needs the network or a mirror"
        )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def zoo_version() -> str:
    """The version the checkout declares (pyproject.toml), which zoo.version repeats."""
    import tomllib

    from zoo.version import __version__

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert declared == __version__
    return declared


def dist_info_file(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


@pytest.mark.slow
def test_wheel_metadata_names_the_distribution(wheel):
    metadata = dist_info_file(wheel, "METADATA").splitlines()
    assert "Name: jax-transformer-zoo" in metadata
    assert f"Name: {DISTRIBUTION}" in metadata
    version = zoo_version()
    assert Path(wheel.filename).name.startswith(f"jax_transformer_zoo-{version}-py3-none-any")


@pytest.mark.slow
def test_wheel_metadata_carries_the_license_expression(wheel):
    metadata = dist_info_file(wheel, "METADATA").splitlines()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Python: >=3.11" in metadata


@pytest.mark.slow
def test_wheel_installs_the_zoo_command(wheel):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(dist_info_file(wheel, "entry_points.txt"))
    assert entry_points.sections() == ["console_scripts"]
    assert dict(entry_points["console_scripts"]) == {"zoo": "zoo.cli:main"}


@pytest.mark.slow
def test_wheel_holds_every_module(wheel, source):
    modules = {path.relative_to(source).as_posix() for path in (source / "zoo").rglob("*.py")}
    packed = {name for name in wheel.namelist() if name.endswith(".py")}
    assert len(modules) > 100
    assert packed == modules
