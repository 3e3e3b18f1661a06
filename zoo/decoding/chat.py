"""Chat with a GPT: a conversation through the model's chat template, the reply as text.

    reply = zoo.chat(model, tokenizer, [{"role": "user", "content": "Hello!"}])
    reply = zoo.chat(model, ChatFormat(tokenizer, system="Answer briefly."), "Hello!",
                     on_text=print)

The conversation is rendered with the model's own chat template and its generation prompt
(`zoo.data.chat.tokens.encode_prompt`), exactly the ids transformers' `apply_chat_template(...,
add_generation_prompt=True)` gives, and continued token by token (`zoo.decoding.stream`). The
reply ends at the template's end of turn: the tokenizer's stop ids (`eos_ids`), the model's
`end_ids`, and any special token the template writes to close an assistant turn (found by
rendering a probe conversation), none of which is part of the text. `on_text` receives each
piece of text as soon as it is decoded (a token that ends inside a multi-byte character waits
for the next).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Int, PRNGKeyArray

from zoo.data.chat.conversations import Message, check_messages
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import end_of_turn_ids, prompt_ids
from zoo.data.tokenizers.base import UNKNOWN_WARNING_RATE, Tokenizer
from zoo.decoding.placement import decoding_layout
from zoo.decoding.sampling import SamplingSettings, sampling_or_greedy
from zoo.decoding.stream import stream_tokens
from zoo.distributed.layout import Layout
from zoo.models.gpt import GPT

Conversation = str | Sequence[Mapping[str, object]]  # a user message, or {role, content} messages
# the keywords of `replies` (and of `reply` and `chat`, beside `on_text`); any other keyword is
# a variable of the chat template
OPTIONS = ("max_new_tokens", "sampling", "key", "mesh")


@dataclass(frozen=True)
class ChatFormat:
    """How a conversation becomes the model's prompt: the tokenizer, the chat template that
    renders the conversation, and a system prompt.

    Pass it where the chat calls take the tokenizer, when the tokenizer alone is not enough:
    `zoo.chat(model, ChatFormat(tokenizer, system="Answer briefly."), "Hello!")`.
    """

    tokenizer: Tokenizer
    # a `ChatTemplate` or Jinja text; None: the tokenizer's own, else zoo's default (logged)
    template: ChatTemplate | str | None = None
    # opens every conversation with a system turn (unless it opens with one of its own)
    system: str | None = None


@dataclass(frozen=True)
class Reply:
    """The assistant's answer to one conversation."""

    text: str  # decoded, without the end-of-turn token
    tokens: tuple[int, ...]  # the generated ids, without the end-of-turn token
    finish_reason: str  # "stop": the turn ended; "length": max_new_tokens (or the model) ran out
    prompt_tokens: int  # ids of the rendered conversation with its generation prompt


def as_messages(conversation: Conversation, *, system: str | None = None) -> list[Message]:
    """The conversation as checked messages: a text is one user turn; `system` goes first
    (unless the conversation opens with a system turn of its own). It must end with a user
    (or system) turn, which the reply answers."""
    if isinstance(conversation, str):
        turns: list[dict[str, object]] = [{"role": "user", "content": conversation}]
    else:
        turns = [dict(message) for message in conversation]
    if system is not None and not (turns and turns[0].get("role") == "system"):
        turns.insert(0, {"role": "system", "content": system})
    messages = check_messages(turns, require_assistant=False, allow_empty_replies=True)
    if messages[-1]["role"] == "assistant":
        raise ValueError(
            "the conversation ends with an assistant turn: add the user message to answer"
        )
    return messages


class UnknownTokensWarning(UserWarning):
    """Many of a prompt's ids are the tokenizer's `<unk>`: the model reads other text than it
    was trained on, so its reply means little."""


