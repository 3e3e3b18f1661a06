"""The model `zoo train` starts from: a preset sized by the data, or `--init` weights."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def check_preset(args: argparse.Namespace) -> str:
    """The flavor of `--preset`; it must match the command's flavor."""
    import zoo

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
    from zoo.cli.train import FILE_SCHEMES, model_overrides, resolve_data
    from zoo.train.warm_start import load_init, with_classes

    initial, args.init_tokenizer = (None, None) if args.init is None else load_init(args.init)
    if initial is not None:
        if zoo.models.flavor_of(initial) != args.flavor:
            raise ValueError(
                f"--init {args.init} holds a {zoo.models.flavor_of(initial)}, not a {args.flavor}"
            )
        if args.max_len is None:  # RoBERTa's position offset leaves fewer tokens than positions
            config = initial.config  # type: ignore[attr-defined]
            args.max_len = getattr(config, "max_tokens", config.max_positions)
    train, evaluation, tokenizer = resolve_data(args.data, args.flavor, args)
    overrides = model_overrides(args.flavor, tokenizer, train, [])
    if args.flavor == "classifier" and getattr(args, "data_num_classes", None):
        overrides["num_classes"] = args.data_num_classes
    if initial is None:
        if args.data.partition(":")[0] in FILE_SCHEMES and args.max_len is not None:
            overrides["max_positions"] = args.max_len
        overrides |= model_overrides(args.flavor, None, train, args.set)
        return zoo.create(args.preset, key=model_key, **overrides), train, evaluation, tokenizer
    if args.set:
        raise ValueError("--set changes a fresh model's config; it cannot be used with --init")
    config = initial.config  # type: ignore[attr-defined]
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
