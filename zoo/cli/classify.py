"""`zoo classify MODEL TEXT...`: class probabilities of texts with a trained classifier."""

from __future__ import annotations

import json

from zoo.cli._load import MODEL_HELP
from zoo.cli._mesh import add_mesh_option, layout_from_args


def register(commands) -> None:
    parser = commands.add_parser("classify", help="classify texts with a trained classifier")
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--adapter", help="a PEFT LoRA adapter folder to put on the model")
    parser.add_argument("text", nargs="+", help="texts to classify")
    add_mesh_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args) -> int:
    from zoo.cli._load import load_model
    from zoo.decoding.text import classify_texts
    from zoo.models.classifier import Classifier

    layout = layout_from_args(args)  # a mesh that does not fit stops here, before loading
    model, tokenizer = load_model(args.model, Classifier, args.adapter)
    probabilities = classify_texts(
        model, tokenizer, args.text, mesh=None if layout is None else layout.mesh
    )
    for text, probs in zip(args.text, probabilities):
        label = int(probs.argmax())
        if args.json:
            row = {"text": text, "label": label, "probabilities": [float(p) for p in probs]}
            print(json.dumps(row, ensure_ascii=False))
        else:
            print(f"{label}\t{float(probs[label]):.3f}\t{text}")
    return 0
