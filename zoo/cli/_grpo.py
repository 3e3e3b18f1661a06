"""RL from rewards for `zoo train gpt --objective grpo`: prompt rows, reward functions, rollouts.

The data is rows with a `prompt` (a text, or a list of `{role, content}` messages rendered with
the chat template and its generation prompt); every other column reaches the reward functions.
`--reward` names a function as `module:function` (TRL's signature, `zoo.tasks.rewards`) or a
built-in: `numeric:COLUMN` (the last number of the completion equals the column's),
`exact:COLUMN` (the stripped text equals it), `format:REGEX`, `length:TOKENS` (a penalty past
TOKENS), `model:PATH` (a trained reward model's score, `zoo.tasks.reward_scores`). The task is `zoo.tasks.GRPO`, its batches `zoo.tasks.Rollouts`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import equinox as eqx
import numpy as np

from zoo.cli._data_options import DataOptions
from zoo.cli._numbers import NON_NEGATIVE, POSITIVE, SHARE
from zoo.data.batches import ArrayBatches
from zoo.data.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from zoo.data.specs import DatasetDicts
    from zoo.tasks.grpo import GRPO
    from zoo.tasks.grpo_rollouts import PromptRows, Rollouts
    from zoo.tasks.rewards import RewardFunction

BUILT_IN = ("numeric", "exact", "format", "length", "model")
DEFAULT_COMPLETION_LEN = 256  # TRL's max_completion_length is 512; a CPU run wants less


@dataclass(frozen=True, kw_only=True)
class GRPOOptions:
    """What `--objective grpo` trains with: the rewards, sampling, and the loss."""

    rewards: tuple[str, ...]  # --reward specs
    reward_weights: tuple[float, ...] | None = None  # --reward-weights
    num_generations: int = 8  # --num-generations: completions per prompt
    max_completion_len: int = DEFAULT_COMPLETION_LEN  # --max-completion-len
    temperature: float = 1.0  # --temperature
    top_p: float | None = None  # --top-p
    top_k: int | None = None  # --top-k
    stop: tuple[str, ...] = ()  # --stop: texts that end a completion
    loss: str = "dapo"  # --grpo-loss
    epsilon: float = 0.2  # --epsilon
    epsilon_high: float | None = None  # --epsilon-high
    num_iterations: int = 1  # --num-iterations μ
    importance_sampling: str = "token"  # --importance-sampling
    scale_rewards: str = "group"  # --scale-rewards
    beta: float = 0.0  # --beta: the KL weight
    reference: str | None = None  # --reference: the KL's reference model
    mask_truncated_completions: bool = False  # --mask-truncated-completions


def add_grpo_options(parser: argparse.ArgumentParser) -> None:
    """The flags of `--objective grpo` (`--beta`, `--reference`, `--max-completion-len` are the
    preference flags', read by GRPO too)."""
    group = parser.add_argument_group("RL from rewards (gpt --objective grpo)")
    group.add_argument("--reward", action="append", metavar="SPEC",
                       help="module:function (TRL's signature), numeric:COLUMN, exact:COLUMN, "
                       "format:REGEX, length:TOKENS or model:PATH (a trained reward model); "
                       "repeatable")  # fmt: skip
    group.add_argument("--reward-weights", metavar="W,W,...", help="one weight per --reward")
    group.add_argument("--num-generations", type=int, help="completions per prompt (8)")
    group.add_argument("--temperature", type=NON_NEGATIVE, help="sampling temperature (1.0)")
    group.add_argument("--top-p", type=SHARE, help="nucleus sampling")
    group.add_argument("--top-k", type=int, help="sample from the k likeliest tokens")
    group.add_argument("--stop", action="append", metavar="TEXT", help="ends a completion")
    group.add_argument("--grpo-loss", choices=("grpo", "dr_grpo", "dapo", "bnpo"),
                       help="how token losses are normalised (dapo)")  # fmt: skip
    group.add_argument("--epsilon", type=POSITIVE, help="clip the ratio at 1 - epsilon (0.2)")
    group.add_argument("--epsilon-high", type=POSITIVE, help="... and at 1 + this (epsilon)")
    group.add_argument("--num-iterations", type=int, help="μ: updates per rollout (1)")
    group.add_argument("--importance-sampling", choices=("token", "sequence"),
                       help="one ratio per token, or per completion (GSPO)")  # fmt: skip
    group.add_argument("--scale-rewards", choices=("group", "batch", "none"),
                       help="divide the advantages by the group's std (default), the batch's, "
                       "or not")  # fmt: skip
    group.add_argument("--mask-truncated-completions", action="store_true",
                       help="completions cut by --max-completion-len leave the loss")  # fmt: skip


GRPO_FLAGS = ("reward", "reward_weights", "num_generations", "temperature", "top_p", "top_k",
              "stop", "grpo_loss", "epsilon", "epsilon_high", "num_iterations",
              "importance_sampling", "scale_rewards")  # fmt: skip


def grpo_options(args: argparse.Namespace) -> GRPOOptions | None:
    """The GRPO options of `zoo train`'s flags (None: another objective); refuses GRPO flags
    without `--objective grpo` and mixes that cannot work."""
    given = [name for name in GRPO_FLAGS if getattr(args, name, None) is not None]
    if getattr(args, "mask_truncated_completions", False):
        given.append("mask_truncated_completions")
    if getattr(args, "objective", None) != "grpo":
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} go with --objective grpo")
        return None
    if args.flavor != "gpt":
        raise ValueError(f"--objective grpo trains a gpt on its own completions, not a "
                         f"{args.flavor}: run `zoo train gpt --objective grpo`")  # fmt: skip
    for flag in ("dpo_label_smoothing", "simpo_gamma"):
        if getattr(args, flag, None) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} is a preference loss's setting")
    if getattr(args, "precompute_reference", False):
        raise ValueError("--precompute-reference is for preference pairs, not --objective grpo")
    if not args.reward:
        raise ValueError("--objective grpo needs a reward: --reward numeric:answer, "
                         "--reward module:function, ... (repeatable)")  # fmt: skip
    options = GRPOOptions(
        rewards=tuple(args.reward),
        reward_weights=_weights(args.reward_weights, len(args.reward)),
        num_generations=_or(args.num_generations, 8),
        max_completion_len=_or(args.max_completion_len, DEFAULT_COMPLETION_LEN),
        temperature=_or(args.temperature, 1.0),
        top_p=args.top_p,
        top_k=args.top_k,
        stop=tuple(args.stop or ()),
        loss=_or(args.grpo_loss, "dapo"),
        epsilon=_or(args.epsilon, 0.2),
        epsilon_high=args.epsilon_high,
        num_iterations=_or(args.num_iterations, 1),
        importance_sampling=_or(args.importance_sampling, "token"),
        scale_rewards=_or(args.scale_rewards, "group"),
        beta=_or(args.beta, 0.0),
        reference=args.reference,
        mask_truncated_completions=bool(args.mask_truncated_completions),
    )
    if options.num_generations == 1 and options.scale_rewards == "group":
        raise ValueError("--num-generations 1 makes groups of one completion, whose standard "
                         "deviation is undefined: sample 2 or more per prompt, or pass "
                         "--scale-rewards batch or none")  # fmt: skip
    if options.reference and options.beta == 0.0:
        raise ValueError("--reference is the KL's reference model: give --beta above 0")
    rollout_settings(options)  # bad numbers: refused now
    loss_settings(options)
    for spec in options.rewards:
        reward_function(spec)  # a missing module or function: refused before any work
    return options


