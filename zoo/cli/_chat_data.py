"""Chat data for `zoo train gpt`: rows of conversations become instruction-tuning batches.

A `--data` whose train split has the columns of a conversation format (`messages`, ShareGPT
`conversations`, Alpaca `instruction`/`output`, `prompt`/`completion`) is read as chat data
(`zoo.data.chat.datasets`) instead of plain text; `--chat-format` names the format (or `none`: read
the text column as plain text). `--train-on` chooses the tokens the loss counts, `--pack /
--no-pack` whether conversations share rows, `--template FILE` the chat template (saved in the
run folder as `chat_template.jinja`, which `zoo chat`, `zoo eval` and `zoo export` then use),
`--messages-column` and `--role FROM=TO` where the messages are and what their roles are called.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.cli._data_options import DataOptions, check_holdout, parse_roles, word_options
from zoo.data.chat.conversations import FORMATS
from zoo.data.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from zoo.data.chat.datasets import ChatData
    from zoo.data.chat.options import ChatDataConfig
    from zoo.data.specs import DatasetDicts

CHAT_FORMATS = ("auto", *FORMATS, "none")
TRAIN_ON = ("auto", "assistant", "completion", "last", "all")
DEFAULT_TEMPLATE_ORIGIN = "zoo's default chat template"


def add_chat_options(parser: argparse.ArgumentParser, *, pack: bool = True) -> None:
    """`--chat-format`, `--train-on`, `--template`, `--messages-column`, `--role` and (zoo
    train) `--pack`."""
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
        choices=TRAIN_ON,
        default="auto",
        help="the tokens the loss counts: assistant (every reply), completion (the completion "
        "of prompt/completion rows), last (the last reply), all (every token); auto (default): "
        "completion for prompt/completion data, assistant otherwise",
    )
    group.add_argument(
        "--template",
        metavar="FILE",
        help="a Jinja chat template file to render the conversations with (default: the "
        "tokenizer's own, else zoo's)",
    )
    group.add_argument(
        "--messages-column",
        metavar="NAME",
        help="the column that holds each row's list of messages (default: messages or "
        "conversations)",
    )
    group.add_argument(
        "--role",
        action="append",
        metavar="FROM=TO",
        help="rename a role of the data, e.g. --role human=user --role gpt=assistant; repeatable",
    )
    if not pack:
        return
    group.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pack short conversations into full rows, each attending to itself (default)",
    )
    group.add_argument(
        "--show-data",
        type=positive_int("--show-data"),
        metavar="N",
        help="print N conversations as trained (trained tokens marked), the length "
        "percentiles and what was cut, dropped and packed; then exit without training",
    )
    group.add_argument(
        "--sample-every",
        type=positive_int("--sample-every"),
        metavar="N",
        help="every N steps, write greedy replies to 3 held-out prompts to DIR/samples.jsonl "
        "and stderr",
    )


def positive_int(flag: str) -> Callable[[str], int]:
    """An argparse type: a positive integer, refused naming `flag`."""

    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} takes a positive number, got {value}")
        return value

    read.__name__ = "positive integer"
    return read


def read_template(path: str | None) -> str | None:
    """The text of `--template FILE` (None without it), refused naming the flag when the file
    is missing, unreadable, not UTF-8 or empty."""
    if path is None:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"--template {path}: no such file; give a Jinja chat template")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"--template {path} is not UTF-8 text; save the template as UTF-8"
        ) from None
    if not text.strip():
        raise ValueError(f"--template {path} is empty; give a Jinja chat template")
    return text


def wants_chat(
    dataset: DatasetDicts, flavor: str, options: DataOptions, *, split: str = "train"
) -> bool:
    """Whether `--data` is read as conversations (see the module doc); `split` is the split
    whose columns are looked at (`zoo eval`: the one it scores, where the data has it)."""
    from zoo.data.chat.datasets import is_chat_data

    chosen = options.chat_format
    if chosen == "none":
        _refuse_chat_only(options, "--chat-format none reads plain text")
        return False
    if flavor != "gpt":
        if chosen != "auto":
            raise ValueError(f"--chat-format {chosen} trains a gpt; a {flavor} reads no chats")
        _refuse_chat_only(options, f"a {flavor} reads no chats")
        return False
    if chosen != "auto" or options.messages_column:
        return True
    if is_chat_data(dataset, train_split=split):
        return True
    _refuse_chat_only(options, "the columns of --data fit no chat format (see --chat-format)")
    return False


def _refuse_chat_only(options: DataOptions, why: str) -> None:
    """Chat-data flags given where no conversations are read."""
    given = {
        "--template": options.template,
        "--messages-column": options.messages_column,
        "--role": options.roles,
    }
    for flag, value in given.items():
        if value:
            raise ValueError(f"{flag} is for chat data, and {why}: drop {flag}")
    if options.train_on != "auto":
        raise ValueError(f"--train-on is for chat data, and {why}: drop --train-on")


def chat_config(options: DataOptions, *, template: str | None) -> ChatDataConfig:
    """The `ChatDataConfig` of the command line's chat options, rendering with the Jinja text
    `template` (None: the tokenizer's own, else zoo's)."""
    from zoo.data.chat.options import ChatDataConfig

    tokenizer_options = word_options(options)
    try:
        return ChatDataConfig(
            format=options.chat_format,
            train_on=options.train_on,
            pack=options.pack,
            batch_size=options.batch_size,
            seed=options.seed,
            tokenizer_options=tokenizer_options,
            buckets=options.buckets,
            loss_positions=options.loss_positions,
            group_by_length=options.group_by_length,
            # a value not given keeps ChatDataConfig's default
            max_len=ChatDataConfig.max_len if options.max_len is None else options.max_len,
            holdout=ChatDataConfig.holdout if options.holdout is None else options.holdout,
            template=template,
            roles=dict(options.roles) if options.roles else None,
            messages_column=options.messages_column or None,
        )
    except ValueError as error:  # name the flag the value came from
        raise ValueError(f"{_flag_of(str(error))}: {error}") from None


def _flag_of(message: str) -> str:
    """The command-line flag a `ChatDataConfig` error is about (the field it names first)."""
    flags = {"train_on": "--train-on", "holdout": "--holdout", "roles": "--role", "messages_column": "--messages-column",
             "template": "--template", "format": "--chat-format", "max_len": "--max-len",
             "batch_size": "--batch-size"}  # fmt: skip
    found = [(message.find(name), flag) for name, flag in flags.items() if name in message]
    return min(found)[1] if found else "chat data options"


def chat_run_data(dataset: DatasetDicts, options: DataOptions) -> ChatData:
    """The train and validation batches, tokenizer and chat template of a dataset of
    conversations."""
    from zoo.data.chat.datasets import chat_data

    if options.streaming:
        raise ValueError("chat data is read into memory to be packed: drop --streaming")
    columns = {"--source": options.source, "--target": options.target,
               "--text-column": options.text_column, "--label-column": options.label_column}  # fmt: skip
    for flag, column in columns.items():
        if column is not None:
            raise ValueError(f"{flag} names a plain-text column; chat data reads conversations")
    config = chat_config(options, template=read_template(options.template))
    with naming_flags(options):
        data = chat_data(dataset, tokenizer=options.tokenizer, config=config)
    counts = "; ".join(
        f"{name}: {count['conversations']} conversations, {count['tokens']:,} tokens, "
        f"{count['trained_tokens']:,} trained"
        for name, count in data.counts.items()
    )
    origin = "--template " + options.template if options.template else data.template.origin
    print(
        f"zoo train: chat data ({data.format} format, {origin}, loss on "
        f"{_train_on(options.train_on, data.format)} tokens, "
        f"{'packed' if options.pack else 'one per row'}): {counts}",
        file=sys.stderr,
    )
    if data.template.origin == DEFAULT_TEMPLATE_ORIGIN:
        warn_default_template("train", data.tokenizer)
    return data


@contextlib.contextmanager
def naming_flags(options: DataOptions) -> Iterator[None]:
    """Errors of the data layer about a chat option, prefixed with the flag that set it."""
    try:
        yield
    except ValueError as error:
        message = str(error)
        flags = {
            "--messages-column": (options.messages_column, "messages column"),
            "--chat-format": (options.chat_format if options.chat_format != "auto" else None,
                              "format"),
        }  # fmt: skip
        for flag, (value, said) in flags.items():
            if value and said in message and flag not in message:
                raise type(error)(f"{flag} {value}: {message}") from None
        raise


def _train_on(train_on: str, format: str) -> str:
    """What `--train-on auto` chose for data of `format`."""
    from zoo.data.chat.options import resolve_train_on

    return resolve_train_on(train_on, format)


def warn_default_template(command: str, tokenizer: Tokenizer) -> None:
    """One line on stderr: the tokenizer has no chat template, so zoo's default renders."""
    kind = tokenizer.kind or type(tokenizer).__name__
    print(
        f"zoo {command}: warning: the {kind} tokenizer has no chat template; using zoo's default "
        "('role:' line, content, eos per turn); pass --template FILE to choose one",
        file=sys.stderr,
    )


