"""Continuous batching: many requests decoded together, each in a slot of one compiled step.

    engine = Engine(model, tokenizer, slots=8)
    for event in engine.submit(prompt_ids, max_tokens=64):
        print(tokenizer.decode([event.token]), end="")
    engine.close()

A thread runs the loop: it prefills waiting requests into free slots, then runs one decode step
for every slot, hands each request its token, and frees a finished (or cancelled) request's
slot at once, so the next waiting request joins at the next step. A request's tokens do not
depend on what the other slots hold: greedy output alone equals greedy output beside others.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from zoo.data.tokenizers.base import Tokenizer
from zoo.decoding.sampling import SamplingSettings, sampling_or_greedy
from zoo.models.gpt import GPT
from zoo.serving.slots import Programs, SlotSampling, StepKind

log = logging.getLogger("zoo.serving")
MAX_TOP_LOGPROBS = 20  # as OpenAI's API allows


class EngineFull(RuntimeError):
    """Every slot is busy and the waiting queue is full: try again later."""


class PromptTooLong(ValueError):
    """The prompt and the tokens asked for do not fit a slot's positions."""


@dataclass(frozen=True)
class TokenEvent:
    """One chosen token of a request, with its log-probabilities when they were asked for."""

    token: int
    logprob: float | None = None  # log-probability of `token` under the model (no temperature)
    top: tuple[tuple[int, float], ...] = ()  # the most likely (id, log-probability), best first


@dataclass(frozen=True)
class Finished:
    """The last event of a request."""

    reason: str  # "stop" (an end id), "length" (max_tokens), "cancelled" or "error"
    error: str | None = None  # what went wrong, for "error"


Event = TokenEvent | Finished
Listener = Callable[[Event], object]


@dataclass(eq=False)
class Generation:
    """A submitted request: iterate it for its `TokenEvent`s (blocking until each comes), or
    let the `listener` given to `submit` receive them; `cancel()` frees its slot."""

    prompt: np.ndarray  # int32 [prompt tokens]
    max_tokens: int
    sampling: SamplingSettings
    key_data: np.ndarray  # the random key's data (zeros when greedy)
    stop_ids: frozenset[int]
    logprobs: int  # how many top log-probabilities per token (0: none)
    listener: Listener
    events: queue.Queue[Event] = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    finish_reason: str | None = None
    generated: int = 0  # tokens chosen so far (the end token included)

    def cancel(self) -> None:
        """Stop this request; its slot is freed before the next step."""
        self.cancelled.set()

    def __iter__(self) -> Iterator[TokenEvent]:
        while True:
            event = self.events.get()
            if isinstance(event, Finished):
                if event.reason == "error":
                    raise RuntimeError(event.error)
                return
            yield event


