"""Shared pieces of the HuggingFace parity tests: random tiny models, batches, comparisons."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.extras import pip_install

torch = pytest.importorskip("torch", reason=f"HF parity tests need torch: {pip_install('hf')}")
transformers = pytest.importorskip(
    "transformers", reason=f"HF parity tests need transformers: {pip_install('hf')}"
)

LOGIT_TOL = 1e-4  # full model, float32
PART_TOL = 1e-5  # embeddings, one attention layer, one block
WORST: dict[str, float] = {}  # worst logit difference seen per architecture, for the report


def randomize(model, *, seed: int = 0, std: float = 0.3):
    """Give every weight of a HF model a spread-out random value (LayerNorms near 1 and 0).

    Default inits (tiny std, unit LayerNorms, zero biases) would hide transposed or swapped
    weights; fixed sinusoid tables are left alone.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name:
                continue
            noise = torch.randn(param.shape, generator=generator)
            is_norm = any(part in name for part in ("LayerNorm", "ln_", "layer_norm"))
            if is_norm and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif is_norm or name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(std * noise)
        for name, buffer in model.named_buffers():
            if name == "final_logits_bias":
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    return model.eval()


def batched(model_call):
    """`jax.vmap` of a per-example call (a model or a function), jitted."""
    return functools.partial(_vmapped, model_call)


@eqx.filter_jit
def _vmapped(call, *args):
    return jax.vmap(call)(*args)


def max_diff(ours, theirs, mask=None) -> float:
    """Largest absolute difference, over the positions where `mask` is True (all if None)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    diff = np.abs(ours - theirs)
    if mask is not None:
        diff = diff[np.asarray(mask, bool)]
    return float(diff.max())


def record(arch: str, diff: float) -> None:
    WORST[arch] = max(WORST.get(arch, 0.0), diff)
    print(f"\n[parity] {arch}: worst logit |zoo - transformers| so far = {WORST[arch]:.3g}")


def capture(module):
    """Register a forward hook on a torch module; returns the list its outputs land in."""
    outputs = []

    def hook(_module, _inputs, output):
        outputs.append(output[0] if isinstance(output, tuple) else output)

    module.register_forward_hook(hook)
    return outputs


def tensor(array) -> torch.Tensor:
    return torch.as_tensor(np.asarray(array))


def jnp_int(array) -> jax.Array:
    return jnp.asarray(np.asarray(array), dtype=jnp.int32)


def transformers_count(config) -> tuple[str, int]:
    """`(class name, parameter count)` of the transformers model a zoo config exports to, built
    on the meta device (no memory); a tied head is one tensor, counted once."""
    from zoo.interop.architectures import architecture_for

    arch = architecture_for(config)
    fields = {k: v for k, v in arch.hf_config(config).items() if k != "model_type"}
    class_name = fields["architectures"][0]
    with torch.device("meta"):
        hf = getattr(transformers, class_name)(getattr(transformers, arch.config_class)(**fields))
    return class_name, hf.num_parameters()


def check_preset_count(name: str, class_name: str, count: int) -> None:
    """The preset `name` exports to `class_name`, and both have `count` parameters."""
    import zoo

    theirs = transformers_count(zoo.presets.config(name))
    assert (class_name, zoo.presets.param_count(name)) == theirs
    assert theirs[1] == count
