"""Where each assistant turn lies in a rendered conversation, read from the whole rendering.

A template without `{% generation %}` blocks is read by rendering it a few more times: the
whole conversation once (`full`, the text the model trains on), and for each assistant turn i
the conversation before it with the generation prompt (`messages[:i]`,
`add_generation_prompt=True`). That prompt must be where `full` starts the turn (a prefix of
it), and the turn starts where the prompt ends. A conversation may open with an assistant turn
(a greeting), when the template renders the empty conversation's generation prompt.

Where the turn ends is read from the conversation ending with it (`messages[:i + 1]`):

- the turn runs as far as that rendering and `full` agree: all of it when it is a prefix of
  `full` (the content, the end marker and what follows up to the next message: Llama's
  `<|eot_id|>`, Gemma's `<end_of_turn>\n`, Qwen2.5's `<|im_end|>\n`, Mistral's `</s>`). Phi-3
  writes eos after a conversation's last message, so the two part after its `<|end|>\n`,
  inside a token (`<|endoftext|>` against `<|user|>`): only the tokens wholly before the
  parting count (`TurnSpan.soft_end`);
- a turn that then holds no stop token (`eos_ids`) goes on over the stop token the template
  writes next whenever the conversation goes on: the one that `full`, the same rendering with
  the generation prompt, and the same rendering with a user turn after it all start with
  (Qwen1.5 writes `<|im_end|>` after every message but the last).

`zoo.data.chat.tokens.encode_chat` then keeps a turn's tokens up to and including its first
stop token (the tokenizer's `eos_ids`), the end of the turn the model learns to write.

The last reply of a conversation gets the end-of-turn token a template writes after a reply
only when the conversation goes on (Qwen1.5's `<|im_end|>`; `closing_text`): the model learns
to stop after every reply, the last one too. With that one difference the text is
transformers' `apply_chat_template`.

A template this cannot read (one that writes the conversation before a turn differently once
the turn is added, or that leaves a reply's content out of its turn) is refused with a
`ValueError` that names it and says how to go on: a template whose `{% generation %}` blocks
mark the assistant's text, or training on every token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from zoo.data.chat.conversations import Message
from zoo.data.chat.template import ChatTemplate
from zoo.data.errors import DataError

# The user turn that stands for "the conversation goes on" while a turn's end is read.
GOES_ON: Message = {"role": "user", "content": "\ue003"}
HOW_TO_FIX = (
    "pass a chat template whose {% generation %} ... {% endgeneration %} blocks mark what the "
    "assistant writes (--template FILE, template=...), or train on every token "
    "(--train-on all, train_on='all')"
)


@dataclass(frozen=True)
class TurnSpan:
    """One assistant turn's characters in the rendered text: every token that overlaps
    `[start, end)` is the turn's, and every token wholly inside `[start, soft_end)`."""

    start: int
    end: int
    soft_end: int


def turn_spans(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, object]],
    *,
    stop_texts: Sequence[str] = (),
    full: str | None = None,
    **variables: object,
) -> tuple[str, list[TurnSpan]]:
    """The rendered conversation and the span of each assistant turn (see the module doc);
    `stop_texts` are the texts of the tokenizer's stop tokens (`eos_ids`), `full` the
    conversation already rendered (None: rendered here)."""
    if full is None:
        full = template.render(messages, add_generation_prompt=False, **variables)
    spans: list[TurnSpan] = []
    for turn, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = turn_start(template, messages, turn, full, variables)
        if spans and start < spans[-1].soft_end:
            raise unreadable(template, f"assistant turn {turn} starts inside the turn before it")
        span = turn_end(template, messages, turn, full, start, stop_texts, variables)
        content = message.get("content")
        if isinstance(content, str) and content.strip() not in full[start : span.soft_end]:
            raise unreadable(
                template,
                f"the content of assistant turn {turn} is not where the turn is written (the "
                "template rewrites or drops it)",
            )
        spans.append(span)
    return full, spans


def turn_start(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, object]],
    turn: int,
    full: str,
    variables: Mapping[str, object],
) -> int:
    """Where assistant turn `turn` starts in `full`: the end of its generation prompt."""
    try:
        before = template.render(messages[:turn], add_generation_prompt=True, **variables)
    except ValueError as error:
        if turn > 0:
            raise
        raise DataError(
            f"the conversation opens with an assistant turn, and {template.origin} cannot "
            f"write the empty conversation before it ({error}); start the conversation with "
            f"a user (or system) turn, or {HOW_TO_FIX}"
        ) from None
    if not full.startswith(before):
        at = len(common_prefix([before, full]))
        raise unreadable(
            template,
            f"the conversation before assistant turn {turn}, with the generation prompt, is "
            f"written differently once the turn follows it (they part at character {at}: "
            f"{before[at : at + 40]!r} against {full[at : at + 40]!r})",
        )
    return len(before)


