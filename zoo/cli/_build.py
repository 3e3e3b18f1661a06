"""The model `zoo train` starts from: a preset sized by the data, or `--init` weights.

`build_model` reads `--data` and makes the model for it in one step and returns what it made
as a `Built` record: the model, the data, and the parts it started fresh.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import equinox as eqx
from jaxtyping import PRNGKeyArray

from zoo.cli._datasets import DataOptions, RunData, resolve_data
from zoo.cli._load import Model, read_model
from zoo.data.batches import BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.models import flavor_of
from zoo.models.classifier import Classifier
from zoo.tasks.base import Task

# a config field's value, as `--set FIELD=VALUE` and the data give it (a JSON object for a
# record: `--set head.pooler={}`)
FieldValue = int | float | str | bool | list | dict | None


@dataclass(frozen=True)
class Built:
    """What `zoo train` trains: the model, its data, and the parts of an `--init` model that
    start fresh (a classifier's head and pooler after masked-LM pretraining)."""

    model: eqx.Module
    data: RunData
    fresh_parts: tuple[str, ...] = ()


def check_preset(args: argparse.Namespace) -> str:
    """The flavor of `--preset`; it must match the command's flavor."""
    from zoo.presets import get

    if getattr(args, "objective", None) == "mlm" and args.flavor != "classifier":
        raise ValueError(
            f"--objective mlm pretrains an encoder: use `zoo train classifier`, not {args.flavor}"
        )
    if args.preset is None:
        if args.init is None:
            raise ValueError("zoo train needs --preset NAME (see `zoo presets`) or --init PATH")
        return args.flavor
    preset = get(args.preset)
    if preset.flavor != args.flavor:
        raise ValueError(
            f"preset {args.preset!r} is a {preset.flavor}, not a {args.flavor}; pick a "
            f"{args.flavor} preset (see `zoo presets`)"
        )
    return preset.flavor


def build_model(
    args: argparse.Namespace,
    model_key: PRNGKeyArray,
    *,
    tokenizer_given: bool,
    resumed_tokenizer: Tokenizer | None = None,
) -> Built:
    """The model and data of the command line in `args` (its defaults filled).

    `tokenizer_given`: whether `--tokenizer` was on the command line (not a preset's default).
    `resumed_tokenizer`: the tokenizer a resumed run saved, used instead of one learnt again
    from the data (a warning counts the words of the data it does not know).
    """
    from zoo.presets import create

    initial, init_tokenizer, max_len = None, resumed_tokenizer, args.max_len
    if args.init is not None:
        initial, init_tokenizer = read_model(args.init, option="--init")
        _check_init_tokenizer(args, init_tokenizer, tokenizer_given)
        if flavor_of(initial) != args.flavor:
            raise ValueError(
                f"--init {args.init} holds a {flavor_of(initial)}, not a {args.flavor}"
            )
        if max_len is None:  # RoBERTa's position offset leaves fewer tokens than positions
            max_len = getattr(initial.config, "max_tokens", initial.config.max_positions)
    options = DataOptions.from_args(
        args, max_len=max_len, tokenizer=init_tokenizer or args.tokenizer
    )
    data = resolve_data(args.data, args.flavor, options)
    if resumed_tokenizer is not None:
        warn_unknown_words(data)
    overrides = model_overrides(args.flavor, data.tokenizer, data.train, [])
    if options.masked_lm:
        overrides |= masked_lm_fields(data.tokenizer, initial)
    if args.flavor == "classifier" and data.num_classes:
        overrides["num_classes"] = data.num_classes
    if initial is not None:
        return _from_init(args, initial, overrides, data, key=model_key)
    if max_len is not None:  # synthetic data too: its sequences must fit
        overrides["max_positions"] = max_len
    overrides |= model_overrides(args.flavor, None, data.train, args.set)
    return Built(create(args.preset, key=model_key, **overrides), data)


def warn_unknown_words(data: RunData) -> None:
    """Warn when tokens of the training data are `<unk>` to the run's saved tokenizer (the data
    changed since the run learnt it); a source without its arrays in memory is not counted."""
    tokenizer = data.tokenizer
    tokens = getattr(data.train, "arrays", {}).get("tokens")
    unk = None if tokenizer is None else tokenizer.unk_id
    if tokens is None or unk is None or getattr(tokenizer, "source", None) is not None:
        return
    unknown = int((tokens == unk).sum())
    if unknown:
        print(
            f"zoo train: {unknown} tokens of the training data are unknown to the run's saved "
            f"{type(tokenizer).__name__} (they read as <unk>): the data changed since the run "
            "learnt its vocabulary; to learn a new one, train into a new --out",
            file=sys.stderr,
        )


def _from_init(
    args: argparse.Namespace,
    initial: Model,
    overrides: dict[str, FieldValue],
    data: RunData,
    *,
    key: PRNGKeyArray,
) -> Built:
    """The `--init` model fitted to the data: a classifier's head for its classes (and for
    classification after masked-LM pretraining)."""
    from zoo.train.warm_start import with_classes, without_masked_lm

    if args.set:
        raise ValueError("--set changes a fresh model's config; it cannot be used with --init")
    vocab_size = overrides.get("vocab_size")
    if isinstance(vocab_size, int) and vocab_size > initial.config.vocab_size:
        raise ValueError(
            f"the data's tokenizer has {vocab_size} tokens but the --init model only "
            f"{initial.config.vocab_size}; train with the model's own tokenizer"
        )
    if not isinstance(initial, Classifier):
        return Built(initial, data)
    fresh_parts: tuple[str, ...] = ()
    if initial.config.masked_lm and getattr(args, "objective", None) != "mlm":
        print(
            f"zoo train: --init {args.init} was pretrained with a masked-LM head: it is dropped, "
            "and the classification head is initialised fresh (every encoder weight is kept)",
            file=sys.stderr,
        )
        initial = without_masked_lm(initial, key=key)
        fresh_parts = ("head", "pooler") if initial.config.head.pooler else ("head",)
    classes = overrides.get("num_classes")
    if isinstance(classes, int):
        if classes != initial.config.num_classes:
            print(
                f"zoo train: the data has {classes} classes, the --init model "
                f"{initial.config.num_classes}: its classification head is re-initialised",
                file=sys.stderr,
            )
        initial = with_classes(initial, classes, key=key)
    return Built(initial, data, fresh_parts)


def _check_init_tokenizer(
    args: argparse.Namespace, init_tokenizer: Tokenizer | None, given: bool
) -> None:
    """An `--init` model's embeddings go with its own tokenizer: `--tokenizer` may not replace it
    unnoticed, and a folder without one needs `--tokenizer` said out loud."""
    if init_tokenizer is not None and given:
        raise ValueError(
            f"--tokenizer {args.tokenizer} would replace the tokenizer of --init {args.init}, "
            "whose embeddings are learnt for that tokenizer's ids; drop --tokenizer"
        )
    if init_tokenizer is None and not given:
        raise ValueError(
            f"--init {args.init} has no tokenizer files (tokenizer.json, vocab.txt, "
            "zoo_tokenizer.json, ...); copy the checkpoint's tokenizer files into it, or pass "
            "--tokenizer KIND to learn a new vocabulary from the data (the pretrained token "
            "embeddings then start from unrelated tokens)"
        )
    if init_tokenizer is None:
        print(
            f"zoo train: --init {args.init} has no tokenizer: training with a new --tokenizer "
            f"{args.tokenizer} vocabulary; its tokens do not match the pretrained embeddings",
            file=sys.stderr,
        )


def _config_value(text: str) -> FieldValue:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def model_overrides(
    flavor: str, tokenizer: Tokenizer | None, train: BatchSource, settings: list[str]
) -> dict[str, FieldValue]:
    """Config fields taken from the data (vocabulary, special ids, classes) and from `--set`."""
    overrides: dict[str, FieldValue] = {}
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


def masked_lm_fields(tokenizer: Tokenizer | None, initial: Model | None) -> dict[str, FieldValue]:
    """Config fields of a classifier pretrained with `--objective mlm` on `tokenizer`'s data.

    A tokenizer without a mask token (word, char) gets one more id, one past its vocabulary.
    """
    if initial is not None:
        if not (isinstance(initial, Classifier) and initial.config.masked_lm):
            raise ValueError(
                "--objective mlm trains a masked-LM head, and the --init model has none: "
                "start from a preset, a masked-LM run or a *ForMaskedLM checkpoint"
            )
        return {}
    assert tokenizer is not None  # the data of a fresh model always brings one
    mask_id = getattr(tokenizer, "mask_id", None)
    if mask_id is not None:
        return {"masked_lm": True, "mask_id": mask_id}
    return {
        "masked_lm": True,
        "mask_id": tokenizer.vocab_size,
        "vocab_size": tokenizer.vocab_size + 1,
    }


def make_task(args: argparse.Namespace, model: eqx.Module, tokenizer: Tokenizer | None) -> Task:
    """The task `zoo train` optimises: the flavor's, or masked-LM pretraining (`--objective`)."""
    from zoo.tasks import for_flavor
    from zoo.tasks.masked_lm import MaskedLanguageModeling

    if getattr(args, "objective", None) != "mlm":
        options = {"label_smoothing": args.label_smoothing} if args.flavor == "translator" else {}
        return for_flavor(args.flavor, **options)
    if not isinstance(model, Classifier) or tokenizer is None:
        raise ValueError("--objective mlm pretrains a classifier's encoder on tokenized text")
    mask_id = model.config.mask_id
    if mask_id is None:
        mask_id = getattr(tokenizer, "mask_id", None)
    return MaskedLanguageModeling.for_tokenizer(
        tokenizer, args.mask_rate, whole_word=args.whole_word_masking, mask_id=mask_id
    )
