"""Packed conversations train as the same conversations one per row: equal summed loss, equal
count of trained tokens and equal gradients, with the assistant-only mask and without it."""

from __future__ import annotations

import importlib.util

import equinox as eqx
import jax
import numpy as np
import pytest

import zoo
from zoo.data import CharTokenizer
from zoo.data.chat.batches import chat_batches, encode_conversations
from zoo.data.chat.options import ChatDataConfig

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
TOKENIZER = CharTokenizer("abcdefghijklmnopqrstuvwxyz :\n?")
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "why?"},
        {"role": "assistant", "content": "because"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "yes"},
    ],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "blue"}],
]


@eqx.filter_jit
def _loss_and_grads(model, batch):
    def loss_sum(model):
        stats = zoo.tasks.LanguageModeling().statistics(model, batch)
        return stats.loss_sum, stats

    return eqx.filter_value_and_grad(loss_sum, has_aux=True)(model)


def summed(model, batch):
    """Summed loss and trained-token count of a batch, and the gradient of the summed loss."""
    (total, stats), grads = _loss_and_grads(model, batch)
    return float(total), float(stats.weight), grads


@pytest.mark.parametrize("train_on", ["assistant", "all"])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_conversations_unpacked(train_on):
    model = zoo.create("llama-tiny", key=jax.random.key(0), vocab_size=TOKENIZER.vocab_size)
    examples = encode_conversations(CONVERSATIONS, TOKENIZER, train_on=train_on, max_len=127)
    packed = chat_batches(examples, pad_id=0, config=ChatDataConfig(batch_size=1, max_len=127),
                          shuffle=False)  # fmt: skip
    assert len(packed) == 2  # four conversations in two rows of 128
    packed_batch = {name: np.concatenate([packed.batch(s)[name] for s in range(2)])
                    for name in ("tokens", "loss_mask", "segments")}  # fmt: skip
    one_per_row = ChatDataConfig(batch_size=4, max_len=127, pack=False)
    unpacked = chat_batches(examples, pad_id=0, config=one_per_row, shuffle=False,
                            drop_last=False)  # fmt: skip
    one_by_one = unpacked.batch(0)
    assert one_by_one["tokens"].shape[0] == 4 and "segments" not in one_by_one

    loss_packed, weight_packed, grads_packed = summed(model, packed_batch)
    loss_alone, weight_alone, grads_alone = summed(model, one_by_one)
    assert weight_packed == weight_alone == examples.trained_tokens
    np.testing.assert_allclose(loss_packed, loss_alone, rtol=1e-5)
    for packed_grad, alone_grad in zip(
        jax.tree_util.tree_leaves(grads_packed), jax.tree_util.tree_leaves(grads_alone)
    ):
        np.testing.assert_allclose(packed_grad, alone_grad, rtol=1e-4, atol=1e-6)


def test_the_assistant_mask_trains_only_the_replies():
    examples = encode_conversations(CONVERSATIONS, TOKENIZER)
    # each reply's characters (one id each) and its eos
    replies = [m["content"] for c in CONVERSATIONS for m in c if m["role"] == "assistant"]
    replies = sum(len(reply) + 1 for reply in replies)
    assert examples.trained_tokens == replies
    every = encode_conversations(CONVERSATIONS, TOKENIZER, train_on="all")
    assert every.trained_tokens == every.total_tokens - len(CONVERSATIONS)
