"""Conversations -> token ids and the assistant mask, through the model's own chat template.

`encode_chat(messages, tokenizer)` renders the conversation and tokenizes the text as
transformers' `apply_chat_template` does (without adding bos or eos: templates write their own),
and marks the tokens the assistant wrote: 1 on each assistant turn's content and its end-of-turn
token, 0 elsewhere. `encode_prompt` gives the ids a model continues from to answer (the
conversation and the opening of an assistant turn, `add_generation_prompt=True`).

Where the assistant's turns lie comes from rendering the template, never from searching the text
for role names:

- a template with `{% generation %}` blocks marks them itself; as transformers'
  `return_assistant_tokens_mask` does, every token that overlaps a block counts;
- any other template is rendered again for each assistant turn i, once up to it with the
  generation prompt (`messages[:i]`, `add_generation_prompt=True`) and once through it
  (`messages[:i + 1]`): the turn is the text the second adds to the first. Its tokens count up
  to and including the first of the tokenizer's stop tokens (`eos_ids`), the end of the turn;
  what a template writes after that (the newline after Qwen's `<|im_end|>`) the model never
  generates. A template that rewrites earlier text when a turn is added cannot be read this way
  and is refused: give it generation blocks.

Character spans become token positions through the offsets of the `tokenizers` library (a
`FastTokenizer`, or a transformers fast tokenizer). Tokenizers without offsets (char, word,
tiktoken) encode the text in pieces, cut at their special token strings (which become the
special ids) and at the turn boundaries, so that no token straddles a boundary.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jaxtyping import Int

from zoo.data.chat.files import chat_template_for, token_id_or_none
from zoo.data.chat.template import ChatTemplate
from zoo.data.errors import DataError
from zoo.data.tokenizers.base import Tokenizer

Span = tuple[int, int]  # [start, end) character offsets in the rendered text


@dataclass(frozen=True)
class ChatTokens:
    """One conversation as the model reads it, and which of its tokens the assistant wrote."""

    input_ids: Int[np.ndarray, " seq"]  # int32 token ids of the rendered conversation
    assistant_mask: Int[np.ndarray, " seq"]  # int32, 1 on the assistant's tokens and end of turn
    text: str  # the rendered conversation the ids encode


def encode_chat(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    **variables: Any,
) -> ChatTokens:
    """The conversation's ids and assistant mask (see the module doc).

    `template` defaults to the tokenizer's own (`chat_template_for(tokenizer)`); `variables`
    reach the template (e.g. Llama 3's `date_string`).
    """
    template = template or chat_template_for(tokenizer)
    if template.has_generation_blocks:
        text, spans = template.spans(messages, **variables)
        stop_ids: set[int] | None = None
    else:
        text, spans = turn_spans(template, messages, **variables)
        stop_ids = set(tokenizer.eos_ids)
    ids, offsets = tokenize_text(tokenizer, text, cuts=[end for span in spans for end in span])
    mask = span_mask(ids, offsets, spans, stop_ids=stop_ids)
    return ChatTokens(np.asarray(ids, np.int32), np.asarray(mask, np.int32), text)


PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"}]


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
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    *,
    template: ChatTemplate | None = None,
    **variables: Any,
) -> Int[np.ndarray, " seq"]:
    """`int32[seq]`: the ids of the conversation and the opening of the assistant's reply,
    which generation continues from."""
    template = template or chat_template_for(tokenizer)
    text = template.render(messages, add_generation_prompt=True, **variables)
    ids, _ = tokenize_text(tokenizer, text)
    return np.asarray(ids, np.int32)


def turn_spans(
    template: ChatTemplate, messages: Sequence[Mapping[str, Any]], **variables: Any
) -> tuple[str, list[Span]]:
    """The rendered conversation and, for each assistant turn, the span the template writes
    for it after the generation prompt (content, end of turn and anything up to the next turn)."""
    full = template.render(messages, **variables)
    spans = []
    for turn, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        if turn == 0:
            raise DataError(
                "the conversation opens with an assistant turn: a chat template writes an "
                "assistant turn after a prompt; start it with a user (or system) turn"
            )
        before = template.render(messages[:turn], add_generation_prompt=True, **variables)
        through = template.render(messages[: turn + 1], **variables)
        if not through.startswith(before) or not full.startswith(through):
            raise ValueError(
                f"{template.origin} writes the conversation before assistant turn {turn} "
                "differently once that turn (or a later one) is added, so where the turn lies "
                "cannot be read from it; pass a template (template=...) that marks what the "
                "assistant writes with {% generation %} ... {% endgeneration %}"
            )
        spans.append((len(before), len(through)))
    return full, spans


def tokenize_text(
    tokenizer: Tokenizer, text: str, *, cuts: Iterable[int] = ()
) -> tuple[list[int], list[Span]]:
    """The ids of rendered `text` (no bos/eos added) and each token's character span.

    With the `tokenizers` library's offsets the whole text is encoded at once, as transformers
    does; otherwise the text is encoded in pieces cut at `cuts` and at the special token
    strings, each token getting its piece's span.
    """
    backend = offsets_backend(tokenizer)
    if backend is not None:
        encoding = backend.encode(text, add_special_tokens=False)
        return list(encoding.ids), [(int(start), int(end)) for start, end in encoding.offsets]
    ids: list[int] = []
    offsets: list[Span] = []
    for start, end, special in _pieces(text, special_strings(tokenizer), cuts):
        piece = [special] if special is not None else tokenizer.encode(text[start:end])
        ids.extend(piece)
        offsets.extend([(start, end)] * len(piece))
    return ids, offsets


def span_mask(
    ids: Sequence[int],
    offsets: Sequence[Span],
    spans: Sequence[Span],
    *,
    stop_ids: set[int] | None = None,
) -> list[int]:
    """1 on every token that overlaps one of `spans`; with `stop_ids`, a span's tokens end at
    (and include) its first stop token."""
    mask = [0] * len(ids)
    for start, end in spans:
        inside = [t for t, (first, last) in enumerate(offsets) if last > start and first < end]
        if stop_ids is not None:
            stop = next((k for k, t in enumerate(inside) if ids[t] in stop_ids), None)
            inside = inside if stop is None else inside[: stop + 1]
        for position in inside:
            mask[position] = 1
    return mask


def offsets_backend(tokenizer: Tokenizer) -> Any:
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
    text: str, specials: Mapping[str, int], cuts: Iterable[int]
) -> list[tuple[int, int, int | None]]:
    """`(start, end, special id or None)` pieces covering `text`, cut at `cuts` and around
    every special token string (the longest first, as added tokens are matched)."""
    bounds = sorted({*cuts, 0, len(text)})
    pieces: list[tuple[int, int, int | None]] = []

    def plain(start: int, end: int) -> None:
        points = [start, *(b for b in bounds if start < b < end), end]
        pieces.extend((a, b, None) for a, b in itertools.pairwise(points) if b > a)

    position = 0
    if specials:
        longest = sorted(specials, key=len, reverse=True)
        for match in re.finditer("|".join(map(re.escape, longest)), text):
            plain(position, match.start())
            pieces.append((match.start(), match.end(), specials[match.group()]))
            position = match.end()
    plain(position, len(text))
    return pieces
