"""Decoder-only GPT: token embeddings -> causal blocks -> final norm -> vocabulary.

One class for GPT-2 and for today's decoders (Llama, Mistral, Qwen2, Qwen3, SmolLM): they differ
only in their parts' settings (the attention's heads, rotary base, QK-norm and window; the
feed-forward's kind; the norm's). See `zoo.presets` for each family's settings.

Read in this order, from token ids to logits (`GPT._run` below is the whole forward pass):

1. `zoo/models/common.py`: the checks on the ids; padding moved to the end (`compact_padding`).
2. `zoo/nn/embedding.py`: token ids (plus learned or sinusoidal positions) -> `[seq, d_model]`.
3. `zoo/nn/block.py`: one layer: norm, self-attention, feed-forward, each with its residual.
4. `zoo/nn/attention.py`: `MultiHeadAttention`: projections, scores, softmax, heads merged.
5. `zoo/nn/mask.py`: `Mask`, which keys each query sees (causal order, padding, window).
6. `zoo/nn/rotary.py`: rotary positions (Llama and after), applied to queries and keys.
7. `zoo/nn/feedforward.py`: the MLP (GELU, or gated SiLU for Llama); `zoo/nn/moe.py` its
   mixture-of-experts form (Mixtral, Qwen-MoE, OLMoE): a router over grouped experts.
8. `zoo/nn/stack.py`: the `num_layers` blocks, stacked once and run scanned or unrolled.
9. `zoo/nn/vocab.py`: the final norm's output -> logits (the tied token table or a head).

Then, for speed and decoding: `zoo/nn/kernel.py` (the fused attention kernels, cuDNN or XLA)
and `zoo/nn/cache.py` (the KV cache that `prefill` and `extend` fill).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from zoo.models.common import (
    Routed,
    check_cache_room,
    check_tokens,
    compact_padding,
    layer_stack,
    restore_order,
    routed,
    segment_positions,
    token_positions,
    valid_positions,
)
from zoo.models.config import TransformerConfig
from zoo.nn.block import BlockExtras, BlockInputs, BlockSettings
from zoo.nn.cache import KVCache
from zoo.nn.dropout import split_optional
from zoo.nn.embedding import Embedder, EmbedderSettings
from zoo.nn.feedforward import FeedForwardSettings
from zoo.nn.linear import Linear
from zoo.nn.mask import Mask
from zoo.nn.multihead import AttentionSettings
from zoo.nn.norm import Norm, NormSettings
from zoo.nn.plan import LayerPlan
from zoo.nn.stack import LayerStack
from zoo.nn.vocab import VocabHead


@dataclass(frozen=True, kw_only=True)
class LMHead:
    """The projection of a GPT's features to the vocabulary."""

    tie: bool = True  # the token table transposed (GPT-2); False: a head of its own
    softcap: float | None = None  # logits -> softcap * tanh(logits / softcap) (Gemma 2)
    # outputs of a score head read at the last real token (HF's ...ForSequenceClassification;
    # 1 for a reward model); 0: none
    scores: int = 0

    def __post_init__(self) -> None:
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"head softcap must be a positive number or None, got {self.softcap}")
        if not isinstance(self.scores, int) or isinstance(self.scores, bool) or self.scores < 0:
            raise ValueError(
                f"head scores must be a count of score outputs >= 0 (0: no score head), got "
                f"{self.scores!r}"
            )


def gpt2_plan(num_heads: int = 12, d_ff: int = 3072, num_layers: int = 12) -> LayerPlan:
    """GPT-2's blocks: pre-norm LayerNorms, a dense tanh-GELU feed-forward, biases everywhere,
    dropout 0.1 on the residual branches, the feed-forward hidden and the attention weights."""
    block = BlockSettings(
        attention=AttentionSettings(num_heads=num_heads, dropout=0.1),
        feed_forward=FeedForwardSettings(d_ff=d_ff, activation="gelu_tanh", dropout=0.1),
        norm=NormSettings(kind="layernorm", eps=1e-5),
        norm_first=True,
        dropout=0.1,
    )
    return LayerPlan(block=block, num_layers=num_layers)


