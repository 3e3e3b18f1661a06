"""`zoo export MODEL --hf DIR`: a run or model folder as a HuggingFace checkpoint folder.

The folder holds what `transformers`' `AutoModelFor...` and `AutoTokenizer` read: the weights,
`config.json`, the tokenizer files with the chat template, and a GPT's `generation_config.json`
naming every end of turn (`zoo.interop.save_hf` writes them). A LoRA run, or MODEL with
`--adapter`, is exported merged (the adapters folded into the weights, as PEFT's
`merge_and_unload` gives). Refused before anything is written: a tokenizer transformers cannot
read (char, word, tiktoken: `--no-tokenizer` exports the weights alone), a model its HF
architecture cannot express, an output folder that is not empty (`--force`). The files are
written in a hidden folder beside DIR and moved into it at the end: Ctrl-C or SIGTERM on the way
leaves DIR as it was (status 130 or 143).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from zoo.cli._load import MODEL_HELP, Model, read_model
from zoo.data.tokenizers.base import Tokenizer

# tokenizer kinds whose saved files transformers reads: `FastTokenizer` (tokenizer.json) and a
# transformers tokenizer (`HFTokenizer`, written by its own save_pretrained)
HF_READABLE = ("tokenizer.json", "hf")


def register(commands) -> None:
    parser = commands.add_parser(
        "export", help="write a model as a HuggingFace checkpoint folder transformers loads"
    )
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--adapter", help="a PEFT LoRA adapter folder, merged into the export")
    parser.add_argument(
        "--hf", required=True, metavar="DIR", help="the folder to write (new or empty)"
    )
    parser.add_argument(
        "--force", action="store_true", help="write into a folder that is not empty"
    )
    parser.add_argument(
        "--no-tokenizer",
        action="store_true",
        help="write the weights and config.json only (for a tokenizer transformers cannot read)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON record of the export")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.interop.export import save_hf
    from zoo.presets import count_params
    from zoo.train.interrupts import HeldInterrupts

    out = Path(args.hf).expanduser()
    check_output(out, args.model, force=args.force)
    model, tokenizer, merged = load_plain(args.model, args.adapter)
    export_class, model_type = check_exportable(model, args.model)
    if args.no_tokenizer:
        tokenizer = None
    else:
        check_tokenizer(tokenizer, args.model)
    with HeldInterrupts() as interrupts, interrupts.immediate():
        save_hf(model, out, tokenizer=tokenizer)  # SIGTERM too stops it, writing nothing
    record = {
        "hf": str(out),
        "architecture": export_class,
        "model_type": model_type,
        "parameters": count_params(model),
        "tokenizer": None if tokenizer is None else tokenizer.kind,
        "chat_template": (out / "chat_template.jinja").is_file(),
        "merged_lora": merged,
        "files": sorted(path.name for path in out.iterdir()),
    }
    if args.json:
        print(json.dumps(record))
        return 0
    merged_note = ", LoRA merged" if merged else ""
    tokenizer_note = "" if tokenizer is not None else ", no tokenizer"
    print(
        f"zoo export: wrote {export_class} ({record['parameters']:,} parameters{merged_note}"
        f"{tokenizer_note}) to {out}"
    )
    return 0


def check_output(out: Path, spec: str, *, force: bool) -> None:
    """Refuse a file, the model's own folder, or (without `--force`) a folder that is not empty."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--hf {out} is a file; name a new or empty folder to export into")
    model_folder = Path(spec).expanduser()
    if model_folder.is_dir() and out.is_dir() and out.resolve() == model_folder.resolve():
        raise ValueError(
            f"--hf {out} is the folder of MODEL {spec}: the export would overwrite its "
            "config.json; name another folder"
        )
    if out.is_dir() and not force and any(out.iterdir()):
        raise ValueError(
            f"--hf {out} exists and is not empty; name a new or empty folder, or pass --force "
            "to write into it (files of the same names are replaced)"
        )


def load_plain(spec: str, adapter: str | None) -> tuple[Model, Tokenizer | None, bool]:
    """`(model, tokenizer or None, merged)`: MODEL with `--adapter`, LoRA adapters merged and
    int8 layers dequantized, so that it is a plain model an HF architecture holds."""
    from zoo.lora.adapters import merge
    from zoo.nn.lora import has_lora
    from zoo.nn.quantized import dequantize, quantized_paths

    model, tokenizer = read_model(spec, option="MODEL")
    if adapter is not None:
        from zoo.lora.peft_load import load_adapter

        model = load_adapter(model, adapter)
    if has_lora(model):
        return merge(model), tokenizer, True
    if quantized_paths(model):
        return dequantize(model), tokenizer, False
    return model, tokenizer, False


def check_tokenizer(tokenizer: Tokenizer | None, spec: str) -> None:
    """Refuse a missing tokenizer, or one of a kind whose files transformers cannot read."""
    weights_only = "or pass --no-tokenizer to export the weights and config.json alone"
    if tokenizer is None:
        raise FileNotFoundError(
            f"{spec} has no tokenizer (zoo_tokenizer.json, tokenizer.json, ...), so the export "
            f"would have none; copy the checkpoint's tokenizer files into it, {weights_only}"
        )
    if tokenizer.kind in HF_READABLE:
        return
    name = _describe(tokenizer)
    if tokenizer.kind == "tiktoken":
        gpt2 = getattr(tokenizer, "encoding_name", "") == "gpt2"
        same = " (transformers' GPT-2 tokenizer gives the same ids)" if gpt2 else ""
        raise ValueError(
            f"{spec} has a {name}, which transformers cannot load from zoo's files; pass "
            f"--no-tokenizer to export the weights and config.json alone{same}, or train with "
            "a tokenizer.json (zoo train --init hf:NAME or a checkpoint folder that has one)"
        )
    raise ValueError(
        f"{spec} has a {name}, which transformers cannot load; train with a tokenizer.json "
        f"(zoo train --init hf:NAME or a checkpoint folder that has one), {weights_only}"
    )


def _describe(tokenizer: Tokenizer) -> str:
    """`word tokenizer`, `tiktoken tokenizer (gpt2)`, `pair tokenizer (word source, char
    target)`."""
    source, target = getattr(tokenizer, "source", None), getattr(tokenizer, "target", None)
    if isinstance(source, Tokenizer) and isinstance(target, Tokenizer):
        return f"{tokenizer.kind} tokenizer ({source.kind} source, {target.kind} target)"
    encoding = getattr(tokenizer, "encoding_name", None)
    return f"{tokenizer.kind} tokenizer" + (f" ({encoding})" if encoding else "")


def check_exportable(model: Model, spec: str) -> tuple[str, str]:
    """`(transformers class, model_type)` MODEL exports to; refuses with the reason before
    anything is written. (Warnings about settings left out come once, from `save_hf`.)"""
    from zoo.interop.architecture import UnsupportedExport
    from zoo.interop.architectures import architecture_for

    architecture = architecture_for(model)
    interop = logging.getLogger("zoo.interop")
    level = interop.level
    interop.setLevel(logging.ERROR)
    try:
        architecture.hf_config(model.config)
    except UnsupportedExport as error:
        raise ValueError(
            f"{spec} cannot be exported to transformers: {error}; train with a preset of a "
            "HuggingFace family (gpt2, llama-tiny, bert-base, ...: see zoo presets) or keep "
            "using the model with zoo"
        ) from None
    finally:
        interop.setLevel(level)
    return architecture.export_class, architecture.model_type