def _or(value, default):
    return default if value is None else value


def _weights(text: str | None, count: int) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        weights = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--reward-weights {text!r}: give numbers separated by commas") from None
    if len(weights) != count:
        raise ValueError(f"--reward-weights gives {len(weights)} weights for {count} --reward")
    return weights


def rollout_settings(options: GRPOOptions):
    from zoo.decoding.sampling import SamplingSettings
    from zoo.tasks.grpo_rollouts import RolloutSettings

    sampling = SamplingSettings(temperature=options.temperature, top_k=options.top_k,
                                top_p=options.top_p)  # fmt: skip
    return RolloutSettings(
        num_generations=options.num_generations,
        max_completion_len=options.max_completion_len,
        sampling=sampling,
        scale_rewards=options.scale_rewards,
        mask_truncated_completions=options.mask_truncated_completions,
        num_iterations=options.num_iterations,
        stop_strings=options.stop,
    )


def loss_settings(options: GRPOOptions):
    from zoo.tasks.grpo_loss import GRPOLoss

    return GRPOLoss(kind=options.loss, epsilon=options.epsilon,
                    epsilon_high=options.epsilon_high, beta=options.beta,
                    importance_sampling=options.importance_sampling,
                    temperature=options.temperature)  # fmt: skip


def reward_function(spec: str) -> RewardFunction:
    """The function of `--reward SPEC`: a built-in, or `module:function` (the working
    directory is searched first, so a local `rewards.py` works)."""
    from zoo.tasks import rewards

    kind, separator, rest = spec.partition(":")
    if not separator or not rest or not kind:
        raise ValueError(f"--reward {spec!r} is not module:function, numeric:COLUMN, "
                         "exact:COLUMN, format:REGEX, length:TOKENS or model:PATH")  # fmt: skip
    if kind in ("numeric", "exact"):
        return rewards.answer_match(rest, numeric=kind == "numeric")
    if kind == "format":
        return rewards.format_match(rest)
    if kind == "length":
        if not rest.isdigit() or int(rest) < 1:
            raise ValueError(f"--reward {spec}: length:TOKENS takes a positive number of tokens")
        return rewards.length_penalty(int(rest))
    if kind == "model":
        return _reward_model(spec, rest)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(kind)
    except ImportError as error:
        raise ValueError(f"--reward {spec}: cannot import module {kind!r} ({error})") from None
    function = getattr(module, rest, None)
    if not callable(function):
        raise ValueError(f"--reward {spec}: module {kind!r} has no function {rest!r}")
    return function


