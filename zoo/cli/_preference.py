"""Preference optimisation for `zoo train gpt --objective dpo|ipo|hinge|robust|simpo|orpo`.

The data is rows of `prompt` / `chosen` / `rejected` (`zoo.data.chat.preference`), the task
`zoo.tasks.Preference`. The reference model of the DPO family is, in this order of choice:

- `--precompute-reference`: the reference's log-probabilities are computed once, before
  training, and kept with the data (training then holds one model);
- `--reference RUN_OR_FOLDER`: that model (a zoo run, an HF folder, `hf:NAME`), with the
  same tokenizer as the trained one;
- with `--lora`: the trained model with its adapters off (the frozen base, no second copy);
  when the adapters came with `--init` (a LoRA run) and train further (`--lora-init
  continue`), the model with its adapters at their starting values: the `--init` model, as
  TRL's frozen copy of a `PeftModel`'s adapter (after `--lora-init merge`, the new adapters
  off leave the merged `--init` model);
- otherwise a frozen copy of the starting weights.

`--precompute-reference` combines with `--reference` (whose numbers it stores) and with LoRA
(the base's numbers); the numbers are kept in the run folder for `--resume`
(`zoo.cli._reference_pass`). SimPO and ORPO read no reference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import equinox as eqx

from zoo.cli._data_options import PREFERENCE_OBJECTIVES, DataOptions
from zoo.cli._numbers import ANY, FLIPPED, POSITIVE
from zoo.data.batches import BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.models import GPT, flavor_of

if TYPE_CHECKING:
    from zoo.cli._load import Model
    from zoo.data.chat.preference import PreferenceData, PreferenceDataConfig
    from zoo.data.specs import DatasetDicts
    from zoo.tasks.preference import Preference
    from zoo.tasks.preference_loss import PreferenceLoss


@dataclass(frozen=True, kw_only=True)
class PreferenceOptions:
    """What a preference objective trains or scores with: the loss and its reference model."""

    objective: str  # one of PREFERENCE_OBJECTIVES
    beta: float | None = None  # β (None: the loss's default, 0.1)
    dpo_label_smoothing: float | None = None  # robust: ε, the pairs flipped
    simpo_gamma: float | None = None  # simpo: γ
    reference: str | None = None  # the reference model, a run, folder or hf:NAME
    precompute_reference: bool = False  # its log-probabilities computed once before training


def add_preference_options(parser: argparse.ArgumentParser) -> None:
    """`--beta`, `--reference`, `--precompute-reference`, the losses' own settings and the
    truncation of prompts and answers."""
    group = parser.add_argument_group(
        "preference optimisation (gpt --objective dpo|ipo|hinge|robust|simpo|orpo)"
    )
    group.add_argument(
        "--beta", type=POSITIVE, default=None, help="β (default 0.1; for orpo it is the λ of TRL)"
    )
    group.add_argument(
        "--reference",
        metavar="RUN_OR_FOLDER",
        help="the reference model (default: a frozen copy of the start; with --lora the base)",
    )
    group.add_argument(
        "--precompute-reference",
        action="store_true",
        help="compute the reference's log-probabilities once before training",
    )
    _add_loss_settings(group)


def _add_loss_settings(group: argparse._ArgumentGroup, *, default: str = "") -> None:
    """The losses' own settings and the truncation of prompts and answers, which `zoo train`
    and `zoo eval` share (`default`: how eval says its default, the run's)."""
    group.add_argument("--dpo-label-smoothing", type=FLIPPED, default=None,
                       help=f"robust: ε, the pairs flipped{default}")  # fmt: skip
    group.add_argument("--simpo-gamma", type=ANY, default=None, help=f"simpo: γ (0.5){default}")
    group.add_argument("--max-prompt-len", type=int,
                       help=f"prompt tokens kept (its last ones){default}")  # fmt: skip
    group.add_argument("--max-completion-len", type=int,
                       help=f"answer tokens kept (the first){default}")  # fmt: skip


def preference_options(args: argparse.Namespace) -> PreferenceOptions | None:
    """The preference options of `zoo train`'s flags (None: the objective is no preference
    objective); refuses preference flags without one, and mixes that cannot work."""
    names = ("beta", "reference", "dpo_label_smoothing", "simpo_gamma", "max_prompt_len",
             "max_completion_len")  # fmt: skip
    given = [name for name in names if getattr(args, name, None) is not None]
    if getattr(args, "precompute_reference", False):
        given.append("precompute_reference")
    if getattr(args, "objective", None) not in PREFERENCE_OBJECTIVES:
        if getattr(args, "objective", None) in ("grpo", "reward"):  # checked by its own module
            return None
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} go with --objective {'|'.join(PREFERENCE_OBJECTIVES)}")
        return None
    if args.flavor != "gpt":
        raise ValueError(f"--objective {args.objective} trains a gpt, not a {args.flavor}")
    options = PreferenceOptions(
        objective=args.objective,
        beta=args.beta,
        dpo_label_smoothing=args.dpo_label_smoothing,
        simpo_gamma=args.simpo_gamma,
        reference=args.reference,
        precompute_reference=bool(args.precompute_reference),
    )
    preference_loss(options)  # a bad --beta or ε: refused now
    if options.objective in ("simpo", "orpo") and (
        options.reference or options.precompute_reference
    ):
        raise ValueError(
            f"--objective {options.objective} reads no reference model: drop --reference and "
            "--precompute-reference"
        )
    return options


