"""`zoo train FLAVOR --preset NAME --data SPEC --steps N --out DIR`: train, checkpoint, resume.

Writes `DIR/metrics.jsonl`, checkpoints under `DIR/checkpoints/` and the final model (with its
tokenizer) in `DIR/`, loadable with `zoo.load(DIR)`. `--resume` continues from the newest
checkpoint exactly where it stopped. Data comes from `--data SCHEME:REST` (`resolve_data`, a
new scheme registers with `data_scheme`; see `zoo.cli._datasets`). Options left out come from
the preset's row in `zoo.train.defaults`; `--init` and `--freeze` fine-tune, `--lora` adapts.

Read in this order: `register` (the flags), `run` = `execute(plan(args))`, `plan` (what the
flags decide, a `TrainPlan` of records; nothing is read or written yet: `zoo.cli._plan`),
`execute` (the run folder held, checked and recorded, the model built, trained and reported).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import equinox as eqx
import jax

from zoo.cli import _preference
from zoo.cli._build import Built, build_model, make_task
from zoo.cli._chat_data import add_chat_options, positive_int
from zoo.cli._compile_cache import add_compile_cache_option, use_compile_cache
from zoo.cli._config_file import enable_config_file
from zoo.cli._datasets import RunData, add_data_options, data_scheme, resolve_data
from zoo.cli._grpo import GRPORun, add_grpo_options, grpo_setup
from zoo.cli._lora import base_model_name, finish_run, trained_prefixes, with_lora
from zoo.cli._lora_chain import chained_lora
from zoo.cli._mesh import add_mesh_option
from zoo.cli._mixing import Datasets
from zoo.cli._numbers import CLIP_NORM, NON_NEGATIVE, POSITIVE, RATE, SHARE
from zoo.cli._plan import TrainPlan, fill_defaults, plan, with_epochs
from zoo.cli._reward import OBJECTIVE, add_reward_options, reward_model, reward_task
from zoo.cli._run_dir import check_resume, record_run, resumed_tokenizer
from zoo.cli._samples import with_samples
from zoo.data.tokenizers.base import Tokenizer
from zoo.distributed.hosts import is_writer
from zoo.lora.chain import DEFAULT_LORA_INIT
from zoo.nn.lora import has_lora
from zoo.presets import count_params
from zoo.tasks.base import Task
from zoo.train.checkpoint import list_checkpoints
from zoo.train.freeze import check_freeze, freeze, parse_freeze
from zoo.train.history import History
from zoo.train.interrupts import Terminated, ignore_further_interrupts
from zoo.train.lock import RunLock
from zoo.train.loop import TrainingDiverged
from zoo.train.optim import OptimizerLike
from zoo.train.run_setup import check_folders
from zoo.train.settings import Outputs
from zoo.train.spelling import spoken_as
from zoo.train.trainer import Trainer

FLAVORS = ("classifier", "gpt", "translator")
CHECKPOINTS = "checkpoints"  # the run folder's checkpoint folder
__all__ = ["TrainPlan", "data_scheme", "execute", "fill_defaults", "plan", "register",
           "resolve_data", "run"]  # fmt: skip


def register(commands) -> None:
    parser = commands.add_parser(
        "train", help="train a model: checkpoints, resume, metrics.jsonl, final model"
    )
    parser.add_argument("flavor", choices=FLAVORS)
    parser.add_argument("--preset", help="model preset (see `zoo presets`); optional with --init")
    parser.add_argument(
        "--init", help="start from a zoo model directory, a HF checkpoint folder or a hub name"
    )
    parser.add_argument(
        "--freeze",
        help="parameters not to train, e.g. embeddings,layers:0-5 (see zoo.train.freeze)",
    )
    parser.add_argument(
        "--lora",
        metavar="SPEC",
        help="train LoRA adapters only, e.g. rank=8,alpha=16,dropout=0.05,targets=attention (see zoo.lora)",
    )
    parser.add_argument(
        "--lora-init",
        choices=("continue", "merge"),
        help="with --lora and an --init whose model has LoRA adapters (a LoRA run): continue "
        "(default, as TRL) trains them further, merge folds them into the base and starts new ones",
    )
    parser.add_argument(
        "--merge", action="store_true", help="with --lora: also save the merged model in DIR"
    )
    parser.add_argument(
        "--quantize",
        choices=("int8", "nf4"),
        help="with --lora: keep the frozen base's Linear layers (and int8: experts) in int8, or "
        "in QLoRA's 4-bit NF4 (see zoo.lora.quantize)",
    )
    parser.add_argument(
        "--data",
        action=Datasets,
        help="SCHEME:NAME: synthetic:addition, hf:rotten_tomatoes, json:DIR, text:FILE, ...; "
        "repeat to mix datasets, each with an optional weight (json:b.jsonl:0.3)",
    )
    parser.add_argument("--steps", type=int, help="total optimizer updates (default: preset's)")
    parser.add_argument(
        "--epochs",
        type=positive_int("--epochs"),
        help="passes over the training data instead of --steps: the steps follow from the "
        "data's size and --batch-size (said at the start)",
    )
    parser.add_argument("--out", help="run directory (required)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=POSITIVE, help="peak learning rate")
    parser.add_argument("--schedule", choices=("inverse_sqrt", "cosine", "constant"))
    parser.add_argument("--warmup", type=int, help="linear warmup steps")
    parser.add_argument("--weight-decay", type=NON_NEGATIVE)
    parser.add_argument("--clip-norm", type=CLIP_NORM, default=1.0, help="0 turns clipping off")
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="compute dtype; auto (default): bf16 on a GPU or TPU, fp32 on a CPU",
    )
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute each layer in the backward pass, to train in less memory: --set remat=full",
    )
    parser.add_argument("--label-smoothing", type=RATE, help="translator only")
    parser.add_argument(
        "--num-classes", type=int, help="classifier: how many classes (default: from the labels)"
    )
    parser.add_argument(
        "--objective",
        choices=("classify", "mlm", "reward", *_preference.PREFERENCE_OBJECTIVES, "grpo"),
        default="classify",
        help="classifier: classify (labels) or mlm (masked-LM pretraining on plain text); "
        "classifier or gpt: reward (a reward model on prompt/chosen/rejected pairs); "
        "gpt: dpo|ipo|hinge|robust|simpo|orpo on prompt/chosen/rejected pairs, or grpo "
        "(RL from --reward on prompt rows)",
    )
    parser.add_argument("--mask-rate", type=SHARE, default=0.15, help="mlm: tokens chosen")
    parser.add_argument(
        "--whole-word-masking", action="store_true", help="mlm: mask every piece of a word"
    )
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, help="default: preset's, else at the end")
    parser.add_argument("--eval-limit", type=int, default=None, help="eval batches per eval")
    parser.add_argument("--checkpoint-every", type=int, default=None, help="default: at the end")
    parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change the preset's config (repeatable); NAME as the config tree spells it: a "
        "dotted path (layers.block.attention.window), a short path that changes every block "
        "(attention.num_kv_heads, norm.eps, feed_forward.kind), an alias (num_layers, "
        "num_heads, d_ff, dropout, attention_dropout, num_classes) or a model field (d_model, "
        "max_positions); VALUE is read as JSON where it can be, a JSON object for a record "
        "(head.pooler={}); e.g. --set num_layers=2 --set attention.num_kv_heads=1 (see "
        "docs/configs.md)",
    )
    parser.add_argument("--plot", action="store_true", help="write DIR/curves.png (matplotlib)")
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        choices=("tensorboard", "wandb"),
        help="also log to TensorBoard (DIR/tensorboard) or W&B (DIR/wandb, offline); repeatable",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_mesh_option(parser, processes=True)
    add_data_options(parser)
    add_chat_options(parser)
    add_compile_cache_option(parser)
    _preference.add_preference_options(parser)
    add_reward_options(parser)
    add_grpo_options(parser)
    enable_config_file(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """`zoo train`: decide the run from the flags, then run it."""
    decided = plan(args)
    use_compile_cache(args.compile_cache)
    with spoken_as("--resume"):  # the loop's and checkpoints' messages speak CLI
        return execute(decided)


# -- execute: the run folder held, checked and recorded; the model built, trained, reported -------


def execute(plan: TrainPlan) -> int:
    """Run `plan`; returns the exit status.

    The run folder is locked first (`RunLock`: one run per folder; its lock file is the only
    thing written before the checks), then every check that could refuse the run reads it
    (`--resume` against the recorded options, checkpoints a fresh run would mix with, a saved
    model it would overwrite), the model is built, and only then is the run's record
    (`train_args.json`) written and training started.
    """
    if plan.show_data is not None:  # nothing is trained or written
        from zoo.cli._show_data import show_data

        return show_data(plan.model, plan.data, plan.data_options, plan.show_data)
    writes = is_writer()  # with many processes, process 0 alone prints and writes
    with RunLock(plan.out) if writes else contextlib.nullcontext():
        fresh = _check_run_folder(plan)
        saved_tokenizer = None if fresh else _resumed_tokenizer(plan)
        model_key, train_key = jax.random.split(jax.random.key(plan.seed))
        built = build_model(plan.model, plan.data, plan.data_options, model_key,
                            resumed=not fresh, resumed_tokenizer=saved_tokenizer)  # fmt: skip
        if plan.objective.name == OBJECTIVE:  # one score per row: a score head where none
            built = reward_model(built, key=jax.random.fold_in(model_key, 1))
        if plan.steps is None:  # --epochs: now that the data's size is known
            plan = with_epochs(plan, len(built.data.train))
            _check_resume(plan, list_checkpoints(plan.out / CHECKPOINTS))
        if not plan.print_json and writes:
            _print_defaults(plan, built.data.tokenizer)
        model, optimizer, lora_train = _trainable(plan, built, model_key, writes=writes)
        data = built.data
        train, evaluation = data.train, data.evaluation
        preference, grpo = plan.objective.preference, plan.objective.grpo
        task: Task
        loop = plan.loop  # GRPO writes its own samples: the rollouts with their rewards
        if grpo is None:
            loop = with_samples(plan.loop, plan.sample_every, data, plan.out, writes=writes)
        if grpo is not None:  # batches sampled by the model being trained, scored by rewards
            task, train = grpo_setup(grpo, model, _grpo_run(plan, data, writes=writes))
        elif preference is not None:  # the reference's numbers join the batches
            continued = has_lora(built.model) and plan.lora is not None and (
                plan.lora_init or DEFAULT_LORA_INIT) == "continue"  # fmt: skip
            task, train, evaluation = _preference.preference_setup(
                preference, model, train, evaluation, data.tokenizer,
                continued=continued, out=plan.out if writes else None,
                progress=plan.loop.progress)  # fmt: skip
        elif plan.objective.name == OBJECTIVE:
            task = reward_task(plan.objective.center_rewards)
        else:
            task = make_task(plan.model.flavor, plan.objective, model, data.tokenizer)
        trainer = Trainer(
            task,
            optimizer,
            loop=loop,
            precision=plan.precision,
            accumulate=plan.accumulate,
            mesh=plan.mesh,
        )
        if fresh and writes:
            record_run(
                plan.flags,
                plan.out,
                built.data.tokenizer,
                chat_template=built.data.chat_template,
                tokenizer_given=plan.model.tokenizer_given,
            )
        outputs = Outputs(plan.out / CHECKPOINTS, plan.out, tokenizer=built.data.tokenizer,
                          plot=plan.plot, chat_template=built.data.chat_template)  # fmt: skip
        try:
            model, history = trainer.fit(model, train, steps=_steps(plan),
                                         key=train_key, eval_batches=evaluation,
                                         outputs=outputs, resume=plan.resume)  # fmt: skip
        except FileNotFoundError:
            raise  # a path given on the command line: the usual one-line error
        except (TrainingDiverged, OSError) as error:  # OSError: e.g. a full disk, file named
            print(f"zoo train: {error}", file=sys.stderr)
            return 1
        except Terminated as stop:
            ignore_further_interrupts()
            print("zoo train: terminated (SIGTERM); continue with --resume", file=sys.stderr)
            return stop.exit_status
        except KeyboardInterrupt:
            ignore_further_interrupts()
            print("zoo train: interrupted; continue with --resume", file=sys.stderr)
            return 130
        if writes:  # process 0 reports the run
            _report(plan, model, history, lora_train=lora_train, tokenizer=built.data.tokenizer)
    return 0


def _grpo_run(plan: TrainPlan, data: RunData, *, writes: bool) -> GRPORun:
    """What `--objective grpo` reads of the plan and its data (`zoo.cli._grpo`)."""
    if data.prompts is None or data.tokenizer is None:
        raise ValueError("--objective grpo reads prompt rows: give --data with a 'prompt' column")
    return GRPORun(prompts=data.prompts, tokenizer=data.tokenizer,
                   chat_template=data.chat_template, batch_size=plan.data_options.batch_size,
                   seed=plan.seed, samples=plan.out / "samples.jsonl" if writes else None,
                   sample_every=plan.sample_every, store=plan.out / "rollouts")  # fmt: skip


def _print_defaults(plan: TrainPlan, tokenizer: Tokenizer | None) -> None:
    """Name the options the preset's defaults filled; the tokenizer as the one the run uses
    (an `--init` model's own, a synthetic task's), not the default it did not need."""
    filled = dict(plan.filled)
    if "tokenizer" in filled:
        if tokenizer is None:
            del filled["tokenizer"]
        elif plan.model.init is not None:  # filled, so --init's own (build_model refuses none)
            filled["tokenizer"] = f"the --init model's ({tokenizer.kind})"
        else:
            filled["tokenizer"] = tokenizer.kind
    if filled:
        shown = ", ".join(f"{name}={value}" for name, value in filled.items())
        print(f"zoo train: defaults: {shown}", file=sys.stderr)


def _check_run_folder(plan: TrainPlan) -> bool:
    """Refuse a run that would harm what `plan.out` holds (its lock held); whether the run
    starts without a checkpoint."""
    found = list_checkpoints(plan.out / CHECKPOINTS)
    if plan.steps is not None:  # else once --epochs gives the steps
        _check_resume(plan, found)
    check_folders(Outputs(plan.out / CHECKPOINTS, plan.out), resume=plan.resume)
    return not found


def _check_resume(plan: TrainPlan, found: list[tuple[int, Path]]) -> None:
    """Refuse a `--resume` whose steps or options do not continue the run (`check_resume`)."""
    check_resume(plan.flags, plan.out, found[-1][0] if found else None, steps=_steps(plan),
                 resume=plan.resume)  # fmt: skip


def _steps(plan: TrainPlan) -> int:
    if plan.steps is None:
        raise RuntimeError("the steps of an --epochs run are decided before training")
    return plan.steps


def _trainable(
    plan: TrainPlan, built: Built, model_key: jax.Array, *, writes: bool
) -> tuple[eqx.Module, OptimizerLike, tuple[str, ...]]:
    """The model and optimizer that `--freeze` or `--lora` make of the built model, and what
    LoRA trains whole beside its adapters."""
    model, optimizer = built.model, plan.optimizer
    if optimizer is None:
        raise RuntimeError("the optimizer of an --epochs run is made before training")
    if plan.freeze_spec is not None:
        counts = check_freeze(model, parse_freeze(plan.freeze_spec))
        if writes:
            print(f"zoo train: frozen parameters: {counts}", file=sys.stderr)
        return model, freeze(optimizer, plan.freeze_spec), ()
    if plan.lora is None:
        return model, optimizer, ()
    train = trained_prefixes(plan.lora, plan.model.flavor, built.fresh_parts)
    key = jax.random.fold_in(model_key, 1)
    if has_lora(model):  # --init of a LoRA run: its adapters continue, or merge
        model, adapted = chained_lora(model, optimizer, plan.lora, train=train, key=key,
                                      mode=plan.lora_init or DEFAULT_LORA_INIT,
                                      init=plan.model.init, quantize=plan.quantize)  # fmt: skip
        return model, adapted, train
    if plan.lora_init is not None:
        raise ValueError(
            f"--lora-init {plan.lora_init} says what becomes of the LoRA adapters of --init, and "
            f"--init {plan.model.init} has none: drop --lora-init"
        )
    model, adapted = with_lora(model, optimizer, plan.lora, train=train, quantize=plan.quantize,
                               key=key)  # fmt: skip
    return model, adapted, train


def _report(
    plan: TrainPlan,
    model: eqx.Module,
    history: History,
    *,
    lora_train: tuple[str, ...],
    tokenizer: Tokenizer | None,
) -> None:
    """Print the run's summary, after writing a LoRA run's adapter (and merged model)."""
    summary = _summary(plan, model, history)
    if plan.lora is not None:
        base = base_model_name(plan.model.init, plan.model.preset)
        summary |= finish_run(model, plan.out, train=lora_train, merge=plan.merge,
                              base_model=base, tokenizer=tokenizer)  # fmt: skip
    if plan.print_json:
        print(json.dumps(summary))
    else:
        for name, value in summary.items():
            print(f"{name:>14}: {value}")


def _resumed_tokenizer(plan: TrainPlan) -> Tokenizer | None:
    """The tokenizer the resumed run in `plan.out` saved (`zoo.cli._run_dir.resumed_tokenizer`)."""
    choice = plan.model
    return resumed_tokenizer(plan.out, data=plan.data, init=choice.init,
                             tokenizer=choice.tokenizer)  # fmt: skip


def _summary(plan: TrainPlan, model: eqx.Module, history: History) -> dict[str, object]:
    info = history.summary
    train_row, eval_row = info["final_train"], info["final_eval"]
    shown = eval_row or train_row
    metric_name = None if shown is None else shown["metric_name"]
    return {
        "flavor": plan.model.flavor,
        "preset": plan.model.preset,
        "data": plan.data if isinstance(plan.data, str) else list(plan.data),
        "params": count_params(model),
        "steps": info["steps"],
        "resumed_from": info["resumed_from"],
        "train_loss": None if train_row is None else train_row["loss"],
        "eval_loss": None if eval_row is None else eval_row["loss"],
        "metric_name": metric_name,
        "eval_metric": None if eval_row is None else eval_row["metric"],
        "tokens_per_s": info["tokens_per_s"],
        "wall_seconds": info["wall_seconds"],
        "out": str(plan.out),
        "checkpoint": info["checkpoint"],
        # the accelerator's peak memory, where the device reports it (a GPU; None on a CPU)
        "device_peak_mb": _device_peak_mb(),
    }


def _device_peak_mb() -> float | None:
    from zoo.bench.hardware import peak_memory

    peak, _ = peak_memory()
    return None if peak is None else round(peak / 2**20, 1)
