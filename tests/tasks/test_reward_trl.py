"""The reward-model loss and metrics equal TRL's `RewardTrainer` on a tiny Llama score model.

TRL's numbers come from `RewardTrainer.compute_loss` on a `LlamaForSequenceClassification`
(one label) called with the same ids; zoo's model is that checkpoint read by `zoo.from_pretrained`
(a GPT with a score head).
"""

from __future__ import annotations

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
from zoo.data.chat.preference import PreferencePair, pair_arrays  # noqa: E402
from zoo.interop.export import save_hf  # noqa: E402
from zoo.tasks import RewardModeling  # noqa: E402

VOCAB = 48
PAIRS = [
    PreferencePair([1, 5, 9], [6, 7, 20, 2], [8, 2]),
    PreferencePair([1, 9, 10, 11, 3], [12, 2], [13, 14, 15, 30, 2]),
    PreferencePair([1, 40], [41, 42, 43, 2], [41, 44, 2]),
]
MARGINS = np.array([0.5, 0.0, -0.25], np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(torch LlamaForSequenceClassification, the same model read by zoo.from_pretrained)."""
    causal = tiny_llama(0, VOCAB)
    torch.manual_seed(1)
    scorer = transformers.LlamaForSequenceClassification(
        transformers.LlamaConfig(**{**causal.config.to_dict(), "num_labels": 1})
    )
    scorer = scorer.float().eval()
    scorer.model.load_state_dict(causal.model.state_dict())
    with torch.no_grad():  # a score head big enough that the rewards differ clearly
        scorer.score.weight.normal_(0.0, 1.0)
    folder = tmp_path_factory.mktemp("scorer")
    scorer.save_pretrained(folder)
    return scorer, zoo.from_pretrained(folder)


def _tokenizer():
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t3"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3"
    )


def trl_reward(scorer, batch, *, margin=None, center=None):
    """TRL's loss (a tensor with its graph) and metrics, `RewardTrainer.compute_loss`."""
    from datasets import Dataset

    config = trl.RewardConfig(
        output_dir="/tmp/zoo-trl-reward", report_to=[], use_cpu=True, bf16=False,
        per_device_train_batch_size=len(PAIRS), max_length=None,
        center_rewards_coefficient=center,
    )  # fmt: skip
    data = Dataset.from_list([{"chosen": "t5 t6", "rejected": "t5 t7"}])
    trainer = trl.RewardTrainer(model=scorer, args=config, train_dataset=data,
                                processing_class=_tokenizer())  # fmt: skip
    trainer.model.train()
    tokens = np.concatenate([batch["tokens"][:, 0], batch["tokens"][:, 1]])
    lengths = np.concatenate([batch["lengths"][:, 0], batch["lengths"][:, 1]])
    attention = (np.arange(tokens.shape[1])[None] < lengths[:, None]).astype(np.int64)
    inputs = {"input_ids": torch.tensor(tokens, dtype=torch.long),
              "attention_mask": torch.tensor(attention)}  # fmt: skip
    if margin is not None:
        inputs["margin"] = torch.tensor(margin)
    loss = trainer.compute_loss(trainer.model, inputs)
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return loss, metrics


def zoo_reward(model, batch, **options):
    task = RewardModeling(**options.pop("task", {}))
    data = {k: jnp.asarray(v) for k, v in batch.items()}
    task.check_batch(data, model)
    value, metrics = task(model, data)
    return float(value), {name: float(v) for name, v in metrics.items()}


@pytest.mark.parametrize(
    ("margin", "center"), [(None, None), (MARGINS, None), (None, 0.01), (MARGINS, 0.1)]
)
def test_reward_loss_and_metrics_equal_trl(models, margin, center):
    scorer, model = models
    batch = pair_arrays(PAIRS, pad_id=0, positions=False)
    expected_loss, expected = trl_reward(scorer, batch, margin=margin, center=center)
    if margin is not None:
        batch["margin"] = margin
    loss, metrics = zoo_reward(model, batch, task={"center_rewards": center})
    np.testing.assert_allclose(loss, float(expected_loss.detach()), rtol=1e-5, atol=1e-6)
    for name in ("accuracy", "margin", "mean_reward"):
        np.testing.assert_allclose(metrics[name], expected[name], rtol=1e-5, atol=1e-6)
    assert expected_loss.item() > 0.0


def test_reward_gradient_equals_trl(models):
    """The gradient of the score head and of the first layer's query projection."""
    scorer, model = models
    batch = pair_arrays(PAIRS, pad_id=0, positions=False)
    scorer.zero_grad()
    loss, _ = trl_reward(scorer, batch, margin=MARGINS, center=0.05)
    loss.backward()
    data = {k: jnp.asarray(v) for k, v in {**batch, "margin": MARGINS}.items()}
    task = RewardModeling(center_rewards=0.05)
    grads = eqx.filter_grad(lambda m: task(m, data)[0])(model)
    np.testing.assert_allclose(
        np.asarray(grads.score.weight), scorer.score.weight.grad.numpy(), rtol=1e-4, atol=1e-6
    )
    query = scorer.model.layers[0].self_attn.q_proj.weight.grad.numpy()
    ours = np.asarray(grads.layers.blocks.self_attention.query_proj.weight)
    np.testing.assert_allclose(ours[0] if ours.ndim == 3 else ours, query, rtol=1e-4, atol=1e-6)


def test_scores_equal_llama_for_sequence_classification(models, tmp_path):
    """The score of the last real token, on right-padded rows, as transformers reads it; and
    the model exported back to HF is a `LlamaForSequenceClassification` with the same scores."""
    scorer, model = models
    batch = pair_arrays(PAIRS, pad_id=0, positions=False)
    tokens = np.concatenate([batch["tokens"][:, 0], batch["tokens"][:, 1]])
    with torch.no_grad():
        expected = scorer(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    ours = jax.vmap(lambda row: model.scores_and_router(row).output)(jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-5, atol=1e-5)

    folder = tmp_path / "exported"
    save_hf(model, folder)
    exported = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(exported).__name__ == "LlamaForSequenceClassification"
    with torch.no_grad():
        again = exported(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(again, expected, rtol=1e-5, atol=1e-6)