def preference_loss(options: PreferenceOptions) -> PreferenceLoss:
    """The loss of `options`; its settings are refused where the objective has none."""
    from zoo.tasks.preference_loss import OBJECTIVES, PreferenceLoss

    if options.dpo_label_smoothing is not None and options.objective != "robust":
        raise ValueError("--dpo-label-smoothing is the robust loss's ε: use --objective robust")
    if options.simpo_gamma is not None and options.objective != "simpo":
        raise ValueError("--simpo-gamma is SimPO's margin: use --objective simpo")
    settings: dict[str, float] = {}
    if options.beta is not None:
        settings["beta"] = options.beta
    if options.dpo_label_smoothing is not None:
        settings["label_smoothing"] = options.dpo_label_smoothing
    if options.simpo_gamma is not None:
        settings["gamma"] = options.simpo_gamma
    return PreferenceLoss(kind=OBJECTIVES[options.objective], **settings)


def preference_run_data(dataset: DatasetDicts, flavor: str, options: DataOptions) -> PreferenceData:
    """The train and validation batches, tokenizer and chat template (None for text rows) of a
    dataset of preference rows (`zoo.data.preference_data`), read with `options`."""
    from zoo.data.chat.preference import preference_data

    if flavor == "translator":  # a classifier reads them as a reward model (_reward)
        raise ValueError("preference pairs train a gpt or a reward model, not a translator")
    if options.streaming:
        raise ValueError("preference data is read into memory: drop --streaming")
    tokenizer = options.tokenizer
    data = preference_data(dataset, tokenizer=tokenizer, config=preference_config(options))
    counts = ", ".join(f"{name}: {count} pairs" for name, count in data.counts.items())
    print(f"zoo train: preference data ({data.format}): {counts}", file=sys.stderr)
    return data


def preference_config(options: DataOptions) -> PreferenceDataConfig:
    """How the flags' data options read preference rows (lengths, batches, seed)."""
    from zoo.data.chat.preference import PreferenceDataConfig

    return PreferenceDataConfig(
        max_len=options.max_len,
        max_prompt_len=options.max_prompt_len,
        max_completion_len=options.max_completion_len,
        batch_size=options.batch_size,
        seed=options.seed,
        loss_positions=options.loss_positions,
        special_tokens=options.special_tokens,
    )


