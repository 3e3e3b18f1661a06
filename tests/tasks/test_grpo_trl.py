"""GRPO's advantages, loss, metrics and gradient equal TRL's `GRPOTrainer` on a tiny Llama.

TRL's generation is replaced by fixed completions (`_generate_single_turn` returns them), so
both sides score the same ids: TRL through `_generate_and_score_completions` and
`_compute_loss`, zoo through its rollout code (`Rollouts._cut`, `_arrays`, `score`,
`advantages`, `rollout_metrics`) and `GRPO`. Old log-probabilities (μ = 2) are shifted by a fixed
amount on both sides so that the ratios leave 1 and clipping happens.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
tokenizers = pytest.importorskip("tokenizers")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import zoo  # noqa: E402
from tests.tasks.tiny_llama import tiny_llama  # noqa: E402
from zoo.tasks import GRPO, GRPOLoss, PromptRows, Rollouts, RolloutSettings  # noqa: E402
from zoo.tasks.grpo_advantages import advantages, rollout_metrics, weighted_rewards  # noqa: E402
from zoo.tasks.grpo_rollouts import CompletionText, _logps  # noqa: E402
from zoo.tasks.rewards import score  # noqa: E402

VOCAB, GROUP, WIDTH = 48, 3, 5
PROMPTS = ["t1 t5 t9", "t1 t7 t4"]
ANSWERS = ["3", "4"]
COMPLETIONS = [[5, 6, 2], [7, 8, 9, 10, 11], [12, 2], [13, 14, 15, 2], [16, 17, 18, 19, 20],
               [21, 22, 23, 24, 2]]  # fmt: skip
WEIGHTS = [1.0, 0.5]
SHIFT = np.random.default_rng(0).uniform(-0.4, 0.4, (len(COMPLETIONS), WIDTH)).astype(np.float32)
METRICS = ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
           "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max")  # fmt: skip
ROLLOUT_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "rewards/by_ids/mean",
                   "rewards/by_ids/std", "rewards/by_text/mean", "rewards/by_text/std",
                   "completions/mean_length", "completions/min_length", "completions/max_length",
                   "completions/clipped_ratio", "completions/mean_terminated_length")  # fmt: skip


def by_ids(completion_ids, **_):
    return [len(ids) * 0.5 + ids[0] % 3 for ids in completion_ids]


def by_text(completions, answer, **_):
    return [None if row % 4 == 1 else len(text) * 0.1 + float(given)
            for row, (text, given) in enumerate(zip(completions, answer, strict=True))]  # fmt: skip


def llama(seed: int):
    return tiny_llama(seed, VOCAB)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(policy folder, torch reference, zoo policy, zoo reference)."""
    folders = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp(f"llama{seed}")
        llama(seed).save_pretrained(folder)
        folders.append(folder)
    reference_pt = transformers.LlamaForCausalLM.from_pretrained(folders[1]).float().eval()
    return (
        folders[0],
        reference_pt,
        zoo.from_pretrained(folders[0]),
        zoo.from_pretrained(folders[1]),
    )


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t3"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3"
    )


def trl_rollout(folder, reference_pt, settings):
    """TRL's trainer and its scored batch of the fixed completions."""
    from datasets import Dataset

    config = trl.GRPOConfig(
        output_dir="/tmp/zoo-trl-grpo", report_to=[], use_cpu=True, bf16=False,
        per_device_train_batch_size=len(COMPLETIONS), num_generations=GROUP,
        max_completion_length=WIDTH, reward_weights=WEIGHTS, **settings,
    )  # fmt: skip
    rows = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS, strict=True)]
    policy = transformers.LlamaForCausalLM.from_pretrained(folder).float()
    trainer = trl.GRPOTrainer(model=policy, reward_funcs=[by_ids, by_text], args=config,
                              train_dataset=Dataset.from_list(rows),
                              processing_class=_tokenizer())  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    if settings.get("beta", 0.0):
        from trl.trainer.utils import add_fused_lm_head

        reference = copy.deepcopy(reference_pt)  # TRL's own reference is the policy's weights
        add_fused_lm_head(reference, temperature=config.temperature)
        trainer.ref_model = reference
    trainer._generate_single_turn = lambda *_: ([list(c) for c in COMPLETIONS], None)
    inputs = [row for row in rows for _ in range(GROUP)]
    output = trainer._generate_and_score_completions(inputs)
    return trainer, output


