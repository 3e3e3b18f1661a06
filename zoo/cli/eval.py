"""`zoo eval MODEL_DIR --data SPEC --split NAME [--json]`: a trained model's metrics on a split.

| flavor | metrics |
| --- | --- |
| classifier | loss, accuracy, confusion matrix (rows: true class, columns: predicted) |
| gpt | loss (nats per token), perplexity; chat data: over `--train-on` tokens, token accuracy |
| translator | loss, token accuracy, BLEU (sacrebleu, detokenized) of greedy or beam translations |

The data is tokenized with the model's own tokenizer (saved beside it by `zoo train`); a GPT's
conversations (chat data, as `zoo train` reads it) are rendered with its chat template, one per
row, and scored on the tokens `--train-on` names: loss, perplexity and `token_accuracy` (the
share of them whose argmax prediction is the target). Without a validation split, `--split
validation` scores the examples `zoo train` held out of train: the same `--seed` (by default
the run's own, from its `train_args.json`) picks the same ones. A single `--data` file is read
as the split `--split` names, except the very file the run trained on (its `train_args.json`
`data`), which is read as training read it, as the train split, so that its validation is the
part training held out, as for a folder. With `--mesh` the batches' rows (and a translator's
sources) are split over the devices, of many processes too (`--coordinator ...`: every process
runs the command, process 0 prints). Text of the data or the model that is printed (a
translator's samples) comes with its control characters escaped (`zoo.text.printable`). A split smaller than `--batch-size`, and a partial last
batch, are scored as they are. The batches done show as a bar on a terminal and as a tqdm-style
line every 30 seconds in a log (`zoo.progress`; `--no-progress`: neither).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.cli import _preference
from zoo.cli._chat_data import add_chat_options, wants_chat
from zoo.cli._datasets import (
    FILE_SCHEMES,
    TASK_OF_FLAVOR,
    DataOptions,
    HFOptions,
    OneDataset,
    add_data_options,
    from_hf_options,
    load_dataset,
)
from zoo.cli._load import MODEL_HELP, Model
from zoo.cli._mesh import add_mesh_option, layout_from_args
from zoo.cli._reward import evaluate_reward_pairs, is_reward_model
from zoo.data.batches import Batch, BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.models.translator import Translator
from zoo.text import printable

if TYPE_CHECKING:
    from zoo.data.specs import DatasetDicts
    from zoo.data.splits import AnySplit
    from zoo.distributed.layout import Layout
    from zoo.progress import Progress
    from zoo.tasks.base import Stats, Task

# one result of `zoo eval`, printed as JSON or a line per entry
Result = dict[str, object]


def register(commands) -> None:
    parser = commands.add_parser("eval", help="evaluate a trained model on a dataset split")
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument(
        "--data", required=True, action=OneDataset, help="json:DIR, hf:NAME, csv:, parquet:, text:"
    )
    parser.add_argument(
        "--split",
        default="validation",
        help="split to evaluate (validation); a single --data file is read as this split, "
        "but the run's own training file is split as training split it",
    )
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (on a terminal) or progress lines (in a log)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam-size", type=int, default=1, help="translator: 1 is greedy")
    parser.add_argument("--limit", type=int, default=None, help="translator: first N examples")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the seed that held out validation (default: the run's, from train_args.json; else 0)",
    )
    add_mesh_option(parser, processes=True)
    add_data_options(parser)
    add_chat_options(parser, pack=False)
    _preference.add_eval_options(parser)
    parser.set_defaults(run=run)


def _statistics(
    model: Model, task: Task, source: BatchSource, layout: Layout | None, *, progress: bool
) -> tuple[Stats, list[Batch]]:
    """The statistics of `task` summed over the batches of `source`, and the batches; with
    `progress`, a bar (or lines in a log) counts the batches."""
    import equinox as eqx
    import jax

    @eqx.filter_jit
    def stats(model, batch):
        return task.statistics(model, batch)

    total: Stats | None = None
    batches: list[Batch] = []
    with eval_progress(len(source), "batches", enabled=progress) as shown:
        for index in range(len(source)):
            batch = source.batch(index)
            task.check_batch(batch, model)
            placed = batch if layout is None else layout.place_batch(batch, even=False)
            part = stats(model, placed)
            total = part if total is None else total + part
            batches.append(batch)
            if progress:  # counts the batches computed, not those only queued
                jax.block_until_ready(total)
            shown.advance()
    if total is None:
        raise ValueError("the split gives no batches to evaluate; check --data and --split")
    return total, batches


def eval_progress(total: int | None, unit: str, *, enabled: bool) -> Progress:
    """`zoo eval`'s progress over `total` `unit`s: a bar on a terminal, a line every half
    minute in a log; shown by process 0 alone, and not with `--no-progress`."""
    from zoo.distributed.hosts import is_writer
    from zoo.progress import Progress

    return Progress(total=total, description="zoo eval", unit=unit,
                    enabled=enabled and is_writer())  # fmt: skip


def _classes(
    model: Model, batches: list[Batch], layout: Layout | None
) -> tuple[list[int], list[int]]:
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from zoo.distributed.hosts import gather

    @eqx.filter_jit
    def predict(model, tokens):
        return jnp.argmax(jax.vmap(model)(tokens), axis=-1)

    labels: list[int] = []
    predictions: list[int] = []
    for batch in batches:
        labels.extend(int(label) for label in batch["labels"])
        tokens = batch["tokens"]
        placed = jnp.asarray(tokens) if layout is None else layout.place_batch(
            {"tokens": tokens}, even=False)["tokens"]  # fmt: skip
        predictions.extend(int(p) for p in gather(predict(model, placed)))
    return labels, predictions


def _bleu(
    model: Translator,
    tokenizer: Tokenizer,
    args: argparse.Namespace,
    split: AnySplit,
    layout: Layout | None,
) -> Result:
    """BLEU of greedy or beam translations; on a mesh the sources' rows are split over it (on
    many processes too) and the tokens gathered whole into every process."""
    from zoo.data.metrics import bleu
    from zoo.data.tokenizers.pair import source_tokenizer
    from zoo.decoding.translate import translate
    from zoo.distributed.hosts import gather

    source_column, target_column = args.source or "de", args.target or "en"
    rows = split if args.limit is None else split.select(range(min(args.limit, len(split))))
    sources, references = rows[source_column], rows[target_column]
    length = model.config.max_positions
    hypotheses: list[str] = []
    with eval_progress(len(sources), "sentences", enabled=not args.no_progress) as shown:
        for start in range(0, len(sources), args.batch_size):
            src = source_tokenizer(tokenizer).encode_batch(
                sources[start : start + args.batch_size], length=length, add_eos=True
            )
            out = translate(model, src, beam_size=args.beam_size, max_len=length, mesh=layout)
            hypotheses.extend(tokenizer.decode(ids.tolist()) for ids in gather(out))  # to eos
            shown.advance(len(src))
    return {
        "bleu": bleu(hypotheses, references),
        "examples": len(hypotheses),
        "beam_size": args.beam_size,
        "samples": [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(zip(sources, references, hypotheses))[:3]
        ],
    }


def evaluate(args: argparse.Namespace) -> Result:
    """The metrics `zoo eval` prints, as a dict."""
    from zoo.cli._load import load_model
    from zoo.data.hf import split_batches
    from zoo.data.metrics import confusion_matrix
    from zoo.models import flavor_of
    from zoo.models.classifier import Classifier
    from zoo.tasks import for_flavor

    if args.data.partition(":")[0] not in FILE_SCHEMES:
        raise ValueError(f"--data {args.data!r}: zoo eval reads {', '.join(FILE_SCHEMES)} specs")
    model, tokenizer = load_model(args.model)
    flavor = flavor_of(model)
    layout = layout_from_args(args)
    if layout is not None:
        model = layout.place(model)
    num_classes = model.config.num_classes if isinstance(model, Classifier) else None
    record = training_record(args.model)
    seed = _seed(args, record)
    data = DataOptions.from_args(
        args,
        max_len=model.config.max_positions if args.max_len is None else args.max_len,
        num_classes=num_classes,
        seed=seed,
    )
    options = from_hf_options(data, flavor)
    dataset = load_dataset(args.data, data, file_split=_file_split(args, record))
    if is_reward_model(model) and _preference.is_preference_data(dataset, args.split):
        return _evaluate_rewards(args, model, tokenizer, dataset, record, seed=seed)
    if flavor == "gpt" and _preference.is_preference_data(dataset, args.split):
        return _evaluate_pairs(args, model, tokenizer, dataset, record, seed=seed)
    if wants_chat(dataset, flavor, data, split=args.split if args.split in dataset else "train"):
        return _evaluate_chat(args, model, tokenizer, dataset, data, layout)
    split, split_label = _eval_split(dataset, args, flavor, options)
    source = split_batches(split, task=TASK_OF_FLAVOR[flavor], tokenizer=tokenizer,
                           split_name=args.split, **options)  # fmt: skip
    task = for_flavor(flavor)
    stats, batches = _statistics(model, task, source, layout, progress=not args.no_progress)
    scored = max(float(stats.weight), 1.0)
    loss = float(stats.nll_sum) / scored
    result: Result = {
        "model": args.model,
        "flavor": flavor,
        "data": args.data,
        "split": split_label,
        "loss": loss,
        "unknown_token_rate": _unknown_rate(tokenizer, split, flavor, args),
    }
    if num_classes is not None:  # a classifier
        labels, predictions = _classes(model, batches, layout)
        result["examples"] = len(labels)
        result["accuracy"] = sum(a == b for a, b in zip(labels, predictions)) / len(labels)
        matrix = confusion_matrix(labels, predictions, num_classes=num_classes)
        result["confusion_matrix"] = matrix.tolist()
    elif flavor == "gpt":
        result["tokens"] = int(stats.weight)
        result["perplexity"] = math.exp(loss)
    elif isinstance(model, Translator):
        result["token_accuracy"] = float(stats.accuracy)
        result |= _bleu(model, tokenizer, args, split, layout)
    return result


def _evaluate_pairs(
    args: argparse.Namespace,
    model: Model,
    tokenizer: Tokenizer,
    dataset: DatasetDicts,
    record: Mapping[str, object],
    *,
    seed: int,
) -> Result:
    """A GPT's preference metrics on pairs (`zoo.cli._preference.evaluate_pairs`), with the
    loss and data options of its flags, else those the run recorded, and `seed` (`_seed`)."""
    from zoo.cli._run_dir import recorded_int
    from zoo.data.chat.preference import PreferenceDataConfig, special_tokens_for

    options = _preference.eval_preference_options(args, record)
    config = PreferenceDataConfig(
        max_len=args.max_len or recorded_int(record, "max_len"),
        max_prompt_len=args.max_prompt_len or recorded_int(record, "max_prompt_len"),
        max_completion_len=args.max_completion_len or recorded_int(record, "max_completion_len"),
        batch_size=args.batch_size,
        seed=seed,
        validation_split=args.split if args.split in dataset else None,
        special_tokens=special_tokens_for(options.objective),
        drop_last=False,  # only the evaluated split is read: a batch past its pairs is fine
    )
    pairs = _preference.evaluate_pairs(model, tokenizer, dataset, options=options,
                                       config=config, split=args.split,
                                       progress=not args.no_progress)  # fmt: skip
    return {"model": args.model, "flavor": "gpt", "data": args.data, **pairs}


def _evaluate_rewards(args, model, tokenizer, dataset, record, *, seed: int) -> Result:
    """A reward model's metrics on pairs (`zoo.cli._reward.evaluate_reward_pairs`), read with
    the run's lengths and centering unless the flags say."""
    from zoo.cli._run_dir import recorded_float, recorded_int
    from zoo.data.chat.preference import PreferenceDataConfig
    from zoo.models import flavor_of

    config = PreferenceDataConfig(max_len=args.max_len or recorded_int(record, "max_len"),
                                  batch_size=args.batch_size, seed=seed, drop_last=False,
                                  validation_split=args.split if args.split in dataset else None)  # fmt: skip
    pairs = evaluate_reward_pairs(model, tokenizer, dataset, config=config, split=args.split,
                                  center_rewards=recorded_float(record, "center_rewards_coefficient"),
                                  progress=not args.no_progress)  # fmt: skip
    return {"model": args.model, "flavor": flavor_of(model), "data": args.data, **pairs}


