"""The floor: `zoo bench`'s work written as plain JAX, to tell XLA's cost from zoo's own.

A GPT-2 (train step, forward, greedy KV-cache decoding) and a BERT classifier (train step,
forward) in a few functions over a dict of arrays: batch-major, no Equinox module, no `vmap`,
no mask object, no checks in the program. The math is zoo's: the weights are read from a zoo
model (`floor_params`), attention is the same `jax.nn.dot_product_attention`, the loss is the
mean cross-entropy in float32, the optimizer is zoo's AdamW (global-norm clipping at 1, decay on
the weight matrices only) and bf16 runs cast the float32 master weights for the forward and
backward, as zoo's train step does. `tests/bench/test_floor.py` holds each loss equal to zoo's
on the same weights.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int

from zoo.models import GPT, Classifier
from zoo.models.classifier import Pooler
from zoo.models.config import TransformerConfig
from zoo.models.gpt import LMHead
from zoo.nn import FeedForwardSettings
from zoo.nn.kernel import current_platform
from zoo.nn.layer_loop import scans
from zoo.records import get_path

# zoo's attention implementations as `jax.nn.dot_product_attention`'s (zoo's explicit softmax and
# the platform's choice: JAX's choice)
KERNELS: dict[str, Literal["xla", "cudnn"]] = {"xla": "xla", "cudnn": "cudnn"}
Params = dict[str, Any]  # the arrays by name, "layers" holding a `LayerParams`
LayerParams = dict[str, Array]  # one array per name, the layers stacked on the first axis

# Block arrays per layer: (floor name, path in a zoo block, transposed to [in, out]).
BLOCK_ARRAYS = (
    ("query_w", "self_attention.query_proj.weight", True),
    ("query_b", "self_attention.query_proj.bias", False),
    ("key_w", "self_attention.key_proj.weight", True),
    ("key_b", "self_attention.key_proj.bias", False),
    ("value_w", "self_attention.value_proj.weight", True),
    ("value_b", "self_attention.value_proj.bias", False),
    ("out_w", "self_attention.output_proj.weight", True),
    ("out_b", "self_attention.output_proj.bias", False),
    ("norm1_w", "self_attention_norm.weight", False),
    ("norm1_b", "self_attention_norm.bias", False),
    ("hidden_w", "feed_forward.hidden.weight", True),
    ("hidden_b", "feed_forward.hidden.bias", False),
    ("ff_out_w", "feed_forward.output.weight", True),
    ("ff_out_b", "feed_forward.output.bias", False),
    ("norm2_w", "feed_forward_norm.weight", False),
    ("norm2_b", "feed_forward_norm.bias", False),
)
# The arrays outside the blocks, by flavor, as `BLOCK_ARRAYS`.
TOP_ARRAYS = {
    "gpt": (
        ("token", "embedder.token_weight", False),
        ("position", "embedder.position_weight", False),
        ("final_w", "final_norm.weight", False),
        ("final_b", "final_norm.bias", False),
    ),
    "classifier": (
        ("token", "embedder.token_weight", False),
        ("position", "embedder.position_weight", False),
        ("token_type", "embedder.token_type_weight", False),
        ("embed_norm_w", "embedder.norm.weight", False),
        ("embed_norm_b", "embedder.norm.bias", False),
        ("pooler_w", "pooler.weight", True),
        ("pooler_b", "pooler.bias", False),
        ("head_w", "head.weight", True),
        ("head_b", "head.bias", False),
    ),
}
# The arrays weight decay applies to: the matrices of zoo's `Linear` layers.
DECAYED = frozenset({"query_w", "key_w", "value_w", "out_w", "hidden_w", "ff_out_w",
                     "pooler_w", "head_w"})  # fmt: skip


def _leaf(module: Any, path: str) -> Any:
    for name in path.split("."):
        module = getattr(module, name)
    return module


def floor_params(model: GPT | Classifier) -> dict[str, Any]:
    """The floor's copy of a GPT-2 or BERT-classifier zoo model's weights: the same numbers,
    matrices as `[in, out]` and the layers stacked (`{"layers": {...}, ...}`)."""
    stack = model.layers if isinstance(model, GPT) else model.encoder
    blocks = [stack.layer(i) for i in range(model.config.num_layers)]
    layers = {
        name: jnp.stack([_leaf(block, path).T if transpose else _leaf(block, path)
                         for block in blocks])
        for name, path, transpose in BLOCK_ARRAYS
    }  # fmt: skip
    top = TOP_ARRAYS["gpt" if isinstance(model, GPT) else "classifier"]
    params = {name: _leaf(model, path).T if transpose else _leaf(model, path)
              for name, path, transpose in top}  # fmt: skip
    if "token_type" in params:  # every position is segment 0
        params["token_type"] = params["token_type"][0]
    return {**params, "layers": layers}


# What the floor's GPT-2 and BERT are, as paths of a config and the value each must hold.
COMMON = {
    "embedder.positions": "learned", "embedder.scale": False, "embedder.position_offset": 0,
    "layers.overrides": (), "layers.block.output_norm": False,
    "layers.block.attention_norm": True, "layers.block.cross_attention": None,
    "layers.block.norm.kind": "layernorm", "layers.block.norm.bias": True,
    "layers.block.norm.weight_offset": 0.0, "layers.block.attention.qkv_bias": True,
    "layers.block.attention.output_bias": True, "layers.block.attention.qk_norm": None,
    "layers.block.attention.scale_dim": None, "layers.block.attention.softcap": None,
    "layers.block.attention.rope": None, "layers.block.attention.window": None,
    "layers.block.feed_forward.kind": "dense", "layers.block.feed_forward.bias": True,
}  # fmt: skip
SHAPES = {
    "gpt": {**COMMON, "embedder.norm": None, "embedder.type_vocab_size": 0,
            "layers.block.norm_first": True, "head": LMHead(tie=True, softcap=None)},
    "classifier": {**COMMON, "layers.block.norm_first": False, "head.pooling": "first",
                   "head.pooler": Pooler(activation="tanh", bias=True, norm=False),
                   "embedder.norm.kind": "layernorm", "masked_lm": False},
}  # fmt: skip


def covers(flavor: str, config: TransformerConfig) -> str | None:
    """None when the floor has this model (GPT-2's or BERT's parts at any size), else why not."""
    if flavor not in SHAPES:
        return f"the floor has a GPT-2 and a BERT classifier, not a {flavor}"
    shape = SHAPES[flavor]
    block = config.layers.block
    if not isinstance(block.feed_forward, FeedForwardSettings):
        return "the floor has no mixture of experts"
    wrong = [path for path, value in shape.items() if _value(config, path) != value]
    if block.attention.num_kv_heads not in (None, block.attention.num_heads):
        wrong.append("layers.block.attention.num_kv_heads")
    if block.feed_forward.activation not in ("gelu", "gelu_tanh"):
        wrong.append("layers.block.feed_forward.activation")
    if flavor == "classifier" and not config.embedder.type_vocab_size:
        wrong.append("embedder.type_vocab_size")
    if wrong:
        model = "GPT-2's" if flavor == "gpt" else "BERT's"
        return f"the floor has {model} parts only, and this model differs at {', '.join(wrong)}"
    return None


def _value(config: TransformerConfig, path: str) -> object:
    try:
        return get_path(config, path)
    except (AttributeError, TypeError, ValueError):
        return None


def _layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(-1, keepdims=True)
    variance = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + eps) * weight + bias


def _heads(x: Array, num_heads: int) -> Array:
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


class Floor(eqx.Module):
    """The shapes and choices of one row's model: what the floor's functions read besides the
    weights (static, so a jitted function sees plain Python values)."""

    num_heads: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    activation: str = eqx.field(static=True)  # gelu_tanh (GPT-2) | gelu (BERT)
    attention: Literal["xla", "cudnn"] | None = eqx.field(static=True)  # the kernel (None: JAX's)
    scan: bool | None = eqx.field(static=True)  # lax.scan, a Python loop, or None: as zoo

    @classmethod
    def of(cls, config: TransformerConfig) -> Floor:
        block = config.layers.block
        return cls(
            num_heads=block.attention.num_heads,
            eps=block.norm.eps,
            activation=block.feed_forward.activation,
            attention=KERNELS.get(block.attention.implementation or ""),
            scan=config.scan_layers,
        )

    def feed_forward(self, x: Array, p: LayerParams) -> Array:
        hidden = x @ p["hidden_w"] + p["hidden_b"]
        hidden = jax.nn.gelu(hidden, approximate=self.activation == "gelu_tanh")
        return hidden @ p["ff_out_w"] + p["ff_out_b"]

    def qkv(self, x: Array, p: LayerParams) -> tuple[Array, Array, Array]:
        q, k, v = (
            _heads(x @ p[f"{name}_w"] + p[f"{name}_b"], self.num_heads)
            for name in ("query", "key", "value")
        )
        return q, k, v

    def attend(self, q: Array, k: Array, v: Array, p: LayerParams, **mask: Any) -> Array:
        # cuDNN where zoo would call it: on a GPU (or a program lowered as for one)
        kernel = self.attention if current_platform() == "gpu" else None
        out = jax.nn.dot_product_attention(q, k, v, implementation=kernel, **mask)
        return out.reshape(*out.shape[:-2], -1) @ p["out_w"] + p["out_b"]

    def loop(self, block: Callable[[Array, Any], tuple[Array, Any]], x: Array, xs: Any):
        """`block` over the layers (`xs` stacked on the first axis): scanned or unrolled."""
        if scans(self.scan):  # zoo's choice: unrolled on a GPU, scanned elsewhere
            return jax.lax.scan(block, x, xs)
        outputs = []
        for i in range(jax.tree_util.tree_leaves(xs)[0].shape[0]):
            x, out = block(x, jax.tree_util.tree_map(lambda value, i=i: value[i], xs))
            outputs.append(out)
        return x, jax.tree_util.tree_map(lambda *values: jnp.stack(values), *outputs)

    def layers(self, x: Array, layers: LayerParams, block: Callable[[Array, LayerParams], Array]):
        return self.loop(lambda h, p: (block(h, p), None), x, layers)[0]

    def gpt2_features(self, params: Params, tokens: Int[Array, "batch seq"]) -> Array:
        x = params["token"][tokens] + params["position"][: tokens.shape[1]]

        def block(x, p):  # pre-norm: x + attention(norm(x)), then x + mlp(norm(x))
            q, k, v = self.qkv(_layer_norm(x, p["norm1_w"], p["norm1_b"], self.eps), p)
            x = x + self.attend(q, k, v, p, is_causal=True)
            return x + self.feed_forward(_layer_norm(x, p["norm2_w"], p["norm2_b"], self.eps), p)

        x = self.layers(x, params["layers"], block)
        return _layer_norm(x, params["final_w"], params["final_b"], self.eps)

    def gpt2_loss(self, params: Params, batch: dict[str, Array]) -> Float[Array, ""]:
        tokens = batch["tokens"]
        features = self.gpt2_features(params, tokens[:, :-1])
        logits = (features @ params["token"].T).astype(jnp.float32)  # the tied head
        log_probs = jax.nn.log_softmax(logits, -1)
        picked = jnp.take_along_axis(log_probs, tokens[:, 1:, None], -1)
        return -picked.mean()

    def bert_logits(self, params: Params, tokens: Int[Array, "batch seq"]) -> Array:
        x = params["token"][tokens] + params["position"][: tokens.shape[1]] + params["token_type"]
        x = _layer_norm(x, params["embed_norm_w"], params["embed_norm_b"], self.eps)

        def block(x, p):  # post-norm: norm(x + attention(x)), then norm(x + mlp(x))
            q, k, v = self.qkv(x, p)
            x = _layer_norm(x + self.attend(q, k, v, p), p["norm1_w"], p["norm1_b"], self.eps)
            return _layer_norm(x + self.feed_forward(x, p), p["norm2_w"], p["norm2_b"], self.eps)

        x = self.layers(x, params["layers"], block)
        pooled = jnp.tanh(x[:, 0] @ params["pooler_w"] + params["pooler_b"])
        return pooled @ params["head_w"] + params["head_b"]

    def bert_loss(self, params: Params, batch: dict[str, Array]) -> Float[Array, ""]:
        logits = self.bert_logits(params, batch["tokens"]).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(log_probs, batch["labels"][:, None], -1).mean()

    def greedy_decode(
        self, params: Params, prompts: Int[Array, "batch prompt"], new_tokens: int
    ) -> Int[Array, "batch new"]:
        """Prefill the prompts, then `new_tokens - 1` single-token steps over a KV cache."""
        batch, prompt_len = prompts.shape
        length = prompt_len + new_tokens
        layers = params["layers"]
        num_layers, width = layers["query_w"].shape[:2]
        cache_shape = (num_layers, batch, length, self.num_heads, width // self.num_heads)
        dtype = params["token"].dtype

        def step(x, position, keys, values, causal):
            def block(x, layer):
                p, k_cache, v_cache = layer
                q, k, v = self.qkv(_layer_norm(x, p["norm1_w"], p["norm1_b"], self.eps), p)
                k_cache = jax.lax.dynamic_update_slice_in_dim(k_cache, k, position, 1)
                v_cache = jax.lax.dynamic_update_slice_in_dim(v_cache, v, position, 1)
                seen = jnp.arange(length) < position + x.shape[1]
                if causal:
                    mask = jnp.arange(length)[None] <= position + jnp.arange(x.shape[1])[:, None]
                    seen = mask & seen
                x = x + self.attend(q, k_cache, v_cache, p, mask=seen)
                ff_in = _layer_norm(x, p["norm2_w"], p["norm2_b"], self.eps)
                return x + self.feed_forward(ff_in, p), (k_cache, v_cache)

            x, (keys, values) = self.loop(block, x, (layers, keys, values))
            x = _layer_norm(x[:, -1], params["final_w"], params["final_b"], self.eps)
            token = jnp.argmax(x @ params["token"].T, -1).astype(jnp.int32)
            return token, keys, values

        empty = jnp.zeros(cache_shape, dtype)
        x = params["token"][prompts] + params["position"][:prompt_len]
        first, keys, values = step(x, 0, empty, empty, causal=True)

        def next_token(carry, _):
            token, position, keys, values = carry
            x = params["token"][token][:, None] + params["position"][position][None, None]
            following, keys, values = step(x, position, keys, values, causal=False)
            return (following, position + 1, keys, values), token

        carry = (first, jnp.asarray(prompt_len), keys, values)
        (last, *_), tokens = jax.lax.scan(next_token, carry, None, length=new_tokens - 1)
        return jnp.concatenate([tokens.T, last[:, None]], axis=1)


def _broadcasting(method):
    """Run `method` with NumPy's rank promotion (`bias + x` of any rank), as plain JAX code
    does, whatever the program around it sets."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        with jax.numpy_rank_promotion("allow"):
            return method(*args, **kwargs)

    return run


