"""`zoo plot-attention MODEL TEXT --out attn.png`: attention heatmaps with token labels."""

from __future__ import annotations

import argparse

import numpy as np

from zoo.cli._load import MODEL_HELP
from zoo.data.tokenizers.base import Tokenizer


def register(commands) -> None:
    parser = commands.add_parser(
        "plot-attention", help="plot a model's attention maps for one input (matplotlib)"
    )
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("text", help="the input (the source sentence for a translator)")
    parser.add_argument("--out", required=True, help="image path, e.g. attn.png")
    parser.add_argument("--layer", type=int, default=-1, help="which layer (default: the last)")
    parser.add_argument(
        "--kind",
        choices=("cross", "encoder", "decoder"),
        default="cross",
        help="translator: which attention to draw",
    )
    parser.add_argument("--max-len", type=int, default=64, help="translator: longest output")
    parser.set_defaults(run=run)


def _labels(tokenizer: Tokenizer, ids: np.ndarray) -> list[str]:
    return [tokenizer.decode([int(i)], skip_special=False) for i in ids]


def run(args: argparse.Namespace) -> int:
    from zoo.cli._load import load_model
    from zoo.data.tokenizers.pair import source_tokenizer, target_tokenizer
    from zoo.inspection import attention_maps, plot_attention
    from zoo.models import flavor_of
    from zoo.models.translator import Translator

    model, tokenizer = load_model(args.model)
    flavor = flavor_of(model)
    if isinstance(model, Translator):
        from zoo.decoding.text import encode_texts
        from zoo.decoding.translate import translate

        source = source_tokenizer(tokenizer)
        src = encode_texts(source, [args.text], model.config.max_positions, add_eos=True)[0]
        out = np.asarray(translate(model, src[None], max_len=args.max_len))[0]
        eos = model.config.eos_id
        stop = int(np.argmax(out == eos)) + 1 if (out == eos).any() else len(out)
        tgt = np.concatenate([[model.config.bos_id], out[:stop]]).astype(np.int32)
        maps = attention_maps(model, src, tgt[:-1])  # by kind: encoder, decoder, cross
        stacked = np.asarray(maps[args.kind] if isinstance(maps, dict) else maps)
        target = target_tokenizer(tokenizer)
        outputs, inputs = _labels(target, tgt[:-1]), _labels(source, src)
        queries = inputs if args.kind == "encoder" else outputs
        keys = outputs if args.kind == "decoder" else inputs
    else:
        add_bos = flavor == "classifier" and tokenizer.bos_id is not None
        tokens = np.asarray(tokenizer.encode(args.text, add_bos=add_bos), np.int32)
        stacked = np.asarray(attention_maps(model, tokens))
        queries = keys = _labels(tokenizer, tokens)
    layer = args.layer % stacked.shape[0]
    plot_attention(stacked[layer], queries, keys, args.out, title=f"{flavor}: layer {layer}")
    print(f"wrote {args.out}")
    return 0