def _evaluate_chat(
    args: argparse.Namespace,
    model: Model,
    tokenizer: Tokenizer,
    dataset: DatasetDicts,
    data: DataOptions,
    layout: Layout | None,
) -> Result:
    """A GPT's loss, perplexity and token accuracy on conversations (see the module doc), read
    with the data options `data` (their `max_len` and `seed` resolved)."""
    from zoo.cli._chat_data import eval_chat_config, naming_flags, resolved_train_on
    from zoo.data.chat.datasets import chat_evaluation
    from zoo.tasks import LanguageModeling

    if data.streaming:
        raise ValueError("chat data is read into memory: drop --streaming")
    config = eval_chat_config(data, model=args.model)  # the run's template
    with naming_flags(data):
        chats = chat_evaluation(dataset, tokenizer, split=args.split, config=config)
    stats, _ = _statistics(model, LanguageModeling(), chats.batches, layout,
                           progress=not args.no_progress)  # fmt: skip
    loss = float(stats.nll_sum) / max(float(stats.weight), 1.0)
    return {
        "model": args.model,
        "flavor": "gpt",
        "data": args.data,
        "split": chats.name,
        "loss": loss,
        "unknown_token_rate": chats.unknown_token_rate,
        "conversations": chats.conversations,
        "train_on": resolved_train_on(config.train_on, dataset, args.split),
        "tokens": int(stats.weight),
        "total_tokens": chats.tokens,
        "perplexity": math.exp(loss),
        "token_accuracy": float(stats.accuracy),  # of the scored tokens, summed on the device
    }