def run_template(template_flag: str | None, model: str) -> str | None:
    """The chat template `zoo eval` renders with: `--template FILE`, else the one the run in
    `model` saved (`chat_template.jinja` and the other files `zoo.data.chat.files` reads; None:
    the tokenizer's own, else zoo's default, warned about)."""
    from zoo.data.chat.files import pick_template, read_chat_templates

    if template_flag is not None:
        return read_template(template_flag)
    folder = Path(model)
    if not folder.is_dir():
        return None
    found = read_chat_templates(folder)
    return None if found is None else pick_template(found)


def eval_chat_config(options: DataOptions, *, model: str) -> ChatDataConfig:
    """The `ChatDataConfig` `zoo eval` scores conversations with (one per row), from the data
    options of its flags (`max_len` and `seed` resolved) and the template of the run in `model`
    (`run_template`). The word tokenizer's options, `--buckets` and `--group-by-length` are
    not read: the model's own tokenizer encodes, in buckets fitted to the data."""
    scoring = dataclasses.replace(options, pack=False, min_freq=None, lowercase=None,
                                  buckets="auto", loss_positions=True, group_by_length=False)  # fmt: skip
    return chat_config(scoring, template=run_template(options.template, model))


def resolved_train_on(train_on: str, dataset: DatasetDicts, split: str) -> str:
    """What `--train-on` means for the conversations of `dataset[split]` (auto resolved)."""
    if train_on != "auto":
        return train_on
    from zoo.data.chat.datasets import chat_format_of

    rows = dataset[split] if split in dataset else dataset["train"]
    try:
        return _train_on(train_on, chat_format_of(rows, None))
    except ValueError:  # columns named by --messages-column: messages
        return "assistant"


def check_chat_flags(args: argparse.Namespace) -> None:
    """`zoo train`'s chat flags checked before the run folder is touched: the template file
    read, the roles parsed, `--holdout` a fraction, `--show-data` and `--sample-every` where
    they can apply."""
    read_template(getattr(args, "template", None))
    parse_roles(getattr(args, "role", None))
    check_holdout(getattr(args, "holdout", None))
    for flag, name in (("--show-data", "show_data"), ("--sample-every", "sample_every")):
        if getattr(args, name, None) is None:
            continue
        if args.chat_format == "none":
            raise ValueError(
                f"{flag} is for chat data, and --chat-format none reads plain text: drop {flag}"
            )
        if args.flavor != "gpt":
            raise ValueError(f"{flag} is for chat data, which trains a gpt: drop {flag}")