class Engine:
    """Serves a GPT to many requests at once in `slots` slots of `max_len` positions each.

    Batch with the engine, not `jax.vmap`: it owns a thread, the slotted KV cache and the
    compiled programs (`zoo.serving.slots`). `close()` (or `with Engine(...)`) stops it.

    Args:
        model: a `zoo.GPT`.
        tokenizer: its tokenizer: its stop ids (`eos_ids`) end every request, beside the
            model's `end_ids`; None: the model's alone.
        slots: how many requests decode together.
        max_len: positions per slot (a prompt and its reply); None: the model's
            `max_positions`.
        max_waiting: requests that may wait for a slot; one more raises `EngineFull`.
    """

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer | None = None,
        *,
        slots: int = 8,
        max_len: int | None = None,
        max_waiting: int = 64,
    ):
        if not isinstance(model, GPT):
            raise TypeError(f"the engine serves a zoo.GPT, got {type(model).__name__}")
        limit = model.config.max_positions
        max_len = limit if max_len is None else max_len
        for name, value in (("slots", slots), ("max_len", max_len), ("max_waiting", max_waiting)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if max_len > limit:
            raise ValueError(f"max_len={max_len} exceeds the model's max_positions={limit}")
        self.model, self.max_len, self.max_waiting = model, max_len, max_waiting
        ends = {*model.config.end_ids, *(tokenizer.eos_ids if tokenizer is not None else ())}
        self.end_ids = frozenset(int(end) for end in ends)
        self.programs = Programs(model, slots=slots, capacity=max_len)
        self._slots: list[Generation | None] = [None] * slots
        self._next_tokens = np.zeros((slots,), np.int32)
        key_shape = jax.random.key_data(jax.random.key(0)).shape
        self._sampling = SlotSampling(
            temperature=np.zeros((slots,), np.float32),
            top_k=np.full((slots,), model.config.vocab_size, np.int32),
            top_p=np.ones((slots,), np.float32),
            key_data=np.zeros((slots, *key_shape), np.uint32),
            steps=np.zeros((slots,), np.int32),
        )
        self.finished: Counter[str] = Counter()  # requests ended so far, by finish reason
        self._waiting: deque[Generation] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="zoo-serving", daemon=True)
        self._thread.start()

    @property
    def slots(self) -> int:
        return len(self._slots)

    def busy_slots(self) -> int:
        """Slots holding a request now."""
        return sum(slot is not None for slot in self._slots)

    def submit(
        self,
        prompt: Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = None,
        sampling: SamplingSettings | None = None,
        key: PRNGKeyArray | None = None,
        stop_ids: Sequence[int] = (),
        logprobs: int = 0,
        listener: Listener | None = None,
    ) -> Generation:
        """Queue a request; it joins the batch at the next step with a free slot.

        Args:
            prompt: the token ids to continue.
            max_tokens: the most tokens to choose; None: as many as the slot holds.
            sampling: how each token is chosen (None is greedy).
            key: the random key of a sampled request (token i draws as `zoo.decoding.stream`
                draws it for one row); None: a fresh random one.
            stop_ids: more ids that end this request (a chat template's end of turn).
            logprobs: how many of the most likely tokens to report with each token (0 to 20).
            listener: receives each event on the engine's thread instead of the iterator.
        """
        settings = sampling_or_greedy(sampling)
        ids = np.asarray(prompt, np.int64).reshape(-1)
        vocab = self.model.config.vocab_size
        if ids.size == 0:
            raise ValueError("the prompt is empty: pass at least one token")
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"the prompt holds ids outside the vocabulary of {vocab}")
        room = self.max_len - ids.size
        if max_tokens is None:
            max_tokens = room
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if max_tokens > room:
            raise PromptTooLong(
                f"the prompt has {ids.size} tokens and {max_tokens} more were asked for, "
                f"{ids.size + max_tokens} in all, over the {self.max_len} positions this "
                f"server holds per request; ask for at most {max(room, 0)} tokens or shorten "
                "the prompt"
            )
        if not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be 0 to {MAX_TOP_LOGPROBS}, got {logprobs!r}")
        if settings.greedy:
            key_data = np.zeros_like(self._sampling.key_data[0])
        else:
            key = jax.random.key(secrets.randbits(32)) if key is None else key
            key_data = np.asarray(jax.random.key_data(key), np.uint32)
        request = Generation(
            ids.astype(np.int32), max_tokens, settings, key_data,
            frozenset(int(stop) for stop in stop_ids), logprobs, listener or (lambda _: None),
        )  # fmt: skip
        if listener is None:
            request.listener = request.events.put
        with self._wake:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if len(self._waiting) >= self.max_waiting:
                raise EngineFull(
                    f"all {self.slots} slots are busy and {len(self._waiting)} requests wait; "
                    "try again later"
                )
            self._waiting.append(request)
            self._wake.notify()
        return request

    def close(self) -> None:
        """Stop the loop; requests still running or waiting finish as cancelled."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()
        for request in [*self._waiting, *self._slots]:
            if request is not None:
                self._finish(request, Finished("cancelled"))
        self._waiting.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._waiting and not self.busy_slots():
                    self._wake.wait()
                if self._closed:
                    return
                joining = []
                free = [index for index, slot in enumerate(self._slots) if slot is None]
                while free and self._waiting:
                    request = self._waiting.popleft()
                    if request.cancelled.is_set():
                        self._finish(request, Finished("cancelled"))
                        continue
                    joining.append((free.pop(0), request))
            for slot, request in joining:
                self._join(slot, request)
            if self.busy_slots():
                self._step()

    def _join(self, slot: int, request: Generation) -> None:
        try:
            self.programs.prefill(slot, request.prompt)
        except Exception as error:  # a request never stops the loop
            log.exception("prefill failed")
            self._finish(request, Finished("error", f"the prompt could not be read: {error}"))
            self._recover(error)
            return
        settings, numbers = request.sampling, self._sampling
        numbers.temperature[slot] = settings.temperature
        numbers.top_k[slot] = settings.top_k or self.model.config.vocab_size
        numbers.top_p[slot] = 1.0 if settings.top_p is None else settings.top_p
        numbers.key_data[slot] = request.key_data
        numbers.steps[slot] = 0
        self._next_tokens[slot] = request.prompt[-1]
        self._slots[slot] = request

    def _recover(self, error: Exception) -> None:
        """After a failed call the donated cache may be gone: the running requests fail (their
        keys and values with it) and the cache starts empty; waiting requests go on."""
        for index, request in enumerate(self._slots):
            if request is not None:
                self._free(index, Finished("error", f"decoding failed: {error}"))
        self.programs.reset()

    def _kind(self) -> StepKind:
        running = [request for request in self._slots if request is not None]
        sampled = [request.sampling for request in running if not request.sampling.greedy]
        return StepKind(
            sampled=bool(sampled),
            top_k=any(settings.top_k is not None for settings in sampled),
            top_p=any(settings.top_p is not None for settings in sampled),
            logprobs=max(request.logprobs for request in running),
        )

    def _step(self) -> None:
        for slot, request in enumerate(self._slots):  # a cancelled request leaves at once
            if request is not None and request.cancelled.is_set():
                self._free(slot, Finished("cancelled"))
        active = np.array([request is not None for request in self._slots])
        if not active.any():
            return
        try:
            out = self.programs.decode(self._next_tokens, active, self._sampling, self._kind())
        except Exception as error:  # fail the running requests, keep serving
            log.exception("decode step failed")
            self._recover(error)
            return
        self._sampling.steps[active] += 1
        for slot, request in enumerate(self._slots):
            if request is None:
                continue
            token = int(out.tokens[slot])
            self._next_tokens[slot] = token
            request.generated += 1
            if token in self.end_ids or token in request.stop_ids:
                self._free(slot, Finished("stop"))
                continue
            self._emit(request, out, slot, token)
            if request.generated >= request.max_tokens:
                self._free(slot, Finished("length"))

    def _emit(self, request: Generation, out, slot: int, token: int) -> None:
        if request.logprobs and out.logprobs is not None:
            top = zip(out.top_ids[slot, : request.logprobs], out.top_logprobs[slot], strict=False)
            pairs = tuple((int(i), float(value)) for i, value in top)
            self._send(request, TokenEvent(token, float(out.logprobs[slot]), pairs))
        else:
            self._send(request, TokenEvent(token))

    def _free(self, slot: int, end: Finished) -> None:
        request = self._slots[slot]
        self._slots[slot] = None
        if request is not None:
            self._finish(request, end)

    def _finish(self, request: Generation, end: Finished) -> None:
        request.finish_reason = end.reason
        self.finished[end.reason] += 1
        self._send(request, end)

    def _send(self, request: Generation, event: Event) -> None:
        try:
            request.listener(event)
        except Exception:  # a listener's error cancels its request only
            log.exception("a request's listener failed; cancelling it")
            request.cancel()
