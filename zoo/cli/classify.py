"""`zoo classify MODEL TEXT...`: class probabilities of texts with a trained classifier."""

from __future__ import annotations

import argparse

from zoo.cli import _inference as inference


def register(commands) -> None:
    parser = commands.add_parser("classify", help="classify texts with a trained classifier")
    inference.add_model_arguments(parser)
    parser.add_argument("text", nargs="+", help="texts to classify")
    inference.add_output_options(parser, json_help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from zoo.decoding.text import classify_texts
    from zoo.models.classifier import Classifier

    model, tokenizer, layout = inference.load_for(args, Classifier)
    probabilities = classify_texts(model, tokenizer, args.text, mesh=layout)
    rows = []
    for text, probs in zip(args.text, probabilities):
        label = int(probs.argmax())
        rows.append({"text": text, "label": label, "probabilities": [float(p) for p in probs]})
    inference.print_results(
        rows,
        args.json,
        lambda row: f"{row['label']}\t{row['probabilities'][row['label']]:.3f}\t{row['text']}",
        raw=args.raw,
    )
    return 0
