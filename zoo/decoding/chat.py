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

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import Mesh
from jaxtyping import Int, PRNGKeyArray

from zoo.data.chat.conversations import Message, check_messages
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_prompt, end_of_turn_ids
from zoo.data.tokenizers.base import UNKNOWN_WARNING_RATE, Tokenizer
from zoo.decoding.keywords import PLACEMENT, SAMPLING, instead, sampling_of
from zoo.decoding.placement import decoding_layout
from zoo.decoding.sampling import SamplingSettings
from zoo.decoding.stream import stream_tokens
from zoo.distributed.layout import Layout
from zoo.models.gpt import GPT
from zoo.records import legacy_keywords

Conversation = str | Sequence[Mapping[str, Any]]  # a user message, or {role, content} messages
# the chat calls' keywords before `sampling`, `ChatFormat` and `Layout`
OLDER = (*SAMPLING, *PLACEMENT, "system", "template")


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
        turns: list[dict[str, Any]] = [{"role": "user", "content": conversation}]
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
    tokenizer: Tokenizer, template: ChatTemplate | str | None = None, folder: Any = None
) -> ChatTemplate:
    """`template`, the Jinja text `template`, or the tokenizer's own (`chat_template_for`)."""
    if isinstance(template, ChatTemplate):
        return template
    return chat_template_for(tokenizer, template=template, folder=folder)


class _Request:
    """What a chat call asks for beyond the conversations, its older keywords resolved."""

    def __init__(
        self,
        older: dict[str, Any],
        function: str,
        max_new_tokens: int = 256,
        sampling: SamplingSettings | None = None,
        key: PRNGKeyArray | None = None,
        mesh: Mesh | str | Layout | None = None,
        **variables: Any,
    ):
        self.max_new_tokens, self.key, self.variables = max_new_tokens, key, variables
        self.sampling = sampling_of(function, sampling, older)
        self.layout = decoding_layout(mesh, older.get("rules"))
        self.loose = {name: older[name] for name in ("template", "system") if name in older}

    def chat_format(self, tokenizer: Tokenizer | ChatFormat) -> ChatFormat:
        if not isinstance(tokenizer, ChatFormat):
            return ChatFormat(tokenizer, **self.loose)
        if self.loose:
            raise TypeError(
                f"{', '.join(f'{name}=' for name in self.loose)} beside a ChatFormat: set "
                "them in the ChatFormat"
            )
        return tokenizer


def _older(options: dict[str, Any]) -> dict[str, Any]:
    """The older keywords, taken out of a call's keywords (the rest are template variables)."""
    if "on_text" in options:
        raise ValueError(
            "on_text streams one conversation's reply: use zoo.chat or reply, one conversation "
            "at a time"
        )
    return {name: options.pop(name) for name in OLDER if name in options}


def _answer(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversations: Sequence[Conversation],
    request: _Request,
    on_text: Callable[[str], object] | None,
) -> list[Reply]:
    chat_format = request.chat_format(tokenizer)
    tokenizer = chat_format.tokenizer
    template = chat_template(tokenizer, chat_format.template)
    prompts = [
        encode_prompt(as_messages(conversation, system=chat_format.system), tokenizer,
                      template=template, **request.variables)
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
    **variables: Any,
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
        **variables: variables of the template (Llama 3's `date_string`). The older keywords
            `temperature`, `top_k`, `top_p` (now `sampling`), `system` and `template` (now a
            `ChatFormat`) and `rules` (now a `Layout` as `mesh`) still work, with a
            DeprecationWarning.
    """
    legacy = _older(variables)
    older = legacy_keywords("replies", legacy, OLDER, instead(legacy))
    request = _Request(
        older, "replies", max_new_tokens=max_new_tokens, sampling=sampling, key=key, mesh=mesh,
        **variables,
    )  # fmt: skip
    return _answer(model, tokenizer, conversations, request, None)


def reply(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversation: Conversation,
    *,
    on_text: Callable[[str], object] | None = None,
    **options: Any,
) -> Reply:
    """The reply to one conversation, with its tokens and why it ended.

    `on_text(piece)` is called with the reply's text as it is generated. `options` are those of
    `replies`: `max_new_tokens`, `sampling`, `key`, `mesh` and template variables.
    """
    legacy = _older(options)
    older = legacy_keywords("reply", legacy, OLDER, instead(legacy))
    request = _Request(older, "reply", **options)
    return _answer(model, tokenizer, [conversation], request, on_text)[0]


def chat(
    model: GPT,
    tokenizer: Tokenizer | ChatFormat,
    conversation: Conversation,
    *,
    on_text: Callable[[str], object] | None = None,
    **options: Any,
) -> str:
    """The assistant's reply to `conversation` (a user message, or `{role, content}` messages
    ending with a user turn), rendered with the model's chat template.

    `tokenizer` may be a `ChatFormat`: the tokenizer with a template of your choosing (a
    tokenizer without one gets zoo's default, logged) and a system prompt. `on_text(piece)` is
    called with the text as it is generated. `options` are those of `replies`:
    `max_new_tokens` (default 256), `sampling` (None is greedy; otherwise pass `key`), `mesh`
    (as for `zoo.generate`) and template variables; the older keywords (`temperature`,
    `system`, ...) still work, with a DeprecationWarning.
    """
    legacy = _older(options)
    older = legacy_keywords("chat", legacy, OLDER, instead(legacy))
    request = _Request(older, "chat", **options)
    return _answer(model, tokenizer, [conversation], request, on_text)[0].text
