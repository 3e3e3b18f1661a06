"""Conversations -> token ids and the assistant mask, through the model's own chat template.

`encode_chat(messages, tokenizer)` renders the conversation and tokenizes the text as
transformers' `apply_chat_template` does (without adding bos or eos: templates write their own),
and marks the tokens the assistant wrote: 1 on each assistant turn's content and its end-of-turn
token, 0 elsewhere. `encode_prompt` gives the ids a model continues from to answer (the
conversation and the opening of an assistant turn, `add_generation_prompt=True`; `prompt_ids`
takes the template's variables as a mapping).

Where the assistant's turns lie comes from rendering the template, never from searching the text
for role names:

- a template with `{% generation %}` blocks marks them itself; as transformers'
  `return_assistant_tokens_mask` does, every token that overlaps a block counts;
- any other template is read from the whole rendering (`zoo.data.chat.turns`): each assistant
  turn starts where the conversation before it, with the generation prompt, ends, and runs to
  the end of what the template writes for it. Its tokens count up to and including the first
  of the tokenizer's stop tokens (`eos_ids`), the end of the turn; what a template writes after
  that (the newline after Qwen's `<|im_end|>`) the model never generates. A template whose
  turns cannot be read this way is refused: give it generation blocks, or train on every token.

`read_turns=False` (training on every token) renders the conversation without reading its
turns: the mask is 1 everywhere.

The conversation's `tools` (a variable, `tools=[...]`) reach the template as transformers'
`apply_chat_template(tools=...)` passes them; assistant turns with `tool_calls` and `tool` turns
are rendered by the template. A template that never mentions tools, tool calls or the tool
role while the conversation has them is refused (`check_tool_support`): it would drop them.

An assistant turn of weight 0 (`"weight": 0`, OpenAI's fine-tuning format, or `train: false`;
see `zoo.data.chat.conversations`) is written in the text like any other but left out of the
mask.

Character spans become token positions through the offsets of the `tokenizers` library (a
`FastTokenizer`, or a transformers fast tokenizer). Tokenizers without offsets (char, word,
tiktoken) encode the text in pieces, cut at their special token strings (which become the
special ids) and at the turn boundaries, so that no token straddles a boundary.

Only the template writes special ids. A special token's text inside a message's content (a
literal `<pad>`, or `<|im_end|>` typed by a user) is encoded as plain text, never as the id,
which training would read as padding or the end of a turn: the conversation is rendered a
second time with that text defused (its first character swapped for a private-use one), and
only the special token texts found in that rendering, the template's own markers, become
special ids (`content_defused`). transformers' `apply_chat_template` gives such content the
special ids; the two agree on every conversation whose content holds no special token text.

A template whose generation prompt is empty while it writes an opening before each assistant
reply (`<|im_start|>assistant\n`; a ChatML template that ignores `add_generation_prompt`) is
refused at the first conversation (`check_generation_prompt`): generation would start without
the opening, and training would score the opening as the reply's.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from jaxtyping import Int

from zoo.data.chat.conversations import message_weight
from zoo.data.chat.files import chat_template_for, token_id_or_none
from zoo.data.chat.template import ChatTemplate, template_tools
from zoo.data.chat.tools import check_tool_support
from zoo.data.chat.turns import PROBE, TurnSpan, check_generation_prompt, closing_text, turn_spans
from zoo.data.tokenizers.base import Tokenizer

if TYPE_CHECKING:  # the `tokenizers` library is optional (the hf extra)
    from tokenizers import Tokenizer as BackendTokenizer

Span = tuple[int, int]  # [start, end) character offsets in the rendered text
# Stands for the first character of a special token's text written in a message's content.
DEFUSED = "\ue002"


@dataclass(frozen=True)
class ChatTokens:
    """One conversation as the model reads it, and which of its tokens the assistant wrote."""

    input_ids: Int[np.ndarray, " seq"]  # int32 token ids of the rendered conversation
    assistant_mask: Int[np.ndarray, " seq"]  # int32, 1 on the assistant's tokens and end of turn
    text: str  # the rendered conversation the ids encode


def encode_chat(
    messages: Sequence[Mapping[str, object]],
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    read_turns: bool = True,
    **variables: object,
) -> ChatTokens:
    """The conversation's ids and assistant mask (see the module doc).

    `template` defaults to the tokenizer's own (`chat_template_for(tokenizer)`); `variables`
    reach the template (`tools=[...]`, Llama 3's `date_string`). `read_turns=False` marks every
    token (training on all of them) without reading the turns.
    """
    template = template or chat_template_for(tokenizer)
    check_tool_support(template, messages, template_tools(variables.get("tools")))
    check_generation_prompt(template, messages, **variables)
    stops = stop_texts(tokenizer)
    stop_ids: set[int] | None = None
    spans: list[TurnSpan] = []
    if template.has_generation_blocks:
        text, blocks = template.spans(messages, add_generation_prompt=False, **variables)
        spans = [TurnSpan(start, end, end) for start, end in blocks]
    else:
        text = template.render(messages, add_generation_prompt=False, **variables)
    # special token texts in the content are found before the turns are read
    markers = content_defused(template, messages, text, special_texts(tokenizer), variables)
    if read_turns and not template.has_generation_blocks:
        text, spans = turn_spans(template, messages, stop_texts=stops, full=text, **variables)
        stop_ids = set(tokenizer.eos_ids)
    closing = ""
    last_stopped = bool(spans) and any(
        stop in text[spans[-1].start : spans[-1].soft_end] for stop in stops
    )
    if not template.has_generation_blocks and not last_stopped:
        closing = closing_text(template, messages, text, stops, variables)
    if closing:
        markers = None if markers is None else markers + closing
        text += closing
        if spans:
            last = spans[-1]
            spans[-1] = TurnSpan(last.start, last.end, len(text))
    # the turn boundaries, not a turn's first character (`TurnSpan.end` when only whole
    # tokens count): a word cut there would be spelled differently
    cuts = [
        point
        for span in spans
        for point in (span.start, span.soft_end, span.end if span.end > span.start + 1 else 0)
    ]
    ids, offsets = tokenize_text(tokenizer, text, cuts=cuts, markers=markers)
    if read_turns:
        chosen = trained_spans(template, messages, spans)
        mask = span_mask(ids, offsets, chosen, stop_ids=stop_ids)
    else:
        mask = [1] * len(ids)
    return ChatTokens(np.asarray(ids, np.int32), np.asarray(mask, np.int32), text)


def stop_texts(tokenizer: Tokenizer) -> list[str]:
    """The texts of the tokenizer's stop tokens (`eos_ids`)."""
    texts = (tokenizer.decode([token_id], skip_special=False) for token_id in tokenizer.eos_ids)
    return list(dict.fromkeys(text for text in texts if text))


def trained_spans(
    template: ChatTemplate, messages: Sequence[Mapping[str, object]], spans: Sequence[TurnSpan]
) -> list[TurnSpan]:
    """`spans` (one per assistant turn, in order) without those of the turns of weight 0."""
    weights = [
        message_weight(message, where=f"message {number} (assistant)")
        for number, message in enumerate(messages)
        if message.get("role") == "assistant"
    ]
    if 0 not in weights:
        return list(spans)
    if len(spans) != len(weights):
        raise ValueError(
            f"{template.origin} writes {len(spans)} {{% generation %}} blocks for "
            f"{len(weights)} assistant turns, so the turns of weight 0 cannot be left out of "
            "the loss; give each assistant turn one block, or drop the weights"
        )
    return [span for span, weight in zip(spans, weights, strict=True) if weight != 0]


def end_of_turn_ids(tokenizer: Tokenizer, template: ChatTemplate | None = None) -> tuple[int, ...]:
    """The ids that end an assistant turn: the tokenizer's stop ids (`eos_ids`) and the special
    tokens `template` writes after an assistant's content (`<|im_end|>`, `<|eot_id|>`, eos),
    found by rendering a probe conversation."""
    template = template or chat_template_for(tokenizer)
    chat = encode_chat(PROBE, tokenizer, template=template)
    unknown = token_id_or_none(tokenizer, "unk")
    written = chat.input_ids[chat.assistant_mask == 1].tolist()
    # a transformers tokenizer (HFTokenizer) knows its added special tokens itself
    wrapped = getattr(getattr(tokenizer, "tokenizer", None), "all_special_ids", None) or ()
    specials = {*tokenizer.special_ids, *wrapped} - {unknown}
    special = [i for i in written if i in specials]
    return tuple(dict.fromkeys([*tokenizer.eos_ids, *special]))


def encode_prompt(
    messages: Sequence[Mapping[str, object]],
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    **variables: object,
) -> Int[np.ndarray, " seq"]:
    """`int32[seq]`: the ids of the conversation and the opening of the assistant's reply,
    which generation continues from; `variables` reach the template."""
    return prompt_ids(messages, tokenizer, template or chat_template_for(tokenizer), variables)


def prompt_ids(
    messages: Sequence[Mapping[str, object]],
    tokenizer: Tokenizer,
    template: ChatTemplate,
    variables: Mapping[str, object],
) -> Int[np.ndarray, " seq"]:
    """`encode_prompt`, the template's variables given as a mapping: a variable of any name
    reaches the template (`template` too, which `encode_prompt` takes for itself)."""
    check_tool_support(template, messages, template_tools(variables.get("tools")))
    check_generation_prompt(template, messages, **variables)
    text = template.render(messages, add_generation_prompt=True, **variables)
    specials = special_texts(tokenizer)
    markers = content_defused(template, messages, text, specials, variables, prompt=True)
    ids, _ = tokenize_text(tokenizer, text, markers=markers)
    return np.asarray(ids, np.int32)


def tokenize_text(
    tokenizer: Tokenizer, text: str, *, cuts: Iterable[int] = (), markers: str | None = None
) -> tuple[list[int], list[Span]]:
    """The ids of rendered `text` (no bos/eos added) and each token's character span.

    With the `tokenizers` library's offsets the whole text is encoded at once, as transformers
    does; otherwise the text is encoded in pieces cut at `cuts` and at the special token
    strings, each token getting its piece's span. `markers` (`content_defused`) is `text` with
    the special token texts of the messages' content defused: only the special token texts it
    still holds become special ids, the rest is plain text. None: every one in `text` does.
    """
    backend = offsets_backend(tokenizer)
    if backend is not None:
        if markers is not None and markers != text:
            return _encode_around_markers(backend, text, markers)
        encoding = backend.encode(text, add_special_tokens=False)
        return list(encoding.ids), [(int(start), int(end)) for start, end in encoding.offsets]
    ids: list[int] = []
    offsets: list[Span] = []
    for start, end, special in _pieces(text, special_strings(tokenizer), cuts, markers=markers):
        piece = [special] if special is not None else tokenizer.encode(text[start:end])
        ids.extend(piece)
        offsets.extend([(start, end)] * len(piece))
    return ids, offsets


def special_texts(tokenizer: Tokenizer) -> dict[str, int]:
    """`{text: id}` of the special tokens that `tokenizer` finds in a text: the special added
    tokens of a `tokenizers` backend; otherwise bos, eos and pad (`special_strings`)."""
    backend = offsets_backend(tokenizer)
    if backend is None:
        return special_strings(tokenizer)
    added = backend.get_added_tokens_decoder().items()
    return {token.content: int(token_id) for token_id, token in added if token.special}


def content_defused(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, object]],
    text: str,
    specials: Iterable[str],
    variables: Mapping[str, object],
    *,
    prompt: bool = False,
) -> str | None:
    """`text` (the conversation as `template` renders it, with the generation prompt when
    `prompt`) rendered again with each of the `specials` texts in a message's content defused:
    its first character is `DEFUSED`. The same text, character for character, except there; None
    when no content holds a special text. A `ValueError` when the template rewrites such content
    (the two renderings do not line up)."""
    pattern = _alternatives(tuple(specials))
    if pattern is None:
        return None
    defused: list[Mapping[str, object]] = []
    touched: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and pattern.search(content):
            message = {**message, "content": pattern.sub(lambda m: DEFUSED + m[0][1:], content)}
            touched.extend(match[0] for match in pattern.finditer(content))
        defused.append(message)
    if not touched:
        return None
    again = template.render(defused, add_generation_prompt=prompt, **variables)
    if len(again) != len(text) or any(a != b and a != DEFUSED for a, b in zip(again, text)):
        raise ValueError(
            f"{template.origin} rewrites message content that holds the special token text "
            f"{sorted(set(touched))}, so that text cannot be told from the template's own "
            "tokens; remove it from the content"
        )
    return again


