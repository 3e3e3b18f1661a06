"""What every flavor's config shares: the model-level fields and the tree of its parts.

A config holds the fields of the whole model (vocabulary, width, positions, padding, dtype and
initialisation, how the layers loop and what the backward recomputes) and, beside them, its
parts' own settings records: the embedder's (`zoo.nn.EmbedderSettings`) and a `zoo.nn.LayerPlan`
of the blocks (their attention, feed-forward and norm, and how layer i differs). Each flavor
adds its head (`GPTConfig`, `ClassifierConfig`, `TranslatorConfig`).

A field anywhere in the tree is changed by its dotted path, `config.replace(**{"layers.block.
attention.num_kv_heads": 2})`, or by the short path from a block, `"attention.num_kv_heads"`,
which changes the base block of every plan (a translator's encoder and decoder). A few flat
names stand for the knobs people override most (`ALIASES`: `num_layers`, `num_heads`, `d_ff`,
`dropout`, `attention_dropout`, and a classifier's `num_classes`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import jax.numpy as jnp

from zoo.nn.block import BlockSettings
from zoo.nn.embedding import EmbedderSettings
from zoo.nn.layer_loop import LAYER_LOOPS, REMAT_CHOICES
from zoo.nn.linear import Init
from zoo.nn.moe import MoESettings
from zoo.nn.norm import Norm
from zoo.nn.plan import LayerPlan
from zoo.records import field_types, from_data, get_path, replace_paths, to_data

DTYPES = ("float32", "bfloat16", "float16")
C = TypeVar("C", bound="TransformerConfig")

# short paths into a block (`attention.num_heads`) change the base block of every plan
BLOCK_FIELDS = tuple(field.name for field in dataclasses.fields(BlockSettings))


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """The fields every flavor shares: the model's own, its embedder's settings and the plan of
    its layers (the encoder's, for a translator)."""

    # the config's fields that hold a `LayerPlan` (a translator's decoder has one too)
    plans: ClassVar[tuple[str, ...]] = ("layers",)
    # flat names for the knobs people override most -> the paths they set (the ones this
    # config has; short block paths change every plan's base block)
    aliases: ClassVar[dict[str, tuple[str, ...]]] = {
        "num_layers": tuple(f"{plan}.num_layers" for plan in ("layers", "decoder")),
        "num_heads": ("attention.num_heads", "cross_attention.num_heads"),
        "d_ff": ("feed_forward.d_ff",),
        "dropout": ("embedder.dropout", "dropout", "feed_forward.dropout", "head.dropout"),
        "attention_dropout": ("attention.dropout", "cross_attention.dropout"),
    }

    vocab_size: int = 32000  # token ids are in [0, vocab_size)
    d_model: int = 512  # model width
    max_positions: int = 512  # longest sequence the model accepts
    pad_id: int | None = 0  # padding token id; None: no padding (every position is real)
    dtype: str = "float32"  # parameter dtype
    init_std: float = 0.02  # std of the normal init of weight matrices and embeddings
    layer_loop: str = "auto"  # auto (unrolled on a GPU, scanned elsewhere) | scan | unroll
    remat: str | None = None  # recompute in the backward: None | dots | full | auto (zoo.nn.stack)
    embedder: EmbedderSettings = field(default_factory=EmbedderSettings)  # tokens + positions
    layers: LayerPlan = field(default_factory=LayerPlan)  # the blocks and how each differs

    def __post_init__(self) -> None:
        """Check the model's fields and how the parts fit together; each record checks its own
        fields as it is made."""
        for name in ("vocab_size", "d_model", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(
                f"layer_loop must be one of {LAYER_LOOPS} (auto: unrolled on a GPU, scanned "
                f"elsewhere), got {self.layer_loop!r}"
            )
        if self.remat not in REMAT_CHOICES:
            raise ValueError(f"remat must be one of {REMAT_CHOICES}, got {self.remat!r}")
        if not isinstance(self.init_std, int | float) or not self.init_std > 0:
            raise ValueError(f"init_std must be a positive number, got {self.init_std!r}")
        self._check_token_id("pad_id", self.pad_id)
        positions = self.embedder.positions
        if positions == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        for path, settings in self.layer_settings():
            attention = settings.attention
            head_dim = attention.width(self.d_model)
            if attention.rope is not None:
                attention.rope.rotary_dim(head_dim)
                if positions != "none":
                    raise ValueError(
                        f"{path}.attention.rope rotates queries and keys, but the embedder adds "
                        f"{positions} positions too: set embedder.positions='none' for rotary "
                        f"positions, or {path}.attention.rope=None"
                    )
            if settings.cross_attention is not None:
                settings.cross_attention.width(self.d_model)
        self.check_parts()

    def check_parts(self) -> None:
        """Refuse settings this flavor does not use (each flavor says which)."""

    def layer_settings(self) -> Iterator[tuple[str, BlockSettings]]:
        """(`<plan>.layers[i]`, settings) of every layer of every plan."""
        for name in self.plans:
            plan = getattr(self, name)
            for index, settings in enumerate(plan.layers()):
                yield f"{name}[{index}]", settings

    def refuse(self, path: str, why: str) -> None:
        """Raise the error for a setting this flavor does not use, naming both."""
        raise ValueError(f"{type(self).__name__}: {path} {why}")

    def _check_token_id(self, name: str, value: int | None, vocab: int | None = None) -> None:
        vocab = self.vocab_size if vocab is None else vocab
        if value is not None and (isinstance(value, bool) or not 0 <= value < vocab):
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {vocab})")

    # -- derived sizes ---------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        """Blocks in `layers` (the encoder's, for a translator)."""
        return self.layers.num_layers

    @property
    def num_heads(self) -> int:
        """Query heads of the base block's attention."""
        return self.layers.block.attention.num_heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head: the attention's `head_dim`, else d_model // num_heads."""
        return self.layers.block.attention.width(self.d_model)

    @property
    def kv_heads(self) -> int:
        """Key/value heads of the base block's attention."""
        return self.layers.block.attention.kv_heads

    @property
    def scan_layers(self) -> bool | None:
        """`LayerStack`'s `scan`: True (scan), False (unroll), None (by platform)."""
        return {"auto": None, "scan": True, "unroll": False}[self.layer_loop]

    @property
    def param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def init(self) -> Init:
        """How every part initialises its weights."""
        return Init(self.init_std, self.param_dtype)

    def make_norm(self) -> Norm:
        """A norm of the base block's kind and width (a model's final norm)."""
        return self.layers.block.norm.make(self.d_model, self.param_dtype)

    def experts(self) -> MoESettings | None:
        """The settings of the first mixture-of-experts layer (its router loss weights are the
        model's); None for a dense model."""
        for _, settings in self.layer_settings():
            if isinstance(settings.feed_forward, MoESettings):
                return settings.feed_forward
        return None

    # -- changed copies ------------------------------------------------------------------------

    def paths(self, name: str) -> tuple[str, ...]:
        """The full paths a name given to `replace` sets: an alias's paths, a short block path
        in every plan, or the path itself (the ones this config has)."""
        given = self.aliases.get(name, (name,))
        found = tuple(path for short in given for path in self._full(short) if self._has(path))
        if found:
            return found
        head = name.split(".")[0]
        if name in self.aliases:
            raise ValueError(f"{type(self).__name__} has nothing that {name!r} sets")
        if head in BLOCK_FIELDS:  # the error of the base block, naming the wrong field
            get_path(self.layers.block, name)
        elif head in field_types(type(self)):
            get_path(self, name)
        else:
            from zoo.models.flat import unknown_name

            # a field of another flavor is named as that flavor's (a GPT's `relative`)
            flavors = TransformerConfig.__subclasses__()
            raise unknown_name(type(self), name, tuple(self.aliases), flavors)
        raise ValueError(f"{type(self).__name__} has nothing at {name!r} (it is None)")

    def _full(self, path: str) -> tuple[str, ...]:
        """A short block path in every plan (`attention.x` -> `layers.block.attention.x`), or
        the path itself."""
        if path.split(".")[0] in BLOCK_FIELDS:
            return tuple(f"{plan}.block.{path}" for plan in self.plans)
        return (path,)

    def _has(self, path: str) -> bool:
        value: object = self
        for name in path.split("."):
            if not dataclasses.is_dataclass(value) or name not in field_types(type(value)):
                return False
            value = getattr(value, name)
        return True

    def replace(self: C, **changes: object) -> C:
        """A copy with some fields changed, by dotted path, short block path or alias
        (`replace(num_layers=4, **{"attention.num_kv_heads": 2})`); every change is made
        before the new config is checked, so their order does not matter."""
        by_path = {path: value for name, value in changes.items() for path in self.paths(name)}
        return replace_paths(self, by_path)

    # -- JSON ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, object]:
        """The config as JSON data: a dict per record (`zoo.records.to_data`)."""
        return to_data(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, object]) -> C:
        """The config `to_dict` wrote; a flat config written before the tree (0.1) is
        upgraded (`zoo.models.flat`)."""
        if not isinstance(data.get("layers"), Mapping):
            from zoo.models.flat import config_from_flat

            return config_from_flat(cls, data)
        return from_data(cls, data)
