"""`zoo generate MODEL --prompt TEXT`: continue a prompt with a GPT."""

from __future__ import annotations

import argparse

from zoo.cli import _inference as inference


def register(commands) -> None:
    parser = commands.add_parser("generate", help="continue a text prompt with a trained GPT")
    inference.add_model_arguments(parser)
    parser.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    inference.add_sampling_options(parser, max_new_tokens=100)
    inference.add_output_options(parser, json_help="print JSON instead of text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.decoding.text import generate_texts
    from zoo.models.gpt import GPT

    sampling, key = inference.sampling_from_args(args)
    model, tokenizer, layout = inference.load_for(args, GPT)
    outputs = generate_texts(
        model, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens, sampling=sampling,
        key=key, mesh=layout,
    )  # fmt: skip
    rows = [{"prompt": p, "output": o} for p, o in zip(args.prompt, outputs)]
    inference.print_results(
        rows, args.json, lambda row: row["prompt"] + row["output"], raw=args.raw
    )
    return 0
