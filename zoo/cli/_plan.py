"""What `zoo train`'s flags decide, as records: `plan(args)` is the one place that reads the
`argparse.Namespace` of `zoo train`, and the `TrainPlan` it returns is all the run reads.

The flags are checked (alone and together), the preset's defaults fill the options left out
(`fill_defaults`), and each group becomes its record: the model (`ModelChoice`), the data
(`DataOptions`), the objective (`Objective`, with its `PreferenceOptions`), the optimizer, the
training loop (`LoopSettings`) and, for the run's own record, every option by name
(`RunFlags`, what `train_args.json` and `train_config.yaml` hold). Nothing is read or written.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import jax
from jax.sharding import Mesh

from zoo.cli._build import ModelChoice, Objective, check_preset
from zoo.cli._chat_data import check_chat_flags
from zoo.cli._config_file import FlagValue, RunFlags, required_options
from zoo.cli._data_options import DataOptions
from zoo.cli._grpo import GRPOOptions, grpo_options
from zoo.cli._lora import LoRASpec, parse_lora
from zoo.cli._mixing import data_specs
from zoo.cli._preference import PreferenceOptions, preference_options
from zoo.cli._reward import check_reward_flags
from zoo.cli._run_dir import check_out_dir, run_buckets, run_group_by_length, run_loss_positions
from zoo.distributed.hosts import is_writer
from zoo.distributed.mesh import as_mesh
from zoo.train.defaults import Default, training_defaults
from zoo.train.freeze import parse_freeze
from zoo.train.optim import Optimizer, adamw
from zoo.train.plot import check_matplotlib
from zoo.train.settings import LoopSettings

# namespace entries that are no option of the run: the command's function
NOT_FLAGS = ("run",)


@dataclass(frozen=True)
class TrainPlan:
    """Everything `zoo train` decides from its flags, before it reads data or writes a file."""

    model: ModelChoice  # --preset or --init, --set, --tokenizer
    data: str | tuple[str, ...]  # --data: one spec, or several to mix
    data_options: DataOptions  # how --data becomes batches (--batch-size, --max-len, chat, ...)
    objective: Objective  # --objective and the options of its loss
    flags: RunFlags  # every option by name, defaults filled: the run's record of its flags
    out: Path  # --out, the run folder
    filled: dict[str, Default]  # the options the preset's defaults filled (reported)
    steps: int | None  # optimizer updates in all (None: --epochs decides, see `with_epochs`)
    seed: int
    resume: bool
    # adamw of --lr, --warmup, --schedule, ...; before --freeze or --lora (None with steps)
    optimizer: Optimizer | None
    freeze_spec: str | None  # --freeze, checked
    lora: LoRASpec | None  # --lora, parsed
    quantize: str | None  # --quantize (with --lora)
    merge: bool  # --merge (with --lora)
    lora_init: str | None  # --lora-init continue|merge (with --lora; None: continue)
    loop: LoopSettings  # --log-every, --eval-every, --eval-limit, --checkpoint-every, --keep, ...
    precision: str
    accumulate: int
    mesh: Mesh | None  # --mesh
    plot: bool
    print_json: bool  # --json: the summary as JSON on stdout
    show_data: int | None = None  # --show-data N: show the chat data and exit
    sample_every: int | None = None  # --sample-every N: sample replies to held-out prompts
    epochs: int | None = None  # --epochs N: passes over the training data, instead of --steps


def plan(args: argparse.Namespace) -> TrainPlan:
    """Check the flags of `args` and decide the run; raises ValueError (or ImportError for a
    missing extra) for a flag, or a mix of flags, that cannot work. `args` is left as it is."""
    args = argparse.Namespace(**vars(args))
    required_options(args, ("data",) if getattr(args, "show_data", None) else ("data", "out"))
    args.data = data_specs(args.data)
    _check_length(args)
    args.set = remat_settings(args)
    check_chat_flags(args)
    check_preset(args.flavor, args.preset, args.init, objective=args.objective)
    check_reward_flags(args)  # --objective reward and its flags
    preference = preference_options(args)  # --objective dpo|... and its flags
    grpo = grpo_options(args)  # --objective grpo and its flags
    mesh = as_mesh(args.mesh) if args.mesh else None  # one that does not fit: before any work
    if args.plot:
        check_matplotlib()  # before training, not after it
    out = check_out_dir(args.out) if args.out is not None else Path()  # --show-data: unused
    tokenizer_given = args.tokenizer is not None  # before the preset's default fills it
    args.buckets = run_buckets(args.buckets, out, resume=args.resume)
    args.loss_positions = run_loss_positions(out, resume=args.resume)
    args.group_by_length = run_group_by_length(args.group_by_length, out, resume=args.resume)
    filled = fill_defaults(args, args.preset or "", args.flavor)
    return TrainPlan(
        model=ModelChoice(
            flavor=args.flavor,
            preset=args.preset,
            init=args.init,
            settings=tuple(args.set),
            tokenizer=args.tokenizer,
            tokenizer_given=tokenizer_given,
        ),
        data=args.data if isinstance(args.data, str) else tuple(args.data),
        data_options=DataOptions.from_args(args),
        objective=_objective(args, preference, grpo),
        flags=_flags(args),
        out=out,
        filled=filled,
        steps=args.steps,
        seed=args.seed,
        resume=args.resume,
        optimizer=None if args.steps is None else run_optimizer(vars(args), args.steps),
        freeze_spec=_freeze_spec(args),
        lora=_lora_spec(args),
        quantize=args.quantize,
        merge=args.merge,
        lora_init=getattr(args, "lora_init", None),
        loop=LoopSettings(
            log_every=args.log_every,
            eval_every=args.eval_every,
            eval_limit=args.eval_limit,
            checkpoint_every=args.checkpoint_every,
            keep=args.keep,
            progress=not args.no_progress,
            loggers=args.log,  # a logger's missing package is named here
        ),
        precision=args.precision,
        accumulate=args.accumulate,
        mesh=mesh,
        plot=args.plot,
        print_json=args.json,
        show_data=getattr(args, "show_data", None),
        sample_every=getattr(args, "sample_every", None),
        epochs=args.epochs,
    )


def fill_defaults(args: argparse.Namespace, preset: str, flavor: str) -> dict[str, Default]:
    """Set every option of `args` still None to the preset's default (`zoo.train.defaults`);
    returns the values it filled."""
    filled: dict[str, Default] = {}
    for name, value in training_defaults(preset, flavor).items():
        if name == "steps" and getattr(args, "epochs", None) is not None:
            continue  # the epochs decide, once the data is read (`with_epochs`)
        if getattr(args, name, None) is None and value is not None:
            setattr(args, name, value)
            filled[name] = value
        elif not hasattr(args, name):
            setattr(args, name, value)
    if args.steps is not None and "steps" not in filled:
        _shorter_warmup(args.steps, filled, args)
    return filled


def _shorter_warmup(steps: int, filled: dict[str, Default], args: argparse.Namespace) -> None:
    """Keep the warmup of a short run asked for by --steps or --epochs a tenth of it, where the
    preset's default warmup would outlast it (`args` and `filled` are changed)."""
    if "warmup" in filled and args.warmup >= steps:
        args.warmup = filled["warmup"] = max(1, steps // 10)


def run_optimizer(flags: RunFlags, steps: int) -> Optimizer:
    """The optimizer of a run of `steps` updates with the options of `flags`: AdamW of `--lr`,
    `--warmup`, `--schedule`, `--weight-decay` and `--clip-norm` (0: no clipping)."""
    return adamw(
        _number(flags["lr"]),
        warmup=int(_number(flags["warmup"])),
        schedule=None if flags["schedule"] is None else str(flags["schedule"]),
        total_steps=steps,
        weight_decay=_number(flags["weight_decay"]),
        clip_norm=_number(flags["clip_norm"]) or None,
    )


def _number(value: FlagValue) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")  # the parser gave numbers
    return float(value)


def with_epochs(plan: TrainPlan, batches_per_epoch: int) -> TrainPlan:
    """`plan` of a run of `--epochs N` with its steps and optimizer decided: N passes over the
    training data's `batches_per_epoch` batches (one optimizer step each), said in one line."""
    if plan.epochs is None or plan.steps is not None:
        return plan
    steps = plan.epochs * batches_per_epoch
    args = argparse.Namespace(**plan.flags)
    filled = dict(plan.filled)
    _shorter_warmup(steps, filled, args)
    flags = {**plan.flags, "steps": steps, "warmup": args.warmup}
    warmup = f", warmup {args.warmup}" if filled.get("warmup") != plan.filled.get("warmup") else ""
    if is_writer():
        print(f"zoo train: --epochs {plan.epochs}: {batches_per_epoch} batches of "
              f"{plan.flags['batch_size']} an epoch, so {steps} steps{warmup}", file=sys.stderr)  # fmt: skip
    return replace(plan, steps=steps, optimizer=run_optimizer(flags, steps), flags=flags,
                   filled=filled)  # fmt: skip


def _check_length(args: argparse.Namespace) -> None:
    """`--epochs` or `--steps`, not both (a `--config` file's is replaced by the command line's)."""
    if args.epochs is not None and args.steps is not None:
        raise ValueError(
            f"--epochs {args.epochs} and --steps {args.steps} both say how long to train: give "
            "one (with --epochs the steps follow from the data's size and --batch-size)"
        )
    if args.epochs is not None and getattr(args, "streaming", False):
        raise ValueError(
            "--epochs counts the batches of the training data, which --streaming reads "
            "without counting them: give --steps"
        )


def remat_settings(args: argparse.Namespace) -> list[str]:
    """`--set` with `remat=full` added for `--gradient-checkpointing` (its spelling as a flag);
    a `--set remat=` that says otherwise is refused."""
    settings = list(args.set)
    if not getattr(args, "gradient_checkpointing", False):
        return settings
    for setting in settings:
        name, _, value = setting.partition("=")
        if name.strip() == "remat" and value.strip().strip('"') != "full":
            raise ValueError(
                f"--gradient-checkpointing is --set remat=full, and --set {setting} asks for "
                "another: give one of them"
            )
    if not any(setting.partition("=")[0].strip() == "remat" for setting in settings):
        settings.append("remat=full")
    return settings


def _objective(
    args: argparse.Namespace, preference: PreferenceOptions | None, grpo: GRPOOptions | None
) -> Objective:
    """`--objective` and the options of its loss."""
    return Objective(
        name=args.objective,
        label_smoothing=args.label_smoothing,
        mask_rate=args.mask_rate,
        whole_word_masking=args.whole_word_masking,
        preference=preference,
        grpo=grpo,
        center_rewards=getattr(args, "center_rewards_coefficient", None),
    )


def _flags(args: argparse.Namespace) -> dict[str, FlagValue]:
    """Every option of `args` by its name (the preset's defaults filled): the run's record."""
    return {
        name: value
        for name, value in vars(args).items()
        if name not in NOT_FLAGS and not name.startswith("_")
    }


def _freeze_spec(args: argparse.Namespace) -> str | None:
    """`--freeze`, parsed once to refuse a bad spec now (it is applied to the built model)."""
    if not args.freeze:
        return None
    if args.lora:
        raise ValueError("--lora trains only the adapters already; leave out --freeze")
    parse_freeze(args.freeze)
    return args.freeze


def _lora_spec(args: argparse.Namespace) -> LoRASpec | None:
    """`--lora`, parsed; `--merge` and `--quantize` only go with it."""
    if not args.lora:
        if getattr(args, "lora_init", None):
            raise ValueError(
                "--lora-init continue|merge says how --lora goes on from the adapters of a LoRA "
                "run given to --init: use it with --lora"
            )
        if args.merge:
            raise ValueError("--merge folds LoRA adapters into the weights: use it with --lora")
        if args.quantize:
            raise ValueError(
                "--quantize stores the frozen base of LoRA adapters: use it with --lora"
            )
        return None
    if jax.process_count() > 1:
        raise ValueError(
            "--lora trains on one process for now; run it without --num-processes / "
            "--distributed (a mesh over one process's devices works)"
        )
    return parse_lora(args.lora)
