"""Which `Linear`s get adapters: named groups and glob patterns over their pytree paths.

A `Linear`'s path is the dotted name of the module in the model, without `.weight`:
`layers.blocks.self_attention.query_proj`, `decoder.blocks.cross_attention.value_proj`,
`layers.blocks.feed_forward.gate`, `pooler`, `head`. A mixture of experts' stacked expert
projections are targets too, by the path of their array: `layers.blocks.feed_forward.experts.gate`
(`.up`, `.down`); the group `experts` names the three, `feedforward` names them with the shared
expert, and the router is never chosen unless named. A target is a group name or a pattern;
a pattern matches a path that equals it, ends with `.PATTERN`, or matches it as a glob
(`fnmatch`: `*` also crosses dots), so `query_proj`, `*attention.query_proj` and
`layers.blocks.self_attention.*_proj` all work. `zoo.nn.lora.plain_linears` lists the paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

_ATTENTION = ("*attention.query_proj", "*attention.key_proj", "*attention.value_proj")
_EXPERTS = ("*feed_forward.experts.gate", "*feed_forward.experts.up", "*feed_forward.experts.down")
_SHARED = (
    "*feed_forward.shared.gate",
    "*feed_forward.shared.hidden",
    "*feed_forward.shared.output",
)
# named groups -> patterns; "all-linear" is every Linear but the output layer (as in PEFT)
GROUPS: dict[str, tuple[str, ...]] = {
    "attention": (*_ATTENTION, "*attention.output_proj"),
    "attention.qv": ("*attention.query_proj", "*attention.value_proj"),
    "attention.qkv": _ATTENTION,
    # a dense block's feed-forward, or a mixture's experts and shared expert
    "feedforward": (
        "*feed_forward.gate",
        "*feed_forward.hidden",
        "*feed_forward.output",
        *_EXPERTS,
        *_SHARED,
    ),
    "experts": _EXPERTS,  # each routed expert's gate, up and down projections
    "all-linear": ("*",),
}
# output layers that "all-linear" leaves alone (train them whole with `train=`); `score` is a
# GPT's score head (a reward model's)
OUTPUT_LAYERS = ("head", "output_proj", "score")
# a mixture of experts' routing (its router, the shared expert's gate): "all-linear" leaves
# them frozen too (name one to adapt it)
ROUTING = ("*feed_forward.router", "*feed_forward.shared_gate")


def matches(path: str, pattern: str) -> bool:
    """Whether a target pattern chooses `path` (equal, a dotted suffix, or a glob)."""
    return path == pattern or path.endswith(f".{pattern}") or fnmatchcase(path, pattern)


def normalize_targets(targets: str | Sequence[str]) -> tuple[str, ...]:
    """`"attention,feedforward"` or a sequence of names -> a tuple of non-empty names."""
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    cleaned = tuple(name.strip() for name in names if name.strip())
    if not cleaned:
        raise ValueError(
            f"LoRA targets are empty; name groups ({', '.join(GROUPS)}) or Linear path patterns"
        )
    return cleaned


def select(paths: Iterable[str], targets: Sequence[str]) -> list[str]:
    """The paths the targets choose; a target that matches nothing raises with the candidates."""
    paths = list(paths)
    chosen: set[str] = set()
    for target in targets:
        if target == "all-linear":
            found = {
                p
                for p in paths
                if p.split(".")[0] not in OUTPUT_LAYERS
                and not any(matches(p, routing) for routing in ROUTING)
            }
        else:
            patterns = GROUPS.get(target, (target,))
            found = {p for p in paths if any(matches(p, pattern) for pattern in patterns)}
        if not found:
            raise ValueError(
                f"LoRA target {target!r} matches no Linear layer of this model. Groups: "
                f"{', '.join(GROUPS)}; or a pattern over these Linear paths: {', '.join(paths)}"
            )
        chosen |= found
    return [p for p in paths if p in chosen]