@dataclass(frozen=True, kw_only=True)
class GPTConfig(TransformerConfig):
    """A causal language model. The defaults are GPT-2 small (124M)."""

    vocab_size: int = 50257  # GPT-2's byte-level BPE vocabulary
    d_model: int = 768  # model width
    max_positions: int = 1024  # context length
    pad_id: int | None = None  # GPT-2 has no padding token
    embedder: EmbedderSettings = field(  # learned positions, dropout 0.1
        default_factory=lambda: EmbedderSettings(positions="learned", dropout=0.1)
    )
    layers: LayerPlan = field(default_factory=gpt2_plan)  # 12 blocks of GPT-2's parts
    head: LMHead = field(default_factory=LMHead)  # tied to the token table
    bos_id: int | None = None  # token that starts a document, if any
    eos_id: int | None = None  # token that ends a document: generation stops on it
    stop_ids: tuple[int, ...] = ()  # more ids that end generation (Llama 3: <|eot_id|>, ...)

    def check_parts(self) -> None:
        self._check_token_id("bos_id", self.bos_id)
        self._check_token_id("eos_id", self.eos_id)
        if not isinstance(self.stop_ids, tuple):  # a list read from JSON: keep configs hashable
            object.__setattr__(self, "stop_ids", tuple(self.stop_ids))
        for stop_id in self.stop_ids:
            self._check_token_id("stop_ids", stop_id)
        if self.embedder.type_vocab_size:
            self.refuse(
                "embedder.type_vocab_size", "adds token types, which only a classifier reads"
            )
        if self.embedder.position_offset:
            self.refuse("embedder.position_offset", "is RoBERTa's, for a classifier")
        for path, settings in self.layer_settings():
            if settings.cross_attention is not None:
                self.refuse(f"{path}.cross_attention", "is a translator decoder's")

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Every id that ends a generated sequence: `eos_id` first, then `stop_ids`."""
        first = () if self.eos_id is None else (self.eos_id,)
        return first + tuple(i for i in self.stop_ids if i != self.eos_id)


class GPT(eqx.Module):
    """Causal decoder for one sequence: `Int[Array, "seq"] -> Float[Array, "seq vocab"]`.

    Batch with `jax.vmap`. Called without a key the model is deterministic (no dropout).
    """

    config: GPTConfig = eqx.field(static=True)
    embedder: Embedder
    layers: LayerStack
    final_norm: Norm | None
    head: Linear | None
    score: Linear | None  # the score head (`LMHead.scores`), None without one

    def __init__(self, config: GPTConfig, *, key: PRNGKeyArray):
        embed_key, layers_key, head_key = jax.random.split(key, 3)
        score_key = jax.random.fold_in(
            head_key, 1
        )  # a score head leaves the other draws as they are
        c = config
        self.config = c
        self.embedder = Embedder(
            c.vocab_size, c.d_model, c.max_positions, c.embedder, init=c.init, key=embed_key
        )
        self.layers = layer_stack(c, c.layers, key=layers_key)
        block = c.layers.block
        self.final_norm = c.make_norm() if block.norm_first or block.output_norm else None
        self.head = (
            None if c.head.tie else c.init.linear(c.d_model, c.vocab_size, False, key=head_key)
        )
        scores = c.head.scores
        self.score = c.init.linear(c.d_model, scores, False, key=score_key) if scores else None

    @property
    def output_head(self) -> VocabHead:
        """The projection to the vocabulary: the token table (tied) or the own head."""
        softcap = self.config.head.softcap
        if self.head is not None:
            return VocabHead(self.head, softcap=softcap)
        assert self.embedder.token_weight is not None
        return VocabHead(self.embedder.token_weight, softcap=softcap)

    def _normed(self, x: Float[Array, "seq d_model"]) -> Float[Array, "seq d_model"]:
        return x if self.final_norm is None else self.final_norm(x)

    def _logits(self, x: Float[Array, "seq d_model"]) -> Float[Array, "seq vocab"]:
        return self.output_head(self._normed(x))

    def _run(
        self,
        tokens: Array,
        mask: Bool[Array, " seq"] | None,
        *,
        key: PRNGKeyArray | None,
        segments: Int[Array, " seq"] | None = None,
        cache: KVCache | None = None,
        prefill: bool = False,
        return_weights: bool = False,
    ) -> tuple[Float[Array, "seq d_model"], BlockExtras]:
        """The last layer's output (before the final norm) and the layers' extras.

        Padding (by `pad_id` or `mask`) is compacted away first (`zoo.nn.Compaction`): the
        layers see the real tokens at the front and a length. `segments` (packed documents)
        restart the positions at each document and keep attention inside it."""
        c = self.config
        tokens = check_tokens(tokens, vocab_size=c.vocab_size, max_positions=c.max_positions)
        num_tokens = tokens.shape[0]
        embed_key, layers_key = split_optional(key, 2)
        compaction = None
        if cache is None or prefill:
            valid = None if cache is not None else valid_positions(tokens, c.pad_id, mask)
            positions = token_positions(valid, num_tokens)
            attention = Mask(causal=True)
            documents = None
            if segments is not None:
                if cache is not None:
                    raise ValueError("segments (packed documents) are for training and scoring")
                documents, positions = segment_positions(segments, num_tokens)
            compaction, attention, tokens, positions, documents = compact_padding(
                valid, attention, tokens, positions, documents
            )
            if documents is not None:
                attention = attention.replace(query_segments=documents, key_segments=documents)
        else:
            positions = cache.index + jnp.arange(num_tokens)
            attention = Mask(causal=True, offset=cache.index)
        x = self.embedder(tokens, positions, key=embed_key)
        inputs = BlockInputs(mask=attention, positions=positions, cache=cache)
        x, extras = self.layers(x, inputs, key=layers_key, return_weights=return_weights)
        return restore_order(compaction, x, extras)

    def __call__(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        *,
        segments: Int[Array, " seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq vocab"]:
        """Next-token logits at every position. `mask` (True = real token) overrides `pad_id`.

        `segments` packs several documents into one sequence: tokens with the same id in one
        run belong to one document, which attends only to itself, with positions from 0 (the
        same logits as each document alone).

        Positions count real tokens only, so a left-padded sequence gets the positions it would
        have without its padding (as HuggingFace's generation computes them).
        """
        x, _ = self._run(tokens, mask, key=key, segments=segments)
        return self._logits(x)

    def features(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        *,
        segments: Int[Array, " seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq d_model"]:
        """What `output_head` turns into the logits: `model(tokens) == model.output_head(
        model.features(tokens))`. Losses over the vocabulary start here (`zoo.tasks.vocab_loss`).
        """
        return self.features_and_router(tokens, mask, segments=segments, key=key).output

    def features_and_router(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        *,
        segments: Int[Array, " seq"] | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Routed:
        """`features` and, for a mixture of experts, its routers' statistics summed over the
        layers and real tokens (`Routed`; None for a dense model): what the tasks form the
        router losses from."""
        x, extras = self._run(tokens, mask, key=key, segments=segments)
        return routed(self._normed(x), extras)

    def scores_and_router(
        self,
        tokens: Int[Array, " seq"],
        mask: Bool[Array, " seq"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Routed:
        """The score head's outputs (`Float[Array, "classes"]`) at the last real token (by
        `mask`, else the last token that is not `pad_id`), as HF's `LlamaForSequenceClassification`
        reads them, with the routers' statistics: what `zoo.tasks.RewardModeling` trains."""
        if self.score is None:
            raise ValueError(
                "this GPT has no score head: add one with zoo.models.with_score_head(model) (or "
                "build it with head.scores=1) to score sequences"
            )
        features, router = self.features_and_router(tokens, mask, key=key)
        valid = valid_positions(tokens, self.config.pad_id, mask)
        positions = jnp.arange(tokens.shape[0])
        # HF's rule: the rightmost real token; a row with none reads the last position
        last = tokens.shape[0] - 1 if valid is None else jnp.max(jnp.where(valid, positions, -1))
        last = jnp.where(last < 0, tokens.shape[0] - 1, last)
        return Routed(self.score(features[last]), router)

    def attention_maps(
        self, tokens: Int[Array, " seq"], mask: Bool[Array, " seq"] | None = None
    ) -> Float[Array, "layers heads seq seq"]:
        """Attention weights of every layer and head (inference mode, no dropout)."""
        _, extras = self._run(tokens, mask, key=None, return_weights=True)
        assert extras.self_weights is not None
        return extras.self_weights

    def init_cache(self, max_len: int | None = None, dtype=None) -> KVCache:
        """An empty KV cache for `max_len` positions (default `max_positions`), in `dtype`
        (default: the dtype of the model's token table).

        It holds `[layers, max_len, kv_heads, head_dim]` keys and values: one cached token costs
        `2 * num_layers * kv_heads * head_dim * dtype.itemsize` bytes (`kv_cache_bytes_per_token`).
        """
        max_len = self.config.max_positions if max_len is None else max_len
        if max_len > self.config.max_positions:
            raise ValueError(f"max_len={max_len} exceeds max_positions={self.config.max_positions}")
        if dtype is None:  # the weights' own dtype: a model cast to bf16 caches in bf16
            assert self.embedder.token_weight is not None  # a GPT owns its token table
            dtype = self.embedder.token_weight.dtype
        return self.layers.init_cache(max_len, dtype)

    def kv_cache_bytes_per_token(self, dtype=None) -> int:
        """Bytes one cached token takes: keys and values of every layer's key/value heads."""
        c = self.config
        itemsize = jnp.dtype(c.param_dtype if dtype is None else dtype).itemsize
        return 2 * c.num_layers * c.kv_heads * c.head_dim * itemsize

    def prefill(
        self, tokens: Int[Array, " seq"], max_len: int | None = None, dtype=None
    ) -> tuple[Float[Array, "seq vocab"], KVCache]:
        """Start incremental decoding: `tokens` into a fresh cache of `max_len` positions.

        The same as `extend(tokens, init_cache(max_len, dtype))`, but the attention knows the
        cache was empty, so it runs over the new tokens alone in causal order (a fused
        kernel's causal path) instead of masking the whole cache.
        """
        cache = self.init_cache(max_len, dtype)
        if tokens.shape[0] > cache.capacity:
            raise ValueError(
                f"{tokens.shape[0]} tokens do not fit a cache of {cache.capacity} "
                "positions; pass a larger max_len or a shorter prompt"
            )
        x, extras = self._run(tokens, None, key=None, cache=cache, prefill=True)
        assert extras.cache is not None
        return self._logits(x), extras.cache.advance(tokens.shape[0])

    def extend(
        self, tokens: Int[Array, " seq"], cache: KVCache
    ) -> tuple[Float[Array, "seq vocab"], KVCache]:
        """Feed `tokens` after the `cache.index` positions already cached (incremental decoding).

        Returns their logits and the cache with them added. Logits equal those of running the
        whole sequence through `__call__`.
        """
        cache = check_cache_room(cache, tokens.shape[0], self.config.max_positions)
        x, extras = self._run(tokens, None, key=None, cache=cache)
        assert extras.cache is not None
        return self._logits(x), extras.cache.advance(tokens.shape[0])