def _check_reference_tokenizer(
    spec: str, model: Model, tokenizer: Tokenizer | None, own: Tokenizer | None
) -> None:
    vocab = model.config.vocab_size
    wanted = own.vocab_size if own is not None else None
    if wanted is not None and vocab < wanted:
        raise ValueError(
            f"--reference {spec} has a vocabulary of {vocab} ids, the trained model's tokenizer "
            f"{wanted}: the reference must share the tokenizer"
        )
    if tokenizer is not None and own is not None and tokenizer.vocab_size != own.vocab_size:
        raise ValueError(
            f"--reference {spec}'s tokenizer has {tokenizer.vocab_size} ids, the trained "
            f"model's {own.vocab_size}: the reference must share the tokenizer"
        )


def preference_setup(
    options: PreferenceOptions,
    model: eqx.Module,
    train: BatchSource,
    evaluation: BatchSource | None,
    tokenizer: Tokenizer | None,
    *,
    continued: bool = False,
    out: Path | None = None,
    progress: bool = True,
) -> tuple[Preference, BatchSource, BatchSource | None]:
    """`(task, train batches, eval batches)` of a preference run training `model` on batches
    encoded by `tokenizer`: the loss, and the reference's log-probabilities added to the
    batches or taken from the model with its adapters off (or, `continued`: its adapters
    continue from an `--init` LoRA run, at their starting values).

    Args:
        options: the loss and its reference (`--reference`, `--precompute-reference`).
        model: the model as training starts.
        train: the training pairs.
        evaluation: the held-out pairs (None: none).
        tokenizer: the trained model's tokenizer (a `--reference` must share it).
        continued: `model`'s adapters came with `--init` and train further.
        out: the run folder, where precomputed numbers are kept (None: not kept).
        progress: a progress bar for the reference pass on a terminal.
    """
    from zoo.cli._load import read_model
    from zoo.nn.lora import has_lora
    from zoo.tasks.preference import Preference, adapter_values, adapters_off
    from zoo.tasks.preference_reference import with_reference

    loss = preference_loss(options)
    if not loss.needs_reference:
        return Preference(loss), train, evaluation
    lora = has_lora(model)
    reference: eqx.Module
    if options.reference:
        reference, reference_tokenizer = read_model(options.reference, option="--reference")
        _check_reference_tokenizer(options.reference, reference, reference_tokenizer, tokenizer)
        where = options.reference
    elif lora and continued:  # TRL: a frozen copy of the PeftModel's adapter ("ref")
        where = "the --init model (its LoRA adapters at their starting values)"
        if not options.precompute_reference:
            print(f"zoo train: reference: {where}", file=sys.stderr)
            values = adapter_values(model)
            return (
                Preference(loss, reference="adapters", reference_adapters=values),
                train,
                evaluation,
            )
        reference = model
    elif lora:
        if not options.precompute_reference:
            print("zoo train: reference: the base with the LoRA adapters off", file=sys.stderr)
            return Preference(loss, reference="adapters"), train, evaluation
        reference, where = adapters_off(model), "the base (LoRA adapters off)"
    else:
        reference, where = model, "a frozen copy of the starting weights"
    if not isinstance(reference, GPT):
        raise TypeError(f"preference training trains a GPT, got {type(reference).__name__}")
    precompute = options.precompute_reference
    how = "precomputed once" if precompute else "on the fly"
    print(f"zoo train: reference: {where}, {how}", file=sys.stderr)
    if precompute:
        from zoo.cli._reference_pass import precomputed

        splits = {"train": train} | ({} if evaluation is None else {"validation": evaluation})
        done = precomputed(splits, reference, out=out, progress=progress)
        return Preference(loss), done["train"], done.get("validation")
    train = with_reference(train, reference)
    if evaluation is not None:
        evaluation = with_reference(evaluation, reference)
    return Preference(loss), train, evaluation


# -- zoo eval on preference pairs ------------------------------------------------------------------


