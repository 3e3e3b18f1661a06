"""`--data SCHEME:REST` for `zoo train` and `zoo eval`: a spec and its options -> batch sources.

The command line's data options become one record, `DataOptions` (`zoo.cli._data_options`),
before any data is read.
`resolve_data` dispatches `zoo train`'s `--data` on its scheme: `synthetic:rot13|addition|
majority` makes its own data; the file schemes (`hf:`, `json:`, `csv:`, `parquet:`, `text:`)
share one handler: `zoo.data.load_spec` reads the spec into a `DatasetDict`, `zoo.data.from_hf`
tokenizes it and cuts it into batches for the flavor's task. A new scheme registers a handler
with `@data_scheme("name")`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from zoo.cli._data_options import DataOptions, buckets_flag, word_options
from zoo.cli._numbers import FRACTION
from zoo.data.batches import BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.data.tokenizers.word import WordOptions

if TYPE_CHECKING:
    from zoo.data.chat.datasets import ChatData
    from zoo.data.hf import TaskData
    from zoo.data.specs import DatasetDicts
    from zoo.tasks.grpo_rollouts import PromptRows

FILE_SCHEMES = ("hf", "json", "csv", "parquet", "text")
TASK_OF_FLAVOR = {
    "classifier": "classification",
    "gpt": "language_modeling",
    "translator": "translation",
}
__all__ = ["DataOptions", "RunData", "buckets_flag", "data_scheme", "resolve_data"]


@dataclass(frozen=True)
class RunData:
    """What `--data` gives `zoo train`: batches to train on and to evaluate, the tokenizer."""

    train: BatchSource
    evaluation: BatchSource | None
    tokenizer: Tokenizer | None
    num_classes: int | None = None  # the classes the data names (None: count the labels)
    chat_template: str | None = None  # chat data: the template's text (saved with the run)
    chat: ChatData | None = None  # chat data: the conversations it came from
    prompts: PromptRows | None = None  # --objective grpo: the prompt rows (train is their order)


# scheme -> handler(rest after "SCHEME:", flavor, options)
DataHandler = Callable[[str, str, DataOptions], RunData]
SCHEMES: dict[str, DataHandler] = {}


def data_scheme(name: str) -> Callable[[DataHandler], DataHandler]:
    """Register a `--data NAME:...` handler."""

    def decorate(handler: DataHandler) -> DataHandler:
        SCHEMES[name] = handler
        return handler

    return decorate


def resolve_data(spec: str | Sequence[str], flavor: str, options: DataOptions) -> RunData:
    """`--data SCHEME:REST` -> train and eval batch sources and the tokenizer; several
    `--data` (a sequence) are mixed first (`zoo.cli._mixing`)."""
    if not isinstance(spec, str):
        from zoo.cli._mixing import mix_datasets

        label, dataset = mix_datasets(spec, lambda one: load_dataset(one, options), options.seed)
        return dataset_run_data(label, dataset, flavor, options)
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
    return SCHEMES[scheme](rest, flavor, options)


@data_scheme("synthetic")
def _synthetic(name: str, flavor: str, options: DataOptions) -> RunData:
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
    data = synthetic.make(name, seed=options.seed)
    if options.num_classes is not None and options.num_classes != data.num_classes:
        raise ValueError(
            f"synthetic:{name} sets its own classes ({data.num_classes or 'none'}); "
            "drop --num-classes"
        )
    train, evaluation = data.batches(options.batch_size, seed=options.seed)
    return RunData(train, evaluation, data.tokenizer)


def _files(scheme: str) -> DataHandler:
    def handler(rest: str, flavor: str, options: DataOptions) -> RunData:
        spec = f"{scheme}:{rest}"
        return dataset_run_data(spec, load_dataset(spec, options), flavor, options)

    return handler


def dataset_run_data(
    spec: str, dataset: DatasetDicts, flavor: str, options: DataOptions
) -> RunData:
    """The `RunData` of `dataset`, read from `spec` (named in errors): conversations or the
    flavor's task."""
    from zoo.cli._chat_data import chat_run_data, wants_chat
    from zoo.data.specs import check_split

    check_split(dataset, "train", spec)
    if options.prompts:
        from zoo.cli._grpo import prompt_order, read_prompts

        prompts, tokenizer, template = read_prompts(dataset, flavor, options)
        return RunData(prompt_order(prompts, options.seed), None, tokenizer,
                       chat_template=template, prompts=prompts)  # fmt: skip
    if options.preference:
        from zoo.cli._preference import preference_run_data

        pairs = preference_run_data(dataset, flavor, options)
        template = None if pairs.template is None else pairs.template.source
        classes = 1 if flavor == "classifier" else None  # a reward model: one score
        return RunData(pairs.train, pairs.validation, pairs.tokenizer, classes,
                       chat_template=template)  # fmt: skip
    if wants_chat(dataset, flavor, options):
        chat = chat_run_data(dataset, options)
        return RunData(chat.train, chat.validation, chat.tokenizer,
                       chat_template=chat.template.source, chat=chat)  # fmt: skip
    data = load_task_data(spec, flavor, options, dataset=dataset)
    return RunData(data.train, data.validation, data.tokenizer, data.num_classes)


