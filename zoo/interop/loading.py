"""HuggingFace checkpoints -> zoo models: from a folder, the hub, or a transformers model object."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol, overload, runtime_checkable

import equinox as eqx
import jax
import ml_dtypes
import numpy as np
from jaxtyping import PRNGKeyArray

from zoo.data.tokenizers.base import Tokenizer
from zoo.files import JSONObject
from zoo.interop.architecture import Architecture, HFConfig, logger
from zoo.interop.architectures import (
    ARCHITECTURES,
    DECODER_MODEL_TYPES,
    architecture_of,
)
from zoo.interop.convert import CheckpointMismatch, hf_to_zoo
from zoo.interop.files import CONFIG, INSTALL_HF, json_ids, read_config, read_json, resolve
from zoo.interop.gguf.load import gguf_checkpoint, is_gguf
from zoo.interop.tokenizers.hf_tokenizer import pretrained_tokenizer
from zoo.interop.torch_weights import state_dict_to_numpy
from zoo.interop.weights import read_weights
from zoo.interop.zoo_keys import abstract_model, restack, zoo_arrays, zoo_shapes
from zoo.models import TransformerConfig
from zoo.presets import build
from zoo.tree import fill

GENERATION_CONFIG = "generation_config.json"


@runtime_checkable
class TransformersConfig(Protocol):
    """What `from_hf` reads of a transformers config object (`PretrainedConfig`)."""

    def to_dict(self) -> dict[str, object]: ...


@runtime_checkable
class TransformersModel(Protocol):
    """What `from_hf` reads of a transformers model object (a torch `PreTrainedModel`)."""

    @property
    def config(self) -> TransformersConfig: ...

    def state_dict(self) -> Mapping[str, object]: ...


def stored_dtype(arrays: Mapping[str, np.ndarray]) -> str | None:
    """ "bfloat16" when every floating-point array is stored in bf16 (the model then loads in bf16
    without a float32 copy on the way), else None (the config's dtype, float32 by default)."""
    bf16 = np.dtype(ml_dtypes.bfloat16)  # not a numpy floating subtype: test it by name
    floating = [
        a.dtype for a in arrays.values() if a.dtype == bf16 or np.issubdtype(a.dtype, np.floating)
    ]
    if floating and all(d == bf16 for d in floating):
        return "bfloat16"
    return None


def canonical_keys(arrays: Mapping[str, np.ndarray], arch: Architecture) -> dict[str, np.ndarray]:
    """State-dict keys as the task model names them.

    A bare base model (`GPT2Model`, `BertModel`, `MarianModel`, the `gpt2` hub checkpoint) has
    no `transformer.`/`bert.`/`model.` prefix: add it. Old LayerNorm names gamma/beta become
    weight/bias, as transformers renames them.
    """
    bare = not any(key.startswith(arch.prefix) for key in arrays)
    out = {}
    for key, array in arrays.items():
        key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))
        out[f"{arch.prefix}{key}" if bare else key] = array
    return arch.stored_keys(out)


def load_state_dict(
    config: Mapping[str, object],
    arrays: Mapping[str, np.ndarray],
    *,
    key: PRNGKeyArray | None = None,
    what: str = "checkpoint",
    **overrides: object,
) -> eqx.Module:
    """A zoo model from a HuggingFace config dict and state dict of numpy arrays.

    `overrides` change zoo config fields (`num_classes`, `dropout`, `dtype`, `layer_loop`...).
    Parts the checkpoint lacks (a classification head) are initialised with `key`. A checkpoint
    stored in bfloat16 loads in bfloat16 unless `dtype=` says otherwise.
    """
    arch = architecture_of(config)
    hf = HFConfig(config, arch.hf_defaults(), arch.name)
    arch.check_class(hf)
    arrays = canonical_keys(arrays, arch)
    shapes = {k: tuple(v.shape) for k, v in arrays.items()}
    # `replace` names the valid fields when an override is misspelt
    fields = arch.zoo_fields(hf, shapes)
    check_layers_in_weights(fields, shapes, what)
    dtype = stored_dtype(arrays)
    if dtype is not None:
        fields["dtype"] = dtype
    zoo_config = arch.zoo_config(fields).replace(**overrides)
    skeleton = abstract_model(lambda: build(zoo_config, key=jax.random.key(0)))
    state, fresh = hf_to_zoo(
        arrays, arch.key_map(zoo_config, shapes), zoo_shapes(skeleton), what=what
    )
    if fresh:
        warn_fresh(arch, hf, arrays, fresh, what)
        key = jax.random.key(0) if key is None else key
        state.update(_fresh_arrays(zoo_config, key, fresh))
    return fill(skeleton, restack(skeleton, state), what)