@lru_cache(maxsize=16)
def _alternatives(texts: tuple[str, ...]) -> re.Pattern[str] | None:
    """A pattern matching any of `texts`, the longest first (as added tokens are matched)."""
    longest = sorted((text for text in texts if text), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, longest))) if longest else None


def _encode_around_markers(
    backend: BackendTokenizer, text: str, markers: str
) -> tuple[list[int], list[Span]]:
    """`text` encoded by a `tokenizers` backend with the special tokens `markers` holds as
    their ids and every other special token text as plain text."""
    specials = {
        token.content: int(token_id)
        for token_id, token in backend.get_added_tokens_decoder().items()
        if token.special
    }
    pattern = _alternatives(tuple(specials))
    ids: list[int] = []
    offsets: list[Span] = []

    def plain(start: int, end: int) -> None:
        if end > start:
            encoding = backend.encode(text[start:end], add_special_tokens=False)
            ids.extend(encoding.ids)
            offsets.extend((start + int(a), start + int(b)) for a, b in encoding.offsets)

    position, before = 0, backend.encode_special_tokens
    backend.encode_special_tokens = True  # special token texts between the markers are text
    try:
        for match in pattern.finditer(markers) if pattern is not None else ():
            plain(position, match.start())
            ids.append(specials[match[0]])
            offsets.append(match.span())
            position = match.end()
        plain(position, len(text))
    finally:
        backend.encode_special_tokens = before
    return ids, offsets


