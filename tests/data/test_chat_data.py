"""Conversation datasets -> loss masks -> packed or padded batches (zoo.data.chat.batches,
zoo.data.chat.datasets): ids and masks by hand on a char tokenizer, packing by hand, the format
read from the columns, and errors that name the row and the expected columns."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import replace

import datasets
import numpy as np
import pytest

from zoo.data import CharTokenizer, DataError
from zoo.data.chat.batches import chat_batches, encode_conversations, pack_conversations
from zoo.data.chat.datasets import chat_data, chat_evaluation, chat_format_of, is_chat_data
from zoo.data.chat.options import ChatDataConfig
from zoo.data.chat.template import ChatTemplate

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
CHARS = "\n:HYaeinorstuy"
NL, COLON, H, Y, A, E, I_, N, O_, R, S, T, U, LOWER_Y = range(4, 4 + len(CHARS))
BOS, EOS = 1, 2
USER = [U, S, E, R, COLON, NL]
ASSISTANT = [A, S, S, I_, S, T, A, N, T, COLON, NL]
HI = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
# <bos> user:\n Hi <eos> \n assistant:\n Yo <eos> \n: 26 ids, the assistant's "Yo<eos>" at 22-24
HI_IDS = [BOS, *USER, H, I_, EOS, NL, *ASSISTANT, Y, O_, EOS, NL]
HI_MASK = [0] * 22 + [1, 1, 1, 0]
TOKENIZER = CharTokenizer(CHARS)


def unpacked(batch_size: int) -> ChatDataConfig:
    """One conversation per row, `max_len=64`."""
    return ChatDataConfig(max_len=64, batch_size=batch_size, pack=False)


def rows(*pairs: tuple[str, str]) -> list[dict]:
    return [{"instruction": question, "output": answer} for question, answer in pairs]


def test_loss_mask_is_the_assistant_mask_or_every_token():
    examples = encode_conversations([HI], TOKENIZER)
    assert examples.tokens.row(0).tolist() == HI_IDS
    assert examples.loss_mask.row(0).tolist() == HI_MASK
    assert (examples.total_tokens, examples.trained_tokens) == (26, 3)
    every = encode_conversations([HI], TOKENIZER, train_on="all")
    assert every.loss_mask.row(0).tolist() == [1] * 26
    assert every.trained_tokens == 25  # the first token is never a target
    with pytest.raises(ValueError, match="train_on must be one of"):
        encode_conversations([HI], TOKENIZER, train_on="user")


def test_long_conversations_are_cut_or_dropped_or_refused(caplog):
    long = [{"role": "user", "content": "Hi" * 20}, {"role": "assistant", "content": "Yo"}]
    with caplog.at_level(logging.WARNING, logger="zoo.data.chat.batches"):
        examples = encode_conversations([HI, HI, long], TOKENIZER, max_len=25)
    assert len(examples) == 2  # the long one lost its answer: dropped
    assert "1 of 3 train conversations are longer than 26 tokens" in caplog.text
    assert "1 of them lost every trained token" in caplog.text
    cut = encode_conversations([HI], TOKENIZER, max_len=22)  # 23 ids: the answer's first
    assert cut.tokens.row(0).tolist() == HI_IDS[:23]
    assert cut.loss_mask.row(0).tolist() == HI_MASK[:23]
    with pytest.raises(DataError, match="conversation 0 has 26 tokens; the model reads at most"):
        encode_conversations([HI], TOKENIZER, max_len=22, truncate=False)


def test_packing_places_whole_conversations_best_fit_with_their_own_segments():
    short = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Y"}]
    examples = encode_conversations([HI, short, HI], TOKENIZER)  # 26, 25 and 26 tokens
    packed = pack_conversations(examples, max_len=59, pad_id=0)  # rows of 60
    tokens, mask, segments = packed["tokens"], packed["loss_mask"], packed["segments"]
    assert tokens.shape == mask.shape == segments.shape == (2, 60)
    # longest first: the two 26s share row 0 (52 + 8 padding), the 25 goes to row 1
    assert tokens[0].tolist() == HI_IDS + HI_IDS + [0] * 8
    assert mask[0].tolist() == HI_MASK + HI_MASK + [0] * 8
    assert segments[0].tolist() == [1] * 26 + [2] * 26 + [0] * 8
    assert tokens[1, :25].tolist() == examples.tokens.row(1).tolist()
    assert segments[1].tolist() == [1] * 25 + [0] * 35
    with pytest.raises(DataError, match="more than a packed row of 20"):
        pack_conversations(examples, max_len=19, pad_id=0)


def test_unpacked_batches_pad_each_conversation_to_a_bucket():
    examples = encode_conversations([HI] * 4, TOKENIZER)
    source = chat_batches(examples, pad_id=0, config=unpacked(2))
    batch = source.batch(0)
    assert set(batch) == {"tokens", "loss_mask", "loss_positions"}
    assert batch["tokens"].shape == (2, 33)  # 26 tokens: the bucket of 32 (+1 target)
    assert batch["tokens"][0].tolist() == HI_IDS + [0] * 7
    assert batch["loss_mask"][0].tolist() == HI_MASK + [0] * 7
    # "Yo<eos>" are tokens 22-24: predicted at target positions 21-23; 3 rounds up to 8
    assert batch["loss_positions"].tolist() == [[21, 22, 23] + [-1] * 5] * 2
    with pytest.raises(DataError, match="4 conversations, fewer than batch_size=8"):
        chat_batches(examples, pad_id=0, config=unpacked(8))
    with pytest.raises(DataError, match="pack into 2 rows of 65 tokens, fewer than"):
        chat_batches(examples, pad_id=0, config=ChatDataConfig(max_len=64, batch_size=3))


@pytest.mark.parametrize(
    "columns, expected",
    [
        ({"messages": [HI]}, "messages"),
        ({"conversations": [[{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]]},
         "messages"),
        ({"instruction": ["Hi"], "input": [""], "output": ["Yo"]}, "instruction"),
        ({"prompt": ["Hi"], "completion": ["Yo"]}, "prompt_completion"),
    ],
)  # fmt: skip
def test_the_format_is_read_from_the_columns_and_every_format_gives_the_same_ids(columns, expected):
    dataset = datasets.Dataset.from_dict({name: values * 4 for name, values in columns.items()})
    assert chat_format_of(dataset) == expected and is_chat_data({"train": dataset})
    data = chat_data(dataset, tokenizer=TOKENIZER, config=unpacked(1))
    assert data.format == expected
    assert data.train.batch(0)["tokens"][0, :26].tolist() == HI_IDS
    assert data.counts["train holdout"] == {"conversations": 1, "tokens": 26, "trained_tokens": 3}


def test_columns_that_fit_no_format_and_bad_rows_are_named():
    reviews = datasets.Dataset.from_dict({"text": ["a"], "label": [1]})
    assert not is_chat_data({"train": reviews})
    with pytest.raises(DataError, match=r"the columns \['text', 'label'\] fit no conversation"):
        chat_data(reviews, tokenizer=TOKENIZER)
    broken = datasets.Dataset.from_dict({"instruction": ["Hi", "Hi"], "output": ["Yo", None]})
    with pytest.raises(DataError, match=r"row 1 has no value in 'output' \(null\), which the"):
        chat_data(broken, tokenizer=TOKENIZER)
    with pytest.raises(DataError, match="row 0 lacks the column 'prompt'"):
        chat_data(broken, tokenizer=TOKENIZER, config=ChatDataConfig(format="prompt_completion"))
    with pytest.raises(ValueError, match="unknown chat format 'alpaca'"):
        chat_data(broken, tokenizer=TOKENIZER, config=ChatDataConfig(format="alpaca"))
    no_answer = datasets.Dataset.from_dict({"messages": [[HI[0]]]})
    with pytest.raises(DataError, match="row 0 has no assistant turn"):
        chat_data(no_answer, tokenizer=TOKENIZER)
    stream = datasets.Dataset.from_dict({"messages": [HI] * 4}).to_iterable_dataset()
    with pytest.raises(DataError, match="load it without streaming"):
        chat_data({"train": stream}, tokenizer=TOKENIZER)


def test_numbers_in_alpaca_columns_are_read_as_their_text():
    # a column of ints (Arrow int64), and one of floats with an empty cell (a CSV's NaN)
    columns = {"instruction": ["Yo"] * 4, "input": [3, 7, 3, 7], "output": [1.5, float("nan")] * 2}
    with pytest.raises(DataError, match=r"row 1 has no value in 'output' \(null\)"):
        chat_data(datasets.Dataset.from_dict(columns), tokenizer=TOKENIZER)
    dataset = datasets.Dataset.from_dict({**columns, "output": [1.5] * 4})
    data = chat_data(dataset, tokenizer="char", config=unpacked(1))
    tokens = data.train.batch(0)["tokens"][0].tolist()
    text = data.tokenizer.decode(tokens, skip_special=False)
    assert text.startswith("<bos>user:\nYo\n\n") and "<eos>\nassistant:\n1.5<eos>\n" in text
    assert data.counts["train"]["trained_tokens"] == 3 * 4  # "1.5" and <eos> in each of 3


def test_validation_comes_from_its_split_or_a_seeded_holdout():
    train = rows(*[(f"q{i}", "a") for i in range(20)])
    config = ChatDataConfig(max_len=32, batch_size=2, seed=3)
    held = chat_data(datasets.Dataset.from_list(train), config=config)
    again = chat_data(datasets.Dataset.from_list(train), config=config)
    assert held.counts == again.counts
    assert held.counts["train"]["conversations"] == 18
    assert held.counts["train holdout"]["conversations"] == 2
    dataset = datasets.DatasetDict(
        train=datasets.Dataset.from_list(train),
        validation=datasets.Dataset.from_list(rows(("q1", "a"), ("q2", "a"), ("q3", "a"))),
    )
    split = chat_data(dataset, config=ChatDataConfig(max_len=32, batch_size=2))
    assert split.counts["validation"]["conversations"] == 3
    assert split.counts["train"]["conversations"] == 20
    batches = [split.validation.batch(step) for step in range(len(split.validation))]
    assert sum(int((batch["segments"] > 0).any(axis=1).sum()) for batch in batches) >= 1
    # the vocabulary is learnt from the train conversations: roles and contents
    assert {"user", "assistant", "q19"} <= set(split.tokenizer.words)


def test_a_template_given_as_text_is_used():
    plain = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    dataset = datasets.Dataset.from_list(rows(("Hi", "Yo")) * 4)
    config = ChatDataConfig(template=plain, max_len=16, batch_size=1, pack=False)
    data = chat_data(dataset, tokenizer=TOKENIZER, config=config)
    assert isinstance(data.template, ChatTemplate) and data.template.source == plain
    batch = data.train.batch(0)
    assert batch["tokens"][0, :6].tolist() == [H, I_, EOS, Y, O_, EOS]
    assert batch["loss_mask"][0, :6].tolist() == [0, 0, 0, 1, 1, 1]
    np.testing.assert_array_equal(batch["loss_mask"][0, 6:], 0)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"format": "alpaca"}, "unknown chat format 'alpaca'; choose one of"),
        ({"train_on": "user"}, "train_on must be one of"),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0; pass >= 1"),
        ({"max_len": 1}, "max_len=1 leaves no room for text; use >= 2"),
        ({"validation_split": "train"}, "validation_split and train_split are both 'train'"),
        ({"holdout": 1.0}, r"holdout must be a fraction in \(0, 1\), got 1.0"),
        ({"buckets": [16, 256]}, "bucket length 256 exceeds max_len=128"),
        ({"template": " "}, "template is empty"),
    ],
)
def test_chat_data_config_refuses_a_bad_option_before_reading_data(options, message):
    with pytest.raises(ValueError, match=message):
        ChatDataConfig(**options)


def test_chat_data_config_defaults_and_normalises():
    config = ChatDataConfig(format=None, buckets=[32, 16])
    assert (config.format, config.buckets, config.max_len, config.batch_size) == (
        "auto", (32, 16), 128, 32
    )  # fmt: skip
    with pytest.raises(TypeError):
        ChatDataConfig("auto")  # keyword-only


def every_batch(source) -> list[dict]:
    return [source.batch(step) for step in range(len(source))]


@pytest.mark.parametrize("loose", [dict(max_len=32), dict(batch_size=2), dict(pack=False),
                                   dict(train_on="all"), dict(max_length=32)])  # fmt: skip
def test_chat_data_takes_its_options_in_the_config_alone(loose):
    dataset = datasets.Dataset.from_list(rows(*[(f"q{i}", "a") for i in range(20)]))
    [name] = loose
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        chat_data(dataset, tokenizer="word", **loose)


def test_chat_batches_and_chat_evaluation_take_their_options_in_the_config():
    examples = encode_conversations([HI] * 4, TOKENIZER)
    for name in ("batch_size", "max_len", "train_split"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            chat_batches(examples, pad_id=0, **{name: 2})

    train = datasets.Dataset.from_list(rows(*[(f"q{i}", "a") for i in range(20)]))
    options = dict(max_len=32, batch_size=3, seed=2, holdout=0.25, train_on="all")
    recorded = chat_evaluation({"train": train}, TOKENIZER, config=ChatDataConfig(**options))
    assert recorded.name == "validation (held out of train)"
    assert recorded.conversations == 5  # a quarter of 20, as chat_data holds out with seed 2
    # one conversation per row, whatever the record says about packing
    packed = chat_evaluation({"train": train}, TOKENIZER,
                             config=ChatDataConfig(**options, pack=True))  # fmt: skip
    assert "segments" not in packed.batches.batch(0)
    assert sum(len(batch["tokens"]) for batch in every_batch(packed.batches)) == 5
    for name in ("max_len", "pack"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            chat_evaluation({"train": train}, TOKENIZER, **{name: 32})


def test_unpacked_conversations_pad_to_lengths_fitted_to_them():
    # HI is 26 tokens (25 read by the model, a bucket of 32), one with a longer question 32
    # tokens (31 read: also 32); so one fitted length, then max_len, rows one token wider
    longer = [{"role": "user", "content": "Hi" * 4}, {"role": "assistant", "content": "Yo"}]
    examples = encode_conversations([HI, longer] * 4, TOKENIZER)
    source = chat_batches(examples, pad_id=0, config=unpacked(2))
    assert source.lengths == (33, 65)
    assert {source.batch(step)["tokens"].shape for step in range(len(source))} == {(2, 33)}
    powers = chat_batches(examples, pad_id=0, config=replace(unpacked(2), buckets=None))
    assert powers.lengths == (17, 33, 65)


def test_packed_rows_list_the_positions_they_score_where_few():
    examples = encode_conversations([HI] * 4, TOKENIZER)
    packed = chat_batches(examples, pad_id=0, config=ChatDataConfig(max_len=63, batch_size=2))
    batch = packed.batch(0)  # two conversations a row of 64: targets 21-23 and 47-49
    assert batch["loss_positions"].tolist() == [[21, 22, 23, 47, 48, 49, -1, -1]] * 2
    # every token trained: the head runs on every position, no list
    every = encode_conversations([HI] * 4, TOKENIZER, train_on="all")
    assert "loss_positions" not in chat_batches(every, pad_id=0, config=unpacked(2)).batch(0)