def check_layers_in_weights(
    fields: Mapping[str, object], shapes: Mapping[str, tuple[int, ...]], what: str
) -> None:
    """Refuse a config that claims more layers than its weights number, before anything is
    built from it: every HuggingFace key of a layer carries its index (`model.layers.11.`), so
    a config claiming a million layers over twelve layers' weights is not these weights'."""
    indices = [int(part) for key in shapes for part in key.split(".") if part.isdigit()]
    if not indices:
        return
    numbered = max(indices) + 1
    for name in ("num_layers", "layers.num_layers", "decoder.num_layers"):
        claimed = fields.get(name)
        if isinstance(claimed, int) and claimed > numbered:
            raise CheckpointMismatch(
                f"the {what}'s config claims {claimed} layers ({name}), but its weights number "
                f"layers 0..{numbered - 1} at most: the config.json does not belong to these "
                "weights; use the config.json that came with them"
            )


class FreshWeightsWarning(UserWarning):
    """Weights the checkpoint lacks were initialised afresh: the logits are not the original's."""


def warn_fresh(
    arch: Architecture, hf: HFConfig, arrays: Mapping[str, np.ndarray], fresh: list[str], what: str
) -> None:
    """Say loudly (a warning and the log) which zoo weights start afresh, and why it matters."""
    message = (
        f"{arch.name}: not in the {what}, initialised afresh (biases zero, weights random "
        f"from `key`): {', '.join(fresh)}. The logits differ from those of any model trained "
        "with these weights: train them before use"
    )
    for hf_class in hf["architectures"] or []:
        lacking = [k for k in arch.task_weights(hf_class) if k not in arrays]
        if lacking:
            message = (
                f"{arch.name}: the {what} lacks {', '.join(lacking)}, which every {hf_class} "
                f"checkpoint holds (config.json names {hf_class}): zoo initialised "
                f"{', '.join(fresh)} afresh, so the logits WILL DIFFER from the original "
                f"model's. The file is incomplete, e.g. converted through AutoModel, which "
                f"drops task heads: download it again, or convert with transformers.{hf_class}"
            )
    logger.warning("%s", message)
    warnings.warn(message, FreshWeightsWarning, stacklevel=3)


def _fresh_arrays(
    config: TransformerConfig, key: PRNGKeyArray, names: list[str]
) -> dict[str, np.ndarray]:
    # Under jit, XLA drops the initialisation of every array that is not returned.
    @eqx.filter_jit
    def initialise(key):
        return zoo_arrays(build(config, key=key), names)

    return {name: np.asarray(array) for name, array in initialise(key).items()}


@overload
def from_pretrained(
    name_or_dir: str | Path,
    *,
    revision: str | None = None,
    return_tokenizer: Literal[False] = False,
    key: PRNGKeyArray | None = None,
    **overrides: object,
) -> eqx.Module: ...


@overload
def from_pretrained(
    name_or_dir: str | Path,
    *,
    revision: str | None = None,
    return_tokenizer: Literal[True],
    key: PRNGKeyArray | None = None,
    **overrides: object,
) -> tuple[eqx.Module, Tokenizer]: ...


