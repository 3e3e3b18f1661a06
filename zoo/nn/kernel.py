"""Which attention kernel a call runs (zoo's explicit softmax, XLA's fused attention or cuDNN's),
and the call of a fused one.

`zoo.nn.attention.dot_product_attention` asks `choose_kernel` once per traced call. The choice
is made while tracing, from what is known then: the platform the program is for, dtypes, head
size, whether the mask can be said in lengths and flags, attention dropout, a score bias.

- `"explicit"`: zoo's own float32 softmax of einsum scores. Needed for attention dropout and
  for returning the weights; the default on the CPU, where its backward pass is faster.
- `"xla"`: `jax.nn.dot_product_attention(implementation="xla")`.
- `"cudnn"`: cuDNN's fused flash attention on an NVIDIA GPU, the default there for bf16/fp16.
  Where cuDNN cannot serve a call (float32, a head size it lacks, a mask that is not lengths,
  causal order and a window), the call runs XLA's attention instead and the reason is logged
  once: asking for cuDNN never crashes a model.

`kernel_platform("gpu")` makes the choice as if on a GPU while tracing on another machine
(lowering a program for CUDA on a CPU host: `jax.jit(f).trace(...).lower(lowering_platforms=
("cuda",))`).

A fused kernel gets the mask as `jax.nn.dot_product_attention`'s own arguments (`is_causal`,
sequence lengths, `local_window_size`: `zoo.nn.Mask.kernel_arguments`) where the mask can be
said that way, else as the boolean array (`fused_attention`). The explicit kernel, the one
softmax of zoo, lives in `zoo.nn.attention`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from zoo.nn.dropout import Dropout
from zoo.nn.mask import KernelArguments, Mask

Kernel = Literal["explicit", "xla", "cudnn"]
IMPLEMENTATIONS = (None, "explicit", "xla", "cudnn")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)

logger = logging.getLogger("zoo.nn")
_platform_override: list[str] = []
_said: set[str] = set()


@contextlib.contextmanager
def kernel_platform(platform: str) -> Iterator[None]:
    """Choose attention kernels as if tracing for `platform` ("cpu" or "gpu")."""
    if platform not in ("cpu", "gpu"):
        raise ValueError(f"kernel_platform takes 'cpu' or 'gpu', got {platform!r}")
    _platform_override.append(platform)
    try:
        yield
    finally:
        _platform_override.pop()


def current_platform() -> str:
    """The platform kernels are chosen for: `kernel_platform`'s, else JAX's default backend."""
    if _platform_override:
        return _platform_override[-1]
    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def say_once(message: str) -> None:
    """Log a kernel fallback the first time it happens in this process."""
    if message not in _said:
        _said.add(message)
        logger.warning(message)


class KernelOptions(NamedTuple):
    """How one attention call runs, besides its arrays, mask and score bias: the kernel asked
    for, whether scores are scaled, and attention dropout with its key.

    `MultiHeadAttention.attend` makes one per call from its `AttentionSettings`
    (`attention_implementation`, `scale_scores`, `attention_dropout`) and the call's key.
    """

    implementation: str | None = None  # None (by platform) | explicit | xla | cudnn
    scale: bool | float = True  # True: 1/sqrt(head_dim); False: 1 (T5); a number: that factor
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma 2)
    dropout: Dropout | None = None  # on the attention weights (needs the explicit kernel)
    dropout_key: PRNGKeyArray | None = None  # without a key, no dropout

    @property
    def dropout_active(self) -> bool:
        """Whether this call drops attention weights (a key, a rate, not in inference mode)."""
        dropout = self.dropout
        return (
            dropout is not None
            and self.dropout_key is not None
            and not dropout.inference
            and dropout.rate > 0.0
        )


def choose_kernel(
    implementation: str | None,
    *,
    query: jax.Array,
    key: jax.Array,
    mask_arguments: KernelArguments | None,
    return_weights: bool = False,
    dropout_active: bool = False,
    softcap: bool = False,
) -> Kernel:
    """The kernel for one attention call (see the module docstring).

    Returning the weights and attention dropout need the explicit path.

    Args:
        implementation: the model's setting: None picks by platform (explicit on a CPU; cuDNN
            for bf16/fp16 on a GPU where it can serve the call, else XLA), "explicit", "xla" or
            "cudnn" ask for one.
        query: the call's queries (their dtype and head size decide for cuDNN).
        key: the call's keys.
        mask_arguments: the mask in the kernels' terms, or None where it needs an array
            (`zoo.nn.Mask.kernel_arguments`).
        return_weights: whether the call returns the attention weights.
        dropout_active: whether the call drops attention weights.
        softcap: whether the scores are soft-capped (Gemma 2), which no fused kernel does.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    platform = current_platform()
    if dropout_active and platform == "gpu" and implementation != "explicit":
        say_once(
            "attention dropout needs the attention weights, so attention runs zoo's explicit "
            "softmax instead of a fused kernel; attention_dropout=0 lets it run fused"
        )
    if softcap and platform == "gpu" and implementation != "explicit":
        say_once(
            "attention logit soft-capping is not an option of the fused kernels, so attention "
            "runs zoo's explicit softmax"
        )
    if return_weights or dropout_active or softcap or implementation == "explicit":
        return "explicit"
    if implementation is None and platform != "gpu":
        return "explicit"
    if implementation == "xla" or platform != "gpu":
        if implementation == "cudnn":
            say_once(f"cuDNN attention needs an NVIDIA GPU; running XLA's attention on {platform}")
        return "xla"
    refusal = cudnn_refusal(query, mask_arguments)
    if refusal is None:
        return "cudnn"
    say_once(f"cuDNN attention cannot serve this call ({refusal}); running XLA's attention")
    return "xla"


