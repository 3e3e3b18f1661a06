"""Reward functions for RL from rewards, with TRL's signature, and the built-in ones.

A reward function is called as TRL's `GRPOTrainer` calls it:
`fn(prompts=..., completions=..., completion_ids=..., **columns) -> list[float | None]`, one
reward per completion. `prompts` and `completions` are texts, or for conversational prompts
message lists (a completion is `[{"role": "assistant", "content": text}]`); every other column
of the prompt rows comes as a keyword, one value per completion. `None` means the function does
not score that completion (it is left out of the function's mean, as in TRL). Existing TRL
reward functions run unchanged.

`score` calls every function and refuses, naming the function and the row, a function that
raises, returns the wrong count, or returns NaN or anything but a number or None.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from numbers import Real

import numpy as np

RewardFunction = Callable[..., Sequence[float | None]]
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


class RewardError(ValueError):
    """A reward function failed or returned what is no reward; the message names it."""


def reward_name(function: RewardFunction) -> str:
    """The name a function's metrics carry (`rewards/NAME/mean`): its `__name__`, as TRL's."""
    return getattr(function, "__name__", type(function).__name__)


def completion_text(completion: str | Sequence[Mapping[str, object]]) -> str:
    """The text of a completion: itself, or the content of its (last) message."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1].get("content", "")) if completion else ""


def score(
    functions: Sequence[RewardFunction],
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    columns: Mapping[str, list],
) -> np.ndarray:
    """`float64[rows, functions]`: each function's rewards, NaN where it returned None."""
    rows = len(completions)
    out = np.full((rows, len(functions)), np.nan)
    for index, function in enumerate(functions):
        name = reward_name(function)
        try:
            values = function(prompts=prompts, completions=completions,
                              completion_ids=completion_ids, **columns)  # fmt: skip
        except Exception as error:
            raise RewardError(
                f"reward function {name!r} raised {type(error).__name__}: {error} (on a batch of "
                f"{rows} completions; the first prompt: {_short(prompts[0])})"
            ) from error
        try:
            values = list(values)
        except TypeError:
            raise RewardError(
                f"reward function {name!r} returned {type(values).__name__}, not a list of "
                f"{rows} rewards (one per completion)"
            ) from None
        if len(values) != rows:
            raise RewardError(
                f"reward function {name!r} returned {len(values)} rewards for {rows} completions; "
                "it must return one per completion (None where it does not apply)"
            )
        for row, value in enumerate(values):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, Real | np.floating | np.integer):
                raise RewardError(
                    f"reward function {name!r} returned {value!r} ({type(value).__name__}) for "
                    f"row {row}: a reward is a number or None ({_row(prompts, completions, row)})"
                )
            if not math.isfinite(float(value)):
                raise RewardError(
                    f"reward function {name!r} returned {value} for row {row}; rewards must be "
                    f"finite (None where it does not apply) ({_row(prompts, completions, row)})"
                )
            out[row, index] = float(value)
    return out


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _row(prompts: list, completions: list, row: int) -> str:
    return f"prompt {_short(prompts[row])}, completion {_short(completions[row])}"


# -- built-in rewards ---------------------------------------------------------------------------


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas allowed), or None."""
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def answer_match(column: str = "answer", *, numeric: bool = True) -> RewardFunction:
    """1.0 when a completion gives the row's `column` value, else 0.0.

    `numeric`: the last number of the completion equals the answer (as numbers, so `12.0`
    matches `12`); otherwise the stripped text equals the stripped answer."""

    def reward(completions, **columns):
        if column not in columns:
            raise KeyError(
                f"the prompt rows have no {column!r} column (they have {sorted(columns)})"
            )
        answers = columns[column]
        out = []
        for completion, answer in zip(completions, answers, strict=True):
            text = completion_text(completion)
            if numeric:
                expected, given = last_number(str(answer)), last_number(text)
                right = expected is not None and given is not None and abs(given - expected) < 1e-6
            else:
                right = text.strip() == str(answer).strip()
            out.append(1.0 if right else 0.0)
        return out

    reward.__name__ = f"{'numeric' if numeric else 'exact'}_match_{column}"
    return reward


def format_match(pattern: str) -> RewardFunction:
    """1.0 when a completion's text matches the regular expression `pattern` (`re.search`,
    `.` matching newlines too; anchor it with `^...$` for the whole text), else 0.0."""
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as error:
        raise ValueError(f"the format reward's pattern {pattern!r} is no regex: {error}") from None

    def reward(completions, **_):
        return [1.0 if compiled.search(completion_text(c)) else 0.0 for c in completions]

    reward.__name__ = "format"
    return reward


def length_penalty(target: int) -> RewardFunction:
    """`-max(0, tokens - target) / target`: 0 up to `target` completion tokens, then more
    negative with each token beyond it."""
    if not isinstance(target, int) or target < 1:
        raise ValueError(f"the length penalty's target must be a positive integer, got {target!r}")

    def reward(completion_ids, **_):
        return [-max(0, len(ids) - target) / target for ids in completion_ids]

    reward.__name__ = "length_penalty"
    return reward
