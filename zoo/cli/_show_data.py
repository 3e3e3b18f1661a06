"""`zoo train gpt --data ... --show-data N`: the chat data as it would be trained, then exit.

Prints N conversations rendered with the run's chat template, the trained tokens marked (green
on a terminal, `[[ ]]` otherwise), the length percentiles, and the conversations cut, dropped
and packed (`zoo.data.chat.preview`). Preference pairs (`prompt`/`chosen`/`rejected` rows, or a
preference `--objective`) are shown as pairs: each prompt, then its chosen and rejected answer
with the scored tokens marked (`zoo.data.chat.preference_preview`). Control characters of the
data are shown escaped. Nothing is trained and the run folder is not written.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from zoo.cli._build import ModelChoice
from zoo.cli._chat_data import chat_config, naming_flags, read_template, wants_chat
from zoo.cli._datasets import DataOptions, load_dataset
from zoo.cli._preference import is_preference_data, preference_config

if TYPE_CHECKING:
    from zoo.data.specs import DatasetDicts


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
    if options.preference or is_preference_data(dataset, "train"):
        return _show_pairs(dataset, options, count)
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


def _show_pairs(dataset: DatasetDicts, options: DataOptions, count: int) -> int:
    """Print `count` preference pairs of `dataset` as a preference objective trains them."""
    from zoo.data.chat.preference_preview import preview_preference_data

    if options.streaming:
        raise ValueError("preference data is read into memory: drop --streaming")
    preview = preview_preference_data(dataset, tokenizer=options.tokenizer,
                                      config=preference_config(options), count=count,
                                      color=sys.stdout.isatty())  # fmt: skip
    print(preview.text)
    return 0
