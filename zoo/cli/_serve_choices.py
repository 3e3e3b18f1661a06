"""One HTTP request's choices: `n` requests submitted to the engine, their events turned into
text pieces on the server's event loop, cut at the stop strings.

The engine calls each request's listener on its own thread; the listener hands the event to
the event loop (`call_soon_threadsafe`), where `Choices.pieces()` reads them in order. A stop
string cancels its request (its slot is freed before the next step); `cancel()` cancels them
all (a client that went away).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

from zoo.data.tokenizers.base import Tokenizer
from zoo.decoding.sampling import SamplingSettings
from zoo.serving.engine import Engine, Event, Finished, Generation, TokenEvent
from zoo.serving.text import StopText


@dataclass
class TokenLogprob:
    """A chosen token's text and log-probability, and the most likely alternatives."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class Piece:
    """What one event of choice `index` adds: text, its tokens' log-probabilities, and the
    finish reason when the choice ended."""

    index: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Choice:
    """A choice as it grows."""

    generation: Generation
    text: StopText
    tokens: int = 0  # tokens shown (those after a stop string are not counted)
    finish_reason: str | None = None


@dataclass(frozen=True)
class Ask:
    """What the engine is asked for each choice."""

    prompt: np.ndarray
    max_tokens: int | None
    sampling: SamplingSettings
    seed: int | None
    stop_ids: tuple[int, ...]
    stops: tuple[str, ...]
    logprobs: int  # top log-probabilities per token; 0 with want_logprobs: the token's only
    want_logprobs: bool


class Choices:
    """`n` choices of one prompt, running in the engine."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, ask: Ask, n: int, offset: int = 0):
        self.tokenizer, self.ask, self.offset = tokenizer, ask, offset
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.choices: list[Choice] = []
        try:
            for index in range(n):
                generation = engine.submit(
                    ask.prompt, max_tokens=ask.max_tokens, sampling=ask.sampling,
                    key=self._key(index), stop_ids=ask.stop_ids,
                    logprobs=max(ask.logprobs, 1) if ask.want_logprobs else 0,
                    listener=self._listener(index),
                )  # fmt: skip
                self.choices.append(Choice(generation, StopText(tokenizer, ask.stops)))
        except BaseException:
            self.cancel()
            raise

    def _key(self, index: int) -> jax.Array | None:
        """Choice 0 draws with `key(seed)`, as `zoo chat --seed` would; choice i folds in i."""
        if self.ask.seed is None or self.ask.sampling.greedy:
            return None
        key = jax.random.key(self.ask.seed)
        return key if index == 0 else jax.random.fold_in(key, index)

    def _listener(self, index: int):
        def listen(event: Event) -> None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

        return listen

    @property
    def prompt_tokens(self) -> int:
        return len(self.ask.prompt)

    @property
    def completion_tokens(self) -> int:
        return sum(choice.tokens for choice in self.choices)

    def cancel(self) -> None:
        for choice in self.choices:
            choice.generation.cancel()

    async def pieces(self) -> AsyncIterator[Piece]:
        """Each choice's text as it comes; the last piece of each carries its finish reason."""
        open_choices = len(self.choices)
        while open_choices:
            index, event = await self.queue.get()
            choice = self.choices[index]
            if choice.finish_reason is not None:
                continue  # events after a stop string
            piece = self._piece(index, choice, event)
            if piece.finish_reason is not None:
                open_choices -= 1
            if piece.text or piece.logprobs or piece.finish_reason:
                yield piece

    def _piece(self, index: int, choice: Choice, event: Event) -> Piece:
        where = self.offset + index
        if isinstance(event, Finished):
            if event.reason == "error":
                raise RuntimeError(event.error or "the request failed")
            choice.finish_reason = "stop" if event.reason in ("stop", "cancelled") else "length"
            return Piece(where, choice.text.finish(), finish_reason=choice.finish_reason)
        assert isinstance(event, TokenEvent)
        choice.tokens += 1
        text = choice.text.add(event.token)
        logprobs = [self._logprob(event)] if self.ask.want_logprobs else []
        if choice.text.stopped:
            choice.generation.cancel()
            choice.finish_reason = "stop"
            return Piece(where, text, logprobs, "stop")
        return Piece(where, text, logprobs)

    def _logprob(self, event: TokenEvent) -> TokenLogprob:
        top = [(self.token_text(i), value) for i, value in event.top[: self.ask.logprobs]]
        return TokenLogprob(self.token_text(event.token), event.logprob or 0.0, top)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special=False)


async def run_all(groups: Sequence[Choices]) -> AsyncIterator[Piece]:
    """The pieces of several prompts' choices, one prompt after another."""
    for group in groups:
        async for piece in group.pieces():
            yield piece
