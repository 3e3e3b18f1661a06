"""GRPO by hand: the clipped loss of each kind, advantages, rewards and their errors, and rollouts
sampled by a tiny model (reproducible from the key, cut at the end ids, LoRA taking part)."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.decoding.groups import sample_groups
from zoo.decoding.loop import Stopping
from zoo.decoding.sampling import SamplingSettings
from zoo.tasks import GRPO, GRPOLoss, PromptRows, Rollouts, RolloutSettings
from zoo.tasks.grpo_advantages import advantages, weighted_rewards
from zoo.tasks.grpo_loss import policy_loss
from zoo.tasks.grpo_rollouts import CompletionText, RolloutFiles
from zoo.tasks.rewards import (
    RewardError,
    answer_match,
    format_match,
    length_penalty,
    score,
)

# two rows of two tokens; the second row's last token is not scored
LOGPS = jnp.asarray([[-1.0, -2.0], [-0.5, -1.0]])
LOG_RATIO = jnp.asarray([[0.0, math.log(1.5)], [math.log(0.5), 0.0]])
MASK = jnp.asarray([[1.0, 1.0], [1.0, 0.0]])
ADVANTAGES = jnp.asarray([1.0, -1.0])


def loss_of(kind: str, **settings) -> dict[str, float]:
    terms = policy_loss(GRPOLoss(kind=kind, **settings), LOGPS, LOGPS - LOG_RATIO, ADVANTAGES,
                        MASK, settings.get("beta") and LOGPS + jnp.asarray([[math.log(2.0), 0.0],
                                                                            [0.0, 0.0]]))  # fmt: skip
    return {name: float(value) for name, value in terms.items()}


def test_token_losses_by_hand():
    # row 0: ratio 1 (A=1) -> -1; ratio 1.5 clipped to 1.2 -> -1.2. row 1: ratio 0.5 (A=-1):
    # -min(-0.5, -0.8) = 0.8
    dapo = loss_of("dapo")
    assert dapo["loss_sum"] / dapo["weight"] == pytest.approx(-1.4 / 3)
    grpo = loss_of("grpo")  # each row's mean, then the mean over rows
    assert grpo["loss_sum"] / grpo["weight"] == pytest.approx((-1.1 + 0.8) / 2)
    dr = loss_of("dr_grpo")  # over rows x the completion width
    assert dr["loss_sum"] / dr["weight"] == pytest.approx(-1.4 / (2 * 2))
    assert loss_of("bnpo") == dapo
    assert dapo["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    assert dapo["clip_ratio/high_mean"] == pytest.approx(1 / 3)
    assert dapo["clip_ratio/region_mean"] == pytest.approx(2 / 3)
    assert dapo["clip_ratio/low_min"] == 0.0 and dapo["clip_ratio/high_max"] == 0.5


def test_sequence_importance_sampling_and_a_wider_upper_clip():
    # row 0's ratio is exp(mean log ratio) = sqrt(1.5) = 1.2247 -> 1.2 on both tokens
    gspo = loss_of("dapo", importance_sampling="sequence")
    assert gspo["loss_sum"] / gspo["weight"] == pytest.approx((-2.4 + 0.8) / 3)
    wide = loss_of("dapo", epsilon_high=0.28)  # 1.5 is clipped to 1.28 now
    assert wide["loss_sum"] / wide["weight"] == pytest.approx((-1 - 1.28 + 0.8) / 3)


def test_kl_to_the_reference_times_the_ratio():
    # ref - logp = ln 2 on row 0's first token: exp(ln 2) - ln 2 - 1, times its ratio 1
    kl = 2.0 - math.log(2.0) - 1.0
    with_kl = loss_of("dapo", beta=0.1)
    assert with_kl["kl"] == pytest.approx(kl / 3)
    assert with_kl["loss_sum"] == pytest.approx(-1.4 + 0.1 * kl)


def test_advantages_by_hand():
    rewards = np.asarray([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    group = advantages(rewards, 3, "group")  # std of (1, 2, 3) is 1; of (5, 5, 5) 0
    assert np.allclose(group, [-1 / 1.0001, 0, 1 / 1.0001, 0, 0, 0], atol=1e-6)
    assert np.allclose(advantages(rewards, 3, "none"), [-1, 0, 1, 0, 0, 0])
    batch_std = np.std(rewards, ddof=1)
    assert np.allclose(advantages(rewards, 3, "batch"),
                       np.asarray([-1, 0, 1, 0, 0, 0]) / (batch_std + 1e-4), atol=1e-6)  # fmt: skip


def test_rows_no_function_scores_get_no_advantage():
    per_function = np.asarray([[np.nan, np.nan], [1.0, np.nan], [3.0, 1.0]])
    rewards = weighted_rewards(per_function, np.asarray([1.0, 2.0]))
    assert np.isnan(rewards[0]) and rewards[1] == 1.0 and rewards[2] == 5.0
    spread = np.std([1.0, 5.0], ddof=1) + 1e-4
    assert np.allclose(advantages(rewards, 3, "group"), [0, -2 / spread, 2 / spread], atol=1e-6)


def test_built_in_rewards():
    numeric = answer_match("answer")
    completions = ["The sum is 1,234.", "12.0", "no number", "3"]
    assert numeric(completions=completions, answer=["1234", "12", "5", "4"]) == [1, 1, 0, 0]
    exact = answer_match("answer", numeric=False)
    assert exact(completions=[" yes ", "no"], answer=["yes", "yes"]) == [1.0, 0.0]
    messages = [[{"role": "assistant", "content": "<a>7</a>"}], [{"role": "assistant",
                                                               "content": "7"}]]  # fmt: skip
    assert format_match(r"^<a>\d+</a>$")(completions=messages) == [1.0, 0.0]
    assert length_penalty(4)(completion_ids=[[1] * 3, [1] * 6]) == [0.0, -0.5]


def test_reward_errors_name_the_function_and_the_row():
    def broken(completions, **_):
        raise RuntimeError("no scorer")

    def short(completions, **_):
        return [1.0]

    def nan_second(completions, **_):
        return [1.0, float("nan")]

    def text(completions, **_):
        return ["1", 2.0]

    args = (["p", "q"], ["a", "b"], [[1], [2]], {})
    with pytest.raises(RewardError, match="'broken' raised RuntimeError: no scorer"):
        score([broken], *args)
    with pytest.raises(RewardError, match="'short' returned 1 rewards for 2 completions"):
        score([short], *args)
    with pytest.raises(RewardError, match="'nan_second' returned nan for row 1.*'q'.*'b'"):
        score([nan_second], *args)
    with pytest.raises(RewardError, match="'text' returned '1' \\(str\\) for row 0"):
        score([text], *args)
    none = score([lambda completions, **_: [None, 2]], *args)
    assert np.isnan(none[0, 0]) and none[1, 0] == 2.0


@pytest.fixture(scope="module")
def tiny():
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=16, pad_id=0, eos_id=2,
                       bos_id=1, max_positions=24)  # fmt: skip
    return model


def rollouts(settings=None, **options):
    prompts = ["a", "bb", "c"]
    ids = [np.asarray([1, 4], np.int32), np.asarray([1, 5, 5], np.int32), np.asarray([1, 6])]

    def sevens(completion_ids, **_):
        return [float(sum(token == 7 for token in ids)) for ids in completion_ids]

    settings = settings or RolloutSettings(num_generations=4, max_completion_len=6, batch_size=2)
    text = CompletionText((2,), 0, lambda t: " ".join(map(str, t)))
    return Rollouts(PromptRows(prompts, ids, {"answer": ["1", "2", "3"]}), GRPO(), rewards=[sevens],
                    settings=settings, text=text, **options)  # fmt: skip


def test_rollouts_are_drawn_from_the_key_and_cut_at_the_end(tiny):
    source = rollouts()
    first = source.rollout(0, tiny, jax.random.key(3))
    again = source.rollout(0, tiny, jax.random.key(3))
    other = source.rollout(0, tiny, jax.random.key(4))
    assert np.array_equal(first["tokens"], again["tokens"])
    assert not np.array_equal(first["tokens"], other["tokens"])
    tokens, mask = first["tokens"], first["completion_mask"]
    assert tokens.shape == (8, 3 + 6) and mask.shape == (8, 6)
    for row in range(8):  # the mask covers the completion through its first end id
        start = first["prompt_lengths"][row]
        completion = tokens[row, start : start + 6]
        ends = np.flatnonzero(completion == 2)
        count = ends[0] + 1 if len(ends) else 6
        assert mask[row].sum() == count == first["token_counts"][row] - start
    assert np.isclose(first["rollout/_steps"].sum(), 1.0)
    GRPO().check_batch(first, tiny)


def test_num_iterations_reuse_the_rollout_with_its_log_probabilities(tiny):
    source = rollouts(
        RolloutSettings(num_generations=2, max_completion_len=4, num_iterations=2, batch_size=2)
    )
    key = jax.random.key(0)
    first = source.batch_for(0, tiny, key)
    assert source.batch_for(1, tiny, key) is first
    assert source.batch_for(2, tiny, key) is not first
    assert first["old_logps"].shape == first["completion_mask"].shape
    # on the sampling model the ratio is 1: the same loss as without old log-probabilities
    loss = eqx.filter_jit(lambda model, batch: GRPO()(model, batch)[0])
    fresh = {k: v for k, v in first.items() if k != "old_logps"}
    assert float(loss(tiny, first)) == pytest.approx(float(loss(tiny, fresh)), abs=1e-6)


def test_a_resumed_run_goes_on_with_the_stored_rollout(tiny, tmp_path):
    settings = RolloutSettings(num_generations=2, max_completion_len=4, num_iterations=2,
                               batch_size=2)  # fmt: skip
    first = rollouts(settings, files=RolloutFiles(store=tmp_path)).batch_for(
        0, tiny, jax.random.key(0)
    )
    # a fresh source (a resumed process) at step 1, with other weights: the stored rollout
    other = zoo.create("llama-tiny", key=jax.random.key(9), vocab_size=16, pad_id=0, eos_id=2,
                       bos_id=1, max_positions=24)  # fmt: skip
    again = rollouts(settings, files=RolloutFiles(store=tmp_path)).batch_for(
        1, other, jax.random.key(0)
    )
    assert sorted(again) == sorted(first)
    for name in first:
        np.testing.assert_array_equal(again[name], first[name])
    with pytest.warns(UserWarning, match="drawn again with the current weights"):
        rollouts(settings).batch_for(1, tiny, jax.random.key(0))


def test_sampling_uses_the_lora_adapters(tiny):
    from zoo.lora import apply
    from zoo.nn.lora import is_lora

    adapted = apply(tiny, rank=2, targets="attention", key=jax.random.key(1))

    def adapters(model):
        return [n.lora_b for n in jax.tree_util.tree_leaves(model, is_leaf=is_lora) if is_lora(n)]

    # a nonzero up-projection: the adapters change the logits
    adapted = eqx.tree_at(adapters, adapted, [jnp.full_like(b, 0.5) for b in adapters(adapted)])
    prompts, lengths = np.asarray([[1, 4, 5]]), np.asarray([3])
    settings = {"num_generations": 4, "stopping": Stopping(8, (), 0),
                "sampling": SamplingSettings(temperature=1.0), "key": jax.random.key(2)}  # fmt: skip
    with_adapters = sample_groups(adapted, prompts, lengths, **settings)
    base = sample_groups(tiny, prompts, lengths, **settings)
    assert not np.array_equal(np.asarray(with_adapters), np.asarray(base))


def test_settings_refuse_what_cannot_work():
    with pytest.raises(ValueError, match="num_generations=1 makes groups of one"):
        RolloutSettings(num_generations=1)
    RolloutSettings(num_generations=1, scale_rewards="batch")
    with pytest.raises(ValueError, match="temperature above 0"):
        RolloutSettings(sampling=SamplingSettings())
    with pytest.raises(ValueError, match="kind must be one of"):
        GRPOLoss(kind="ppo")
    with pytest.raises(ValueError, match="needs a reference model"):
        Rollouts(PromptRows(["a"], [np.asarray([1])]), GRPO(GRPOLoss(beta=0.1)),
                 rewards=[length_penalty(2)], text=CompletionText((2,), 0, str))  # fmt: skip
    with pytest.raises(ValueError, match="prompt row 0 encodes to no tokens"):
        PromptRows(["a"], [np.asarray([], np.int32)])
