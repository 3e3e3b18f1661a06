"""Whether a tokenizer can write a chat template's markers (`<|im_start|>`, `<end_of_turn>`,
`[INST]`) as the single tokens the template means them to be.

A template's markers are the literal texts in its string constants that look like special
tokens: `<|...|>`, `<name>` / `</name>` and `[NAME]` / `[/NAME]`. `template_marker_report`
encodes each with the tokenizer:

- a marker with `<unk>` in its ids cannot be written at all (a word vocabulary learnt from the
  conversations reads `<|im_start|>` as unknown pieces): the model would train on `<unk>`;
- a marker of several tokens is spelled out (a char vocabulary, or GPT-2's byte-level BPE):
  the model can learn it, but generation stops only on single end-of-turn tokens, so a model
  trained on a spelled-out `<|im_end|>` never stops.

`chat_data` refuses a template whose markers (those its first conversation holds) the tokenizer
cannot write (`check_markers`): any marker with `<unk>`; and, when the template is not the
tokenizer's own (one passed in, or a vocabulary learnt here from the conversations), any
`<|...|>` marker of several tokens (`<tools>` or `[INST]` may be plain text by design). A model's own
template is trusted to spell its markers as its vocabulary does (Zephyr's `<|user|>` is plain
text to Mistral's tokenizer, and was trained so). Markers are not added to a learnt vocabulary
as new special tokens: a char or word vocabulary has four special tokens (`<pad> <bos> <eos>
<unk>`) and zoo's tokenizers save no others; zoo's default template ends each turn with the eos
token instead, which every tokenizer has and generation stops on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zoo.data.chat.template import ChatTemplate, _compile, _environment
from zoo.data.chat.tokens import tokenize_text
from zoo.data.tokenizers.base import Tokenizer

MARKER = re.compile(r"<\|[^<>|\s]{1,40}\|>|</?[A-Za-z_][\w-]{0,40}>|\[/?[A-Z][A-Z_]{1,40}\]")
# The ChatML-style markers (`<|im_end|>`), which only a special token writes as one token.
SPECIAL_LOOKING = re.compile(r"<\|[^<>|\s]{1,40}\|>")


@dataclass(frozen=True)
class MarkerReport:
    """The markers of a template and how a tokenizer writes them."""

    markers: dict[str, list[int]]  # marker -> its ids, in the template's order
    unknown: list[str]  # markers whose ids hold the tokenizer's unk id
    split: list[str]  # markers written as several tokens (none unknown)

    @property
    def single(self) -> list[str]:
        """The markers written as one token."""
        return [marker for marker, ids in self.markers.items() if len(ids) == 1]

    def describe(self) -> str:
        """One line: how many markers, and which are unknown or spelled out."""
        parts = [f"{len(self.markers)} marker(s), {len(self.single)} written as one token"]
        if self.unknown:
            parts.append(f"unknown to the tokenizer: {self.unknown}")
        if self.split:
            spelled = ", ".join(f"{m} ({len(self.markers[m])} tokens)" for m in self.split)
            parts.append(f"spelled out in several tokens: {spelled}")
        return "; ".join(parts)


def template_markers(template: ChatTemplate) -> list[str]:
    """The marker texts in `template`'s string constants, each once, in order."""
    from jinja2 import nodes

    _compile(template.source, template.origin)  # refused with its reason when it is not valid
    tree = _environment().parse(template.source)
    found: list[str] = []
    for constant in tree.find_all(nodes.Const):
        if isinstance(constant.value, str):
            found.extend(MARKER.findall(constant.value))
    for data in tree.find_all(nodes.TemplateData):
        found.extend(MARKER.findall(data.data))
    return list(dict.fromkeys(found))


def template_marker_report(
    template: ChatTemplate, tokenizer: Tokenizer, *, rendered: str | None = None
) -> MarkerReport:
    """How `tokenizer` writes each of `template`'s markers (see the module doc); with
    `rendered` (a conversation the template wrote), only the markers that text holds."""
    unk = tokenizer.unk_id
    markers: dict[str, list[int]] = {}
    for marker in template_markers(template):
        if rendered is None or marker in rendered:
            markers[marker], _ = tokenize_text(tokenizer, marker)
    unknown = [m for m, ids in markers.items() if unk is not None and unk in ids]
    split = [m for m, ids in markers.items() if len(ids) > 1 and m not in unknown]
    return MarkerReport(markers, unknown, split)


def check_markers(
    template: ChatTemplate, tokenizer: Tokenizer, *, own: bool, rendered: str | None = None
) -> MarkerReport:
    """The report (of the markers `rendered` holds, when given), or a `ValueError` when the
    tokenizer cannot write them: any unknown one, and (unless the template is the tokenizer's
    `own`) any `<|...|>` marker spelled out."""
    report = template_marker_report(template, tokenizer, rendered=rendered)
    spelled = [marker for marker in report.split if SPECIAL_LOOKING.fullmatch(marker)]
    refused = report.unknown + ([] if own else spelled)
    if refused:
        raise ValueError(
            f"{template.origin} writes {len(report.markers)} marker(s), and the "
            f"{tokenizer.kind or type(tokenizer).__name__} tokenizer cannot write "
            f"{len(refused)} of them as one token ({report.describe()}): the model would "
            "train on unknown or spelled-out markers and never stop at its end of turn; use a "
            "tokenizer that has these tokens (the model's own), or a template in plain text "
            "that ends each turn with the eos token (zoo's default: leave out --template / "
            "template=)"
        )
    return report


__all__ = ["MARKER", "MarkerReport", "check_markers", "template_marker_report", "template_markers"]
