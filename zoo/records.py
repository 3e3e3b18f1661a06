"""Settings records that replaced loose keyword arguments, and the old spelling kept working.

Where a function now takes one record (`sampling=SamplingSettings(...)`) instead of a run of
keywords (`temperature=, top_k=, top_p=`), `legacy_keywords` takes the old keywords from the
call's `**legacy`, warns once with a `DeprecationWarning` that names the record to use, and
refuses any other name with the `TypeError` Python itself would raise. Code written for the
older signature keeps running, and says how to move on.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

# frames that stand between the user's call and this module: zoo itself, and the runtime type
# checkers that wrap zoo's functions under test (jaxtyping, beartype)
_PASSED_OVER = (str(Path(__file__).resolve().parent), "jaxtyping", "beartype")


def legacy_keywords(
    function: str, legacy: Mapping[str, Any], names: Collection[str], instead: str
) -> dict[str, Any]:
    """The old keywords of `function` found in `legacy` (a call's `**legacy`).

    Args:
        function: the function's name, as the messages show it.
        legacy: the keywords the call passed beyond its signature.
        names: the old keyword names still accepted.
        instead: how to write the same call today, e.g. "sampling=SamplingSettings(...)".

    Raises:
        TypeError: for a keyword that is neither in the signature nor in `names`.
    """
    unknown = sorted(set(legacy) - set(names))
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    if legacy:
        warnings.warn(
            f"{function}({', '.join(f'{name}=' for name in legacy)}) is the older spelling; "
            f"pass {instead}",
            DeprecationWarning,
            stacklevel=_caller_level(),
        )
    return dict(legacy)


def _caller_level() -> int:
    """The `stacklevel` of the first frame outside zoo (and the type checkers' wrappers) above
    the call of `legacy_keywords`: the warning names the user's line."""
    level = 1  # the frame that calls warnings.warn
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and any(part in frame.f_code.co_filename for part in _PASSED_OVER):
        level, frame = level + 1, frame.f_back
    return level


__all__ = ["legacy_keywords"]