def training_record(model: str) -> Mapping[str, object]:
    """The options `zoo train` recorded for the run in `model` (`train_args.json`); `{}` for a
    model without one (a HuggingFace folder, `hf:NAME`, a `zoo.save` folder)."""
    from zoo.cli._run_dir import RUN_ARGS_FILE
    from zoo.files import read_json_object

    path = Path(model) / RUN_ARGS_FILE
    fix = "it records how the run was trained: delete it to evaluate without it"
    return read_json_object(path, fix=fix, missing_ok=True) if path.is_file() else {}


def _seed(args: argparse.Namespace, record: Mapping[str, object]) -> int:
    """`--seed`, else the run's own (the one that held out its validation), else 0."""
    from zoo.distributed.hosts import is_writer

    if args.seed is not None:
        recorded = record.get("seed")
        if isinstance(recorded, int) and recorded != args.seed and is_writer():
            print(
                f"zoo eval: --seed {args.seed}, but the run was trained with --seed {recorded}: "
                "a held-out validation split is not the one training held out",
                file=sys.stderr,
            )
        return args.seed
    recorded = record.get("seed")
    return recorded if isinstance(recorded, int) else 0


def _file_split(args: argparse.Namespace, record: Mapping[str, object]) -> str:
    """The split a single `--data` file is read as: `--split`, except the run's own training
    file where training held out its validation: the train split, as training read it, so that
    `--split validation` is the part it held out (see the module doc)."""
    from zoo.distributed.hosts import is_writer

    scheme, _, rest = args.data.partition(":")
    if scheme == "hf" or not Path(rest).is_file():
        return args.split
    train_files, held_out = _training_files(record, scheme)
    if not any(Path(rest).samefile(file) for file in train_files):
        return args.split
    if args.split == "train" or (held_out and len(train_files) == 1 and args.split == "validation"):
        return "train"
    if is_writer():
        recorded = printable(str(record.get("data")))  # read from the run's folder
        print(
            f"zoo eval: --data {args.data} is training data of the run in {args.model} "
            f"(train_args.json: {recorded}); read as --split {args.split}, its scores "
            "are on examples the model was trained on",
            file=sys.stderr,
        )
    return args.split


