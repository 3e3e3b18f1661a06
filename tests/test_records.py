"""The older loose keywords of a call that now takes a record: accepted, warned about at the
user's own line (past zoo's frames and the type checkers' wrappers), unknown ones refused."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

from zoo.nn import Init, Linear
from zoo.records import legacy_keywords


def test_the_old_spelling_warns_at_the_callers_line_and_builds_the_same():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = Linear(3, 4, init_std=0.5, key=jax.random.key(0))  # two zoo frames below this one
    new = Linear(3, 4, init=Init(0.5), key=jax.random.key(0))
    assert np.array_equal(old.weight, new.weight)
    [warning] = caught
    assert warning.category is DeprecationWarning
    assert (
        str(warning.message)
        == "Linear(init_std=) is the older spelling; pass init=Init(std, dtype)"
    )
    assert warning.filename == __file__


def test_an_unknown_keyword_is_refused_as_python_would():
    with pytest.raises(TypeError, match=r"^f\(\) got an unexpected keyword argument 'colour'$"):
        legacy_keywords("f", {"colour": 1, "temperature": 0.5}, ("temperature",), "sampling=...")
    assert legacy_keywords("f", {}, ("temperature",), "sampling=...") == {}
