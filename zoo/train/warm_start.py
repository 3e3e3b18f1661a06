"""Starting training from trained weights: a zoo model directory or a HuggingFace checkpoint.

`load_init(path)` reads a directory written by `zoo.save` / `zoo train` (its `config.json`
names a zoo flavor), else hands the path or hub name to `zoo.from_pretrained`. `with_classes`
gives a classifier a new, freshly initialised head when the data has another number of classes;
`without_masked_lm` turns an encoder pretrained with a masked-LM head into a classifier.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PRNGKeyArray

from zoo.models import flavor_of as zoo_flavor
from zoo.serialize import is_zoo_folder
from zoo.tree import path_name

logger = logging.getLogger(__name__)
GPT2_VOCAB_SIZE = 50257  # GPT-2's BPE vocabulary: tiktoken's gpt2 encoding, no files needed


def load_init(path: str) -> tuple[eqx.Module, Any]:
    """`(model, tokenizer or None)` from a zoo directory, a HF checkpoint folder or a hub name."""
    import zoo
    from zoo.serialize import load_with_tokenizer

    folder = Path(path)
    if folder.is_dir() and is_zoo_folder(folder):
        return load_with_tokenizer(folder)
    if folder.is_dir():
        model = zoo.from_pretrained(str(folder))
        return model, folder_tokenizer(folder, model)
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1 or folder.suffix
    if looks_local or folder.exists():
        raise FileNotFoundError(
            f"--init {path}: no such model directory; pass a directory written by `zoo train` "
            "or `zoo.save`, a HuggingFace checkpoint folder, or a hub name such as gpt2"
        )
    return zoo.from_pretrained(path, return_tokenizer=True)


def folder_tokenizer(folder: Path, model: eqx.Module) -> Any:
    """The tokenizer of a HuggingFace checkpoint folder, None when it has no tokenizer files.

    GPT-2's own vocabulary needs no files (it is tiktoken's gpt2 encoding); any other model
    without them gets None rather than a tokenizer guessed by `transformers`.
    """
    from zoo.data.tokenizer import TOKENIZER_FILE
    from zoo.interop.files import TOKENIZER_PATTERNS
    from zoo.interop.tokenizer import pretrained_tokenizer

    patterns = [*TOKENIZER_PATTERNS, TOKENIZER_FILE]
    has_files = any(next(folder.glob(pattern), None) is not None for pattern in patterns)
    config = model.config  # type: ignore[attr-defined]
    gpt2_vocabulary = zoo_flavor(model) == "gpt" and config.vocab_size == GPT2_VOCAB_SIZE
    return pretrained_tokenizer(folder) if has_files or gpt2_vocabulary else None


def with_classes(model: eqx.Module, num_classes: int, *, key: PRNGKeyArray) -> eqx.Module:
    """`model` with `num_classes` outputs: the same weights, a new head if the count differs."""
    config = model.config  # type: ignore[attr-defined]
    if config.num_classes == num_classes:
        return model
    logger.warning(
        "the data has %d classes and the initial model %d: the classification head is "
        "re-initialised (every other weight is kept)",
        num_classes,
        config.num_classes,
    )
    return _transplant(model, config.replace(num_classes=num_classes), ("head",), key=key)


def without_masked_lm(model: eqx.Module, *, key: PRNGKeyArray) -> eqx.Module:
    """The classifier of an encoder pretrained with a masked-LM head: the same embeddings and
    layers, the masked-LM head dropped, and a classification head (and pooler) started fresh,
    since masked-LM pretraining never trains them."""
    config = model.config.replace(masked_lm=False)  # type: ignore[attr-defined]
    return _transplant(model, config, ("head", "pooler"), key=key)


def _transplant(
    model: eqx.Module, config: Any, fresh_parts: tuple[str, ...], *, key: PRNGKeyArray
) -> eqx.Module:
    """A model of `config` holding `model`'s weights, except the parts named (fresh from `key`)."""
    import zoo

    fresh = zoo.presets.build(config, key=key)
    old_leaves = {
        path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(model)[0]
    }
    paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(fresh)
    leaves = [
        leaf if path_name(path).startswith(fresh_parts) else old_leaves[path_name(path)]
        for path, leaf in paths_and_leaves
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)
