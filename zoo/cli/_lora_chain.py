"""`zoo train --init LORA_RUN --lora SPEC [--lora-init continue|merge]`: training on from a
run whose model already has LoRA adapters (`zoo.lora.chain` does the work)."""

from __future__ import annotations

import sys

import equinox as eqx
from jaxtyping import PRNGKeyArray

from zoo.cli._lora import LoRASpec, with_lora
from zoo.train.optim import Optimizer, OptimizerLike


def chained_lora(
    model: eqx.Module,
    optimizer: OptimizerLike,
    spec: LoRASpec,
    *,
    mode: str,
    init: str | None,
    train: tuple[str, ...],
    quantize: str | None,
    key: PRNGKeyArray,
) -> tuple[eqx.Module, Optimizer]:
    """The adapted model and its optimizer, from `model` (with adapters) by `mode`.

    Args:
        model: the `--init` model, with the adapters its run trained.
        optimizer: the optimizer of the whole model, restricted here to the adapters.
        spec: `--lora`: with "continue" it must name the model's own adapters.
        mode: `--lora-init`: "continue" or "merge" (`zoo.lora.chain`).
        init: `--init`, named in the line that says what happens.
        train: parts trained whole beside the adapters (`trained_prefixes`).
        quantize: `--quantize`: the frozen base's storage.
        key: draws new adapters ("merge").
    """
    from zoo.lora.adapters import adapter_arrays, merge, only_adapters
    from zoo.lora.chain import adapter_summary, check_continues
    from zoo.lora.quantized import quantize as quantized
    from zoo.lora.targets import OUTPUT_LAYERS
    from zoo.nn.quantized import quantized_paths
    from zoo.presets import count_params

    held = adapter_summary(model)
    if mode == "merge":
        print(f"zoo train: --init {init} has LoRA adapters ({held}): merged into the base, new "
              "adapters start on top (--lora-init merge)", file=sys.stderr)  # fmt: skip
        return with_lora(merge(model), optimizer, spec, train=train, quantize=quantize, key=key)
    print(f"zoo train: --init {init} has LoRA adapters ({held}): they train further "
          "(--lora-init continue, as TRL does with a PeftModel; --lora-init merge folds them "
          "into the base and starts new ones)", file=sys.stderr)  # fmt: skip
    check_continues(model, rank=spec.rank, alpha=spec.alpha, targets=spec.targets,
                    merge_instead="--lora-init merge")  # fmt: skip
    if quantize and quantized_paths(model):
        print(f"zoo train: the base of --init {init} is int8 already: --quantize {quantize} "
              "changes nothing", file=sys.stderr)  # fmt: skip
    elif quantize:
        model = quantized(model, quantize, skip=(*OUTPUT_LAYERS, *train))
    total = sum(leaf.size for leaf in adapter_arrays(model, train).values())
    print(f"zoo train: LoRA trains {total:,} of {count_params(model):,} parameters",
          file=sys.stderr)  # fmt: skip
    return model, only_adapters(optimizer, train=train)
