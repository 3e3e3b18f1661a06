"""Settings records that replaced loose keyword arguments, and the old spelling kept working.

Where a function now takes one record (`sampling=SamplingSettings(...)`) instead of a run of
keywords (`temperature=, top_k=, top_p=`), `legacy_keywords` takes the old keywords from the
call's `**legacy`, warns once with a `DeprecationWarning` that names the record to use, and
refuses any other name with the `TypeError` Python itself would raise. Code written for the
older signature keeps running, and says how to move on.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from typing import Any


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
            stacklevel=3,
        )
    return dict(legacy)


__all__ = ["legacy_keywords"]