def span_mask(
    ids: Sequence[int],
    offsets: Sequence[Span],
    spans: Sequence[TurnSpan | Span],
    *,
    stop_ids: set[int] | None = None,
) -> list[int]:
    """1 on every token that overlaps a span's `[start, end)` or lies wholly inside its
    `[start, soft_end)`; with `stop_ids`, a span's tokens end at (and include) its first stop
    token. A `(start, end)` pair is a span whose `soft_end` is its end."""
    mask = [0] * len(ids)
    for given in spans:
        span = given if isinstance(given, TurnSpan) else TurnSpan(given[0], given[1], given[1])
        inside = [
            t
            for t, (first, last) in enumerate(offsets)
            if (last > span.start and first < span.end)
            or (first >= span.start and last <= span.soft_end and last > first)
        ]
        if stop_ids is not None:
            stop = next((k for k, t in enumerate(inside) if ids[t] in stop_ids), None)
            inside = inside if stop is None else inside[: stop + 1]
        for position in inside:
            mask[position] = 1
    return mask


def offsets_backend(tokenizer: Tokenizer) -> BackendTokenizer | None:
    """The `tokenizers.Tokenizer` behind `tokenizer` (a FastTokenizer's, a transformers fast
    tokenizer's), or None."""
    inner = getattr(tokenizer, "tokenizer", None)
    inner = getattr(inner, "backend_tokenizer", inner)
    if inner is None:
        return None
    try:
        import tokenizers
    except ImportError:
        return None
    return inner if isinstance(inner, tokenizers.Tokenizer) else None


