"""`zoo generate MODEL --prompt TEXT`: continue a prompt with a GPT."""

from __future__ import annotations

import json

from zoo.cli._load import MODEL_HELP
from zoo.cli._mesh import add_mesh_option, layout_from_args


def register(commands) -> None:
    parser = commands.add_parser("generate", help="continue a text prompt with a trained GPT")
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--adapter", help="a PEFT LoRA adapter folder to put on the model")
    parser.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    add_mesh_option(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(run=run)


def run(args) -> int:
    import jax

    from zoo.cli._load import load_model
    from zoo.decoding.text import generate_texts
    from zoo.models.gpt import GPT

    layout = layout_from_args(args)  # a mesh that does not fit stops here, before loading
    model, tokenizer = load_model(args.model, GPT, args.adapter)
    outputs = generate_texts(
        model,
        tokenizer,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        key=None if args.temperature == 0 else jax.random.key(args.seed),
        mesh=None if layout is None else layout.mesh,
    )
    for prompt, output in zip(args.prompt, outputs):
        if args.json:
            print(json.dumps({"prompt": prompt, "output": output}, ensure_ascii=False))
        else:
            print(prompt + output)
    return 0
