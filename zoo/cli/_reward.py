"""`zoo train classifier|gpt --objective reward`: a reward model on preference pairs.

The pairs are read as preference training reads them (`zoo.cli._preference`); the model is a
classifier with one class or a GPT with a score head (added to a language model, as HF's
`AutoModelForSequenceClassification` does), trained by `zoo.tasks.RewardModeling`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from jaxtyping import PRNGKeyArray

from zoo.cli._build import Built
from zoo.cli._numbers import NON_NEGATIVE
from zoo.data.tokenizers.base import Tokenizer
from zoo.models import GPT, Classifier, with_score_head
from zoo.tasks.reward import RewardModeling

if TYPE_CHECKING:
    from zoo.data.chat.preference import PreferenceDataConfig
    from zoo.data.specs import DatasetDicts

OBJECTIVE = "reward"
# the preference flags a reward model has no use for (it reads no reference and has no β)
NOT_FOR_REWARD = ("beta", "reference", "dpo_label_smoothing", "simpo_gamma",
                  "precompute_reference")  # fmt: skip


def add_reward_options(parser: argparse.ArgumentParser) -> None:
    """`--center-rewards-coefficient`."""
    group = parser.add_argument_group("reward models (classifier|gpt --objective reward)")
    group.add_argument(
        "--center-rewards-coefficient",
        type=NON_NEGATIVE,
        default=None,
        help="weight of mean((r_chosen + r_rejected)^2) in the loss, to keep rewards near 0 "
        "(TRL's center_rewards_coefficient; default: none)",
    )


def check_reward_flags(args: argparse.Namespace) -> None:
    """Refuse `--objective reward` on a translator, preference flags it has no use for, and
    `--center-rewards-coefficient` without it."""
    objective = getattr(args, "objective", None)
    if objective != OBJECTIVE:
        if getattr(args, "center_rewards_coefficient", None) is not None:
            raise ValueError("--center-rewards-coefficient goes with --objective reward")
        return
    if args.flavor not in ("classifier", "gpt"):
        raise ValueError(
            f"--objective reward trains a classifier or a gpt with a score head, not a "
            f"{args.flavor}"
        )
    given = [name for name in NOT_FOR_REWARD if getattr(args, name, None) not in (None, False)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(
            f"{flags} go with preference optimisation (--objective dpo, ...); a reward model "
            "reads no reference: drop them"
        )


def reward_model(built: Built, *, key: PRNGKeyArray) -> Built:
    """`built` with a model that scores with one output: a GPT gets a score head where it has
    none (a fresh one, as transformers gives a causal checkpoint); a classifier must have one
    class (the data sets it for a fresh model; an `--init` one is refitted by `build_model`)."""
    model = built.model
    if isinstance(model, GPT) and model.config.head.scores == 1:  # it trains whole with --lora
        return dataclasses.replace(built, fresh_parts=(*built.fresh_parts, "score"))
    if isinstance(model, GPT) and model.config.head.scores != 1:
        if model.config.head.scores:
            raise ValueError(
                f"the --init model's score head has {model.config.head.scores} outputs; a reward "
                "model has one"
            )
        print("zoo train: the model gets a score head of one output, initialised fresh "
              "(every other weight is kept)", file=sys.stderr)  # fmt: skip
        model = with_score_head(model, key=key)
        return dataclasses.replace(built, model=model, fresh_parts=(*built.fresh_parts, "score"))
    if isinstance(model, Classifier) and model.config.num_classes != 1:
        raise ValueError(
            f"a reward model scores with one output, the classifier has num_classes="
            f"{model.config.num_classes}: drop --num-classes (or give --num-classes 1)"
        )
    return built


def reward_task(center_rewards: float | None) -> RewardModeling:
    """The task of `--objective reward`."""
    return RewardModeling(center_rewards=center_rewards)


def is_reward_model(model: object) -> bool:
    """A model that scores a row with one number: a GPT with a one-output score head, or a
    classifier with one class."""
    if isinstance(model, GPT):
        return model.config.head.scores == 1
    return isinstance(model, Classifier) and model.config.num_classes == 1


def evaluate_reward_pairs(
    model: GPT | Classifier,
    tokenizer: Tokenizer,
    dataset: DatasetDicts,
    *,
    config: PreferenceDataConfig,
    split: str,
    center_rewards: float | None,
    progress: bool = False,
) -> dict[str, object]:
    """`zoo eval` of a reward model on the pairs of `split` (`config.validation_split`, or
    those training held out): the loss and `accuracy`, `margin`, `mean_reward`, ..."""
    from zoo.data.chat.preference import preference_data
    from zoo.distributed.hosts import is_writer
    from zoo.progress import Progress
    from zoo.train.evaluation import evaluate
    from zoo.train.step import make_eval_step

    data = preference_data(dataset, tokenizer=tokenizer, config=config)
    if data.validation is None:
        raise ValueError(f"--split {split}: no preference pairs to evaluate")
    task = reward_task(center_rewards)
    shown = Progress(total=len(data.validation), description="zoo eval", unit="batches",
                     enabled=progress and is_writer())  # fmt: skip
    with shown:
        result = evaluate(task, make_eval_step(task), model, data.validation, progress=shown)
    name = next(name for name in data.counts if name != config.train_split)
    return {"split": name, "objective": OBJECTIVE, "pairs": result["scored"],
            "loss": result["loss"], "accuracy": result["metric"], **result["metrics"]}  # fmt: skip