def add_eval_options(parser: argparse.ArgumentParser) -> None:
    """`zoo eval`'s `--objective`, `--beta`, `--reference`, the losses' settings and the
    truncation of prompts and answers for preference pairs, with `zoo train`'s meaning (by
    default those the run recorded)."""
    group = parser.add_argument_group("preference pairs (prompt/chosen/rejected rows)")
    group.add_argument("--objective", choices=PREFERENCE_OBJECTIVES, help="default: the run's")
    group.add_argument("--beta", type=POSITIVE, help="default: the run's, else 0.1")
    group.add_argument(
        "--reference",
        metavar="RUN_OR_FOLDER",
        help="the reference model (default: the run's --reference, else its --init)",
    )
    _add_loss_settings(group, default="; default: the run's")


def eval_preference_options(
    args: argparse.Namespace, record: Mapping[str, object]
) -> PreferenceOptions:
    """The loss `zoo eval` scores pairs with: its flags, else those of the run's `record` (its
    `train_args.json`); the reference is `--reference`, else the run's, else its `--init`."""
    from zoo.cli._run_dir import recorded_float, recorded_str

    recorded = recorded_str(record, "objective")
    objective = args.objective or recorded
    objective = objective if objective in PREFERENCE_OBJECTIVES else "dpo"

    def setting(name: str) -> float | None:  # the run's ε or γ belongs to the run's loss only
        given = getattr(args, name, None)
        if given is not None or objective != recorded:
            return given
        return recorded_float(record, name)

    return PreferenceOptions(
        objective=objective,
        beta=args.beta if args.beta is not None else recorded_float(record, "beta"),
        dpo_label_smoothing=setting("dpo_label_smoothing"),
        simpo_gamma=setting("simpo_gamma"),
        reference=args.reference
        or recorded_str(record, "reference")
        or recorded_str(record, "init"),
    )


def is_preference_data(dataset: DatasetDicts, split: str) -> bool:
    """Whether the split (else train) has the `chosen` and `rejected` columns of pairs."""
    from zoo.data.checks import column_names

    part = dataset[split] if split in dataset else dataset.get("train")
    return part is not None and {"chosen", "rejected"} <= set(column_names(part))


def evaluate_pairs(
    model: Model,
    tokenizer: Tokenizer,
    dataset: DatasetDicts,
    *,
    options: PreferenceOptions,
    config: PreferenceDataConfig,
    split: str,
    progress: bool = False,
) -> dict[str, object]:
    """The preference metrics of `model` on the pairs of `split` (`config.validation_split`,
    or those training held out): the loss and TRL's `rewards/*` and `logps/*`
    (`zoo.tasks.Preference`), the split's name first. With `progress`, a bar (or lines in a
    log) counts the batches of pairs (process 0's)."""
    from zoo.cli._load import read_model
    from zoo.data.chat.preference import preference_data
    from zoo.distributed.hosts import is_writer
    from zoo.progress import Progress
    from zoo.tasks.preference import Preference
    from zoo.tasks.preference_reference import with_reference
    from zoo.train.evaluation import evaluate
    from zoo.train.step import make_eval_step

    loss = preference_loss(options)
    data = preference_data(dataset, tokenizer=tokenizer, config=config)
    if data.validation is None:
        raise ValueError(f"--split {split}: no preference pairs to evaluate")
    batches = data.validation
    if loss.needs_reference:
        if not options.reference:
            raise ValueError(
                f"--objective {options.objective} compares with a reference model: name it "
                "with --reference RUN_OR_FOLDER (the run records none: it had no --init)"
            )
        reference, _ = read_model(options.reference, option="--reference")
        if not isinstance(reference, GPT):
            raise ValueError(
                f"--reference {options.reference} holds a {flavor_of(reference)}, not a GPT: "
                "name a run or folder of the model's family"
            )
        batches = with_reference(batches, reference)
    task = Preference(loss)
    shown = Progress(total=len(batches), description="zoo eval", unit="batches",
                     enabled=progress and is_writer())  # fmt: skip
    with shown:
        result = evaluate(task, make_eval_step(task), model, batches, progress=shown)
    name = next(name for name in data.counts if name != config.train_split)
    return {
        "split": name,
        "objective": options.objective,
        "reference": options.reference if loss.needs_reference else None,
        "pairs": result["scored"],
        "loss": result["loss"],
        **result["metrics"],
    }