for _name in ("gpt2_loss", "bert_loss", "gpt2_features", "bert_logits", "greedy_decode"):
    setattr(Floor, _name, _broadcasting(getattr(Floor, _name)))


def cast(params: Any, dtype: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: leaf.astype(dtype), params)


def optimizer(lr: float = 1e-4) -> optax.GradientTransformation:
    """zoo's AdamW on the floor's dict: clipping at 1, then decay on the weight matrices."""

    def decayed(params):
        layers = {name: name in DECAYED for name in params["layers"]}
        return {**{name: name in DECAYED for name in params}, "layers": layers}

    adam = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, mask=decayed)
    return optax.chain(optax.clip_by_global_norm(1.0), adam)


def make_train_step(loss: Callable[[Params, dict[str, Array]], Array], compute: Any, lr: float):
    """`step(params, opt_state, batch) -> (params, opt_state, loss)`, jitted, donating the
    params and optimizer state; the forward and backward run in `compute`."""
    adamw = optimizer(lr)

    def step(params, opt_state, batch):
        # optax mixes Python floats with integer counts, and bf16 attention promotes inside
        with jax.numpy_dtype_promotion("standard"):
            value, grads = jax.value_and_grad(lambda p: loss(cast(p, compute), batch))(params)
            updates, opt_state = adamw.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step, donate_argnums=(0, 1)), adamw.init
