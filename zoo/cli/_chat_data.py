"""Chat data for `zoo train gpt`: rows of conversations become instruction-tuning batches.

A `--data` whose train split has the columns of a conversation format (`messages`, ShareGPT
`conversations`, Alpaca `instruction`/`output`, `prompt`/`completion`) is read as chat data
(`zoo.data.chat.datasets`) instead of plain text; `--chat-format` names the format (or `none`: read
the text column as plain text). `--train-on` chooses the tokens the loss counts, `--pack /
--no-pack` whether conversations share rows.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from zoo.data.chat.conversations import FORMATS

CHAT_FORMATS = ("auto", *FORMATS, "none")


def add_chat_options(parser: argparse.ArgumentParser, *, pack: bool = True) -> None:
    """`--chat-format`, `--train-on` and (zoo train) `--pack`."""
    group = parser.add_argument_group(
        "chat data (gpt)", "rows of messages, instruction/output or prompt/completion"
    )
    group.add_argument(
        "--chat-format",
        choices=CHAT_FORMATS,
        default="auto",
        help="auto (default): conversations when the columns fit a format; none: plain text",
    )
    group.add_argument(
        "--train-on",
        choices=("assistant", "all"),
        default="assistant",
        help="the tokens the loss counts: the assistant's (default) or every token",
    )
    if not pack:
        return
    group.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pack short conversations into full rows, each attending to itself (default)",
    )


def wants_chat(dataset: Any, flavor: str, options: Any, *, split: str = "train") -> bool:
    """Whether `--data` is read as conversations (see the module doc); `split` is the split
    whose columns are looked at (`zoo eval`: the one it scores, where the data has it)."""
    from zoo.data.chat.datasets import is_chat_data

    chosen = getattr(options, "chat_format", "auto")
    if chosen == "none":
        return False
    if flavor != "gpt":
        if chosen != "auto":
            raise ValueError(f"--chat-format {chosen} trains a gpt; a {flavor} reads no chats")
        return False
    return chosen != "auto" or is_chat_data(dataset, train_split=split)


def chat_run_data(dataset: Any, options: Any) -> tuple[Any, Any, Any]:
    """(train batches, validation batches, tokenizer) of a dataset of conversations."""
    from zoo.data.chat.datasets import chat_data
    from zoo.data.chat.options import ChatDataConfig

    if options.streaming:
        raise ValueError("chat data is read into memory to be packed: drop --streaming")
    for option in ("source", "target", "text_column", "label_column"):
        if getattr(options, option) is not None:
            flag = "--" + option.replace("_", "-")
            raise ValueError(f"{flag} names a plain-text column; chat data reads conversations")
    tokenizer_options = {}
    if options.min_freq is not None:
        tokenizer_options["min_freq"] = options.min_freq
    if options.lowercase:
        tokenizer_options["lowercase"] = True
    extra = {} if options.max_len is None else {"max_len": options.max_len}
    config = ChatDataConfig(
        format=options.chat_format,
        train_on=options.train_on,
        pack=options.pack,
        batch_size=options.batch_size,
        seed=options.seed,
        tokenizer_options=tokenizer_options,
        **extra,
    )
    data = chat_data(dataset, tokenizer=options.tokenizer, config=config)
    counts = "; ".join(
        f"{name}: {count['conversations']} conversations, {count['tokens']:,} tokens, "
        f"{count['trained_tokens']:,} trained"
        for name, count in data.counts.items()
    )
    print(
        f"zoo train: chat data ({data.format} format, {data.template.origin}, loss on "
        f"{options.train_on} tokens, {'packed' if options.pack else 'one per row'}): {counts}",
        file=sys.stderr,
    )
    return data.train, data.validation, data.tokenizer