def _reward_model(spec: str, path: str) -> RewardFunction:
    """The reward function of `--reward model:PATH`: a trained reward model (a run of
    `--objective reward`, or a `*ForSequenceClassification` folder) scoring each completion."""
    from zoo.cli._load import read_model
    from zoo.models import GPT, Classifier
    from zoo.tasks.reward_scores import model_reward

    model, tokenizer = read_model(path, option=f"--reward {spec}:")
    if tokenizer is None:
        raise ValueError(f"--reward {spec}: the reward model has no tokenizer files to read "
                         "the completions with; copy its tokenizer into the folder")  # fmt: skip
    if not isinstance(model, GPT | Classifier):
        raise ValueError(f"--reward {spec}: a reward model is a classifier or a gpt with a score "
                         f"head, not a {type(model).__name__}")  # fmt: skip
    try:
        return model_reward(model, tokenizer)
    except TypeError as error:
        raise ValueError(f"--reward {spec}: not a reward model: {error}") from None


# -- the data: prompt rows -----------------------------------------------------------------------


def read_prompts(
    dataset: DatasetDicts, flavor: str, options: DataOptions
) -> tuple[PromptRows, Tokenizer, str | None]:
    """The prompt rows of `dataset`'s train split encoded, their tokenizer, and the chat
    template's text (None for text prompts)."""
    from zoo.cli._chat_data import read_template
    from zoo.data.chat.files import chat_template_for
    from zoo.data.tokenizers.build import build_tokenizer

    if flavor != "gpt":
        raise ValueError(f"prompt rows train a gpt, not a {flavor}")
    rows = dataset["train"]
    columns = list(rows.column_names)
    if "prompt" not in columns:
        raise ValueError(f"--objective grpo reads a 'prompt' column (text or messages); the "
                         f"data has {columns}")  # fmt: skip
    prompts = list(rows["prompt"])
    for index, prompt in enumerate(prompts):
        if not (isinstance(prompt, str) and prompt) and not _is_messages(prompt):
            raise ValueError(f"prompt row {index} is {prompt!r:.80}: a prompt is a text or a "
                             "list of {role, content} messages")  # fmt: skip
    texts = any(isinstance(prompt, str) for prompt in prompts)
    if texts and not all(isinstance(prompt, str) for prompt in prompts):
        raise ValueError("the prompts mix texts and message lists: give one kind")
    others = {name: list(rows[name]) for name in columns if name != "prompt"}
    tokenizer = options.tokenizer or "char"
    if not isinstance(tokenizer, Tokenizer):
        corpus = [p if isinstance(p, str) else " ".join(str(m["content"]) for m in p)
                  for p in prompts] + [str(v) for values in others.values() for v in values]  # fmt: skip
        tokenizer = build_tokenizer(tokenizer, corpus)
    template = None
    if texts:
        bos = tokenizer.bos_id is not None and getattr(tokenizer, "source", None) is None
        ids = [np.asarray(tokenizer.encode(p, add_bos=bos), np.int32) for p in prompts]
    else:
        from zoo.data.chat.tokens import prompt_ids

        given = read_template(options.template)
        template = chat_template_for(tokenizer, template=given)
        ids = [prompt_ids(p, tokenizer, template, {}) for p in prompts]
    from zoo.tasks.grpo_rollouts import PromptRows

    prompt_rows = PromptRows(prompts, ids, others)
    width = max(len(row) for row in ids)
    print(f"zoo train: {len(ids)} prompts ({'text' if texts else 'messages'}), the longest "
          f"{width} tokens", file=sys.stderr)  # fmt: skip
    return prompt_rows, tokenizer, None if template is None else template.source


