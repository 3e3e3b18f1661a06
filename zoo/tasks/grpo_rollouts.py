"""The batches of GRPO: completions sampled by the model being trained, scored by rewards.

`Rollouts` is a batch source the trainer draws from with its current model
(`zoo.data.batches.OnPolicySource`): step `s` takes `batch_size` prompts (reshuffled each epoch
with the seed), samples `num_generations` completions of each in one compiled call
(`zoo.decoding.groups`), cuts each at its end of turn, scores the texts with the reward
functions, and forms the advantages and metrics (`zoo.tasks.grpo_advantages`). With
`num_iterations` μ > 1 a rollout serves μ steps in a row, its log-probabilities under the
sampling model kept as `old_logps`; with a reference (`beta > 0`) its log-probabilities join the
batch as `reference_logps`.

The sampling key of the rollout at step `s` is drawn from the run's key (which checkpoints keep)
and `s`, so a run and its resumption sample the same completions. With μ > 1 a `store` folder
keeps the last rollouts, so that a run resumed between a rollout's updates goes on with it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from zoo.data.batches import ArrayBatches, Batch
from zoo.decoding.groups import sample_groups
from zoo.decoding.loop import Stopping
from zoo.decoding.sampling import SamplingSettings
from zoo.files import write_atomic
from zoo.models.gpt import GPT
from zoo.tasks.grpo import GRPO, ROLLOUT_PREFIX, ROLLOUTS, completion_logps
from zoo.tasks.grpo_advantages import SCALE_REWARDS, advantages, rollout_metrics, weighted_rewards
from zoo.tasks.preference import adapters_off
from zoo.tasks.rewards import RewardFunction, reward_name, score

# `np.savez` by names; its stubs read a `**` mapping as its `allow_pickle` flag
save_arrays: Callable[..., None] = np.savez
KEPT_ROLLOUTS = 4  # rollouts a store keeps (a resume reads the one its checkpoint is in)
SAMPLING_STREAM = 0x5A4D  # folded into the run's key: sampling draws apart from dropout


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """How completions are drawn and turned into advantages (TRL's `GRPOConfig` defaults)."""

    num_generations: int = 8  # completions per prompt (a group)
    max_completion_len: int = 256  # the most tokens of a completion
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(temperature=1.0))
    scale_rewards: str = "group"  # group | batch | none: what the advantages are divided by
    mask_truncated_completions: bool = False  # completions without an end leave the loss
    num_iterations: int = 1  # μ: optimizer steps per rollout
    stop_strings: tuple[str, ...] = ()  # texts that end a completion (beside the end ids)
    batch_size: int = 1  # prompts per step (rows: batch_size * num_generations)
    seed: int = 0  # shuffles the prompts each epoch

    def __post_init__(self) -> None:
        for name in ("num_generations", "max_completion_len", "num_iterations", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(
                f"scale_rewards must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}"
            )
        if self.num_generations == 1 and self.scale_rewards == "group":
            raise ValueError(
                "num_generations=1 makes groups of one completion, whose standard deviation is "
                "undefined: sample 2 or more per prompt, or scale_rewards='batch' or 'none'"
            )
        if self.sampling.greedy:
            raise ValueError("completions are sampled: give a temperature above 0")


@dataclass(frozen=True)
class CompletionText:
    """How a completion's ids end and read: the end ids, the filler after them, the decoder."""

    end_ids: tuple[int, ...]  # the ids that end a completion (chat template's end of turn, eos)
    fill_id: int  # what follows a completion's end in the batch (the model's pad id)
    decode: Callable[[list[int]], str]  # ids -> text (the tokenizer's, special tokens skipped)


@dataclass(frozen=True)
class SampleLog:
    """Where completions and their rewards are written: every `every`-th step, to `path`."""

    path: Path  # a samples.jsonl, appended to
    every: int  # steps between written rollouts


@dataclass(frozen=True)
class RolloutFiles:
    """What the rollouts write: samples with their rewards, and the last rollouts kept."""

    samples: SampleLog | None = None  # completions and rewards (None: not written)
    # a folder that keeps the last rollouts (with num_iterations > 1), so that a run resumed
    # between a rollout's updates continues with it exactly (None: not kept)
    store: Path | None = None


@dataclass(frozen=True)
class PromptRows:
    """The prompts as the reward functions see them, their token ids, and the other columns."""

    prompts: list  # each row's prompt: a text, or a list of messages
    ids: list[np.ndarray]  # each prompt's ids (rendered by the chat template for messages)
    columns: Mapping[str, list] = field(default_factory=dict)  # every other column, by name

    def __post_init__(self) -> None:
        if not self.prompts or len(self.ids) != len(self.prompts):
            raise ValueError(f"{len(self.prompts)} prompts with {len(self.ids)} encodings")
        for name, values in self.columns.items():
            if len(values) != len(self.prompts):
                raise ValueError(f"column {name!r} has {len(values)} values for "
                                 f"{len(self.prompts)} prompts")  # fmt: skip
        empty = [row for row, ids in enumerate(self.ids) if len(ids) == 0]
        if empty:
            raise ValueError(f"prompt row {empty[0]} encodes to no tokens: give it some text")


class Rollouts:
    """Scored completions of the model being trained, one batch per step (see the module doc).

    Args:
        prompts: the prompt rows (`PromptRows`).
        task: the `GRPO` task the batches are for (its temperature and β).
        rewards: the reward functions (TRL's signature, `zoo.tasks.rewards`).
        weights: one weight per function (None: all 1).
        settings: sampling, groups, advantages, prompts per step (`RolloutSettings`).
        text: the end ids, filler and decoder of completions (`CompletionText`).
        reference: the reference model for β > 0, or "adapters" (the model, LoRA off).
        files: where samples go and the last rollouts are kept (`RolloutFiles`; None: no
            files).
    """

    def __init__(
        self,
        prompts: PromptRows,
        task: GRPO,
        *,
        rewards: Sequence[RewardFunction],
        weights: Sequence[float] | None = None,
        settings: RolloutSettings | None = None,
        text: CompletionText,
        reference: eqx.Module | str | None = None,
        files: RolloutFiles | None = None,
    ):
        if not rewards:
            raise ValueError("GRPO needs at least one reward function")
        weights = [1.0] * len(rewards) if weights is None else list(weights)
        if len(weights) != len(rewards):
            raise ValueError(f"{len(weights)} reward weights for {len(rewards)} reward functions; "
                             "give one weight per function")  # fmt: skip
        if task.loss.beta != 0.0 and reference is None:
            raise ValueError(f"beta={task.loss.beta} needs a reference model (or 'adapters')")
        self.prompts = prompts
        self.task = task
        self.rewards = list(rewards)
        self.names = [reward_name(function) for function in rewards]
        self.weights = np.asarray(weights, np.float64)
        self.settings = settings = settings or RolloutSettings()
        self.end_ids, self.fill_id, self.decode = tuple(text.end_ids), text.fill_id, text.decode
        self.reference = reference if task.loss.beta != 0.0 else None
        files = files or RolloutFiles()
        self.samples, self.store = files.samples, files.store
        self.order = ArrayBatches({"row": np.arange(len(prompts.ids))}, settings.batch_size,
                                  seed=settings.seed)  # fmt: skip
        self.width = max(len(ids) for ids in prompts.ids)  # one prompt width: one compile
        self._cached: tuple[int, Batch] | None = None

    def __len__(self) -> int:
        return len(self.order)

    def batch(self, step: int) -> Batch:
        raise TypeError(
            "Rollouts are sampled by the model being trained: draw them with "
            "batch_for(step, model, key), as zoo.Trainer does"
        )

    def batch_for(self, step: int, model: eqx.Module, key: PRNGKeyArray) -> Batch:
        """The batch of `step`: a new rollout every `num_iterations` steps, else the last one."""
        start = step - step % self.settings.num_iterations
        if self._cached is not None and self._cached[0] == start:
            return self._cached[1]
        if start != step:  # a resumed run in the middle of a rollout's updates
            kept = self._kept(start)
            if kept is not None:
                self._cached = (start, kept)
                return kept
            warnings.warn(
                f"step {step + 1} reuses the rollout of step {start + 1}, which this process did "
                "not draw and no store keeps: it is drawn again with the current weights (resume "
                "at a multiple of num_iterations to continue exactly)",
                stacklevel=2,
            )
        batch = self.rollout(start, model, key)
        self._cached = (start, batch)
        self._keep(start, batch)
        return batch

    def _stored(self, step: int) -> Path | None:
        return None if self.store is None else self.store / f"rollout_{step:08d}.npz"

    def _keep(self, step: int, batch: Batch) -> None:
        """Write the rollout of `step` to the store, where later steps of it can find it after
        a resume (`num_iterations` > 1), and drop the oldest beyond `KEPT_ROLLOUTS`."""
        path = self._stored(step)
        if path is None or self.settings.num_iterations == 1:
            return
        path.parent.mkdir(parents=True, exist_ok=True)

        def write(temporary: Path) -> None:
            with open(temporary, "wb") as file:
                save_arrays(file, **batch)

        write_atomic(path, write)
        for old in sorted(path.parent.glob("rollout_*.npz"))[:-KEPT_ROLLOUTS]:
            old.unlink(missing_ok=True)

    def _kept(self, step: int) -> Batch | None:
        path = self._stored(step)
        if path is None or not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}

    def rollout(self, step: int, model: eqx.Module, key: PRNGKeyArray) -> Batch:
        """Sample, cut, score and measure the completions of `step`'s prompts."""
        settings = self.settings
        rows = self.order.batch(step)["row"]
        prompt_ids = [self.prompts.ids[row] for row in rows]
        padded = np.full((len(rows), self.width), self.fill_id, np.int32)
        for index, ids in enumerate(prompt_ids):
            padded[index, : len(ids)] = ids
        lengths = np.asarray([len(ids) for ids in prompt_ids], np.int32)
        sampling_key = jax.random.fold_in(jax.random.fold_in(key, SAMPLING_STREAM), step)
        if not isinstance(model, GPT):
            raise TypeError(f"GRPO samples with a zoo.GPT, got {type(model).__name__}")
        stopping = Stopping(settings.max_completion_len, self.end_ids, self.fill_id)
        tokens = np.asarray(sample_groups(
            model, padded, lengths, num_generations=settings.num_generations, stopping=stopping,
            sampling=settings.sampling, key=sampling_key,
        ))  # fmt: skip
        group = settings.num_generations
        source_rows = np.repeat(rows, group)
        kept, truncated = self._cut(tokens)
        completion_ids = [tokens[row, :count].tolist() for row, count in enumerate(kept)]
        texts = [self.decode(ids) for ids in completion_ids]
        prompts = [self.prompts.prompts[row] for row in source_rows]
        completions: list = texts
        if prompts and not isinstance(prompts[0], str):
            completions = [[{"role": "assistant", "content": text}] for text in texts]
        columns = {name: [values[row] for row in source_rows]
                   for name, values in self.prompts.columns.items()}  # fmt: skip
        per_function = score(self.rewards, prompts, completions, completion_ids, columns)
        rewards = weighted_rewards(per_function, self.weights)
        batch = self._arrays(np.repeat(padded, group, axis=0), np.repeat(lengths, group), tokens,
                             kept, truncated)  # fmt: skip
        batch["advantages"] = advantages(rewards, group, settings.scale_rewards)
        metrics = rollout_metrics(per_function, self.weights, self.names,
                                  num_generations=group, scale_rewards=settings.scale_rewards,
                                  lengths=kept, truncated=truncated)  # fmt: skip
        share = 1.0 / len(kept)
        for name, value in metrics.items():
            batch[ROLLOUT_PREFIX + name] = np.full(len(kept), value * share, np.float32)
        batch[ROLLOUTS] = np.full(len(kept), share, np.float32)
        self._add_logps(batch, model)
        if self.samples is not None and step % self.samples.every == 0:
            self._write_samples(step, prompts, texts, per_function, rewards, batch["advantages"])
        return batch

    def _cut(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's kept tokens (through its first end id or stop string) and whether it
        was truncated (no end within `max_completion_len`)."""
        ends = np.isin(tokens, self.end_ids) if self.end_ids else np.zeros(tokens.shape, bool)
        width = tokens.shape[1]
        found = np.asarray(ends.any(axis=1))
        kept = np.where(found, ends.argmax(axis=1) + 1, width)
        for row in range(len(tokens)) if self.settings.stop_strings else ():
            stop = self._stop_length(tokens[row, : kept[row]].tolist())
            if stop is not None:
                kept[row], found[row] = stop, True
        return kept.astype(np.int32), ~found

    def _stop_length(self, ids: list[int]) -> int | None:
        """The fewest tokens whose text holds a stop string (None: none does)."""
        if not any(stop in self.decode(ids) for stop in self.settings.stop_strings):
            return None
        for count in range(1, len(ids) + 1):
            text = self.decode(ids[:count])
            if any(stop in text for stop in self.settings.stop_strings):
                return count
        return None

    def _arrays(self, prompts, lengths, tokens, kept, truncated) -> Batch:
        rows, width = tokens.shape
        full = np.full((rows, prompts.shape[1] + width), self.fill_id, np.int32)
        positions = np.arange(width)[None, :]
        mask = positions < kept[:, None]
        for row in range(rows):
            full[row, : lengths[row]] = prompts[row, : lengths[row]]
            full[row, lengths[row] : lengths[row] + kept[row]] = tokens[row, : kept[row]]
        if self.settings.mask_truncated_completions:
            mask &= ~truncated[:, None]
        return {
            "tokens": full,
            "prompt_lengths": lengths.astype(np.int32),
            "completion_mask": mask.astype(np.int32),
            "token_counts": (lengths + kept).astype(np.int32),
        }

    def _add_logps(self, batch: Batch, model: eqx.Module) -> None:
        temperature = self.task.loss.temperature
        if self.settings.num_iterations > 1:
            batch["old_logps"] = _logps(model, _core(batch), temperature)
        if self.reference is not None:
            reference = self.reference
            if isinstance(reference, str):  # "adapters": the model itself, its LoRA adapters off
                reference = adapters_off(model)
            batch["reference_logps"] = _logps(reference, _core(batch), temperature)

    def _write_samples(self, step, prompts, texts, per_function, rewards, advantage) -> None:
        assert self.samples is not None
        with open(self.samples.path, "a", encoding="utf-8") as file:
            for row, text in enumerate(texts):
                scores = {name: _number(per_function[row, index])
                          for index, name in enumerate(self.names)}  # fmt: skip
                record = {"step": step + 1, "prompt": prompts[row], "completion": text,
                          "rewards": scores, "reward": _number(rewards[row]),
                          "advantage": float(advantage[row])}  # fmt: skip
                file.write(json.dumps(record) + "\n")


def _number(value: np.floating | float) -> float | None:
    return None if np.isnan(value) else float(value)


def _core(batch: Batch) -> dict[str, np.ndarray]:
    names = ("tokens", "prompt_lengths", "completion_mask", "token_counts")
    return {name: batch[name] for name in names}


@eqx.filter_jit
def _jitted_logps(model, batch, temperature):
    logps, _, _ = completion_logps(model, batch, temperature)
    return logps


def _logps(model: eqx.Module, batch: Mapping[str, np.ndarray], temperature: float) -> np.ndarray:
    return np.asarray(_jitted_logps(model, batch, temperature), np.float32)
