"""The model `zoo train` starts from: a preset sized by the data, or `--init` weights."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def check_preset(args: argparse.Namespace) -> str:
    """The flavor of `--preset`; it must match the command's flavor."""
    import zoo

    if getattr(args, "objective", None) == "mlm" and args.flavor != "classifier":
        raise ValueError(
            f"--objective mlm pretrains an encoder: use `zoo train classifier`, not {args.flavor}"
        )
    if args.preset is None:
        if args.init is None:
            raise ValueError("zoo train needs --preset NAME (see `zoo presets`) or --init PATH")
        return args.flavor
    preset = zoo.presets.get(args.preset)
    if preset.flavor != args.flavor:
        raise ValueError(
            f"preset {args.preset!r} is a {preset.flavor}, not a {args.flavor}; pick a "
            f"{args.flavor} preset (see `zoo presets`)"
        )
    return preset.flavor


def build_model(args: argparse.Namespace, model_key: Any) -> tuple[Any, Any, Any, Any]:
    """(model, train source, eval source, tokenizer) for the command line in `args`."""
    import zoo
    from zoo.cli.train import model_overrides, resolve_data
    from zoo.train.warm_start import load_init, with_classes, without_masked_lm

    initial, args.init_tokenizer = (None, None) if args.init is None else load_init(args.init)
    if initial is not None:
        _check_init_tokenizer(args)
        if zoo.models.flavor_of(initial) != args.flavor:
            raise ValueError(
                f"--init {args.init} holds a {zoo.models.flavor_of(initial)}, not a {args.flavor}"
            )
        if args.max_len is None:  # RoBERTa's position offset leaves fewer tokens than positions
            config = initial.config  # type: ignore[attr-defined]
            args.max_len = getattr(config, "max_tokens", config.max_positions)
    train, evaluation, tokenizer = resolve_data(args.data, args.flavor, args)
    overrides = model_overrides(args.flavor, tokenizer, train, [])
    masked_lm = getattr(args, "objective", None) == "mlm"
    if masked_lm:
        overrides |= masked_lm_fields(tokenizer, initial)
    if args.flavor == "classifier" and getattr(args, "data_num_classes", None):
        overrides["num_classes"] = args.data_num_classes
    if initial is None:
        if args.max_len is not None:  # synthetic data too: its sequences must fit
            overrides["max_positions"] = args.max_len
        overrides |= model_overrides(args.flavor, None, train, args.set)
        return zoo.create(args.preset, key=model_key, **overrides), train, evaluation, tokenizer
    if args.set:
        raise ValueError("--set changes a fresh model's config; it cannot be used with --init")
    config = initial.config  # type: ignore[attr-defined]
    if args.flavor == "classifier" and config.masked_lm and not masked_lm:
        print(
            f"zoo train: --init {args.init} was pretrained with a masked-LM head: it is dropped, "
            "and the classification head is initialised fresh (every encoder weight is kept)",
            file=sys.stderr,
        )
        initial = without_masked_lm(initial, key=model_key)
        has_pooler = initial.config.pooler  # type: ignore[attr-defined]
        args.fresh_parts = ("head", "pooler") if has_pooler else ("head",)
    if overrides.get("vocab_size", 0) > config.vocab_size:
        raise ValueError(
            f"the data's tokenizer has {overrides['vocab_size']} tokens but the --init model "
            f"only {config.vocab_size}; train with the model's own tokenizer"
        )
    if args.flavor == "classifier" and "num_classes" in overrides:
        if overrides["num_classes"] != config.num_classes:
            print(
                f"zoo train: the data has {overrides['num_classes']} classes, the --init model "
                f"{config.num_classes}: its classification head is re-initialised",
                file=sys.stderr,
            )
        initial = with_classes(initial, overrides["num_classes"], key=model_key)
    return initial, train, evaluation, tokenizer


def _check_init_tokenizer(args: argparse.Namespace) -> None:
    """An `--init` model's embeddings go with its own tokenizer: `--tokenizer` may not replace it
    unnoticed, and a folder without one needs `--tokenizer` said out loud."""
    given = getattr(args, "tokenizer_given", args.tokenizer is not None)
    if args.init_tokenizer is not None and given:
        raise ValueError(
            f"--tokenizer {args.tokenizer} would replace the tokenizer of --init {args.init}, "
            "whose embeddings are learnt for that tokenizer's ids; drop --tokenizer"
        )
    if args.init_tokenizer is None and not given:
        raise ValueError(
            f"--init {args.init} has no tokenizer files (tokenizer.json, vocab.txt, "
            "zoo_tokenizer.json, ...); copy the checkpoint's tokenizer files into it, or pass "
            "--tokenizer KIND to learn a new vocabulary from the data (the pretrained token "
            "embeddings then start from unrelated tokens)"
        )
    if args.init_tokenizer is None:
        print(
            f"zoo train: --init {args.init} has no tokenizer: training with a new --tokenizer "
            f"{args.tokenizer} vocabulary; its tokens do not match the pretrained embeddings",
            file=sys.stderr,
        )


def masked_lm_fields(tokenizer: Any, initial: Any) -> dict[str, Any]:
    """Config fields of a classifier pretrained with `--objective mlm` on `tokenizer`'s data.

    A tokenizer without a mask token (word, char) gets one more id, one past its vocabulary.
    """
    if initial is not None:
        if not initial.config.masked_lm:
            raise ValueError(
                "--objective mlm trains a masked-LM head, and the --init model has none: "
                "start from a preset, a masked-LM run or a *ForMaskedLM checkpoint"
            )
        return {}
    mask_id = getattr(tokenizer, "mask_id", None)
    if mask_id is not None:
        return {"masked_lm": True, "mask_id": mask_id}
    return {
        "masked_lm": True,
        "mask_id": tokenizer.vocab_size,
        "vocab_size": tokenizer.vocab_size + 1,
    }


def make_task(args: argparse.Namespace, model: Any, tokenizer: Any) -> Any:
    """The task `zoo train` optimises: the flavor's, or masked-LM pretraining (`--objective`)."""
    import zoo

    if getattr(args, "objective", None) != "mlm":
        options = {"label_smoothing": args.label_smoothing} if args.flavor == "translator" else {}
        return zoo.tasks.for_flavor(args.flavor, **options)
    mask_id = model.config.mask_id
    if mask_id is None:
        mask_id = getattr(tokenizer, "mask_id", None)
    return zoo.tasks.MaskedLanguageModeling.for_tokenizer(
        tokenizer, args.mask_rate, whole_word=args.whole_word_masking, mask_id=mask_id
    )