def _training_files(record: Mapping[str, object], scheme: str) -> tuple[list[Path], bool]:
    """(the files of the run's train split, whether training held validation out of them):
    from `data` in its `train_args.json`, a spec relative to where `zoo train` ran."""
    from zoo.data.specs import split_files

    recorded = record.get("data")
    if isinstance(recorded, list) and len(recorded) == 1:  # a repeated --data, given once
        recorded = recorded[0]
    if not isinstance(recorded, str) or recorded.partition(":")[0] != scheme:
        return [], False
    try:
        files = split_files(Path(recorded.partition(":")[2]), scheme)
    except (FileNotFoundError, OSError):  # moved since, or relative to another folder
        return [], False
    held_out = "validation" not in files  # zoo.data.splits.pick_splits: else a holdout
    return [Path(file) for file in files.get("train", [])], held_out


def _eval_split(
    dataset: DatasetDicts, args: argparse.Namespace, flavor: str, options: HFOptions
) -> tuple[AnySplit, str]:
    """(the rows to evaluate, how the result names them): `--split` itself, or for validation
    without such a split the part `zoo train` held out of train (same seed and fraction)."""
    import datasets

    from zoo.data.options import DataConfig
    from zoo.data.specs import check_split
    from zoo.data.splits import hold_out
    from zoo.distributed.hosts import is_writer

    if args.split not in dataset:
        if Path(args.split).is_file():
            raise ValueError(
                f"--split takes a split name, not a file; to evaluate {args.split}, pass it "
                f"as --data SCHEME:{args.split} (it is read as the split --split names)"
            )
        train = dataset.get("train")
        if args.split == "validation" and isinstance(train, datasets.Dataset):
            config = DataConfig.from_options(TASK_OF_FLAVOR[flavor], dict(options))
            return hold_out(train, config)[1], "validation (held out of train)"
        check_split(dataset, args.split, args.data)
    if args.split == "train" and is_writer():
        print(
            "zoo eval: evaluating on the train split: the numbers measure how well the model "
            "fits its training data, not how it generalises",
            file=sys.stderr,
        )
    return dataset[args.split], args.split


