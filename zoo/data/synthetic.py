"""Built-in synthetic tasks, generated offline, one per flavor, with a character tokenizer.

| name | flavor | example | batch keys |
| --- | --- | --- | --- |
| `rot13` | translator | `hey -> url` (rotate letters by 13) | `src`, `tgt` |
| `addition` | gpt | `57+68=125` (the answer is scored; `digits=2` by default) | `tokens`, `loss_mask` |
| `majority` | classifier | `qbxnarc -> 1` (more letters from n-z than from a-m) | `tokens`, `labels` |

Examples are drawn with a seed; the eval split holds examples that are not in the train split
(held out), so its accuracy measures generalisation rather than memory. `zoo train --data
synthetic:NAME` and `zoo demo` use these.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from zoo.data.batches import ArrayBatches, Batch
from zoo.data.tokenizers.char import CharTokenizer

LETTERS = string.ascii_lowercase


@dataclass
class SyntheticData:
    """A generated task: its tokenizer, train and held-out eval arrays, readable eval examples."""

    name: str
    flavor: str  # the model flavor that learns it
    description: str
    tokenizer: CharTokenizer
    train: Batch
    eval: Batch
    eval_text: list[tuple[str, str]]  # (input, reference) of each eval example, in order
    num_classes: int | None = None  # classification only
    options: dict = field(default_factory=dict)

    def batches(self, batch_size: int, *, seed: int = 0) -> tuple[ArrayBatches, ArrayBatches]:
        """(train, eval) batch sources; eval is unshuffled and keeps the last partial batch."""
        num_train = len(next(iter(self.train.values())))
        if num_train < batch_size:
            raise ValueError(
                f"synthetic:{self.name} has {num_train} training examples, fewer than "
                f"batch_size={batch_size}; lower the batch size or generate more examples"
            )
        train = ArrayBatches(self.train, batch_size, seed=seed)
        evaluation = ArrayBatches(self.eval, batch_size, shuffle=False, drop_last=False)
        return train, evaluation


def rot13(text: str) -> str:
    """Rotate each lowercase letter by 13 places (`hey` -> `url`); other characters stay."""
    shifted = LETTERS[13:] + LETTERS[:13]
    return text.translate(str.maketrans(LETTERS, shifted))


def _distinct(
    draw: Callable[[np.random.Generator], str], count: int, rng: np.random.Generator
) -> list[str]:
    """`count` distinct values of `draw` (order of first appearance)."""
    seen: dict[str, None] = {}
    attempts = 0
    while len(seen) < count:
        seen.setdefault(draw(rng), None)
        attempts += 1
        if attempts > 20 * count + 1000:
            raise ValueError(f"cannot draw {count} distinct examples; ask for fewer")
    return list(seen)


def _split(items: list[str], num_eval: int) -> tuple[list[str], list[str]]:
    return items[num_eval:], items[:num_eval]


def make_rot13(
    num_train: int | None, num_eval: int, seed: int, min_len: int = 3, max_len: int = 8
) -> SyntheticData:
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    tokenizer = CharTokenizer(LETTERS)

    def draw(rng):
        length = int(rng.integers(min_len, max_len + 1))
        return "".join(rng.choice(list(LETTERS), size=length))

    num_train = 20000 if num_train is None else num_train
    words = _distinct(draw, num_train + num_eval, np.random.default_rng(seed))
    train_words, eval_words = _split(words, num_eval)

    def arrays(words):
        return {
            "src": tokenizer.encode_batch(words, length=max_len),
            "tgt": tokenizer.encode_batch(
                [rot13(w) for w in words], length=max_len + 2, add_bos=True, add_eos=True
            ),
        }

    return SyntheticData(
        name="rot13",
        flavor="translator",
        description=f"rot13 of random lowercase words ({min_len}-{max_len} letters)",
        tokenizer=tokenizer,
        train=arrays(train_words),
        eval=arrays(eval_words),
        eval_text=[(w, rot13(w)) for w in eval_words],
        options={"min_len": min_len, "max_len": max_len},
    )


def make_addition(
    num_train: int | None, num_eval: int, seed: int, digits: int = 2
) -> SyntheticData:
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    tokenizer = CharTokenizer("0123456789+=")
    high = 10**digits
    # by default 80% of all pairs, at most 20000, train on
    num_train = min(20000, high * high * 4 // 5) if num_train is None else num_train

    def draw(rng):
        return f"{int(rng.integers(high))}+{int(rng.integers(high))}="

    prompts = _distinct(draw, num_train + num_eval, np.random.default_rng(seed))
    train_prompts, eval_prompts = _split(prompts, num_eval)
    # bos, two operands, "+", "=", an answer of up to digits + 1, eos
    length = 2 * digits + 2 + (digits + 1) + 2

    def answer(prompt: str) -> str:
        left, right = prompt[:-1].split("+")
        return str(int(left) + int(right))

    def arrays(prompts):
        texts = [p + answer(p) for p in prompts]
        tokens = tokenizer.encode_batch(texts, length=length, add_bos=True, add_eos=True)
        # Score the answer and its eos: positions after "=" up to and including eos.
        positions = np.arange(length)[None, :]
        starts = np.array([len(p) + 1 for p in prompts])[:, None]  # +1 for bos
        ends = np.array([len(t) + 2 for t in texts])[:, None]  # bos .. eos
        loss_mask = ((positions >= starts) & (positions < ends)).astype(np.int32)
        return {"tokens": tokens, "loss_mask": loss_mask}

    return SyntheticData(
        name="addition",
        flavor="gpt",
        description=f"addition of numbers below {high:,}, e.g. {eval_prompts[0]}"
        f"{answer(eval_prompts[0])}",
        tokenizer=tokenizer,
        train=arrays(train_prompts),
        eval=arrays(eval_prompts),
        eval_text=[(p, answer(p)) for p in eval_prompts],
        options={"digits": digits},
    )


def majority_label(text: str) -> int:
    """1 when letters n-z outnumber letters a-m, else 0."""
    late = sum(c >= "n" for c in text)
    return int(late > len(text) - late)


def make_majority(
    num_train: int | None, num_eval: int, seed: int, max_len: int = 24
) -> SyntheticData:
    num_train = 10000 if num_train is None else num_train
    tokenizer = CharTokenizer(LETTERS)

    def draw(rng):
        # An odd length never ties; the count of n-z letters is uniform, so the classes balance
        # and close calls (one letter apart) are common.
        length = 2 * int(rng.integers(2, max_len // 2)) + 1
        late = int(rng.integers(0, length + 1))
        chars = [LETTERS[13 + int(i)] for i in rng.integers(0, 13, size=late)]
        chars += [LETTERS[int(i)] for i in rng.integers(0, 13, size=length - late)]
        return "".join(rng.permutation(chars))

    texts = _distinct(draw, num_train + num_eval, np.random.default_rng(seed))
    train_texts, eval_texts = _split(texts, num_eval)

    def arrays(texts):
        return {
            "tokens": tokenizer.encode_batch(texts, length=max_len),
            "labels": np.array([majority_label(t) for t in texts], dtype=np.int32),
        }

    return SyntheticData(
        name="majority",
        flavor="classifier",
        description="which letter group (a-m or n-z) is more frequent",
        tokenizer=tokenizer,
        train=arrays(train_texts),
        eval=arrays(eval_texts),
        eval_text=[(t, str(majority_label(t))) for t in eval_texts],
        num_classes=2,
        options={"max_len": max_len},
    )


# name -> (flavor, builder)
TASKS: dict[str, tuple[str, Callable[..., SyntheticData]]] = {
    "rot13": ("translator", make_rot13),
    "addition": ("gpt", make_addition),
    "majority": ("classifier", make_majority),
}


def make(
    name: str, *, num_train: int | None = None, num_eval: int = 1000, seed: int = 0, **options
) -> SyntheticData:
    """Generate synthetic task `name` (see `TASKS`); options such as `digits` go to its builder.

    `num_train=None` takes the task's default (rot13 20000, addition 80% of all pairs up to
    20000, majority 10000).
    """
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; choose one of {sorted(TASKS)}")
    if (num_train is not None and num_train < 1) or num_eval < 1:
        raise ValueError(f"num_train and num_eval must be >= 1, got {num_train}, {num_eval}")
    _, builder = TASKS[name]
    return builder(num_train, num_eval, seed, **options)