def with_score_head(model: GPT, scores: int = 1, *, key: PRNGKeyArray | None = None) -> GPT:
    """`model` (its arrays shared, not copied) with a new score head of `scores` outputs, drawn
    as the config's `init` says, in the dtype of the model's token table: a language model made
    a reward model, as HF's `AutoModelForSequenceClassification.from_pretrained` does with a
    causal checkpoint. `key`: the head's draw (default: `jax.random.key(0)`)."""
    if not isinstance(model, GPT):
        raise TypeError(f"with_score_head takes a zoo.GPT, got {type(model).__name__}")
    config = dataclasses.replace(
        model.config, head=dataclasses.replace(model.config.head, scores=scores)
    )
    key = jax.random.key(0) if key is None else key
    skeleton = eqx.filter_eval_shape(GPT, config, key=key)
    score = config.init.linear(config.d_model, scores, False, key=key) if scores else None
    table = model.embedder.token_weight
    if score is not None and table is not None:
        score = jax.tree_util.tree_map(lambda array: array.astype(table.dtype), score)
    return eqx.tree_at(
        lambda m: (m.embedder, m.layers, m.final_norm, m.head, m.score),
        skeleton,
        (model.embedder, model.layers, model.final_norm, model.head, score),
        is_leaf=lambda node: node is None,
    )
