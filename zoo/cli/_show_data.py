"""`zoo train gpt --data ... --show-data N`: the chat data as it would be trained, then exit.

Prints N conversations rendered with the run's chat template, the trained tokens marked (green
on a terminal, `[[ ]]` otherwise), the length percentiles, and the conversations cut, dropped
and packed (`zoo.data.chat.preview`). Nothing is trained and the run folder is not written.
"""

from __future__ import annotations

import argparse
import sys

from zoo.cli._chat_data import chat_config, naming_flags, read_template, wants_chat
from zoo.cli._datasets import DataOptions, load_dataset


def show_data(args: argparse.Namespace, count: int) -> int:
    """Print the preview of `args`'s chat data (see the module doc); the exit status."""
    from zoo.data.chat.preview import preview_chat_data

    tokenizer = args.tokenizer
    max_len = args.max_len
    if args.init is not None:
        from zoo.cli._load import read_model

        initial, tokenizer = read_model(args.init, option="--init")
        if max_len is None:
            max_len = initial.config.max_positions
    options = DataOptions.from_args(args, tokenizer=tokenizer, max_len=max_len)
    if isinstance(args.data, str):
        if args.data.startswith("synthetic:"):
            raise ValueError(f"--show-data shows chat data; --data {args.data} is no chat data")
        dataset = load_dataset(args.data, options)
    else:
        from zoo.cli._mixing import mix_datasets

        _, dataset = mix_datasets(args.data, lambda spec: load_dataset(spec, options), args.seed)
    if not wants_chat(dataset, args.flavor, options):
        raise ValueError(
            f"--show-data shows chat data, and --data {args.data} is not read as conversations "
            "(its columns fit no chat format; see --chat-format)"
        )
    config = chat_config(options, template=read_template(options.template))
    with naming_flags(options):
        preview = preview_chat_data(dataset, tokenizer=options.tokenizer, config=config,
                                    count=count, color=sys.stdout.isatty())  # fmt: skip
    print(preview.text)
    return 0
