"""`zoo translate MODEL TEXT...`: translate sentences with a trained or pretrained translator."""

from __future__ import annotations

import argparse

from zoo.cli import _inference as inference
from zoo.cli._numbers import ANY


def register(commands) -> None:
    parser = commands.add_parser("translate", help="translate sentences with a translator")
    inference.add_model_arguments(parser)
    parser.add_argument("text", nargs="+", help="source sentences")
    parser.add_argument("--beam-size", type=int, default=1, help="1 is greedy")
    parser.add_argument("--length-penalty", type=ANY, default=0.6, help="GNMT alpha")
    parser.add_argument("--max-len", type=int, default=64, help="longest translation in tokens")
    inference.add_output_options(parser, json_help="print JSON instead of text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.decoding.text import translate_texts
    from zoo.models.translator import Translator

    model, tokenizer, layout = inference.load_for(args, Translator)
    outputs = translate_texts(
        model, tokenizer, args.text, beam_size=args.beam_size,
        length_penalty=args.length_penalty, max_len=args.max_len, mesh=layout,
    )  # fmt: skip
    rows = [{"source": s, "translation": t} for s, t in zip(args.text, outputs)]
    inference.print_results(rows, args.json, lambda row: row["translation"], raw=args.raw)
    return 0
