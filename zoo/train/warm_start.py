"""Starting training from trained weights that do not fit the new task as they are.

`with_classes` gives a classifier a new, freshly initialised head when the data has another
number of classes; `without_masked_lm` turns an encoder pretrained with a masked-LM head into a
classifier. (`zoo train --init` loads the weights with `zoo.cli._load.load_model`.)
"""

from __future__ import annotations

import logging

import jax
from jaxtyping import PRNGKeyArray

from zoo.models.classifier import Classifier
from zoo.models.config import TransformerConfig
from zoo.presets import build
from zoo.tree import path_name

logger = logging.getLogger(__name__)


def with_classes(model: Classifier, num_classes: int, *, key: PRNGKeyArray) -> Classifier:
    """`model` with `num_classes` outputs: the same weights, a new head if the count differs."""
    config = model.config
    if config.num_classes == num_classes:
        return model
    logger.warning(
        "the data has %d classes and the initial model %d: the classification head is "
        "re-initialised (every other weight is kept)",
        num_classes,
        config.num_classes,
    )
    return _transplant(model, config.replace(num_classes=num_classes), ("head",), key=key)


def without_masked_lm(model: Classifier, *, key: PRNGKeyArray) -> Classifier:
    """The classifier of an encoder pretrained with a masked-LM head: the same embeddings and
    layers, the masked-LM head dropped, and a classification head (and pooler) started fresh,
    since masked-LM pretraining never trains them."""
    config = model.config.replace(masked_lm=False)
    return _transplant(model, config, ("head", "pooler"), key=key)


def _transplant(
    model: Classifier,
    config: TransformerConfig,
    fresh_parts: tuple[str, ...],
    *,
    key: PRNGKeyArray,
) -> Classifier:
    """A model of `config` holding `model`'s weights, except the parts named (fresh from `key`)."""
    fresh = build(config, key=key)
    assert isinstance(fresh, Classifier)  # a classifier's config builds a classifier
    old_leaves = {
        path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(model)[0]
    }
    paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(fresh)
    leaves = [
        leaf if path_name(path).startswith(fresh_parts) else old_leaves[path_name(path)]
        for path, leaf in paths_and_leaves
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)