def zoo_rollout(trainer, loss: GRPOLoss, settings: RolloutSettings, reference):
    """zoo's batch of the same completions, formed by its rollout code."""
    hf = trainer.processing_class
    ids = [np.asarray(hf(p, add_special_tokens=False)["input_ids"], np.int32) for p in PROMPTS]
    rows = PromptRows(PROMPTS, ids, {"answer": ANSWERS})
    text = CompletionText((2,), 0, lambda t: hf.decode(t, skip_special_tokens=True))
    source = Rollouts(rows, GRPO(loss), rewards=[by_ids, by_text], weights=WEIGHTS,
                      settings=settings, text=text, reference=reference)  # fmt: skip
    tokens = np.zeros((len(COMPLETIONS), WIDTH), np.int32)
    for row, completion in enumerate(COMPLETIONS):
        tokens[row, : len(completion)] = completion
    kept, truncated = source._cut(tokens)
    prompts = np.stack([ids[row // GROUP] for row in range(len(COMPLETIONS))])
    batch = source._arrays(prompts, np.full(len(COMPLETIONS), 3), tokens, kept, truncated)
    texts = [source.decode(c) for c in COMPLETIONS]
    columns = {"answer": [ANSWERS[row // GROUP] for row in range(len(COMPLETIONS))]}
    prompt_texts = [PROMPTS[row // GROUP] for row in range(len(COMPLETIONS))]
    per_function = score(source.rewards, prompt_texts, texts, COMPLETIONS, columns)
    rewards = weighted_rewards(per_function, source.weights)
    batch["advantages"] = advantages(rewards, GROUP, settings.scale_rewards)
    metrics = rollout_metrics(per_function, source.weights, source.names, num_generations=GROUP,
                              scale_rewards=settings.scale_rewards, lengths=kept,
                              truncated=truncated)  # fmt: skip
    return source, batch, metrics


CASES = {  # TRL's settings, and whether the old log-probabilities are shifted
    "grpo": ({"loss_type": "grpo"}, True),
    "dr_grpo": ({"loss_type": "dr_grpo", "scale_rewards": "none"}, False),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, False),
    "bnpo": ({"loss_type": "bnpo", "scale_rewards": "batch", "mask_truncated_completions": True},
             True),
    "gspo_mu2": ({"loss_type": "grpo", "importance_sampling_level": "sequence",
                  "num_iterations": 2, "epsilon": 0.05}, True),
    "dapo_beta_mu2": ({"loss_type": "dapo", "beta": 0.04, "num_iterations": 2}, True),
}  # fmt: skip


def zoo_settings(settings):
    loss = GRPOLoss(kind=settings["loss_type"], epsilon=settings.get("epsilon", 0.2),
                    epsilon_high=settings.get("epsilon_high"), beta=settings.get("beta", 0.0),
                    importance_sampling=settings.get("importance_sampling_level", "token"))  # fmt: skip
    rollout = RolloutSettings(
        num_generations=GROUP, max_completion_len=WIDTH,
        scale_rewards=settings.get("scale_rewards", "group"),
        mask_truncated_completions=settings.get("mask_truncated_completions", False),
        num_iterations=settings.get("num_iterations", 1), batch_size=len(PROMPTS),
    )  # fmt: skip
    return loss, rollout


def source_keys():
    return ("tokens", "prompt_lengths", "completion_mask", "token_counts")


def both(models, case):
    folder, reference_pt, policy, reference = models
    settings, shifted = CASES[case]
    trainer, output = trl_rollout(folder, reference_pt, settings)
    loss, rollout = zoo_settings(settings)
    source, batch, rollout_values = zoo_rollout(trainer, loss, rollout, reference)
    source._add_logps(batch, policy)
    mask = batch["completion_mask"] == 1
    if "old_per_token_logps" in output:  # μ = 2: TRL kept the sampling model's numbers
        old = output["old_per_token_logps"].numpy()
        assert np.allclose(batch["old_logps"][mask], old[mask], atol=1e-5)
    if shifted:  # ratios away from 1, the same on both sides
        old = _logps(policy, {k: batch[k] for k in source_keys()}, 1.0) + SHIFT
        output["old_per_token_logps"] = torch.tensor(old)
        batch["old_logps"] = old
    if loss.beta:
        ref = output["ref_per_token_logps"].numpy()
        assert np.allclose(batch["reference_logps"][mask], ref[mask], atol=1e-5)
    return trainer, output, GRPO(loss), batch, rollout_values


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpo_equals_trl(models, case):
    trainer, output, task, batch, rollout_values = both(models, case)
    # the rollout: masks, advantages and TRL's logged rollout metrics
    assert np.array_equal(batch["completion_mask"], output["completion_mask"].numpy())
    assert np.allclose(batch["advantages"], output["advantages"].numpy(), rtol=1e-5, atol=1e-6)
    logged = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    for name in ROLLOUT_METRICS:
        assert rollout_values[name] == pytest.approx(logged[name], rel=1e-5, abs=1e-6), name
    # the loss and the metrics of its forward pass
    expected = float(trainer._compute_loss(trainer.model, output).detach())
    logged = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    value, metrics = task(models[2], {k: jnp.asarray(v) for k, v in batch.items()})
    assert abs(expected) > 1e-4
    assert float(value) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    for name in METRICS:
        if name in logged:
            assert float(metrics[name]) == pytest.approx(logged[name], rel=1e-5, abs=1e-6), name
    if CASES[case][1]:  # shifted ratios: some tokens are clipped
        assert logged["clip_ratio/region_mean"] > 0


@pytest.mark.parametrize("case", ["dapo_beta_mu2"])
def test_one_sgd_step_moves_the_loss_as_trl(models, case):
    trainer, output, task, batch, _ = both(models, case)
    rate = 1.0
    model_pt = trainer.model
    loss = trainer._compute_loss(model_pt, output)
    loss.backward()
    with torch.no_grad():
        for parameter in model_pt.parameters():
            if parameter.grad is not None:
                parameter -= rate * parameter.grad
    trl_after = float(trainer._compute_loss(model_pt, output).detach())

    arrays = {k: jnp.asarray(v) for k, v in batch.items()}
    policy = copy.deepcopy(models[2])

    def objective(model):
        return task(model, arrays)[0]

    grads = eqx.filter_grad(objective)(policy)
    stepped = jax.tree_util.tree_map(
        lambda p, g: p - rate * g, eqx.filter(policy, eqx.is_inexact_array), grads
    )
    policy = eqx.combine(stepped, policy)
    zoo_after = float(objective(policy))
    assert abs(trl_after - float(loss.detach())) > 1e-4  # the step moved the loss
    assert zoo_after == pytest.approx(trl_after, rel=1e-5, abs=1e-6)