def cudnn_refusal(query: jax.Array, mask_arguments: KernelArguments | None) -> str | None:
    """Why cuDNN's fused attention cannot run this call, or None if it can.

    The limits are cuDNN's flash attention as JAX calls it: bf16 or fp16, a head size that is
    a multiple of 8 up to 128 (256 on Hopper and later), a mask said in lengths, causal order
    and a left window. (Its training rule also wants even lengths: `fused_attention` pads odd
    ones.)
    """
    if query.dtype not in CUDNN_DTYPES:
        return f"it takes bf16 or fp16, not {query.dtype}"
    head_dim = query.shape[-1]
    limit = 256 if _hopper_or_later() else 128
    if head_dim % 8 != 0 or head_dim > limit:
        return f"head_dim={head_dim} is not a multiple of 8 up to {limit}"
    if mask_arguments is None:
        return "the mask is an array (segments or an explicit mask), not lengths and flags"
    window = mask_arguments.local_window_size
    if window is not None and window[1] > 0:
        return f"its window is two-sided {window}; cuDNN takes a left (causal) window only"
    if not _cudnn_available():
        return "no cuDNN was found"
    return None


def _hopper_or_later() -> bool:
    """True on a Hopper (sm_90) or later GPU, and when tracing for a GPU on another machine."""
    if _platform_override:
        return True
    try:
        capability = jax.devices()[0].compute_capability  # type: ignore[attr-defined]
        return float(capability) >= 9.0
    except (AttributeError, ValueError, RuntimeError):
        return False