def special_strings(tokenizer: Tokenizer) -> dict[str, int]:
    """`{text: id}` for the tokenizer's bos, eos (every stop id) and pad tokens."""
    ids = [tokenizer.bos_id, *tokenizer.eos_ids, tokenizer.eos_id]
    ids.append(token_id_or_none(tokenizer, "pad"))
    found: dict[str, int] = {}
    for token_id in ids:
        if token_id is not None:
            text = tokenizer.decode([token_id], skip_special=False)
            if text:
                found.setdefault(text, token_id)
    return found


def _pieces(
    text: str, specials: Mapping[str, int], cuts: Iterable[int], *, markers: str | None = None
) -> list[tuple[int, int, int | None]]:
    """`(start, end, special id or None)` pieces covering `text`, cut at `cuts` and around
    every special token string (the longest first, as added tokens are matched) that `markers`
    (default `text`) holds at the same place."""
    bounds = sorted({*cuts, 0, len(text)})
    pieces: list[tuple[int, int, int | None]] = []

    def plain(start: int, end: int) -> None:
        points = [start, *(b for b in bounds if start < b < end), end]
        pieces.extend((a, b, None) for a, b in itertools.pairwise(points) if b > a)

    position = 0
    pattern = _alternatives(tuple(specials))
    if pattern is not None:
        for match in pattern.finditer(text if markers is None else markers):
            plain(position, match.start())
            pieces.append((match.start(), match.end(), specials[match[0]]))
            position = match.end()
    plain(position, len(text))
    return pieces