for _scheme in FILE_SCHEMES:
    data_scheme(_scheme)(_files(_scheme))


class OneDataset(argparse.Action):
    """`--data` given once: a second one is refused, where argparse would keep the last alone
    and the run would read half the data it was given without a word."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None:
            raise argparse.ArgumentError(
                self,
                f"given twice ({earlier}, then {values}): a run reads one dataset; put the "
                "files in one folder (train.jsonl, validation.jsonl) or combine them first",
            )
        setattr(namespace, self.dest, values)


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
    group.add_argument(
        "--buckets",
        type=buckets_flag,
        default=None,
        metavar="auto|pow2|N,N,...",
        help="the lengths unpacked rows are padded to, one compiled step each: auto (default) "
        "fits at most four to the data's lengths, pow2 takes 16, 32, 64, ... up to --max-len, "
        "or list them (e.g. 48,64,96)",
    )
    group.add_argument(
        "--group-by-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unpacked rows: batches of examples of one bucket's length (less padding, less "
        "random batches); default: batches drawn at random, padded to their longest's bucket",
    )
    group.add_argument(
        "--holdout",
        type=FRACTION,
        metavar="FRACTION",
        help="the share of train held out for validation when the data has no validation "
        "split (default 0.1; zoo eval: give the run's own)",
    )


class HFOptions(TypedDict, total=False):
    """The keyword options of `zoo.data.from_hf` and `split_batches` (`zoo.data.DataConfig`
    fields) that the command line sets."""

    batch_size: int
    seed: int
    buckets: str | tuple[int, ...] | None
    group_by_length: bool
    source_column: str
    target_column: str
    text_column: str
    label_column: str
    max_len: int
    num_classes: int
    holdout: float
    tokenizer_options: WordOptions
    packing: bool


def from_hf_options(options: DataOptions, flavor: str) -> HFOptions:
    """`zoo.data.from_hf` keyword options (only those the user set)."""
    from_hf = HFOptions(batch_size=options.batch_size, seed=options.seed,
                        buckets=options.buckets, group_by_length=options.group_by_length)  # fmt: skip
    if options.source is not None:
        from_hf["source_column"] = options.source
    if options.target is not None:
        from_hf["target_column"] = options.target
    if options.text_column is not None:
        from_hf["text_column"] = options.text_column
    if options.label_column is not None:
        from_hf["label_column"] = options.label_column
    if options.max_len is not None:
        from_hf["max_len"] = options.max_len
    if options.num_classes is not None:
        from_hf["num_classes"] = options.num_classes
    if options.holdout is not None:
        from_hf["holdout"] = options.holdout
    if flavor != "translator" and (options.source or options.target):
        raise ValueError("--source/--target name translation columns; use --text-column")
    if flavor != "classifier" and options.num_classes is not None:
        raise ValueError(f"--num-classes is for classifiers; a {flavor} has no classes")
    tokenizer_options = word_options(options)
    if tokenizer_options:
        from_hf["tokenizer_options"] = tokenizer_options
    return from_hf


def load_dataset(spec: str, options: DataOptions, *, file_split: str = "train") -> DatasetDicts:
    """The `DatasetDict` of `--data spec`, read with `--encoding` and `--streaming`.

    Masked-LM text files (`--objective mlm`) hold one example per line.
    """
    from zoo.data.specs import load_spec

    extra = {"sample_by": "line"} if options.masked_lm and spec.startswith("text:") else {}
    return load_spec(spec, streaming=options.streaming, encoding=options.encoding,
                     file_split=file_split, **extra)  # fmt: skip


def load_task_data(
    spec: str, flavor: str, options: DataOptions, *, dataset: DatasetDicts | None = None
) -> TaskData:
    """`zoo.data.TaskData` for `spec` (SCHEME:REST, a file scheme) and the flavor's task."""
    from zoo.data.hf import from_hf

    if dataset is None:
        dataset = load_dataset(spec, options)
    tokenizer = options.tokenizer
    keywords = from_hf_options(options, flavor)
    task = TASK_OF_FLAVOR[flavor]
    if options.masked_lm:
        # masked LM reads plain text as bos, text, eos rows, which hold max_len + 1 tokens
        task, keywords["packing"] = "language_modeling", False
        if tokenizer is None:  # the classifier's default (word), which fine-tuning then reuses
            from zoo.data.tokenizers.choose import DEFAULT_TOKENIZERS

            tokenizer = DEFAULT_TOKENIZERS["classification"]
        if "max_len" in keywords:
            keywords["max_len"] -= 1
    return from_hf(dataset, task=task, tokenizer=tokenizer, **keywords)