def warn_unknown_prompts(tokenizer: Tokenizer, prompts: Sequence[Int[np.ndarray, " _"]]) -> None:
    """An `UnknownTokensWarning` with the numbers when more than `UNKNOWN_WARNING_RATE` of the
    prompts' ids are `<unk>` (a tokenizer without one, e.g. byte-level BPE, spells any text)."""
    unk = tokenizer.unk_id
    total = sum(len(prompt) for prompt in prompts)
    if unk is None or not total:
        return
    unknown = sum(int(np.count_nonzero(np.asarray(prompt) == unk)) for prompt in prompts)
    if unknown / total > UNKNOWN_WARNING_RATE:
        warnings.warn(
            f"{unknown} of {total} prompt tokens are unknown to this model's {tokenizer.kind} "
            "tokenizer (<unk>): it was trained on other text, so the reply means little",
            UnknownTokensWarning,
            stacklevel=2,
        )


class TextStream:
    """Decodes a growing list of ids and hands out only the text not yet shown."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""

    def add(self, token: int) -> str:
        """The new text after `token` ("" while a character is incomplete)."""
        self.ids.append(int(token))
        return self._piece(final=False)

    def finish(self) -> str:
        """Whatever is left to show."""
        return self._piece(final=True)

    def _piece(self, *, final: bool) -> str:
        text = self.tokenizer.decode(self.ids)
        if (not final and text.endswith("\ufffd")) or not text.startswith(self.shown):
            return ""  # an incomplete byte sequence, or a detokenizer rejoining earlier text
        piece, self.shown = text[len(self.shown) :], text
        return piece


def chat_template(
    tokenizer: Tokenizer,
    template: ChatTemplate | str | None = None,
    folder: str | os.PathLike | None = None,
) -> ChatTemplate:
    """`template`, the Jinja text `template`, or the tokenizer's own (`chat_template_for`)."""
    if isinstance(template, ChatTemplate):
        return template
    return chat_template_for(tokenizer, template=template, folder=folder)


@dataclass(frozen=True)
class _Request:
    """What a chat call asks for beyond the conversations, checked."""

    function: str  # the call, as its errors name it
    max_new_tokens: int
    sampling: SamplingSettings
    key: PRNGKeyArray | None
    layout: Layout | None
    variables: Mapping[str, object]  # the chat template's variables

    @staticmethod
    def of(function: str, options: Mapping[str, object]) -> _Request:
        """The keywords of `replies` (`OPTIONS`) taken out of `options`, each checked; the
        others are the template's variables."""
        if "on_text" in options:
            raise ValueError(
                "on_text streams one conversation's reply: use zoo.chat or reply, one "
                "conversation at a time"
            )
        variables = {name: value for name, value in options.items() if name not in OPTIONS}
        max_new_tokens = options.get("max_new_tokens", 256)
        key = options.get("key")
        mesh = options.get("mesh")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if key is not None and not isinstance(key, jax.Array):
            raise TypeError(
                f"key must be a random key (jax.random.key(seed)), got {type(key).__name__}"
            )
        if mesh is not None and not isinstance(mesh, Mesh | str | Layout):
            raise TypeError(
                f"mesh must be a jax.sharding.Mesh, a string like 'data=2' or a "
                f"zoo.distributed.Layout, got {type(mesh).__name__}"
            )
        sampling = sampling_or_greedy(options.get("sampling"))
        layout = decoding_layout(mesh)
        return _Request(function, max_new_tokens, sampling, key, layout, variables)

    def check_variables(self, template: ChatTemplate) -> None:
        """A `TypeError` for a keyword that is neither an option of the call nor a variable
        `template` reads (a misspelled option would otherwise be rendered into nothing)."""
        unread = sorted(set(self.variables) - template.variables - {"tools"})
        if unread:
            known = ", ".join(sorted(template.variables)) or "none"
            raise TypeError(
                f"{self.function}() got an unexpected keyword argument {unread[0]!r}: its "
                f"keywords are {', '.join(OPTIONS)}, and the others go to the chat template, "
                f"which reads no variable of that name ({template.origin}; its variables: "
                f"{known})"
            )


