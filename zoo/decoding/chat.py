"""Chat with a GPT: a conversation through the model's chat template, the reply as text.

    reply = zoo.chat(model, tokenizer, [{"role": "user", "content": "Hello!"}])
    reply = zoo.chat(model, tokenizer, "Hello!", system="Answer briefly.", on_text=print)

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxtyping import PRNGKeyArray

from zoo.data.chat.conversations import Message, check_messages
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import encode_prompt, end_of_turn_ids
from zoo.data.tokenizers.base import Tokenizer
from zoo.decoding.stream import stream_tokens
from zoo.models.gpt import GPT

Conversation = str | Sequence[Mapping[str, Any]]  # a user message, or {role, content} messages


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


def replies(
    model: GPT,
    tokenizer: Tokenizer,
    conversations: Sequence[Conversation],
    *,
    system: str | None = None,
    template: ChatTemplate | str | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: PRNGKeyArray | None = None,
    on_text: Callable[[str], object] | None = None,
    mesh: Any = None,
    rules: Any = None,
    **variables: Any,
) -> list[Reply]:
    """The reply to each conversation, decoded together as one batch.

    `on_text` (one conversation only) receives the reply's text piece by piece as it is
    generated. `variables` reach the template (Llama 3's `date_string`). Sampling, `key`,
    `mesh` and `rules` are as in `zoo.generate`.
    """
    if on_text is not None and len(conversations) != 1:
        raise ValueError("on_text streams one conversation's reply: pass a single conversation")
    template = chat_template(tokenizer, template)
    prompts = [
        encode_prompt(as_messages(conversation, system=system), tokenizer, template=template,
                      **variables)
        for conversation in conversations
    ]  # fmt: skip
    ends = end_of_turn_ids(tokenizer, template)
    streams = [TextStream(tokenizer) for _ in prompts]
    ended = [False] * len(prompts)
    for tokens in stream_tokens(
        model, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, key=key, stop_ids=ends, mesh=mesh, rules=rules,
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


def reply(model: GPT, tokenizer: Tokenizer, conversation: Conversation, **options: Any) -> Reply:
    """The reply to one conversation, with its tokens and why it ended (options: `replies`)."""
    return replies(model, tokenizer, [conversation], **options)[0]


def chat(
    model: GPT,
    tokenizer: Tokenizer,
    conversation: Conversation,
    *,
    system: str | None = None,
    template: ChatTemplate | str | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: PRNGKeyArray | None = None,
    on_text: Callable[[str], object] | None = None,
    mesh: Any = None,
    rules: Any = None,
    **variables: Any,
) -> str:
    """The assistant's reply to `conversation` (a user message, or `{role, content}` messages
    ending with a user turn), rendered with the model's chat template.

    `system` opens the conversation with a system turn. `template` (a `ChatTemplate` or Jinja
    text) replaces the tokenizer's own; a tokenizer without one gets zoo's default (logged).
    `temperature=0` (default) is greedy; otherwise pass `key` (and optionally `top_k`,
    `top_p`). `on_text(piece)` is called with the text as it is generated. On many devices
    pass `mesh` (and `rules`), as for `zoo.generate`.
    """
    found = replies(
        model, tokenizer, [conversation], system=system, template=template,
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        key=key, on_text=on_text, mesh=mesh, rules=rules, **variables,
    )  # fmt: skip
    return found[0].text