def prompt_order(prompts: PromptRows, seed: int) -> ArrayBatches:
    """The rows of the prompts, one a batch: what `RunData.train` holds for GRPO (the rollouts
    draw their own batches)."""
    return ArrayBatches({"row": np.arange(len(prompts.ids))}, 1, seed=seed)


def _is_messages(prompt: object) -> bool:
    return (isinstance(prompt, list) and bool(prompt)
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt))  # fmt: skip


def prompt_width(prompts: PromptRows) -> int:
    return max(len(ids) for ids in prompts.ids)


# -- the run: task and rollouts ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GRPORun:
    """What a GRPO run reads beside its options: the data and where samples go."""

    prompts: PromptRows  # the prompt rows
    tokenizer: Tokenizer  # their tokenizer
    chat_template: str | None  # the template of message prompts (None: text prompts)
    batch_size: int  # --batch-size: completions per step
    seed: int  # --seed: the order of the prompts
    samples: Path | None  # samples.jsonl (None: not written)
    sample_every: int | None  # --sample-every
    store: Path | None = None  # where the last rollouts are kept (--num-iterations above 1)


def grpo_setup(options: GRPOOptions, model: eqx.Module, run: GRPORun) -> tuple[GRPO, Rollouts]:
    """The task and its rollouts: the rewards, the end of a completion, the reference."""
    from zoo.cli._load import read_model
    from zoo.data.chat.files import chat_template_for
    from zoo.data.chat.tokens import end_of_turn_ids
    from zoo.models import GPT
    from zoo.nn.lora import has_lora
    from zoo.tasks.grpo import GRPO
    from zoo.tasks.grpo_rollouts import CompletionText, RolloutFiles, Rollouts, SampleLog

    tokenizer, batch_size = run.tokenizer, run.batch_size
    if not isinstance(model, GPT):
        raise ValueError(f"--objective grpo trains a gpt, got a {type(model).__name__}")
    width = prompt_width(run.prompts) + options.max_completion_len
    if width > model.config.max_positions:
        raise ValueError(f"the longest prompt plus --max-completion-len {options.max_completion_len}"
                         f" is {width} tokens, past the model's max_positions="
                         f"{model.config.max_positions}: lower --max-completion-len (or raise "
                         "max_positions: --max-len for a fresh preset)")  # fmt: skip
    if batch_size % options.num_generations:
        raise ValueError(f"--batch-size {batch_size} counts completions (as TRL's): give a "
                         f"multiple of --num-generations {options.num_generations}")  # fmt: skip
    ends = (*tokenizer.eos_ids, *model.config.end_ids)
    if run.chat_template is not None:
        template = chat_template_for(tokenizer, template=run.chat_template)  # its special tokens
        ends = (*ends, *end_of_turn_ids(tokenizer, template))
    reference: eqx.Module | str | None = None
    if options.beta:
        if options.reference:
            reference, _ = read_model(options.reference, option="--reference")
        elif has_lora(model):
            reference = "adapters"
        else:
            reference = model  # the trainer trains a copy: these are the starting weights
    task = GRPO(loss_settings(options))
    config = model.config
    fill = config.pad_id if config.pad_id is not None else (config.eos_id or 0)
    check_sizes(options, batch_size, run.prompts.prompts)
    settings = dataclasses.replace(rollout_settings(options), seed=run.seed,
                                   batch_size=batch_size // options.num_generations)  # fmt: skip
    samples = None
    if run.samples is not None and run.sample_every:
        samples = SampleLog(run.samples, run.sample_every)
    rollouts = Rollouts(
        run.prompts, task, rewards=[reward_function(spec) for spec in options.rewards],
        weights=options.reward_weights, settings=settings, reference=reference,
        files=RolloutFiles(samples, run.store),
        text=CompletionText(tuple(dict.fromkeys(ends)), fill, tokenizer.decode),
    )  # fmt: skip
    return task, rollouts


def check_sizes(options: GRPOOptions, batch_size: int, prompts: Sequence[object]) -> None:
    """Enough prompts for one step."""
    needed = batch_size // options.num_generations
    if needed > len(prompts):
        raise ValueError(f"--batch-size {batch_size} takes {needed} prompts a step and the data "
                         f"has {len(prompts)}: lower --batch-size")  # fmt: skip