def _answer(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversations: Sequence[Conversation],
    request: _Request,
    on_text: Callable[[str], object] | None,
) -> list[Reply]:
    chat_format = tokenizer if isinstance(tokenizer, ChatFormat) else ChatFormat(tokenizer)
    tokenizer = chat_format.tokenizer
    template = chat_template(tokenizer, chat_format.template)
    request.check_variables(template)
    prompts = [
        prompt_ids(as_messages(conversation, system=chat_format.system), tokenizer, template,
                   request.variables)
        for conversation in conversations
    ]  # fmt: skip
    warn_unknown_prompts(tokenizer, prompts)
    ends = end_of_turn_ids(tokenizer, template)
    streams = [TextStream(tokenizer) for _ in prompts]
    ended = [False] * len(prompts)
    for tokens in stream_tokens(
        model, prompts, max_new_tokens=request.max_new_tokens, sampling=request.sampling,
        key=request.key, stop_ids=ends, mesh=request.layout,
    ):  # fmt: skip
        for row, token in enumerate(tokens.tolist()):
            if ended[row]:
                continue
            if token in ends or token in model.config.end_ids:
                ended[row] = True
                continue
            piece = streams[row].add(token)
            if on_text is not None and piece:
                on_text(piece)
    results = []
    for row, stream in enumerate(streams):
        rest = stream.finish()
        if on_text is not None and rest:
            on_text(rest)
        reason = "stop" if ended[row] else "length"
        text = tokenizer.decode(stream.ids)
        results.append(Reply(text, tuple(stream.ids), reason, len(prompts[row])))
    return results


def replies(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversations: Sequence[Conversation],
    *,
    max_new_tokens: int = 256,
    sampling: SamplingSettings | None = None,
    key: PRNGKeyArray | None = None,
    mesh: Mesh | str | Layout | None = None,
    **variables: object,
) -> list[Reply]:
    """The reply to each conversation, decoded together as one batch.

    Each conversation is a user message or `{role, content}` messages ending with a user turn,
    rendered with the chat template and its generation prompt; each reply ends at the
    template's end of turn.

    Args:
        model: a `zoo.GPT`.
        tokenizer: the model's tokenizer, or a `ChatFormat` (the tokenizer with a chat
            template of your choosing and a system prompt).
        conversations: the conversations to answer.
        max_new_tokens: the longest reply in tokens (cut to what fits in `max_positions`).
        sampling: how each token is chosen, as in `zoo.generate` (None is greedy).
        key: the random key of sampling, as in `zoo.generate`.
        mesh: where to decode, as in `zoo.generate`.
        **variables: variables of the chat template, whatever their names (Llama 3's
            `date_string`, a template's own `system`); a keyword the template does not read
            is refused with a `TypeError`.
    """
    options = {"max_new_tokens": max_new_tokens, "sampling": sampling, "key": key, "mesh": mesh}
    request = _Request.of("replies", {**variables, **options})
    return _answer(model, tokenizer, conversations, request, None)


def reply(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversation: Conversation,
    *,
    on_text: Callable[[str], object] | None = None,
    **options: object,
) -> Reply:
    """The reply to one conversation, with its tokens and why it ended.

    `on_text(piece)` is called with the reply's text as it is generated. `options` are those of
    `replies`: `max_new_tokens`, `sampling`, `key`, `mesh` and the template's variables.
    """
    request = _Request.of("reply", options)
    return _answer(model, tokenizer, [conversation], request, on_text)[0]


def chat(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversation: Conversation,
    *,
    on_text: Callable[[str], object] | None = None,
    **options: object,
) -> str:
    """The assistant's reply to `conversation` (a user message, or `{role, content}` messages
    ending with a user turn), rendered with the model's chat template.

    `tokenizer` may be a `ChatFormat`: the tokenizer with a template of your choosing (a
    tokenizer without one gets zoo's default, logged) and a system prompt. `on_text(piece)` is
    called with the text as it is generated. `options` are those of `replies`:
    `max_new_tokens` (default 256), `sampling` (None is greedy; otherwise pass `key`), `mesh`
    (as for `zoo.generate`) and the template's variables.
    """
    request = _Request.of("chat", options)
    return _answer(model, tokenizer, [conversation], request, on_text)[0].text
