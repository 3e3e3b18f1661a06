"""`zoo train FLAVOR --preset NAME --data SPEC --steps N --out DIR`: train, checkpoint, resume.

Writes `DIR/metrics.jsonl`, checkpoints under `DIR/checkpoints/` and the final model (with its
tokenizer) in `DIR/`, loadable with `zoo.load(DIR)`. `--resume` continues from the newest
checkpoint exactly where it stopped. Data comes from `--data SCHEME:REST`; `resolve_data`
dispatches on the scheme: `synthetic:rot13|addition|majority`, and `hf:`, `json:`, `csv:`,
`parquet:`, `text:` through `zoo.data.load_spec` + `zoo.data.from_hf`. Options left out come
from the preset's row in `zoo.train.defaults`; `--init` and `--freeze` fine-tune.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoo.cli._datasets import FILE_SCHEMES, add_data_options
from zoo.cli._mesh import add_mesh_option
from zoo.train.defaults import fill_defaults

FLAVORS = ("classifier", "gpt", "translator")

# scheme -> handler(rest, flavor, args) -> (train source, eval source or None, tokenizer)
DataHandler = Callable[[str, str, argparse.Namespace], tuple[Any, Any, Any]]
SCHEMES: dict[str, DataHandler] = {}


def data_scheme(name: str) -> Callable[[DataHandler], DataHandler]:
    """Register a `--data NAME:...` handler."""

    def decorate(handler: DataHandler) -> DataHandler:
        SCHEMES[name] = handler
        return handler

    return decorate


def resolve_data(spec: str, flavor: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """`--data SCHEME:REST` -> (train batch source, eval batch source or None, tokenizer)."""
    scheme, separator, rest = spec.partition(":")
    if not separator or not rest:
        raise ValueError(
            f"--data {spec!r} is not SCHEME:NAME; for example synthetic:addition "
            f"(known schemes: {', '.join(sorted(SCHEMES))})"
        )
    if scheme not in SCHEMES:
        raise ValueError(
            f"unknown data scheme {scheme!r} in --data {spec!r}; known schemes: "
            f"{', '.join(sorted(SCHEMES))}"
        )
    return SCHEMES[scheme](rest, flavor, args)


@data_scheme("synthetic")
def _synthetic(name: str, flavor: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from zoo.data import synthetic

    if name not in synthetic.TASKS:
        raise ValueError(
            f"unknown synthetic task {name!r}; choose one of {', '.join(sorted(synthetic.TASKS))}"
        )
    task_flavor, _ = synthetic.TASKS[name]
    if task_flavor != flavor:
        raise ValueError(
            f"synthetic:{name} trains a {task_flavor}, not a {flavor}; "
            f"run `zoo train {task_flavor} ...`"
        )
    data = synthetic.make(name, seed=args.seed)
    if args.num_classes is not None and args.num_classes != data.num_classes:
        raise ValueError(
            f"synthetic:{name} sets its own classes ({data.num_classes or 'none'}); "
            "drop --num-classes"
        )
    train, evaluation = data.batches(args.batch_size, seed=args.seed)
    return train, evaluation, data.tokenizer


def _files(scheme: str) -> DataHandler:
    def handler(rest: str, flavor: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
        from zoo.cli._datasets import load_dataset, load_task_data
        from zoo.data.specs import check_split

        spec = f"{scheme}:{rest}"
        dataset = load_dataset(spec, args)
        check_split(dataset, "train", spec)
        data = load_task_data(spec, flavor, args, batch_size=args.batch_size, dataset=dataset)
        args.data_num_classes = data.num_classes
        return data.train, data.validation, data.tokenizer

    return handler


for _scheme in FILE_SCHEMES:
    data_scheme(_scheme)(_files(_scheme))


def _config_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def model_overrides(flavor: str, tokenizer: Any, train: Any, settings: list[str]) -> dict:
    """Config fields taken from the data (vocabulary, special ids, classes) and from `--set`."""
    overrides: dict[str, Any] = {}
    if tokenizer is not None:
        overrides.update(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id)
        source = getattr(tokenizer, "source", None)
        if flavor == "translator" and source is not None:
            overrides.update(
                vocab_size=source.vocab_size,
                target_vocab_size=tokenizer.vocab_size,
                share_embeddings=False,
            )
        if flavor != "classifier":
            for name in ("bos_id", "eos_id"):
                if getattr(tokenizer, name, None) is not None:
                    overrides[name] = getattr(tokenizer, name)
    if flavor == "classifier":
        num_classes = getattr(train, "num_classes", None)
        arrays = getattr(train, "arrays", {})
        if num_classes is None and "labels" in arrays:
            num_classes = int(arrays["labels"].max()) + 1
        if num_classes is not None:
            overrides["num_classes"] = num_classes
    for setting in settings:
        name, separator, value = setting.partition("=")
        if not separator:
            raise ValueError(f"--set takes FIELD=VALUE (e.g. --set dropout=0.1), got {setting!r}")
        overrides[name.strip()] = _config_value(value)
    return overrides


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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import jax

    import zoo
    from zoo.cli._build import build_model, check_preset, make_task
    from zoo.cli._mesh import layout_from_args
    from zoo.cli._run_dir import check_out_dir, check_resume
    from zoo.distributed.hosts import is_writer
    from zoo.train import Terminated, TrainingDiverged
    from zoo.train.freeze import check_freeze, freeze, parse_freeze
    from zoo.train.loggers import check_loggers

    check_preset(args)
    layout = layout_from_args(args)  # a mesh that does not fit the devices: before any work
    writes = is_writer()  # with many processes, process 0 alone prints and writes
    if args.plot:
        from zoo.train.plot import check_matplotlib

        check_matplotlib()  # before training, not after it
    out = check_out_dir(args.out)
    args.tokenizer_given = args.tokenizer is not None  # before the preset's default fills it
    try:
        loggers = check_loggers(args.log)  # before any data is loaded
    except ImportError as error:
        print(f"zoo train: error: {error}", file=sys.stderr)
        return 2
    filled = fill_defaults(args, args.preset or "", args.flavor)
    if filled and not args.json and writes:
        shown = ", ".join(f"{name}={value}" for name, value in filled.items())
        print(f"zoo train: defaults: {shown}", file=sys.stderr)
    has_checkpoint = zoo.train.latest_checkpoint(out / "checkpoints") is not None
    check_resume(args, out, has_checkpoint, record=writes)
    model_key, train_key = jax.random.split(jax.random.key(args.seed))
    model, train, evaluation, tokenizer = build_model(args, model_key)
    optimizer = zoo.train.adamw(
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
    if args.lora and jax.process_count() > 1:
        raise ValueError(
            "--lora trains on one process for now; run it without --num-processes / "
            "--distributed (a mesh over one process's devices works)"
        )
    if args.lora:
        model, optimizer, lora_train = _with_lora(args, model, optimizer, model_key)
    elif args.merge:
        raise ValueError("--merge folds LoRA adapters into the weights: use it with --lora")
    elif args.quantize:
        raise ValueError("--quantize stores the frozen base of LoRA adapters: use it with --lora")
    trainer = zoo.Trainer(
        make_task(args, model, tokenizer),
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
            train,
            eval_batches=evaluation,
            steps=args.steps,
            key=train_key,
            checkpoint_dir=out / "checkpoints",
            out_dir=out,
            resume=args.resume,
            tokenizer=tokenizer,
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
        from zoo.lora.cli import finish_run

        base = args.init or args.preset
        summary |= finish_run(model, out, train=lora_train, merge=args.merge, base_model=base,
                              tokenizer=tokenizer)  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        for name, value in summary.items():
            print(f"{name:>14}: {value}")
    return 0


def _with_lora(args: argparse.Namespace, model: Any, optimizer: Any, model_key: Any):
    """The model with adapters, the optimizer restricted to them, and what trains whole."""
    import jax

    import zoo
    from zoo.lora.adapters import check_train
    from zoo.lora.cli import parse_lora, trained_prefixes
    from zoo.lora.targets import OUTPUT_LAYERS

    if args.freeze:
        raise ValueError("--lora trains only the adapters already; leave out --freeze")
    spec = parse_lora(args.lora)
    train = trained_prefixes(spec, args.flavor, getattr(args, "fresh_parts", ()))
    key = jax.random.fold_in(model_key, 1)
    model = zoo.lora.apply(model, rank=spec.rank, alpha=spec.alpha, targets=spec.targets, key=key)
    check_train(model, train)
    if args.quantize:  # layers trained whole (a classifier's head) stay float
        model = zoo.lora.quantize(model, args.quantize, skip=(*OUTPUT_LAYERS, *train))
    counts = zoo.lora.adapter_arrays(model, train)
    total = sum(leaf.size for leaf in counts.values())
    print(f"zoo train: LoRA trains {total:,} of {zoo.count_params(model):,} parameters",
          file=sys.stderr)  # fmt: skip
    return model, zoo.lora.only_adapters(optimizer, train=train), train


def _summary(args: argparse.Namespace, model: Any, history: Any) -> dict[str, Any]:
    import zoo

    info = history.summary
    train_row, eval_row = info["final_train"] or {}, info["final_eval"] or {}
    return {
        "flavor": args.flavor,
        "preset": args.preset,
        "data": args.data,
        "params": zoo.count_params(model),
        "steps": info["steps"],
        "resumed_from": info["resumed_from"],
        "train_loss": train_row.get("loss"),
        "eval_loss": eval_row.get("loss"),
        "metric_name": eval_row.get("metric_name", train_row.get("metric_name")),
        "eval_metric": eval_row.get("metric"),
        "tokens_per_s": info["tokens_per_s"],
        "wall_seconds": info["wall_seconds"],
        "out": str(Path(args.out)),
        "checkpoint": info["checkpoint"],
    }