def _cudnn_available() -> bool:
    """Whether JAX finds cuDNN (private JAX names: any failure means "no")."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fused

        return fused.check_cudnn_version() > 0
    except Exception:  # a moved private name, no CUDA plugin, no cuDNN
        return False


def fused_attention(
    query: Float[Array, "seq heads head_dim"],
    key: Float[Array, "kv_seq kv_heads head_dim"],
    value: Float[Array, "kv_seq kv_heads head_dim"],
    mask: Mask,
    *,
    arguments: KernelArguments | None,
    score_bias: Float[Array, "heads seq kv_seq"] | None,
    scale: bool | float,
    kernel: Literal["xla", "cudnn"],
) -> Float[Array, "seq heads head_dim"]:
    """`jax.nn.dot_product_attention` with the mask as its own arguments, or as an array.

    Queries that see no key get a zero output, as on the explicit path.

    Args:
        query: one example's queries.
        key: its keys (fewer heads than the queries under grouped-query attention).
        value: its values.
        mask: which keys each query may attend to.
        arguments: `mask.kernel_arguments(seq, kv_seq)`; None: the mask goes as an array.
        score_bias: added to the scaled scores (T5's relative positions), or None.
        scale: True divides the scores by sqrt(head_dim), False leaves them, a number multiplies.
        kernel: "xla" or "cudnn" (`choose_kernel`'s answer).
    """
    num_queries, num_keys = query.shape[0], key.shape[0]
    mask_array = None
    answered: Bool[Array, " seq"] | None
    if arguments is None:
        mask_array = mask.array(num_queries, num_keys)
        arguments = KernelArguments(False, None, None, None)
        answered = None if mask_array is None else jnp.any(mask_array, axis=-1)
    else:
        answered = _answered_queries(arguments, num_queries)
    # the fused kernels take one dtype (a float32 cache read by bf16 queries)
    key, value = key.astype(query.dtype), value.astype(query.dtype)
    query_lengths, key_lengths = arguments.query_seq_lengths, arguments.key_value_seq_lengths
    if key_lengths is not None:
        # a query with no key is zeroed below; the kernel always gets one key to read
        key_lengths = jnp.maximum(key_lengths, 1)

    def call(query, key, value, score_bias, query_lengths, key_lengths):
        return _call_kernel(
            (query, key, value, score_bias, query_lengths, key_lengths),
            mask_array=mask_array,
            arguments=arguments,
            scale=scale,
            kernel=kernel,
        )

    operands = (query, key, value, score_bias, query_lengths, key_lengths)
    if kernel == "cudnn" and (num_queries % 2 or num_keys % 2):
        output = _even_when_differentiated(call, arguments.is_causal)(*operands)
    else:
        output = call(*operands)
    if answered is None:
        return output
    return jnp.where(answered[:, None, None], output, jnp.zeros_like(output))


def _call_kernel(
    operands: tuple[Array, Array, Array, Array | None, Array | None, Array | None],
    *,
    mask_array: Array | None,
    arguments: KernelArguments,
    scale: bool | float,
    kernel: Literal["xla", "cudnn"],
) -> Array:
    """`jax.nn.dot_product_attention` on (query, key, value, score bias, query lengths, key
    lengths); for cuDNN, lengths on both sides or neither, with the queries' batch axis."""
    query, key, value, score_bias, query_lengths, key_lengths = operands
    if kernel == "cudnn":
        if key_lengths is not None and query_lengths is None:
            query_lengths = jnp.full((1,), query.shape[0], jnp.int32)
        if query_lengths is not None and key_lengths is None:
            key_lengths = jnp.full((1,), key.shape[0], jnp.int32)
        key, value = _batched_like(query, key, value)
        query_lengths, key_lengths = _batched_like(query, query_lengths, key_lengths)
    # jax's own kernel mixes bf16 and f32 internally, which strict promotion would reject.
    with jax.numpy_dtype_promotion("standard"):
        return jax.nn.dot_product_attention(
            query,
            key,
            value,
            bias=None if score_bias is None else score_bias.astype(query.dtype)[None],
            mask=None if mask_array is None else mask_array[None, :, :],
            scale=None if scale is True else (1.0 if scale is False else float(scale)),
            is_causal=arguments.is_causal,
            query_seq_lengths=query_lengths,
            key_value_seq_lengths=key_lengths,
            local_window_size=arguments.local_window_size,
            implementation=kernel,
        )


def _even_when_differentiated(call: Callable[..., Array], causal: bool) -> Callable[..., Array]:
    """`call` as it is, but padded to even lengths (`_even_lengths`) where it is differentiated.

    JAX's cuDNN training rule refuses an odd query or key length (a 127-token batch), while its
    inference rule takes them (a decoding step's single query over the cache). Whether a call
    will be differentiated is not known when it is traced, so the call is a `jax.custom_vjp`:
    its forward runs the operands as they are (no copy of a KV cache per decoding step), and the
    rule that runs only under differentiation runs the padded call and its backward.
    """

    def padded(query, key, value, score_bias, query_lengths, key_lengths):
        num_queries = query.shape[0]
        query, key, value, score_bias, key_lengths = _even_lengths(
            query, key, value, score_bias, key_lengths, causal=causal
        )
        if query_lengths is None and key_lengths is not None:  # the added query reads nothing
            query_lengths = jnp.full((1,), num_queries, jnp.int32)
        return call(query, key, value, score_bias, query_lengths, key_lengths)[:num_queries]

    @jax.custom_vjp
    def attend(*operands):
        return call(*operands)

    def forward(*operands):
        return jax.vjp(padded, *operands)  # the output and its backward (residuals in it)

    def backward(pullback, cotangent):
        return pullback(cotangent)

    attend.defvjp(forward, backward)
    return attend


def _even_lengths(
    query: Array,
    key: Array,
    value: Array,
    score_bias: Array | None,
    key_lengths: Array | None,
    *,
    causal: bool,
) -> tuple[Array, Array, Array, Array | None, Array | None]:
    """The operands padded to even query and key lengths, for cuDNN.

    JAX's cuDNN training rule refuses an odd query or key length (a decoding step's single
    query, a 127-token batch), and whether a call will be differentiated is not known when it
    is traced. One zero row goes after the last query (its output is dropped) and after the
    last key, which the key lengths then leave out. In causal order over as many keys as
    queries (counted from the top left) only the added query sees the added key, so the plain
    causal mask stays.
    """
    num_queries, num_keys = query.shape[0], key.shape[0]
    add_query, add_key = num_queries % 2, num_keys % 2
    if add_query == 0 and add_key == 0:
        return query, key, value, score_bias, key_lengths
    if add_key:
        if key_lengths is None and not (causal and num_queries == num_keys):
            key_lengths = jnp.full((1,), num_keys, jnp.int32)
        if key_lengths is not None:
            key_lengths = jnp.minimum(key_lengths, num_keys)
        key = jnp.pad(key, ((0, 1), (0, 0), (0, 0)))
        value = jnp.pad(value, ((0, 1), (0, 0), (0, 0)))
    query = jnp.pad(query, ((0, add_query), (0, 0), (0, 0)))
    if score_bias is not None:
        score_bias = jnp.pad(score_bias, ((0, 0), (0, add_query), (0, add_key)))
    return query, key, value, score_bias, key_lengths


Operand = TypeVar("Operand", Array, Array | None)


def _batched_like(query: Array, *operands: Operand) -> list[Operand]:
    """`operands` plus a zero computed from `query`, so that under `jax.vmap` they carry the
    queries' batch axis.

    cuDNN's batching rule reshapes every operand to the queries' batch; one that does not vary
    over the batch (a length known when tracing, a cross-attention memory shared by every
    beam) has no batch axis and cannot be reshaped. The zero is the same select on both sides,
    which XLA removes.
    """
    zero = jnp.where(jnp.isnan(query[0, 0, 0]), 0, 0).astype(jnp.int32)
    return [
        None if operand is None else operand + zero.astype(operand.dtype) for operand in operands
    ]


def _answered_queries(arguments: KernelArguments, num_queries: int) -> Bool[Array, " seq"] | None:
    """Which queries see at least one key under a mask said in lengths (None: all of them)."""
    answered = None
    if arguments.query_seq_lengths is not None:
        answered = jnp.arange(num_queries) < arguments.query_seq_lengths[0]
    if arguments.key_value_seq_lengths is not None:
        any_key = jnp.broadcast_to(arguments.key_value_seq_lengths[0] > 0, (num_queries,))
        answered = any_key if answered is None else answered & any_key
    return answered
