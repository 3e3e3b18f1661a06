"""`ChatDataConfig`: every option of `chat_data` and `chat_evaluation`, with its default and what
it means; the counterpart for conversations of `zoo.data.DataConfig` (`zoo.data.options`).

    config = ChatDataConfig(max_len=256, batch_size=16, train_on="all")
    data = chat_data(dataset, tokenizer="word", config=config)

Each option is checked here, once, when the record is made: a wrong value raises a `ValueError`
that says what is wrong and how to fix it, before any data is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from zoo.data.chat.conversations import FORMATS, check_roles
from zoo.data.chat.template import ChatTemplate
from zoo.data.options import AUTO, check_buckets
from zoo.data.tokenizers.word import WordOptions

CHAT_FORMATS = ("auto", *FORMATS)
# auto: completion for prompt/completion rows, assistant otherwise; assistant: every assistant
# turn; completion: the completion of prompt/completion rows; last: the final assistant turn;
# all: every token.
TRAIN_ON = ("auto", "assistant", "completion", "last", "all")


@dataclass(frozen=True, kw_only=True)
class ChatDataConfig:
    """How conversations become batches: `chat_data(dataset, tokenizer=..., config=...)`.

    `chat_evaluation` reads the same record (`pack` aside: it scores one conversation per row);
    `chat_batches` reads `batch_size`, `max_len`, `pack`, `buckets` and `seed`.
    """

    format: str | None = "auto"  # messages | instruction | prompt_completion; auto/None: detected
    train_on: str = "auto"  # the tokens the loss counts: one of TRAIN_ON (see resolve_train_on)
    pack: bool = True  # whole conversations packed into rows of max_len + 1 tokens
    template: ChatTemplate | str | None = None  # Jinja text or a ChatTemplate; None: the model's
    max_len: int = 128  # longest sequence the model reads (its max_positions)
    batch_size: int = 32  # rows (packed) or conversations (unpacked) per batch
    seed: int = 0  # shuffling and holdout seed
    train_split: str = "train"  # the split of conversations to train on
    validation_split: str | None = None  # None: validation/valid/dev/val when present, else holdout
    holdout: float = 0.1  # fraction of train conversations held out when there is no validation
    buckets: Sequence[int] | str | None = AUTO  # unpacked: padded lengths (auto: fitted)
    truncate: bool = True  # cut over-long conversations (and log how many); False raises instead
    loss_positions: bool = True  # list the positions scored, where few (the head runs there)
    group_by_length: bool = False  # unpacked: batches of one bucket (True) or drawn at random
    tokenizer_options: WordOptions | None = None  # for build_tokenizer, e.g. {"min_freq": 2}
    roles: Mapping[str, str] | None = None  # speaker names -> roles, e.g. {"human": "user"}
    messages_column: str | None = (
        None  # the column holding the messages; None: messages/conversations
    )

    def __post_init__(self) -> None:
        if self.format is None:
            object.__setattr__(self, "format", "auto")
        if self.format not in CHAT_FORMATS:
            raise ValueError(
                f"unknown chat format {self.format!r}; choose one of {CHAT_FORMATS} (auto reads "
                "it from the columns of the train split)"
            )
        if self.train_on not in TRAIN_ON:
            raise ValueError(
                f"train_on must be one of {TRAIN_ON}, got {self.train_on!r}: assistant trains "
                "on the replies, completion on the completion of prompt/completion rows, last "
                "on the final reply, all on every token, auto on the completion of "
                "prompt/completion rows and the replies otherwise"
            )
        if self.format not in ("auto", "prompt_completion") and self.train_on == "completion":
            raise ValueError(
                f"train_on 'completion' trains the completion of prompt/completion rows, and "
                f"the format is {self.format!r}: choose assistant, last or all for it"
            )
        if self.roles is not None:
            object.__setattr__(self, "roles", check_roles(self.roles))
        if self.messages_column is not None and (
            not isinstance(self.messages_column, str) or not self.messages_column.strip()
        ):
            raise ValueError(
                f"messages_column must name a column, got {self.messages_column!r}; leave it "
                "unset to read 'messages' (or ShareGPT 'conversations')"
            )
        for name in ("batch_size", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}; pass >= 1")
        if self.max_len < 2:
            raise ValueError(f"max_len={self.max_len} leaves no room for text; use >= 2")
        if self.validation_split is not None and self.validation_split == self.train_split:
            raise ValueError(
                f"validation_split and train_split are both {self.train_split!r}; validating on "
                "the training conversations measures nothing: pick another split or leave it unset"
            )
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(
                f"holdout must be a fraction in (0, 1), got {self.holdout}: e.g. 0.1 holds out "
                "one conversation in ten"
            )
        check_buckets(self.max_len, self.buckets)  # raises for a bad or too long bucket
        if self.buckets is not None and not isinstance(self.buckets, str):
            object.__setattr__(self, "buckets", tuple(int(length) for length in self.buckets))
        if isinstance(self.template, str) and not self.template.strip():
            raise ValueError(
                "template is empty: pass Jinja text, a ChatTemplate, or None for the model's own"
            )


def resolve_train_on(train_on: str, format: str) -> str:
    """`train_on` with `auto` made concrete for rows of `format`: completion for
    prompt/completion rows, assistant otherwise. A `ValueError` for completion on other rows."""
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
    if train_on == "auto":
        return "completion" if format == "prompt_completion" else "assistant"
    if train_on == "completion" and format != "prompt_completion":
        raise ValueError(
            f"training on the completion (--train-on completion, train_on='completion') needs "
            f"prompt/completion rows, and these rows are in the {format!r} format: train on "
            "assistant (every reply), last (the final reply) or all (every token)"
        )
    return train_on


__all__ = ["CHAT_FORMATS", "TRAIN_ON", "ChatDataConfig", "resolve_train_on"]
