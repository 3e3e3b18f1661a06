"""What one benchmark row runs: the model, the shapes, the precision, and the random data.

The zoo and its peer get the same `BenchSpec` and the same numpy batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zoo import presets
from zoo.models import ClassifierConfig, TransformerConfig, TranslatorConfig

FLAVORS = ("gpt", "classifier", "translator")
PRECISIONS = ("fp32", "bf16")
LAYER_MODES = ("scan", "unroll")
REMAT_MODES = ("none", "dots", "full", "auto")
ATTENTION_CHOICES = ("auto", "xla", "cudnn")
MOE_PATHS = ("ragged", "dense")  # a mixture of experts: grouped matmuls, or every expert dense
VOCAB_MULTIPLE = 64  # --pad-vocab rounds the vocabulary up to a multiple of this


@dataclass(frozen=True)
class Defaults:
    """Preset per flavor, shapes and step counts of a plain `zoo bench` on one kind of device."""

    presets: dict[str, str]
    batch: dict[str, int]
    seq: dict[str, int]
    precision: str
    steps: int
    warmup: int
    decode_prompt: int
    decode_tokens: int


# CPU: tiny models, so a full run of the three flavors with the peer takes a minute or two.
CPU_DEFAULTS = Defaults(
    presets={"gpt": "gpt-tiny", "classifier": "classifier-tiny", "translator": "translator-tiny"},
    batch={"gpt": 16, "classifier": 16, "translator": 16},
    seq={"gpt": 64, "classifier": 64, "translator": 64},
    precision="fp32",
    steps=20,
    warmup=3,
    decode_prompt=16,
    decode_tokens=32,
)
# GPU/TPU: the published model shapes in bf16.
ACCELERATOR_DEFAULTS = Defaults(
    presets={"gpt": "gpt2", "classifier": "bert-base", "translator": "transformer-base"},
    batch={"gpt": 16, "classifier": 32, "translator": 64},
    seq={"gpt": 1024, "classifier": 512, "translator": 128},
    precision="bf16",
    steps=20,
    warmup=3,
    decode_prompt=128,
    decode_tokens=128,
)


def defaults_for(platform: str) -> Defaults:
    """The defaults for a JAX platform name ("cpu", "gpu", "tpu", ...)."""
    return CPU_DEFAULTS if platform == "cpu" else ACCELERATOR_DEFAULTS


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class BenchSpec:
    """One benchmark row: a preset at a batch shape and precision, and how to time it."""

    preset: str  # a name from `zoo presets`
    batch: int  # sequences (pairs, for a translator) per step
    seq: int  # positions the model reads per sequence (source and target, for a translator)
    precision: str = "fp32"  # fp32 | bf16: the compute dtype (weights stay float32)
    steps: int = 20  # timed calls; the result is their median
    warmup: int = 3  # untimed calls after the first (compiling) one
    rounds: int = 5  # the timed calls are spread over this many rounds, zoo and peer in turn
    pad_vocab: bool = False  # round the vocabulary up to a multiple of 64
    layers: str | None = None  # scan | unroll; None keeps the preset's `layer_loop`
    remat: str | None = None  # none | dots | full; None keeps the preset's `remat`
    attention: str | None = None  # jax.nn.dot_product_attention implementation: None|xla|cudnn
    dropout: float = 0.0  # dropout and attention dropout of both models
    decode_prompt: int = 16  # prompt length of the GPT decode measurement
    decode_tokens: int = 32  # tokens generated per sequence; 0 skips the decode measurement
    seed: int = 0  # data and parameter seed
    mesh: str | None = None  # zoo on many devices (`--mesh`, zoo.distributed); None: one device
    moe_path: str | None = None  # ragged | dense (mixture of experts); None: the preset's own
    num_layers: int | None = None  # depth of both models; None: the preset's

    def __post_init__(self) -> None:
        base = presets.get(self.preset).config  # unknown presets raise with close names
        if self.moe_path is not None:
            if self.moe_path not in MOE_PATHS:
                raise ValueError(f"moe_path must be one of {MOE_PATHS}, got {self.moe_path!r}")
            if base.experts() is None:
                raise ValueError(
                    f"--moe-path chooses how a mixture of experts runs, and preset "
                    f"{self.preset!r} has no experts; drop --moe-path or pick an MoE preset "
                    "(zoo presets: mixtral-*, qwen3-moe-*, qwen2-moe-*, olmoe-*)"
                )
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers} (--num-layers)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.layers is not None and self.layers not in LAYER_MODES:
            raise ValueError(f"layers must be one of {LAYER_MODES}, got {self.layers!r}")
        if self.remat is not None and self.remat not in REMAT_MODES:
            raise ValueError(f"remat must be one of {REMAT_MODES}, got {self.remat!r}")
        for name in ("batch", "seq", "steps", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.decode_tokens < 0 or self.decode_prompt < 1:
            raise ValueError("warmup and decode_tokens must be >= 0 and decode_prompt >= 1")
        if self.mesh is not None:
            from zoo.distributed import parse_mesh

            parse_mesh(self.mesh)  # names and sizes; the device count is checked when run
        if self.seq > base.max_positions:
            raise ValueError(
                f"seq={self.seq} exceeds max_positions={base.max_positions} of preset "
                f"{self.preset!r}; pass a shorter --seq"
            )
        if self.decodes and self.decode_prompt + self.decode_tokens > base.max_positions:
            raise ValueError(
                f"decode prompt {self.decode_prompt} + {self.decode_tokens} new tokens exceed "
                f"max_positions={base.max_positions}; lower --decode-prompt or --decode-tokens"
            )

    @property
    def flavor(self) -> str:
        return presets.get(self.preset).flavor

    @property
    def decodes(self) -> bool:
        """Whether this row measures KV-cache decoding (GPT only)."""
        return self.flavor == "gpt" and self.decode_tokens > 0

    @property
    def data_vocab(self) -> int:
        """Token ids of the data are drawn from the preset's own vocabulary (never the padding)."""
        return presets.get(self.preset).config.vocab_size

    def config(self) -> TransformerConfig:
        """The preset's config with this spec's dropout, vocabulary, layers and attention."""
        base = presets.get(self.preset).config
        # the aliases reach every dropout: embeddings, blocks, feed-forward, a classifier's head
        changes: dict[str, float | int | str | None] = dict(
            dropout=self.dropout, attention_dropout=self.dropout
        )
        if self.pad_vocab:
            changes["vocab_size"] = round_up(base.vocab_size, VOCAB_MULTIPLE)
            target = getattr(base, "target_vocab_size", None)
            if target is not None:
                changes["target_vocab_size"] = round_up(target, VOCAB_MULTIPLE)
        if self.layers is not None:
            changes["layer_loop"] = self.layers
        if self.remat is not None:
            changes["remat"] = None if self.remat == "none" else self.remat
        if self.attention is not None:
            changes["attention.implementation"] = self.attention
            if isinstance(base, TranslatorConfig):
                changes["cross_attention.implementation"] = self.attention
        if self.moe_path is not None:
            changes["feed_forward.implementation"] = self.moe_path
        if self.num_layers is not None:
            changes["num_layers"] = self.num_layers
        return base.replace(**changes)

    def tokens_per_step(self) -> int:
        """Positions the model reads in one step (source plus target for a translator)."""
        return self.batch * self.seq * (2 if self.flavor == "translator" else 1)


