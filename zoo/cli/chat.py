"""`zoo chat MODEL`: talk to a GPT through its chat template, in the terminal or from a script.

Three ways in, one conversation each:

- a terminal: type a message, the reply streams back token by token; the history is kept;
  `/reset` starts the conversation again (the system prompt stays), `/exit` (or Ctrl-D) quits;
- `--message TEXT` (repeatable: each is the next user turn): answered, then the command exits;
- lines on standard input (not a terminal): each line is a user turn, `/reset` and `/exit` work
  as typed; blank lines are skipped; an empty input answers nothing and exits 0; a closed one
  (no standard input at all) is an error that says to pass `--message`.

Ctrl-C at a terminal stops the reply being streamed and returns to the prompt (the history
keeps the message and the part of the reply that was shown); at the prompt it quits with
status 130, the status `zoo train` gives an interrupted run. Elsewhere (`--message`, piped
lines) Ctrl-C stops the command, also with status 130. An empty `--message` or `--system` is
refused before the model loads.

`--json` prints one JSON object per reply instead of the text: `turn`, `user`, `reply`,
`finish_reason` (`stop` at the end of the turn, `length` when `--max-new-tokens` or the model's
positions ran out), `new_tokens` and `prompt_tokens`.

A reply's control characters (ESC, CR, BEL, U+202E, ...) are shown escaped (`\\x1b`, `\\r`,
`\\u202e`; in JSON its own `\\u001b`), so a model cannot clear the screen or reverse the text;
`--raw` prints them as they are. The history keeps the reply as the model wrote it.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

from jaxtyping import PRNGKeyArray

from zoo.cli import _inference as inference
from zoo.cli._chat_data import DEFAULT_TEMPLATE_ORIGIN, read_template, warn_default_template
from zoo.text import printable, printable_json

if TYPE_CHECKING:
    from zoo.decoding.chat import ChatFormat
    from zoo.decoding.sampling import SamplingSettings
    from zoo.distributed.layout import Layout
    from zoo.models.gpt import GPT

COMMANDS = {"/reset": "start the conversation again", "/exit": "quit"}


class ReplyOptions(TypedDict):
    """How each reply is decoded: keywords of `zoo.decoding.chat.reply`."""

    max_new_tokens: int
    sampling: SamplingSettings
    mesh: Layout | None


@runtime_checkable
class Lines(Protocol):
    """Standard input as `zoo chat` reads it: its lines, and whether a terminal types them."""

    def isatty(self) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...


def register(commands) -> None:
    parser = commands.add_parser(
        "chat", help="chat with a GPT through its chat template (streams tokens; /reset, /exit)"
    )
    inference.add_model_arguments(parser)
    parser.add_argument("--system", help="a system prompt that opens the conversation")
    parser.add_argument(
        "--message",
        action="append",
        help="answer this user message and exit; repeat for the turns of one conversation",
    )
    parser.add_argument(
        "--template",
        metavar="FILE",
        help="a Jinja chat template file to use instead of the model's own (a zoo train run's "
        "is its chat_template.jinja)",
    )
    inference.add_sampling_options(parser, max_new_tokens=256, per="per reply")
    inference.add_output_options(parser, json_help="one JSON object per reply")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.decoding.chat import ChatFormat, chat_template
    from zoo.models.gpt import GPT

    sampling, key = inference.sampling_from_args(args)  # bad values: before loading
    _check_texts(args)
    template_text = read_template(args.template)  # a bad file: before loading
    model, tokenizer, layout = inference.load_for(args, GPT)
    folder = Path(args.model) if Path(args.model).is_dir() else None
    template = chat_template(tokenizer, template_text, folder=folder)
    if template.origin == DEFAULT_TEMPLATE_ORIGIN:
        warn_default_template("chat", tokenizer)
    session = Session(
        model,
        ChatFormat(tokenizer, template=template, system=args.system),
        options=ReplyOptions(max_new_tokens=args.max_new_tokens, sampling=sampling, mesh=layout),
        key=key,
        json_output=args.json,
        raw=args.raw,
    )
    try:
        if args.message:
            for message in args.message:
                session.answer(message)  # an error here ends the command with it
            return 0
        return _converse(session, sys.stdin, args.model)
    except KeyboardInterrupt:  # Ctrl-C outside a terminal's prompt: the command stops
        print("zoo chat: interrupted", file=sys.stderr)
        return 130


def _check_texts(args: argparse.Namespace) -> None:
    """Refuse an empty --message or --system, and a missing standard input, before loading."""
    for message in args.message or ():
        if not message.strip():
            raise ValueError("--message is empty: give the text to send")
    if args.system is not None and not args.system.strip():
        raise ValueError("--system is empty: give the system prompt, or leave --system out")
    if not args.message and (sys.stdin is None or sys.stdin.closed):
        raise ValueError(
            "standard input is closed, so there is nothing to answer: pass --message TEXT, "
            "pipe the messages in, or run zoo chat in a terminal"
        )


def _converse(session: Session, stdin: Lines, model: str) -> int:
    """Answer the lines of `stdin` (typed at a prompt when it is a terminal); the exit status.

    At a terminal Ctrl-C stops the reply being streamed and returns to the prompt (the history
    keeps what was shown), and at the prompt it quits with status 130.
    """
    interactive = stdin.isatty()
    if interactive:
        print(f"zoo chat: {model}; /reset clears the history, /exit quits", file=sys.stderr)
    try:
        for line in _lines(stdin, interactive):
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if text == "/exit":
                    break
                _command(session, text, interactive)
                continue
            try:
                session.answer(text)
            except ValueError as error:  # e.g. the history outgrew the model: say so, go on
                print(f"zoo chat: error: {printable(str(error))}", file=sys.stderr)
            except KeyboardInterrupt:
                if not interactive:
                    raise
                print("(reply stopped)", file=sys.stderr)
    except KeyboardInterrupt:
        if not interactive:
            raise
        print(file=sys.stderr)  # the shell's prompt on a line of its own
        return 130
    return 0


def _command(session: Session, text: str, interactive: bool) -> None:
    if text == "/reset":
        session.reset()
        if interactive:
            print("(history cleared)", file=sys.stderr)
        return
    known = ", ".join(f"{name} ({what})" for name, what in COMMANDS.items())
    print(f"zoo chat: unknown command {text!r}; commands: {known}", file=sys.stderr)


class Session:
    """One conversation: its history, how to decode, and where the replies go.

    `chat_format` is the tokenizer with the template and system prompt; `options` are the
    keywords of `zoo.decoding.chat.reply` (`max_new_tokens`, `sampling`, `mesh`); turn `i` draws
    with `fold_in(key, i)`.
    """

    def __init__(
        self,
        model: GPT,
        chat_format: ChatFormat,
        *,
        options: ReplyOptions,
        key: PRNGKeyArray | None,
        json_output: bool,
        raw: bool = False,
    ):
        self.model, self.chat_format = model, chat_format
        self.options, self.key = options, key
        self.json_output, self.raw = json_output, raw
        self.history: list[dict[str, str]] = []
        self.turn = 0

    def reset(self) -> None:
        self.history = []

    def answer(self, text: str) -> None:
        """Reply to the user message `text` and keep both in the history.

        Ctrl-C (KeyboardInterrupt) while the reply streams ends its line and is raised again;
        the history then keeps the message and the part of the reply that was shown (nothing of
        it with `--json`, where nothing was shown).
        """
        import jax

        from zoo.decoding.chat import UnknownTokensWarning, reply

        messages = [*self.history, {"role": "user", "content": text}]
        key = None if self.key is None else jax.random.fold_in(self.key, self.turn)
        shown: list[str] = []
        stream = None if self.json_output else _printer(shown, raw=self.raw)
        try:
            with warnings.catch_warnings():
                if self.turn > 0:  # said once, on the first turn: each turn would repeat it
                    warnings.simplefilter("ignore", UnknownTokensWarning)
                answer = reply(
                    self.model, self.chat_format, messages, key=key, on_text=stream,
                    **self.options,
                )  # fmt: skip
        except KeyboardInterrupt:
            if not self.json_output:
                print(flush=True)
                self.turn += 1
                self.history = [*messages, {"role": "assistant", "content": "".join(shown)}]
            raise
        self.turn += 1
        self.history = [*messages, {"role": "assistant", "content": answer.text}]
        if not self.json_output:
            print(flush=True)
            return
        record = {
            "turn": self.turn,
            "user": text,
            "reply": answer.text,
            "finish_reason": answer.finish_reason,
            "new_tokens": len(answer.tokens),
            "prompt_tokens": answer.prompt_tokens,
        }
        line = json.dumps(record, ensure_ascii=False)
        print(line if self.raw else printable_json(line), flush=True)


def _printer(shown: list[str], *, raw: bool) -> Callable[[str], None]:
    """Writes each piece of a reply to stdout as it comes (its control characters escaped
    unless `raw`), and keeps it as it is in `shown`."""

    def show(piece: str) -> None:
        shown.append(piece)
        _print_piece(piece if raw else printable(piece))

    return show


def _print_piece(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _lines(stream: Iterable[str], interactive: bool) -> Iterator[str]:
    """The input lines; at a terminal each is asked for with a prompt."""
    if not interactive:
        yield from stream
        return
    while True:
        try:
            yield input("> ")
        except EOFError:
            print(file=sys.stderr)
            return
