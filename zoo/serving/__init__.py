"""Serving a GPT to many requests at once: a slotted KV cache and continuous batching.

- `Engine(model, tokenizer, slots=8)`: `submit(prompt_ids, ...)` returns a `Generation` whose
  tokens stream as they are chosen; requests join and leave the batch at every step
- `zoo.serving.slots`: the slotted cache and the compiled prefill and decode step
- `zoo.serving.text`: token events to text, with stop strings

The HTTP server (`zoo serve`) lives in `zoo.cli`.
"""

from zoo.serving.engine import (
    Engine,
    EngineFull,
    Finished,
    Generation,
    PromptTooLong,
    TokenEvent,
)

__all__ = ["Engine", "EngineFull", "Finished", "Generation", "PromptTooLong", "TokenEvent"]