def turn_end(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, object]],
    turn: int,
    full: str,
    start: int,
    stop_texts: Sequence[str],
    variables: Mapping[str, object],
) -> TurnSpan:
    """The span of assistant turn `turn` in `full` (see the module doc).

    Args:
        template: the chat template.
        messages: the conversation.
        turn: the index of the assistant turn in `messages`.
        full: the whole conversation as `template` renders it (with `variables`).
        start: where the turn starts in `full` (`turn_start`).
        stop_texts: the texts of the tokenizer's stop tokens.
        variables: the template's other variables (`tools`, `date_string`, ...).
    """
    # the conversation ending with the last turn is `full` itself: no second rendering
    last = turn + 1 == len(messages)
    through = (
        full
        if last
        else template.render(messages[: turn + 1], add_generation_prompt=False, **variables)
    )
    shared = len(common_prefix([through, full]))
    if shared == len(through):
        end = soft_end = shared
    else:  # they part inside a token maybe (<|endoftext|> against <|user|>): whole ones only
        end, soft_end = min(start + 1, shared), shared
    if any(stop and stop in full[start:soft_end] for stop in stop_texts):
        return TurnSpan(start, end, soft_end)
    # No stop token in the turn: the template may write it only when the conversation goes on.
    after = [full[soft_end:]]
    for more, prompt in ((messages[: turn + 1], True), ([*messages[: turn + 1], GOES_ON], False)):
        try:
            text = template.render(more, add_generation_prompt=prompt, **variables)
        except ValueError:
            continue  # a template that refuses this continuation tells nothing
        if text.startswith(full[:soft_end]):
            after.append(text[soft_end:])
    common = common_prefix(after)
    stop = next((stop for stop in stop_texts if stop and common.startswith(stop)), "")
    return TurnSpan(start, end, soft_end + len(stop))


def closing_text(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, object]],
    full: str,
    stop_texts: Sequence[str],
    variables: Mapping[str, object],
) -> str:
    """The stop token text to write after `full` when the conversation ends with an assistant
    reply that the template leaves without one (Qwen1.5's `<|im_end|>`): the stop text the
    template writes right after the reply whenever the conversation goes on; "" otherwise."""
    if not messages or messages[-1].get("role") != "assistant":
        return ""
    last = template.render(messages[:-1], add_generation_prompt=True, **variables)
    reply = full[len(last) :] if full.startswith(last) else full
    if any(stop and stop in reply for stop in stop_texts):
        return ""
    after = []
    for more, prompt in ((messages, True), ([*messages, GOES_ON], False)):
        try:
            text = template.render(more, add_generation_prompt=prompt, **variables)
        except ValueError:
            continue
        if not text.startswith(full):
            return ""
        after.append(text[len(full) :])
    common = common_prefix(after)
    return next((stop for stop in stop_texts if stop and common.startswith(stop)), "")


def common_prefix(texts: Sequence[str]) -> str:
    """The longest text every one of `texts` starts with ("" for none)."""
    if not texts:
        return ""
    shortest, longest = min(texts), max(texts)  # the first and last in sorted order
    size = next((i for i, (a, b) in enumerate(zip(shortest, longest)) if a != b), len(shortest))
    return shortest[:size]


def unreadable(template: ChatTemplate, reason: str) -> ValueError:
    """The refusal of a template whose assistant turns cannot be read: why, and what to do."""
    return ValueError(
        f"{template.origin} cannot be read turn by turn, so the assistant's tokens are not "
        f"known: {reason}; {HOW_TO_FIX}"
    )


PROBE: list[Message] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}]
# Templates whose generation prompt was seen to open the assistant's turn (or that need none).
_OPENING_CHECKED: set[tuple[str, str]] = set()


def check_generation_prompt(
    template: ChatTemplate, messages: Sequence[Mapping[str, object]], /, **variables: object
) -> None:
    """A `ValueError` when `template` ignores `add_generation_prompt`: the conversation up to
    its first assistant reply (or up to its last user turn, with a probe reply) renders the same
    with and without it, while the template writes an opening (`<|im_start|>assistant\\n`)
    before the reply. A template that needs no opening (Mistral's `[/INST]` ends the prompt)
    passes. Checked once per template, at the first conversation that can tell."""
    key = (template.source, repr(sorted(template.special_tokens.items())))
    if key in _OPENING_CHECKED:
        return
    turn = next(
        (i for i, message in enumerate(messages) if i > 0 and message.get("role") == "assistant"),
        None,
    )
    if turn is None and messages and messages[-1].get("role") == "user":
        messages, turn = [*messages, PROBE[1]], len(messages)
    if turn is None or messages[turn - 1].get("role") != "user":
        return
    prompt = messages[:turn]
    plain = template.render(prompt, add_generation_prompt=False, **variables)
    if template.render(prompt, add_generation_prompt=True, **variables) != plain:
        _remember(key)
        return
    through = template.render(messages[: turn + 1], add_generation_prompt=False, **variables)
    reply = str(messages[turn].get("content") or "").strip()
    written = through[len(plain) :] if through.startswith(plain) else ""
    at = written.find(reply) if reply else -1
    if at < 0:
        return  # the template rewrites the reply: this conversation cannot tell
    opening = written[:at]
    if opening.strip():
        raise ValueError(
            f"{template.origin} ignores add_generation_prompt: it writes {opening!r} before "
            "each assistant reply but not as the generation prompt (the conversation before "
            f"the first reply renders to the same {len(plain)} characters with and without "
            "it), so generation would start without the opening and training would score it as "
            f"the reply's; make the template write {opening!r} at its end when "
            "add_generation_prompt is true"
        )
    _remember(key)


def _remember(key: tuple[str, str]) -> None:
    if len(_OPENING_CHECKED) >= 64:  # a long session trying templates: forget, check again
        _OPENING_CHECKED.clear()
    _OPENING_CHECKED.add(key)


__all__ = [
    "PROBE",
    "TurnSpan",
    "check_generation_prompt",
    "closing_text",
    "turn_end",
    "turn_spans",
    "turn_start",
    "unreadable",
]
