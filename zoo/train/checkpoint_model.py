"""The model of a run that stopped before it saved one: a run ended by SIGTERM or Ctrl-C leaves
checkpoints only. `newest_checkpoint_model` rebuilds the model of its newest intact
checkpoint from the config that checkpoint's `state.json` records, without the optimizer or
the run's code, for the commands that read a run folder (`zoo chat`, `zoo eval`, `zoo export`).
"""

from __future__ import annotations

import os
from pathlib import Path

import equinox as eqx
import jax

from zoo.models import FLAVORS, TransformerConfig
from zoo.presets import build
from zoo.train.checkpoint import MODEL_FILE, read_arrays
from zoo.train.checkpoint_folder import (
    CorruptCheckpoint,
    list_checkpoints,
    read_state,
    verify_checksums,
)
from zoo.train.frozen import FROZEN
from zoo.train.sharded import ARRAYS_DIR, is_sharded_checkpoint, load_arrays
from zoo.tree import fill

CHECKPOINTS = "checkpoints"  # a run folder's checkpoint folder, as `zoo train` names it


def newest_checkpoint_model(run: str | os.PathLike) -> tuple[eqx.Module, Path] | None:
    """`(model, checkpoint path)` of the newest intact checkpoint in `run/checkpoints`; None
    when the folder holds no checkpoint. Damaged checkpoints are passed over (and left where
    they are); a ValueError when none is intact."""
    found = list_checkpoints(Path(run) / CHECKPOINTS)
    if not found:
        return None
    damaged = []
    for _, path in reversed(found):
        try:
            return checkpoint_model(path), path
        except CorruptCheckpoint as error:
            damaged.append(f"{path.name}: {error}")
    raise ValueError(f"no intact checkpoint in {Path(run) / CHECKPOINTS} ({'; '.join(damaged)})")


def checkpoint_model(path: str | os.PathLike) -> eqx.Module:
    """The model held by checkpoint `path`, built from the config it records. A checkpoint of
    the trained arrays alone (LoRA, frozen parameters) is refused: its frozen rest is the
    run's starting model, which only the run itself rebuilds."""
    path = Path(path)
    meta, _, _ = read_state(path)
    if FROZEN in meta:
        raise ValueError(
            f"checkpoint {path} holds only the arrays its run trained (LoRA adapters or "
            "unfrozen parameters), not a whole model; let the run finish (zoo train with the "
            "same flags and --resume) so that it saves its model"
        )
    flavor, fields = meta.get("flavor"), meta.get("config")
    if not isinstance(flavor, str) or flavor not in FLAVORS or not isinstance(fields, dict):
        raise CorruptCheckpoint(f"its state.json names no model (flavor {flavor!r} and config)")
    config_class = FLAVORS[flavor][0]
    assert issubclass(config_class, TransformerConfig)  # every flavor's config is one
    config = config_class.from_dict(fields)
    skeleton = eqx.filter_eval_shape(lambda: build(config, key=jax.random.key(0)))
    if is_sharded_checkpoint(path):
        return fill(skeleton, load_arrays(path)["model"], str(path / ARRAYS_DIR))
    arrays = read_arrays(path / MODEL_FILE)
    verify_checksums(path, meta)
    return fill(skeleton, arrays, str(path / MODEL_FILE))
