"""`--data hf:|json:|csv:|parquet:|text:` for `zoo train` and `zoo eval`: files -> batch sources.

One handler serves every file scheme: `zoo.data.load_spec` reads the spec into a
`DatasetDict`, `zoo.data.from_hf` tokenizes it and cuts it into batches for the flavor's task.
"""

from __future__ import annotations

import argparse
from typing import Any

FILE_SCHEMES = ("hf", "json", "csv", "parquet", "text")
TASK_OF_FLAVOR = {
    "classifier": "classification",
    "gpt": "language_modeling",
    "translator": "translation",
}


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """The options that say how a dataset becomes batches (shared by train and eval)."""
    group = parser.add_argument_group("data (hf:, json:, csv:, parquet:, text:)")
    group.add_argument(
        "--tokenizer", default=None, help="char | word | tiktoken:NAME (default: word; gpt: char)"
    )
    group.add_argument("--source", default=None, help="translation source column (default de)")
    group.add_argument("--target", default=None, help="translation target column (default en)")
    group.add_argument("--text-column", default=None, help="default: text")
    group.add_argument("--label-column", default=None, help="default: label")
    group.add_argument("--max-len", type=int, default=None, help="longest sequence in tokens")
    group.add_argument("--min-freq", type=int, default=None, help="word tokenizer: min count")
    group.add_argument(
        "--lowercase", action="store_true", default=None, help="word tokenizer: lowercase"
    )
    group.add_argument(
        "--encoding", default="utf-8", help="text encoding of json/csv/text files (utf-8)"
    )
    group.add_argument("--streaming", action="store_true", help="read the data as a stream")


def data_options(args: argparse.Namespace, flavor: str, batch_size: int) -> dict[str, Any]:
    """`from_hf` keyword options from the command line (only those the user set)."""
    options: dict[str, Any] = {"batch_size": batch_size, "seed": args.seed}
    columns = {
        "source_column": args.source,
        "target_column": args.target,
        "text_column": args.text_column,
        "label_column": args.label_column,
        "max_len": args.max_len,
        "num_classes": getattr(args, "num_classes", None),
    }
    options.update({name: value for name, value in columns.items() if value is not None})
    if flavor != "translator" and (args.source or args.target):
        raise ValueError("--source/--target name translation columns; use --text-column")
    if flavor != "classifier" and options.get("num_classes") is not None:
        raise ValueError(f"--num-classes is for classifiers; a {flavor} has no classes")
    tokenizer_options: dict[str, Any] = {}
    if args.min_freq is not None:
        tokenizer_options["min_freq"] = args.min_freq
    if args.lowercase:
        tokenizer_options["lowercase"] = True
    if tokenizer_options:
        options["tokenizer_options"] = tokenizer_options
    return options


def load_dataset(
    spec: str, args: argparse.Namespace, *, file_split: str = "train", **options: Any
) -> Any:
    """The `DatasetDict` of `--data spec`, read with `--encoding` and `--streaming`.

    Masked-LM text files (`--objective mlm`) hold one example per line.
    """
    import zoo.data

    if getattr(args, "objective", None) == "mlm" and spec.startswith("text:"):
        options = {"sample_by": "line", **options}
    return zoo.data.load_spec(
        spec, streaming=args.streaming, encoding=args.encoding, file_split=file_split, **options
    )


def load_task_data(
    spec: str,
    flavor: str,
    args: argparse.Namespace,
    *,
    batch_size: int,
    tokenizer: Any = None,
    dataset: Any = None,
    **extra: Any,
) -> Any:
    """`zoo.data.TaskData` for `spec` (SCHEME:REST, a file scheme) and the flavor's task."""
    import zoo.data

    masked_lm = getattr(args, "objective", None) == "mlm"
    if dataset is None:
        dataset = load_dataset(spec, args)
    if tokenizer is None:
        tokenizer = getattr(args, "init_tokenizer", None) or args.tokenizer
    options = data_options(args, flavor, batch_size) | extra
    task = TASK_OF_FLAVOR[flavor]
    if masked_lm:
        # masked LM reads plain text as bos, text, eos rows, which hold max_len + 1 tokens
        task, options["packing"] = "language_modeling", False
        if tokenizer is None:  # the classifier's default (word), which fine-tuning then reuses
            from zoo.data.choose import DEFAULT_TOKENIZERS

            tokenizer = DEFAULT_TOKENIZERS["classification"]
        if "max_len" in options:
            options["max_len"] -= 1
    return zoo.data.from_hf(dataset, task=task, tokenizer=tokenizer, **options)
