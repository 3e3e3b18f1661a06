"""`DataOptions`: how `--data` becomes batches, the command line's data options in one record.

`zoo train` and `zoo eval` turn their flags into it once (`DataOptions.from_args`), before any
data is read; the data, chat and preference helpers take the record, not the flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TypedDict, Unpack

from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.word import WordOptions

# `--objective` values that train on preference pairs (zoo.tasks.preference_loss.OBJECTIVES)
PREFERENCE_OBJECTIVES = ("dpo", "ipo", "hinge", "robust", "simpo", "orpo")


class Resolved(TypedDict, total=False):
    """Options a command resolves itself, which `DataOptions.from_args` puts before the flags."""

    batch_size: int
    seed: int
    tokenizer: str | Tokenizer | None
    max_len: int | None
    num_classes: int | None
    loss_positions: bool


@dataclass(frozen=True, kw_only=True)
class DataOptions:
    """How `--data` becomes batches: the command line's data options, resolved once."""

    batch_size: int  # examples (language modelling: blocks) per batch
    seed: int = 0  # draws the held-out split and the shuffling
    # char | word | tiktoken:NAME, or an --init model's own tokenizer (None: the task's default)
    tokenizer: str | Tokenizer | None = None
    max_len: int | None = None  # longest sequence in tokens (None: the data's own)
    num_classes: int | None = None  # classifier: classes the labels do not say themselves
    source: str | None = None  # translation source column
    target: str | None = None  # translation target column
    text_column: str | None = None
    label_column: str | None = None
    min_freq: int | None = None  # word tokenizer: min count
    lowercase: bool | None = None  # word tokenizer: lowercase the text
    encoding: str = "utf-8"  # of json/csv/text files
    streaming: bool = False  # read the data as a stream
    holdout: float | None = None  # share of train held out without a validation split (0.1)
    masked_lm: bool = False  # `--objective mlm`: plain text, one example per line
    chat_format: str = "auto"  # gpt: conversations when the columns fit (zoo.cli._chat_data)
    train_on: str = "auto"  # chat data: the tokens the loss counts (auto, assistant, ...)
    pack: bool = True  # chat data: conversations packed into rows of max_len + 1 tokens
    template: str | None = None  # chat data: --template, a Jinja chat template file
    messages_column: str | None = None  # chat data: the column of each row's messages
    roles: tuple[tuple[str, str], ...] | None = None  # chat data: --role FROM=TO renames
    preference: bool = False  # --objective dpo, ..., reward: prompt/chosen/rejected rows
    prompts: bool = False  # --objective grpo: prompt rows, other columns for the rewards (_grpo)
    # preference rows: bos/eos as TRL's trainer of the objective adds them (special_tokens_for)
    special_tokens: str = "tokenizer"
    max_prompt_len: int | None = None  # preference rows: most prompt tokens (its end kept)
    max_completion_len: int | None = None  # preference rows: most answer tokens (start kept)
    # --buckets: padded lengths of unpacked rows; auto: fitted to the data, None: powers of two
    buckets: str | tuple[int, ...] | None = "auto"
    # chat data: batches list the positions they score (False: resuming a run recorded before)
    loss_positions: bool = True
    # unpacked rows: batches of one bucket's examples (--group-by-length) or drawn at random
    group_by_length: bool = False

    def __post_init__(self) -> None:
        check_holdout(self.holdout)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **resolved: Unpack[Resolved]) -> DataOptions:
        """The options of `args` (those the command has), with `resolved` values put first."""
        given = {
            field.name: getattr(args, field.name)
            for field in dataclasses.fields(cls)
            if hasattr(args, field.name)
        }
        given["masked_lm"] = getattr(args, "objective", None) == "mlm"
        given["preference"] = getattr(args, "objective", None) in (*PREFERENCE_OBJECTIVES,
                                                                    "reward")  # fmt: skip
        given["prompts"] = getattr(args, "objective", None) == "grpo"
        if given["preference"]:
            from zoo.data.chat.preference import special_tokens_for

            given["special_tokens"] = special_tokens_for(args.objective)
        roles = parse_roles(getattr(args, "role", None))
        given["roles"] = None if roles is None else tuple(roles.items())
        given["buckets"] = bucket_choice(getattr(args, "buckets", None))
        given["group_by_length"] = bool(getattr(args, "group_by_length", None))
        given.update(resolved)
        return cls(**given)


def check_holdout(holdout: float | None) -> None:
    """Refuse a `--holdout` that is no fraction in (0, 1)."""
    if holdout is not None and not 0.0 < holdout < 1.0:
        raise ValueError(
            f"--holdout {holdout} is not a fraction in (0, 1); e.g. --holdout 0.1 holds out one "
            "train example in ten for validation"
        )


def parse_roles(pairs: list[str] | None) -> dict[str, str] | None:
    """`--role FROM=TO ...` as `{FROM: TO}` (None without any)."""
    if not pairs:
        return None
    roles: dict[str, str] = {}
    for pair in pairs:
        source, separator, target = pair.partition("=")
        if not separator or not source.strip() or not target.strip():
            raise ValueError(
                f"--role {pair!r} is not FROM=TO; e.g. --role human=user --role gpt=assistant"
            )
        if source.strip() in roles:
            raise ValueError(f"--role names {source.strip()!r} twice; give each role once")
        roles[source.strip()] = target.strip()
    return roles


def buckets_flag(text: str) -> str:
    """An argparse type: `--buckets` as written (auto, pow2 or comma-separated lengths),
    refused when it is none of these."""
    text = text.strip()
    if text in ("auto", "pow2"):
        return text
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give auto, pow2 or positive lengths separated by commas, e.g. 48,64,96"
        )
    return ",".join(parts)


def bucket_choice(flag: str | None) -> str | tuple[int, ...] | None:
    """The `buckets` option of `--buckets` (None, not given: auto)."""
    if flag is None or flag == "auto":
        return "auto"
    if flag == "pow2":
        return None
    return tuple(int(part) for part in flag.split(","))


def word_options(options: DataOptions) -> WordOptions:
    """The options a word tokenizer learnt from the data takes (`--min-freq`, `--lowercase`),
    only those the user set."""
    chosen = WordOptions()
    if options.min_freq is not None:
        chosen["min_freq"] = options.min_freq
    if options.lowercase:
        chosen["lowercase"] = True
    return chosen
