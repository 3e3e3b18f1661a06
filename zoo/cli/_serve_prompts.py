"""Request bodies to prompts: a chat rendered by the model's chat template (with its tools),
a completion's text encoded as `zoo generate` encodes it, and what each choice asks of the
engine. A conversation the template refuses is a 400 naming why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from zoo.cli._serve_choices import Ask
from zoo.cli._serve_schema import ChatRequest, CompletionRequest, Sampling
from zoo.data.chat.template import ChatTemplate
from zoo.data.chat.tokens import end_of_turn_ids, prompt_ids
from zoo.data.tokenizers.base import Tokenizer
from zoo.decoding.chat import as_messages
from zoo.decoding.sampling import SamplingSettings

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when a request names none


class PromptError(ValueError):
    """A request whose prompt cannot be built; the message says why (answered 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Prompts:
    """How requests become prompts for this model."""

    tokenizer: Tokenizer
    template: ChatTemplate
    system: str | None  # opens every chat that has no system turn of its own (--system)
    vocab_size: int

    def chat(self, body: ChatRequest) -> Ask:
        messages = [_plain_message(message, number) for number, message in
                    enumerate(body.messages)]  # fmt: skip
        variables: dict[str, object] = {}
        if body.tools and body.tool_choice != "none":
            variables["tools"] = body.tools
        try:
            checked = as_messages(messages, system=self.system)
            prompt = prompt_ids(checked, self.tokenizer, self.template, variables)
        except (ValueError, TypeError) as error:
            raise PromptError(f"the conversation cannot be rendered: {error}", "messages") from None
        ends = end_of_turn_ids(self.tokenizer, self.template)
        logprobs = body.top_logprobs or 0
        return self._ask(body, prompt, ends, logprobs, want=body.logprobs)

    def completions(self, body: CompletionRequest) -> list[Ask]:
        texts = body.prompt
        if isinstance(texts, list) and texts and isinstance(texts[0], int):
            ids = np.asarray(texts, np.int64)
            if ids.min() < 0 or ids.max() >= self.vocab_size:
                raise PromptError(f"prompt ids must be 0 to {self.vocab_size - 1}", "prompt")
            prompts = [ids.astype(np.int32)]
        else:
            rows = [texts] if isinstance(texts, str) else texts
            prompts = [np.asarray(self.tokenizer.encode(str(text)), np.int32) for text in rows]
        for prompt in prompts:
            if prompt.size == 0:
                raise PromptError("the prompt is empty: give some text to continue", "prompt")
        logprobs = body.logprobs
        return [self._ask(body, prompt, (), logprobs or 0, want=logprobs is not None)
                for prompt in prompts]  # fmt: skip

    def _ask(self, body: Sampling, prompt, ends, logprobs: int, *, want: bool) -> Ask:
        try:
            stops = body.stops()
        except ValueError as error:
            raise PromptError(str(error), "stop") from None
        temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
        if temperature == 0:  # greedy: the filters act only on a draw (OpenAI ignores them)
            sampling = SamplingSettings()
        else:
            top_p = None if body.top_p in (None, 1.0) else body.top_p
            sampling = SamplingSettings(temperature, body.top_k, top_p)
        limit = body.token_limit()  # type: ignore[attr-defined]
        return Ask(np.asarray(prompt, np.int32), limit, sampling, body.seed,
                   tuple(int(end) for end in ends), tuple(stops), logprobs, want)  # fmt: skip


def _plain_message(message: Mapping[str, object], number: int) -> dict[str, object]:
    """`message` with OpenAI's content parts (`[{"type": "text", "text": ...}]`) joined into
    text; other parts (images, audio) are refused."""
    content = message.get("content")
    plain = dict(message)
    if content is None and message.get("tool_calls"):
        plain["content"] = ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise PromptError(f"messages[{number}] has a {kind!r} part; this model reads "
                                  "text parts only", "messages")  # fmt: skip
            texts.append(str(part.get("text", "")))
        plain["content"] = "".join(texts)
    return plain
