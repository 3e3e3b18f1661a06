"""The request bodies `zoo serve` reads, with OpenAI's field names and checks.

A field of the wrong type or out of range is refused (400, OpenAI's error shape) before
anything is queued. Fields OpenAI defines that change nothing here (`user`, `metadata`,
`frequency_penalty` at 0, ...) are accepted and ignored; those that would change the answer
and are not supported (`echo`, `suffix`, a `best_of` above `n`, penalties other than 0, a
forced `tool_choice`) are refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from zoo.serving.engine import MAX_TOP_LOGPROBS

MAX_CHOICES = 16  # `n` at most: each choice takes a slot


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    include_usage: bool = False  # a last chunk with the usage counts


class Sampling(BaseModel):
    """What both endpoints share: how many tokens, how they are chosen, how they stream."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None  # the served model's id (the one /v1/models lists)
    max_tokens: int | None = Field(default=None, ge=1)  # the most tokens per choice
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # 0 greedy; default 1
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)  # nucleus filter (1: none)
    top_k: int | None = Field(default=None, ge=1)  # beyond OpenAI's API, as vLLM takes it
    stop: str | list[str] | None = None  # up to 4 texts that end a choice (not shown)
    seed: int | None = None  # fixes the draws: the same seed gives the same choices
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)  # choices per prompt
    stream: bool = False  # server-sent events, one chunk per piece of text
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None  # only 0 (or absent) is supported
    presence_penalty: float | None = None  # only 0 (or absent) is supported

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ValueError(f"stop takes at most 4 strings, got {len(stops)}")
        return stops

    def unsupported(self) -> str | None:
        """The name of a field set to what this server does not do, if any."""
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name
        return None


class ChatRequest(Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[dict[str, Any]] = Field(min_length=1)  # {role, content} turns
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer max_tokens
    logprobs: bool = False  # each token's log-probability
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None  # rendered into the prompt by the template
    tool_choice: str | dict[str, Any] | None = None  # "auto" or "none"; others are refused

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unsupported(self) -> str | None:
        if self.tool_choice not in (None, "auto", "none"):
            return "tool_choice"
        return super().unsupported()


class CompletionRequest(Sampling):
    """`POST /v1/completions`: plain text (or token ids) to continue."""

    prompt: str | list[str] | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)  # top tokens per position
    echo: bool = False  # not supported: refused when true
    suffix: str | None = None  # not supported: refused when given
    best_of: int | None = None  # only equal to n (or absent)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.suffix:
            return "suffix"
        if self.best_of not in (None, self.n):
            return "best_of"
        return super().unsupported()


FinishReason = Literal["stop", "length"]
