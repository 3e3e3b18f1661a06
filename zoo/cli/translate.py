"""`zoo translate MODEL TEXT...`: translate sentences with a trained or pretrained translator."""

from __future__ import annotations

import json

from zoo.cli._load import MODEL_HELP
from zoo.cli._mesh import add_mesh_option, layout_from_args


def register(commands) -> None:
    parser = commands.add_parser("translate", help="translate sentences with a translator")
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--adapter", help="a PEFT LoRA adapter folder to put on the model")
    parser.add_argument("text", nargs="+", help="source sentences")
    parser.add_argument("--beam-size", type=int, default=1, help="1 is greedy")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="GNMT alpha")
    parser.add_argument("--max-len", type=int, default=64, help="longest translation in tokens")
    add_mesh_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(run=run)


def run(args) -> int:
    from zoo.cli._load import load_model
    from zoo.decoding.text import translate_texts
    from zoo.models.translator import Translator

    layout = layout_from_args(args)  # a mesh that does not fit stops here, before loading
    model, tokenizer = load_model(args.model, Translator, args.adapter)
    outputs = translate_texts(
        model,
        tokenizer,
        args.text,
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        max_len=args.max_len,
        mesh=None if layout is None else layout.mesh,
    )
    for source, output in zip(args.text, outputs):
        if args.json:
            print(json.dumps({"source": source, "translation": output}, ensure_ascii=False))
        else:
            print(output)
    return 0