def from_pretrained(
    name_or_dir: str | Path,
    *,
    revision: str | None = None,
    return_tokenizer: bool = False,
    key: PRNGKeyArray | None = None,
    **overrides: object,
) -> eqx.Module | tuple[eqx.Module, Tokenizer]:
    """A zoo model from a HuggingFace checkpoint: a local folder or a hub name.

    The folder holds `config.json` and `model.safetensors` (or sharded safetensors with their
    index), or else `pytorch_model.bin` (or its shards), read with torch's weights-only loader.
    A name that is not a folder is downloaded with `huggingface_hub` (the config and one set of
    weights: safetensors when the repository has them). Weights the checkpoint lacks are
    initialised from `key` with a `FreshWeightsWarning`. Supported: GPT-2, Llama, Mistral,
    Qwen2, Qwen3 -> `zoo.GPT`; BERT, RoBERTa, XLM-R, DistilBERT -> `zoo.Classifier`; MarianMT
    and T5 -> `zoo.Translator`. The end ids of `generation_config.json` (Llama 3 instruct stops
    on several) become a decoder's `stop_ids`. Keyword `overrides` change zoo config fields,
    e.g. `num_classes=2`.
    A path to a `.gguf` file (llama.cpp, Ollama, LM Studio) loads through
    `zoo.interop.gguf` with the `gguf` package (the `gguf` extra): its tensors dequantized
    (to float32, or bfloat16 with `dtype="bfloat16"`), its tokenizer built from its metadata.
    With `return_tokenizer=True`, returns `(model, tokenizer)`.
    """
    if is_gguf(name_or_dir):
        config, arrays, tokenizer = gguf_checkpoint(
            name_or_dir, dtype=overrides.get("dtype"), tokenizer=return_tokenizer
        )
        what = f"GGUF file {name_or_dir}"
        model = load_state_dict(config, arrays, key=key, what=what, **overrides)
        return (model, tokenizer) if tokenizer is not None else model
    folder = resolve(name_or_dir, revision=revision, tokenizer=return_tokenizer)
    model = load_state_dict(
        with_generation_end_ids(read_config(folder), folder),
        read_weights(folder),
        key=key,
        what=f"checkpoint in {folder}",
        **overrides,
    )
    if not return_tokenizer:
        return model
    return model, pretrained_tokenizer(folder)


def with_generation_end_ids(config: JSONObject, folder: Path) -> JSONObject:
    """`config` (the folder's `config.json`) with the end ids of `generation_config.json` added
    after its own.

    transformers' `generate` stops on the generation config's ids; zoo keeps them all (the
    config's first), so that generation stops where the checkpoint's authors meant it to. An
    `eos_token_id` of either file that is no id or list of ids names the file as damaged.
    """
    path = folder / GENERATION_CONFIG
    if not path.is_file() or config.get("model_type") not in DECODER_MODEL_TYPES:
        return config
    generation = read_json(path)
    merged = json_ids(config.get("eos_token_id"), "eos_token_id", folder / CONFIG)
    ends = json_ids(generation.get("eos_token_id"), "eos_token_id", path)
    merged += [i for i in ends if i not in merged]
    return {**config, "eos_token_id": [*merged] or None}


def from_hf(
    hf_model: TransformersModel, *, key: PRNGKeyArray | None = None, **overrides: object
) -> eqx.Module:
    """A zoo model with the weights of a transformers model object (GPT-2, BERT or MarianMT)."""
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise ImportError(f"from_hf converts torch models and needs torch: {INSTALL_HF}") from error
    config = hf_model.config.to_dict()
    config["architectures"] = [type(hf_model).__name__]
    arrays = state_dict_to_numpy(hf_model.state_dict(), what=type(hf_model).__name__)
    return load_state_dict(
        config, arrays, key=key, what=f"{type(hf_model).__name__} state dict", **overrides
    )


__all__ = ["ARCHITECTURES", "from_hf", "from_pretrained", "load_state_dict"]
