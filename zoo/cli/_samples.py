"""`zoo train --sample-every N`: greedy replies to held-out prompts, logged as training goes.

Every N steps the model answers the first few validation conversations (their prompt: every
turn before the last assistant turn, rendered with the run's chat template and its generation
prompt) greedily; each reply is a row of `DIR/samples.jsonl` (`step`, `prompt`, `reply`,
`reference`) and a line on stderr. The prompts are cut from the validation batches themselves,
so they are the ids training evaluates on.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import equinox as eqx
import numpy as np

from zoo.cli._datasets import RunData
from zoo.data.batches import BatchSource
from zoo.data.tokenizers.base import Tokenizer
from zoo.train.settings import LoopSettings

if TYPE_CHECKING:
    from zoo.data.chat.datasets import ChatData
    from zoo.data.chat.template import ChatTemplate

SAMPLES_FILE = "samples.jsonl"
SAMPLE_PROMPTS = 3  # held-out prompts answered each time
MAX_NEW_TOKENS = 32  # the longest sampled reply


def with_samples(
    loop: LoopSettings, every: int | None, data: RunData, out: Path, *, writes: bool
) -> LoopSettings:
    """`loop` with a `SampleReplies` callback every `every` steps (`--sample-every`; None:
    `loop` as it is) answering prompts of `data`, written to `out` where `writes`."""
    if every is None:
        return loop
    if data.chat is None or data.evaluation is None:
        raise ValueError(
            "--sample-every answers held-out chat prompts; this --data is not read as "
            "conversations (see --chat-format): drop --sample-every"
        )
    callback = SampleReplies(every, data.chat, out / SAMPLES_FILE, write=writes)
    return dataclasses.replace(loop, callbacks=(*loop.callbacks, callback))


def held_out_prompts(
    validation: BatchSource, template: ChatTemplate, tokenizer: Tokenizer, count: int
) -> list[tuple[list[int], list[int]]]:
    """Up to `count` (prompt ids, reference ids) of the validation batches: each conversation
    cut before its last trained span (its last assistant turn)."""
    from zoo.data.chat.tokens import end_of_turn_ids

    ends = set(end_of_turn_ids(tokenizer, template))
    found: list[tuple[list[int], list[int]]] = []
    for index in range(len(validation)):
        batch = {name: np.asarray(value) for name, value in validation.batch(index).items()}
        segments = batch.get("segments", (batch["loss_mask"] >= 0).astype(np.int32))
        for row in range(len(batch["tokens"])):
            for number in np.unique(segments[row][segments[row] > 0]):
                where = segments[row] == number
                ids, mask = batch["tokens"][row][where], batch["loss_mask"][row][where]
                trained = np.flatnonzero(mask[1:]) + 1
                if not len(trained):
                    continue
                gaps = np.flatnonzero(np.diff(trained) > 1)
                start = int(trained[gaps[-1] + 1] if len(gaps) else trained[0])
                reference = [int(i) for i in ids[start:][mask[start:] == 1] if int(i) not in ends]
                found.append((ids[:start].tolist(), reference))
                if len(found) == count:
                    return found
    return found


class SampleReplies:
    """A `LoopSettings` callback: greedy replies to held-out prompts every `every` steps."""

    def __init__(self, every: int, chat: ChatData, path: Path, *, write: bool = True):
        self.every, self.path, self.write = every, path, write
        self.tokenizer = chat.tokenizer
        self.template = chat.template
        self.prompts = held_out_prompts(chat.validation, chat.template, chat.tokenizer,
                                        SAMPLE_PROMPTS)  # fmt: skip

    def __call__(self, step: int, model: eqx.Module) -> None:
        from zoo.data.chat.tokens import end_of_turn_ids
        from zoo.decoding.stream import stream_tokens
        from zoo.models.gpt import GPT

        if not self.prompts:
            return
        if not isinstance(model, GPT):
            raise TypeError(
                f"--sample-every samples a GPT's replies, not a {type(model).__name__}'s"
            )
        ends = end_of_turn_ids(self.tokenizer, self.template)
        prompts = [prompt for prompt, _ in self.prompts]
        replies: list[list[int]] = [[] for _ in prompts]
        ended = [False] * len(prompts)
        for tokens in stream_tokens(model, prompts, max_new_tokens=MAX_NEW_TOKENS, stop_ids=ends):
            for row, token in enumerate(tokens.tolist()):
                if ended[row] or token in ends or token in model.config.end_ids:
                    ended[row] = True
                    continue
                replies[row].append(token)
        if not self.write:
            return
        decode = self.tokenizer.decode
        with self.path.open("a", encoding="utf-8") as log:
            for (prompt, reference), reply in zip(self.prompts, replies, strict=True):
                shown = decode(prompt, skip_special=False)
                answer, wanted = decode(reply), decode(reference)
                record = {"step": step, "prompt": shown, "reply": answer, "reference": wanted}
                log.write(json.dumps(record, ensure_ascii=False) + "\n")
                print(
                    f"zoo train: step {step} sample: {_tail(shown)!r} -> {answer!r} "
                    f"(reference {wanted!r})",
                    file=sys.stderr,
                )


def _tail(text: str, limit: int = 60) -> str:
    """The end of a prompt, where its question is."""
    return text if len(text) <= limit else "..." + text[-limit:]
