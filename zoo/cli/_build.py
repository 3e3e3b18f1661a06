"""The model `zoo train` starts from: a preset sized by the data, or `--init` weights.

The command line's choice of model is one record, `ModelChoice`, and what the run optimises
another, `Objective`. `build_model` reads `--data` and makes the model for it in one step and
returns what it made as a `Built` record: the model, the data, and the parts it started fresh.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import equinox as eqx
from jaxtyping import PRNGKeyArray

from zoo.cli._datasets import DataOptions, RunData, resolve_data
from zoo.cli._grpo import GRPOOptions
from zoo.cli._load import Model, read_model
from zoo.cli._preference import PreferenceOptions
from zoo.data.batches import BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.models import flavor_of
from zoo.models.classifier import Classifier
from zoo.models.flat import renamed_setting
from zoo.tasks.base import Task

# a config field's value, as `--set NAME=VALUE` and the data give it (a JSON object for a
# record: `--set head.pooler={}`)
FieldValue = int | float | str | bool | list | dict | None


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """The model `zoo train` trains: a preset (changed by `--set`) or `--init` weights, and the
    tokenizer its data is encoded with."""

    flavor: str  # classifier | gpt | translator
    preset: str | None = None  # --preset NAME
    init: str | None = None  # --init: a zoo run or model folder, a HF folder, hf:NAME
    # --set NAME=VALUE: config fields of a fresh model, by the config tree's names (as given)
    settings: tuple[str, ...] = ()
    tokenizer: str | None = None  # --tokenizer KIND, else the preset's default
    tokenizer_given: bool = False  # --tokenizer was given, not a preset's default


@dataclass(frozen=True, kw_only=True)
class Objective:
    """What `zoo train` optimises: `--objective` and the options of its loss."""

    name: str = "classify"  # classify (the flavor's own task) | mlm | a preference objective
    label_smoothing: float | None = None  # translator: the targets' smoothing
    mask_rate: float = 0.15  # mlm: the share of tokens chosen
    whole_word_masking: bool = False  # mlm: every piece of a chosen word is masked
    preference: PreferenceOptions | None = None  # dpo, ipo, ...: the loss and its reference
    grpo: GRPOOptions | None = None  # grpo: the rewards, sampling and loss
    center_rewards: float | None = None  # reward: TRL's center_rewards_coefficient


@dataclass(frozen=True)
class Built:
    """What `zoo train` trains: the model, its data, and the parts of an `--init` model that
    start fresh (a classifier's head and pooler after masked-LM pretraining)."""

    model: eqx.Module
    data: RunData
    fresh_parts: tuple[str, ...] = ()


def check_preset(flavor: str, preset: str | None, init: str | None, *, objective: str) -> str:
    """The flavor of `--preset`; it must match the command's `flavor` (and `--objective`)."""
    from zoo.presets import get

    if objective == "mlm" and flavor != "classifier":
        raise ValueError(
            f"--objective mlm pretrains an encoder: use `zoo train classifier`, not {flavor}"
        )
    if preset is None:
        if init is None:
            raise ValueError("zoo train needs --preset NAME (see `zoo presets`) or --init PATH")
        return flavor
    found = get(preset)
    if found.flavor != flavor:
        raise ValueError(
            f"preset {preset!r} is a {found.flavor}, not a {flavor}; pick a "
            f"{flavor} preset (see `zoo presets`)"
        )
    return found.flavor


def build_model(
    choice: ModelChoice,
    data_specs: str | Sequence[str],
    options: DataOptions,
    model_key: PRNGKeyArray,
    *,
    resumed: bool = False,
    resumed_tokenizer: Tokenizer | None = None,
) -> Built:
    """The model of `choice` and its data, `--data data_specs` read with `options`.

    `resumed`: the run folder holds a run to resume, whose command may spell `--set` as zoo 0.1
    did (`zoo.models.flat.renamed_setting`). `resumed_tokenizer`: the tokenizer a resumed run
    saved, used instead of one learnt again from the data (a warning counts the words of the
    data it does not know).
    """
    from zoo.presets import create

    initial, init_tokenizer, max_len = None, resumed_tokenizer, options.max_len
    if choice.init is not None:
        initial, init_tokenizer = read_model(choice.init, option="--init")
        _check_init_tokenizer(choice, init_tokenizer)
        if flavor_of(initial) != choice.flavor:
            raise ValueError(
                f"--init {choice.init} holds a {flavor_of(initial)}, not a {choice.flavor}"
            )
        if max_len is None:  # RoBERTa's position offset leaves fewer tokens than positions
            max_len = (
                initial.config.max_tokens
                if isinstance(initial, Classifier)
                else initial.config.max_positions
            )
    options = dataclasses.replace(
        options, max_len=max_len, tokenizer=init_tokenizer or choice.tokenizer
    )
    data = resolve_data(data_specs, choice.flavor, options)
    if resumed_tokenizer is not None:
        warn_unknown_words(data)
    overrides = model_overrides(choice.flavor, data.tokenizer, data.train, [])
    if options.masked_lm:
        overrides |= masked_lm_fields(data.tokenizer, initial)
    if choice.flavor == "classifier" and data.num_classes:
        overrides["num_classes"] = data.num_classes
    if initial is not None:
        return _from_init(choice, initial, overrides, data, masked_lm=options.masked_lm,
                          key=model_key)  # fmt: skip
    if max_len is not None:  # synthetic data too: its sequences must fit
        overrides["max_positions"] = max_len
    settings = choice.settings
    if resumed:  # the command that started the run, perhaps under 0.1
        settings = tuple(renamed_setting(setting) for setting in settings)
    overrides |= model_overrides(choice.flavor, None, data.train, settings)
    if choice.preset is None:
        raise ValueError("zoo train needs --preset NAME (see `zoo presets`) or --init PATH")
    return Built(create(choice.preset, key=model_key, **overrides), data)


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
    choice: ModelChoice,
    initial: Model,
    overrides: dict[str, FieldValue],
    data: RunData,
    *,
    masked_lm: bool,
    key: PRNGKeyArray,
) -> Built:
    """The `--init` model fitted to the data: a classifier's head for its classes (and for
    classification after masked-LM pretraining, unless it goes on with it: `masked_lm`)."""
    from zoo.train.warm_start import with_classes, without_masked_lm

    if choice.settings:
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
    if initial.config.masked_lm and not masked_lm:
        print(
            f"zoo train: --init {choice.init} was pretrained with a masked-LM head: it is dropped, "
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


def _check_init_tokenizer(choice: ModelChoice, init_tokenizer: Tokenizer | None) -> None:
    """An `--init` model's embeddings go with its own tokenizer: `--tokenizer` may not replace it
    unnoticed, and a folder without one needs `--tokenizer` said out loud."""
    given = choice.tokenizer_given
    if init_tokenizer is not None and given:
        raise ValueError(
            f"--tokenizer {choice.tokenizer} would replace the tokenizer of --init {choice.init}, "
            "whose embeddings are learnt for that tokenizer's ids; drop --tokenizer"
        )
    if init_tokenizer is None and not given:
        raise ValueError(
            f"--init {choice.init} has no tokenizer files (tokenizer.json, vocab.txt, "
            "zoo_tokenizer.json, ...); copy the checkpoint's tokenizer files into it, or pass "
            "--tokenizer KIND to learn a new vocabulary from the data (the pretrained token "
            "embeddings then start from unrelated tokens)"
        )
    if init_tokenizer is None:
        print(
            f"zoo train: --init {choice.init} has no tokenizer: training with a new --tokenizer "
            f"{choice.tokenizer} vocabulary; its tokens do not match the pretrained embeddings",
            file=sys.stderr,
        )


# the spellings of the non-finite numbers a --set value may give (JSON's NaN and Infinity
# parse as JSON); read as floats, so that the field refuses them with its range
NON_FINITE = ("nan", "inf", "infinity")


def _config_value(text: str) -> FieldValue:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if text.strip().lower().lstrip("+-") in NON_FINITE:
            return float(text)
        return text


def model_overrides(
    flavor: str, tokenizer: Tokenizer | None, train: BatchSource, settings: Sequence[str]
) -> dict[str, FieldValue]:
    """Config fields taken from the data (vocabulary, special ids, classes) and from `--set`
    (`settings`, each `NAME=VALUE`: a name `TransformerConfig.replace` takes, by the config
    tree's path, short block path or alias)."""
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
            raise ValueError(
                f"--set takes NAME=VALUE (e.g. --set attention.num_kv_heads=2), got {setting!r}"
            )
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


def make_task(
    flavor: str, objective: Objective, model: eqx.Module, tokenizer: Tokenizer | None
) -> Task:
    """The task `zoo train` optimises for `model`, a `flavor`: the flavor's, or masked-LM
    pretraining on text encoded by `tokenizer` (`--objective`)."""
    from zoo.tasks import for_flavor
    from zoo.tasks.masked_lm import MaskedLanguageModeling

    if objective.name != "mlm":
        options = {"label_smoothing": objective.label_smoothing} if flavor == "translator" else {}
        return for_flavor(flavor, **options)
    if not isinstance(model, Classifier) or tokenizer is None:
        raise ValueError("--objective mlm pretrains a classifier's encoder on tokenized text")
    mask_id = model.config.mask_id
    if mask_id is None:
        mask_id = getattr(tokenizer, "mask_id", None)
    return MaskedLanguageModeling.for_tokenizer(
        tokenizer, objective.mask_rate, whole_word=objective.whole_word_masking, mask_id=mask_id
    )