def _unknown_rate(
    tokenizer: Tokenizer, split: AnySplit, flavor: str, args: argparse.Namespace
) -> float | None:
    """The share of `<unk>` tokens in the evaluated input text (warned about when high)."""
    import datasets

    from zoo.data.tokenizers.base import warn_unknown
    from zoo.data.tokenizers.pair import source_tokenizer

    if not isinstance(split, datasets.Dataset):
        return None  # a stream is read once, by the evaluation itself
    if flavor == "translator":
        texts, tokenizer = split[args.source or "de"], source_tokenizer(tokenizer)
    else:
        texts = split[args.text_column or "text"]
    rate = warn_unknown(tokenizer, texts, f"the {args.split!r} split")
    return None if rate is None else round(rate, 4)


def run(args: argparse.Namespace) -> int:
    from zoo.distributed.hosts import is_writer

    result = evaluate(args)  # every process computes; process 0 reports
    if not is_writer():
        return 0
    if args.json:
        print(json.dumps(result))
        return 0
    for name, value in result.items():
        if name != "samples":
            print(f"{name:>16}: {printable(str(value))}")
    samples = result.get("samples")  # a translator's first translations
    for sample in samples if isinstance(samples, list) else []:
        # text of the data and the model, one line each: its control characters shown escaped
        source, hypothesis, reference = (printable(str(sample[name]), multiline=False)
                                         for name in ("source", "hypothesis", "reference"))  # fmt: skip
        print(f"  {source}\n    -> {hypothesis}\n    == {reference}")
    return 0