def _token_ids(rng: np.random.Generator, shape: tuple[int, ...], vocab: int, pad_id: int | None):
    """Uniform ids in [0, vocab) that avoid `pad_id`, so every position is a real token."""
    if pad_id is None:
        return rng.integers(0, vocab, shape).astype(np.int32)
    ids = rng.integers(0, vocab - 1, shape).astype(np.int32)
    return ids + (ids >= pad_id).astype(np.int32)


def make_batch(spec: BenchSpec) -> dict[str, np.ndarray]:
    """A random batch in the format of `zoo.data.batches` for the spec's flavor.

    GPT: `tokens [batch, seq + 1]` (the model reads `seq` and predicts the next token of each);
    classifier: `tokens [batch, seq]`, `labels [batch]`; translator: `src [batch, seq]`,
    `tgt [batch, seq + 1]`.
    """
    config = presets.get(spec.preset).config
    rng = np.random.default_rng(spec.seed)
    vocab, pad_id = config.vocab_size, config.pad_id
    if isinstance(config, ClassifierConfig):
        return {
            "tokens": _token_ids(rng, (spec.batch, spec.seq), vocab, pad_id),
            "labels": rng.integers(0, config.num_classes, (spec.batch,)).astype(np.int32),
        }
    if not isinstance(config, TranslatorConfig):
        return {"tokens": _token_ids(rng, (spec.batch, spec.seq + 1), vocab, pad_id)}
    target_vocab = config.tgt_vocab
    return {
        "src": _token_ids(rng, (spec.batch, spec.seq), vocab, pad_id),
        "tgt": _token_ids(rng, (spec.batch, spec.seq + 1), target_vocab, pad_id),
    }


def make_prompts(spec: BenchSpec) -> np.ndarray:
    """`int32[batch, decode_prompt]` random prompts for the decode measurement."""
    config = presets.get(spec.preset).config
    rng = np.random.default_rng(spec.seed + 1)
    return _token_ids(rng, (spec.batch, spec.decode_prompt), config.vocab_size, config.pad_id)
