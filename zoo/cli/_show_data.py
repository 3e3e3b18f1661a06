"""`zoo train gpt --data ... --show-data N`: the chat data as it would be trained, then exit.

Prints N conversations rendered with the run's chat template, the trained tokens marked (green
on a terminal, `[[ ]]` otherwise), the length percentiles, and the conversations cut, dropped
and packed (`zoo.data.chat.preview`). Nothing is trained and the run folder is not written.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from zoo.cli._build import ModelChoice
from zoo.cli._chat_data import chat_config, naming_flags, read_template, wants_chat
from zoo.cli._datasets import DataOptions, load_dataset


def show_data(
    choice: ModelChoice, data_specs: str | Sequence[str], options: DataOptions, count: int
) -> int:
    """Print the preview of `count` conversations of `--data data_specs`, read with `options`
    for the model of `choice` (see the module doc); the exit status."""
    from zoo.data.chat.preview import preview_chat_data

    if choice.init is not None:
        from zoo.cli._load import read_model

        initial, tokenizer = read_model(choice.init, option="--init")
        max_len = initial.config.max_positions if options.max_len is None else options.max_len
        options = dataclasses.replace(options, tokenizer=tokenizer, max_len=max_len)
    if isinstance(data_specs, str):
        if data_specs.startswith("synthetic:"):
            raise ValueError(f"--show-data shows chat data; --data {data_specs} is no chat data")
        dataset = load_dataset(data_specs, options)
    else:
        from zoo.cli._mixing import mix_datasets

        _, dataset = mix_datasets(
            data_specs, lambda spec: load_dataset(spec, options), options.seed
        )
    if not wants_chat(dataset, choice.flavor, options):
        shown = data_specs if isinstance(data_specs, str) else list(data_specs)
        raise ValueError(
            f"--show-data shows chat data, and --data {shown} is not read as conversations "
            "(its columns fit no chat format; see --chat-format)"
        )
    config = chat_config(options, template=read_template(options.template))
    with naming_flags(options):
        preview = preview_chat_data(dataset, tokenizer=options.tokenizer, config=config,
                                    count=count, color=sys.stdout.isatty())  # fmt: skip
    print(preview.text)
    return 0
