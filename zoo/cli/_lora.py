"""`zoo train --lora rank=8,alpha=16,targets=attention [--merge]`: the spec, the adapted model
and optimizer, and the run's outputs (`zoo.lora` does the work)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
from jaxtyping import PRNGKeyArray

from zoo.data.tokenizers.base import Tokenizer
from zoo.train.optim import Optimizer, OptimizerLike

ADAPTER_DIR = "adapter"


@dataclass(frozen=True)
class LoRASpec:
    rank: int = 8  # adapter rank r
    alpha: float = 16.0  # scale alpha / r
    targets: tuple[str, ...] = ("attention",)  # groups or Linear path patterns
    train: tuple[str, ...] | None = None  # path prefixes trained whole (None: the flavor's default)
    dropout: float = 0.0  # share of each adapter's inputs dropped in training (PEFT's lora_dropout)


def parse_lora(spec: str) -> LoRASpec:
    """`"rank=8,alpha=16,dropout=0.05,targets=attention,feedforward,train=head"` -> `LoRASpec`.

    A piece without `=` continues the list of the key before it (`targets=query_proj,value_proj`).
    """
    values: dict[str, list[str]] = {}
    last = None
    for piece in (p.strip() for p in spec.split(",")):
        if not piece:
            continue
        name, separator, value = piece.partition("=")
        if not separator:
            if last is None or last not in ("targets", "train"):
                raise ValueError(
                    f"--lora {spec!r}: {piece!r} is not KEY=VALUE; write e.g. "
                    "rank=8,alpha=16,targets=attention"
                )
            values[last].append(piece)
            continue
        name = name.strip()
        if name not in ("rank", "alpha", "dropout", "targets", "train"):
            raise ValueError(
                f"--lora {spec!r}: unknown key {name!r}; keys are rank, alpha, dropout, targets, "
                "train"
            )
        values[name] = [value.strip()]
        last = name
    try:
        rank = int(values["rank"][0]) if "rank" in values else 8
        alpha = float(values["alpha"][0]) if "alpha" in values else 2.0 * rank
    except ValueError:
        raise ValueError(
            f"--lora {spec!r}: rank is an integer and alpha a number (rank=8,alpha=16)"
        ) from None
    dropout = _dropout(values["dropout"][0], spec) if "dropout" in values else 0.0
    targets = tuple(values.get("targets", ["attention"]))
    train = tuple(v for v in values["train"] if v and v != "none") if "train" in values else None
    return LoRASpec(rank, alpha, targets, train, dropout)


def _dropout(text: str, spec: str) -> float:
    """`dropout=` of `--lora`: a finite share in [0, 1)."""
    try:
        dropout = float(text)
    except ValueError:
        dropout = float("nan")
    if not 0.0 <= dropout < 1.0:  # nan fails too
        raise ValueError(
            f"--lora {spec!r}: dropout={text} is not a share in [0, 1); e.g. dropout=0.05"
        )
    return dropout


def trained_prefixes(spec: LoRASpec, flavor: str, fresh: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What trains whole beside the adapters, unless `train=` says: a classifier's head, and
    the parts started fresh (`fresh`: the pooler of an encoder pretrained with masked LM, a
    reward model's score head, which PEFT trains whole too)."""
    if spec.train is not None:
        return spec.train
    if flavor != "classifier":
        return tuple(part for part in fresh if part == "score")
    return ("head", *(part for part in fresh if part != "head"))


def with_lora(
    model: eqx.Module,
    optimizer: OptimizerLike,
    spec: LoRASpec,
    *,
    train: tuple[str, ...],
    quantize: str | None,
    key: PRNGKeyArray,
) -> tuple[eqx.Module, Optimizer]:
    """The model with adapters (and an int8 base with `quantize`) and the optimizer restricted
    to them and to the parts `train` names."""
    from zoo.lora.adapters import adapter_arrays, apply, check_train, only_adapters
    from zoo.lora.quantized import quantize as quantized
    from zoo.lora.targets import OUTPUT_LAYERS
    from zoo.presets import count_params

    model = apply(model, rank=spec.rank, alpha=spec.alpha, targets=spec.targets,
                  dropout=spec.dropout, key=key)  # fmt: skip
    check_train(model, train)
    if quantize:  # layers trained whole (a classifier's head) stay float
        model = quantized(model, quantize, skip=(*OUTPUT_LAYERS, *train))
    total = sum(leaf.size for leaf in adapter_arrays(model, train).values())
    print(f"zoo train: LoRA trains {total:,} of {count_params(model):,} parameters",
          file=sys.stderr)  # fmt: skip
    return model, only_adapters(optimizer, train=train)


def base_model_name(init: str | None, preset: str | None) -> str | None:
    """`base_model_name_or_path` of the run's PEFT adapter: the hub id of a base read from the
    hub (`--init hf:NAME`, or a folder of the hub's download cache), else the base folder's
    absolute path (so that the adapter finds it from anywhere), else the preset's name."""
    from zoo.cli._load import HUB

    if init is None:
        return preset
    if init.startswith(HUB):
        return init.removeprefix(HUB)
    path = Path(init).expanduser()
    if not path.exists():  # a bare hub name (--init gpt2), read from the hub
        return init
    path = path.resolve()
    # the hub's cache keeps org/name as .../models--org--name/snapshots/REVISION
    cache, snapshots = path.parent.parent.name, path.parent.name
    if snapshots == "snapshots" and cache.startswith("models--"):
        return cache.removeprefix("models--").replace("--", "/")
    return str(path)


def finish_run(
    model: eqx.Module,
    out: Path,
    *,
    train: tuple[str, ...],
    merge: bool,
    base_model: str | None,
    tokenizer: Tokenizer | None,
) -> dict[str, str]:
    """Write `out/adapter/` (PEFT) and, with `merge`, the merged model over `out/model.safetensors`."""
    from zoo.interop.architecture import UnsupportedExport
    from zoo.lora.adapters import merge as merged
    from zoo.lora.peft import save_adapter
    from zoo.serialize import read_config, save

    written: dict[str, str] = {}
    try:
        adapter = save_adapter(model, out / ADAPTER_DIR, train=train, base_model=base_model)
        written["adapter"] = str(adapter)
    except (UnsupportedExport, ValueError) as error:
        print(f"zoo train: no PEFT adapter/ written: {error}", file=sys.stderr)
    if merge:
        training = read_config(out)[1].get("training")
        save(merged(model), out, tokenizer=tokenizer, extra={"training": training})
        written["merged"] = str(out)
    return written
