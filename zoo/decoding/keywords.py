"""The older keywords of the decoding calls, and the records that carry them now.

Every public decoding function ends its signature with `**legacy` and hands it to
`zoo.records.legacy_keywords` itself, so that the DeprecationWarning points at its caller's
line, with `instead(legacy)` saying what to write today. The keywords it gets back become
records here:

- `temperature`, `top_k`, `top_p` -> `sampling=SamplingSettings(...)`;
- `rules` -> `mesh=zoo.distributed.Layout.of(mesh, rules)`;
- `generate`'s `attention_mask` -> `prompts={"input_ids": ..., "attention_mask": ...}`;
- `generate`'s `beam_size`, `length_penalty` -> `zoo.decoding.beam_generate`;
- the chat calls' `system`, `template` -> `ChatFormat(tokenizer, template=..., system=...)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zoo.decoding.sampling import SamplingSettings

SAMPLING = ("temperature", "top_k", "top_p")
PLACEMENT = ("rules",)

_INSTEAD = {
    **dict.fromkeys(SAMPLING, "sampling=SamplingSettings(temperature, top_k, top_p)"),
    "rules": "mesh=zoo.distributed.Layout.of(mesh, rules)",
    "attention_mask": 'prompts={"input_ids": ids, "attention_mask": mask}',
    **dict.fromkeys(
        ("beam_size", "length_penalty"),
        "zoo.decoding.beam_generate(model, prompts, beam_size=..., length_penalty=...)",
    ),
    **dict.fromkeys(
        ("system", "template"),
        "ChatFormat(tokenizer, template=..., system=...) as the tokenizer",
    ),
}


def instead(legacy: Mapping[str, Any]) -> str:
    """How to write today what the older keywords in `legacy` said (for the warning)."""
    advice = dict.fromkeys(_INSTEAD[name] for name in legacy if name in _INSTEAD)
    return " and ".join(advice) or "the keywords of the signature"


def sampling_of(
    function: str, sampling: SamplingSettings | None, older: Mapping[str, Any]
) -> SamplingSettings:
    """`sampling` (greedy when None), or the record the older loose keywords make."""
    loose = {name: older[name] for name in SAMPLING if name in older}
    if loose and sampling is not None:
        raise TypeError(
            f"{function}() got sampling= and {', '.join(f'{name}=' for name in loose)}: pass "
            "the numbers in sampling=SamplingSettings(...) alone"
        )
    if loose:
        return SamplingSettings(**loose)
    if sampling is None:
        return SamplingSettings()
    if not isinstance(sampling, SamplingSettings):
        raise TypeError(
            f"sampling must be a zoo.decoding.SamplingSettings (e.g. "
            f"SamplingSettings(temperature=0.8, top_k=50)), got {type(sampling).__name__}"
        )
    return sampling
