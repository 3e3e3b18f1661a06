"""The argparse type of every float flag: a finite number inside the flag's range.

`float("nan")` and `float("inf")` parse, and NaN passes every `<` test a later check makes
(`--beta inf` passed `beta > 0` and stopped the run at step 1 with a NaN loss), so each float
flag reads its value through one `Real`: NaN, ±inf and values outside the range are refused
when the flags are parsed, naming the flag's range (`argument --beta: inf is not a finite number
> 0`). A `--config` file's values go through the same type.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Real:
    """An argparse type: a finite float in [`low`, `high`] (each bound None: unbounded)."""

    low: float | None = None  # the smallest value allowed (None: no lower bound)
    high: float | None = None  # the largest value allowed (None: no upper bound)
    low_open: bool = False  # `low` itself is refused (`> low` rather than `>= low`)
    high_open: bool = False  # `high` itself is refused (`< high` rather than `<= high`)
    note: str = ""  # said after the range in a refusal (e.g. "0 turns clipping off")

    @property
    def range(self) -> str:
        """The values allowed, as a refusal names them: "> 0", "in [0, 1)", ""."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return ""

    def holds(self, value: float) -> bool:
        """Whether `value` is finite and inside the range."""
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __call__(self, text: str) -> float:
        wanted = " ".join(part for part in ("a finite number", self.range) if part)
        note = f" ({self.note})" if self.note else ""
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}{note}") from None
        if not self.holds(value):
            raise argparse.ArgumentTypeError(f"{text} is not {wanted}{note}")
        return value


# the ranges of the float flags
POSITIVE = Real(low=0.0, low_open=True)  # > 0: --lr, --beta
NON_NEGATIVE = Real(low=0.0)  # >= 0: --weight-decay, --temperature
CLIP_NORM = Real(low=0.0, note="0 turns clipping off")  # --clip-norm
FRACTION = Real(low=0.0, high=1.0, low_open=True, high_open=True)  # in (0, 1): --holdout
RATE = Real(low=0.0, high=1.0, high_open=True)  # in [0, 1): --label-smoothing, --dropout
SHARE = Real(low=0.0, high=1.0, low_open=True)  # in (0, 1]: --mask-rate, --top-p
FLIPPED = Real(low=0.0, high=0.5, high_open=True)  # in [0, 0.5): --dpo-label-smoothing
ANY = Real()  # any finite number: --simpo-gamma, --length-penalty
