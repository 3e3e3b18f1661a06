"""What the inference commands share (`zoo generate`, `zoo translate`, `zoo classify`, `zoo
chat`): the MODEL argument and `--adapter`, the sampling options, `--mesh`, `--json` and
`--raw`, the model loaded once the options are checked, and one result printed a line, its
control characters shown escaped (`zoo.text.printable`) unless `--raw`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from jaxtyping import PRNGKeyArray

from zoo.cli._load import MODEL_HELP, Flavor, load_model
from zoo.cli._mesh import add_mesh_option, layout_from_args
from zoo.cli._numbers import NON_NEGATIVE, SHARE
from zoo.data.tokenizers.base import Tokenizer
from zoo.text import printable, printable_json

if TYPE_CHECKING:
    from zoo.decoding.sampling import SamplingSettings
    from zoo.distributed.layout import Layout

# one result of a command, printed as a JSON object or as a line of text
Row = TypeVar("Row", bound=Mapping[str, object])


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL and `--adapter`."""
    parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument("--adapter", help="a PEFT LoRA adapter folder to put on the model")


def add_sampling_options(
    parser: argparse.ArgumentParser, *, max_new_tokens: int, per: str = ""
) -> None:
    """`--max-new-tokens` (`per` says per what), `--temperature`, `--top-k`, `--top-p`, `--seed`."""
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=per or None)
    parser.add_argument("--temperature", type=NON_NEGATIVE, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=SHARE, default=None)
    parser.add_argument("--seed", type=int, default=0, help="draws the samples (temperature > 0)")


def add_output_options(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    """`--mesh`, `--json` and `--raw`."""
    add_mesh_option(parser)
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument(
        "--raw",
        action="store_true",
        help="print the text exactly as it is, control characters included (by default ESC, "
        "CR, U+202E and the like are shown escaped: \\x1b, \\r, \\u202e)",
    )


def sampling_from_args(
    args: argparse.Namespace,
) -> tuple[SamplingSettings, PRNGKeyArray | None]:
    """`(SamplingSettings, key or None)` of the sampling options; bad numbers, and `--top-k` or
    `--top-p` with greedy decoding, raise here, before anything is loaded."""
    import jax

    from zoo.decoding.sampling import SamplingSettings

    if args.temperature == 0:  # greedy: the filters would be dropped without a word
        for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p)):
            if value is not None:
                raise ValueError(
                    f"{flag} only acts when sampling: pass --temperature above 0 (0 is greedy), "
                    f"or drop {flag}"
                )
    settings = SamplingSettings(args.temperature, args.top_k, args.top_p)
    return settings, None if settings.greedy else jax.random.key(args.seed)


def load_for(
    args: argparse.Namespace, kind: type[Flavor]
) -> tuple[Flavor, Tokenizer, Layout | None]:
    """`(model, tokenizer, layout or None)`: `--mesh` is checked first (a mesh that does not
    fit stops before loading), then MODEL with `--adapter` is loaded as a `kind`."""
    layout = layout_from_args(args)
    model, tokenizer = load_model(args.model, kind, args.adapter)
    return model, tokenizer, layout


def print_results(
    rows: Iterable[Row], as_json: bool, line: Callable[[Row], str], *, raw: bool = False
) -> None:
    """Each row as a JSON object (`as_json`) or as the text `line(row)`, one a line; the
    control characters of the model's text escaped (`zoo.text`) unless `raw` (`--raw`)."""
    for row in rows:
        shown = json.dumps(row, ensure_ascii=False) if as_json else line(row)
        if not raw:
            shown = printable_json(shown) if as_json else printable(shown)
        print(shown)
