"""`zoo train FLAVOR --preset NAME --data SPEC --steps N --out DIR`: train, checkpoint, resume.

Writes `DIR/metrics.jsonl`, checkpoints under `DIR/checkpoints/` and the final model (with its
tokenizer) in `DIR/`, loadable with `zoo.load(DIR)`. `--resume` continues from the newest
checkpoint exactly where it stopped. Data comes from `--data SCHEME:REST` (`resolve_data`, a
new scheme registers with `data_scheme`; see `zoo.cli._datasets`). Options left out come from
the preset's row in `zoo.train.defaults`; `--init` and `--freeze` fine-tune, `--lora` adapts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import equinox as eqx

from zoo.cli._chat_data import add_chat_options
from zoo.cli._datasets import add_data_options, data_scheme, resolve_data
from zoo.cli._mesh import add_mesh_option
from zoo.train.defaults import Default, training_defaults
from zoo.train.history import History

FLAVORS = ("classifier", "gpt", "translator")
__all__ = ["data_scheme", "fill_defaults", "register", "resolve_data", "run"]


def fill_defaults(args: argparse.Namespace, preset: str, flavor: str) -> dict[str, Default]:
    """Set every option of `args` still None to the preset's default (`zoo.train.defaults`);
    returns the values it filled."""
    filled: dict[str, Default] = {}
    for name, value in training_defaults(preset, flavor).items():
        if getattr(args, name, None) is None and value is not None:
            setattr(args, name, value)
            filled[name] = value
        elif not hasattr(args, name):
            setattr(args, name, value)
    if "warmup" in filled and "steps" not in filled and args.warmup >= args.steps:
        # a short run asked for by --steps: keep the warmup a tenth of it
        args.warmup = filled["warmup"] = max(1, args.steps // 10)
    return filled


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
        help="train LoRA adapters only, e.g. rank=8,alpha=16,targets=attention (see zoo.lora)",
    )
    parser.add_argument(
        "--merge", action="store_true", help="with --lora: also save the merged model in DIR"
    )
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        help="with --lora: keep the frozen base's Linear layers in int8 (see zoo.lora.quantize)",
    )
    parser.add_argument(
        "--data",
        required=True,
        help="SCHEME:NAME: synthetic:addition, hf:rotten_tomatoes, json:DIR, text:FILE, ...",
    )
    parser.add_argument("--steps", type=int, help="total optimizer updates (default: preset's)")
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--schedule", choices=("inverse_sqrt", "cosine", "constant"))
    parser.add_argument("--warmup", type=int, help="linear warmup steps")
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--clip-norm", type=float, default=1.0, help="0 turns clipping off")
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="compute dtype; auto (default): bf16 on a GPU or TPU, fp32 on a CPU",
    )
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--label-smoothing", type=float, help="translator only")
    parser.add_argument(
        "--num-classes", type=int, help="classifier: how many classes (default: from the labels)"
    )
    parser.add_argument(
        "--objective",
        choices=("classify", "mlm"),
        default="classify",
        help="classifier: classify (labels) or mlm (masked-LM pretraining on plain text)",
    )
    parser.add_argument("--mask-rate", type=float, default=0.15, help="mlm: tokens chosen")
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
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="model config override"
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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import jax

    from zoo.cli._build import build_model, check_preset, make_task
    from zoo.cli._load import HUB
    from zoo.cli._mesh import layout_from_args
    from zoo.cli._run_dir import check_out_dir, check_resume
    from zoo.distributed.hosts import is_writer
    from zoo.train.checkpoint import latest_checkpoint
    from zoo.train.freeze import check_freeze, freeze, parse_freeze
    from zoo.train.interrupts import Terminated
    from zoo.train.loggers import check_loggers
    from zoo.train.loop import TrainingDiverged
    from zoo.train.optim import OptimizerLike, adamw
    from zoo.train.trainer import Trainer

    check_preset(args)
    layout = layout_from_args(args)  # a mesh that does not fit the devices: before any work
    writes = is_writer()  # with many processes, process 0 alone prints and writes
    if args.plot:
        from zoo.train.plot import check_matplotlib

        check_matplotlib()  # before training, not after it
    out = check_out_dir(args.out)
    tokenizer_given = args.tokenizer is not None  # before the preset's default fills it
    try:
        loggers = check_loggers(args.log)  # before any data is loaded
    except ImportError as error:
        print(f"zoo train: error: {error}", file=sys.stderr)
        return 2
    filled = fill_defaults(args, args.preset or "", args.flavor)
    if filled and not args.json and writes:
        shown = ", ".join(f"{name}={value}" for name, value in filled.items())
        print(f"zoo train: defaults: {shown}", file=sys.stderr)
    has_checkpoint = latest_checkpoint(out / "checkpoints") is not None
    check_resume(args, out, has_checkpoint, record=writes)
    model_key, train_key = jax.random.split(jax.random.key(args.seed))
    built = build_model(args, model_key, tokenizer_given=tokenizer_given)
    model, data = built.model, built.data
    optimizer: OptimizerLike = adamw(
        args.lr,
        warmup=args.warmup,
        schedule=args.schedule,
        total_steps=args.steps,
        weight_decay=args.weight_decay,
        clip_norm=args.clip_norm or None,
    )
    if args.freeze:
        counts = check_freeze(model, parse_freeze(args.freeze))
        if writes:
            print(f"zoo train: frozen parameters: {counts}", file=sys.stderr)
        optimizer = freeze(optimizer, args.freeze)
    lora_train: tuple[str, ...] = ()
    if args.lora:
        from zoo.cli._lora import parse_lora, trained_prefixes, with_lora

        if jax.process_count() > 1:
            raise ValueError(
                "--lora trains on one process for now; run it without --num-processes / "
                "--distributed (a mesh over one process's devices works)"
            )
        if args.freeze:
            raise ValueError("--lora trains only the adapters already; leave out --freeze")
        spec = parse_lora(args.lora)
        lora_train = trained_prefixes(spec, args.flavor, built.fresh_parts)
        model, optimizer = with_lora(model, optimizer, spec, train=lora_train,
                                     quantize=args.quantize, key=jax.random.fold_in(model_key, 1))  # fmt: skip
    elif args.merge:
        raise ValueError("--merge folds LoRA adapters into the weights: use it with --lora")
    elif args.quantize:
        raise ValueError("--quantize stores the frozen base of LoRA adapters: use it with --lora")
    trainer = Trainer(
        make_task(args, model, data.tokenizer),
        optimizer,
        precision=args.precision,
        accumulate=args.accumulate,
        log_every=args.log_every,
        eval_every=args.eval_every,
        eval_limit=args.eval_limit,
        checkpoint_every=args.checkpoint_every,
        keep=args.keep,
        progress=not args.no_progress,
        loggers=loggers,
        mesh=None if layout is None else layout.mesh,
    )
    try:
        model, history = trainer.fit(
            model,
            data.train,
            eval_batches=data.evaluation,
            steps=args.steps,
            key=train_key,
            checkpoint_dir=out / "checkpoints",
            out_dir=out,
            resume=args.resume,
            tokenizer=data.tokenizer,
            plot=args.plot,
        )
    except FileNotFoundError:
        raise  # a path given on the command line: the usual one-line error
    except (TrainingDiverged, OSError) as error:  # OSError: e.g. a full disk, file named
        print(f"zoo train: {error}", file=sys.stderr)
        return 1
    except Terminated as stop:
        print("zoo train: terminated (SIGTERM); continue with --resume", file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:
        print("zoo train: interrupted; continue with --resume", file=sys.stderr)
        return 130
    if not writes:
        return 0  # process 0 reports the run
    summary = _summary(args, model, history)
    if args.lora:
        from zoo.cli._lora import finish_run

        base = (
            args.init.removeprefix(HUB) if args.init else args.preset
        )  # PEFT names hub models bare
        summary |= finish_run(model, out, train=lora_train, merge=args.merge, base_model=base,
                              tokenizer=data.tokenizer)  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        for name, value in summary.items():
            print(f"{name:>14}: {value}")
    return 0


def _summary(args: argparse.Namespace, model: eqx.Module, history: History) -> dict[str, object]:
    from zoo.presets import count_params

    info = history.summary
    train_row, eval_row = info["final_train"], info["final_eval"]
    shown = eval_row or train_row
    metric_name = None if shown is None else shown["metric_name"]
    return {
        "flavor": args.flavor,
        "preset": args.preset,
        "data": args.data,
        "params": count_params(model),
        "steps": info["steps"],
        "resumed_from": info["resumed_from"],
        "train_loss": None if train_row is None else train_row["loss"],
        "eval_loss": None if eval_row is None else eval_row["loss"],
        "metric_name": metric_name,
        "eval_metric": None if eval_row is None else eval_row["metric"],
        "tokens_per_s": info["tokens_per_s"],
        "wall_seconds": info["wall_seconds"],
        "out": str(Path(args.out)),
        "checkpoint": info["checkpoint"],
    }
