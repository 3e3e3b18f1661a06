"""`zoo.chat` and the step-wise decoder under it: the tokens `zoo.generate` gives (greedy and
sampled, ragged prompts), the prompt the chat template writes, the stop at the end of the turn,
text streamed piece by piece, and a mesh."""

from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest

import zoo
from zoo.data import CharTokenizer
from zoo.data.chat.tokens import encode_prompt
from zoo.decoding import SamplingSettings
from zoo.decoding.chat import ChatFormat, TextStream, as_messages, replies, reply
from zoo.decoding.stream import stream_tokens
from zoo.distributed import Layout, make_mesh

needs_jinja = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None, reason="chat templates need jinja2 (zoo[chat])"
)
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
TOKENIZER = CharTokenizer("abcdefghijklmnopqrstuvwxyz :\n")
EOS = TOKENIZER.eos_id


@pytest.fixture(scope="module")
def chat_gpt():
    return zoo.create("gpt-tiny", key=jax.random.key(5), vocab_size=TOKENIZER.vocab_size)


def streamed(model, prompts, **options) -> np.ndarray:
    return np.stack(list(stream_tokens(model, prompts, **options)), axis=1)


@pytest.mark.parametrize("sampling", [None, SamplingSettings(1.3, top_k=20, top_p=0.9)])
def test_streamed_tokens_are_those_of_generate(gpt, sampling):
    key = jax.random.key(7) if sampling else None
    tokens = streamed(gpt, PROMPTS, max_new_tokens=9, sampling=sampling, key=key)
    expected = np.asarray(zoo.generate(gpt, PROMPTS, max_new_tokens=9, sampling=sampling, key=key))
    assert tokens.shape[0] == 3 and 1 <= tokens.shape[1] <= 9
    for row, generated in zip(tokens, expected):
        ends = np.flatnonzero(np.isin(generated, gpt.config.end_ids))
        length = ends[0] + 1 if len(ends) else len(generated)  # generate fills after the end
        np.testing.assert_array_equal(row[:length], generated[:length])


def test_stream_stops_when_every_row_has_ended_and_at_the_models_positions(gpt):
    first = streamed(gpt, [[5, 6, 7]], max_new_tokens=20)
    stop = int(first[0, 2])  # pretend the third token ends the turn
    tokens = streamed(gpt, [[5, 6, 7]], max_new_tokens=20, stop_ids=[stop])
    assert tokens.shape[1] == int(np.flatnonzero(first[0] == stop)[0]) + 1
    long = [[5] * (gpt.config.max_positions - 2)]
    assert streamed(gpt, long, max_new_tokens=20).shape[1] <= 2  # prompt and reply fit
    with pytest.raises(ValueError, match="no room to answer; shorten the conversation"):
        streamed(gpt, [[5] * gpt.config.max_positions], max_new_tokens=2)
    with pytest.raises(ValueError, match="needs a random key"):
        streamed(gpt, PROMPTS, max_new_tokens=2, sampling=SamplingSettings(0.5))


@needs_jinja
def test_a_reply_continues_the_templates_generation_prompt_and_ends_at_its_turn(chat_gpt):
    messages = [{"role": "user", "content": "hi there"}]
    prompt = encode_prompt(messages, TOKENIZER)
    answer = reply(chat_gpt, TOKENIZER, messages, max_new_tokens=12)
    expected = np.asarray(zoo.generate(chat_gpt, [prompt.tolist()], max_new_tokens=12))[0]
    ends = np.flatnonzero(expected == EOS)
    length = ends[0] if len(ends) else len(expected)
    assert answer.tokens == tuple(expected[:length].tolist())
    assert answer.finish_reason == ("stop" if len(ends) else "length")
    assert answer.prompt_tokens == len(prompt)
    assert answer.text == TOKENIZER.decode(expected[:length])
    assert zoo.chat(chat_gpt, TOKENIZER, "hi there", max_new_tokens=12) == answer.text


@needs_jinja
def test_text_streams_piece_by_piece_and_joins_to_the_reply(chat_gpt):
    pieces: list[str] = []
    answer = reply(chat_gpt, TOKENIZER, "hello", max_new_tokens=10, on_text=pieces.append)
    assert "".join(pieces) == answer.text and len(pieces) == len(answer.tokens)
    with pytest.raises(ValueError, match="on_text streams one conversation"):
        replies(chat_gpt, TOKENIZER, ["a", "b"], max_new_tokens=2, on_text=print)


@needs_jinja
def test_a_batch_of_conversations_gives_each_its_own_reply(chat_gpt):
    conversations = ["hello", [{"role": "user", "content": "why"}], "a"]
    brief = ChatFormat(TOKENIZER, system="be brief")
    together = replies(chat_gpt, brief, conversations, max_new_tokens=6)
    alone = [reply(chat_gpt, brief, c, max_new_tokens=6) for c in conversations]
    assert together == alone


def test_text_waits_for_a_whole_character():
    gpt2 = pytest.importorskip("tiktoken") and zoo.data.build_tokenizer("tiktoken:gpt2")
    ids = gpt2.encode("café ☕")
    stream = TextStream(gpt2)
    shown = [stream.add(token) for token in ids]
    assert "".join(shown) + stream.finish() == "café ☕"
    assert all("\ufffd" not in piece for piece in shown)


def test_conversations_are_checked():
    assert as_messages("hi", system="s") == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
    ]
    own_system = [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]
    assert as_messages(own_system, system="s") == own_system
    with pytest.raises(ValueError, match="ends with an assistant turn"):
        as_messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    with pytest.raises(ValueError, match="has the role 'bot'"):
        as_messages([{"role": "bot", "content": "a"}])
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]
    assert as_messages([*history, {"role": "user", "content": "b"}])[1]["content"] == ""


@needs_jinja
def test_chat_on_a_one_device_mesh_answers_as_without(chat_gpt):
    mesh = make_mesh("data=1", jax.devices()[:1])
    options = {"max_new_tokens": 8, "sampling": SamplingSettings(0.9), "key": jax.random.key(2)}
    assert reply(chat_gpt, TOKENIZER, "hello", mesh=mesh, **options) == reply(
        chat_gpt, TOKENIZER, "hello", **options
    )
    assert reply(chat_gpt, TOKENIZER, "hello", mesh=Layout.of(mesh), **options) == reply(
        chat_gpt, TOKENIZER, "hello", **options
    )


def test_stream_tokens_takes_sampling_as_one_record(gpt):
    for loose in (dict(temperature=0.9), dict(top_k=5), dict(top_p=0.5), dict(rules=())):
        [name] = loose
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            streamed(gpt, PROMPTS, max_new_tokens=5, key=jax.random.key(3), **loose)


# the variables `system` and `template`, each on a line: the chat calls' own keywords once had
# these names (now `ChatFormat`'s fields)
WITH_VARIABLES = (
    "{{ system }}\n{{ template }}\n{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
)


@needs_jinja
def test_template_variables_named_system_and_template_reach_the_template(chat_gpt):
    by_variables = ChatFormat(TOKENIZER, template=WITH_VARIABLES)
    written = ChatFormat(TOKENIZER, template=WITH_VARIABLES.replace(
        "{{ system }}", "be brief").replace("{{ template }}", "plain"))  # fmt: skip
    variables = {"system": "be brief", "template": "plain"}
    expected = reply(chat_gpt, written, "hello", max_new_tokens=6)
    # "be brief\nplain\nuser hello\nassistant ": the variables' text is in the prompt
    assert expected.prompt_tokens == len("be brief\nplain\nuser hello\nassistant ")
    assert reply(chat_gpt, by_variables, "hello", max_new_tokens=6, **variables) == expected
    assert replies(chat_gpt, by_variables, ["hello"], max_new_tokens=6, **variables) == [expected]
    assert zoo.chat(chat_gpt, by_variables, "hello", max_new_tokens=6, **variables) == (
        expected.text
    )
    without = reply(chat_gpt, by_variables, "hello", max_new_tokens=6)
    assert without.prompt_tokens == len("\n\nuser hello\nassistant ")


@needs_jinja
@pytest.mark.parametrize("loose", [dict(temperature=0.8), dict(top_k=9), dict(rules=()),
                                   dict(system="be brief"), dict(template="{{ messages }}")])  # fmt: skip
def test_a_keyword_the_template_does_not_read_is_refused(chat_gpt, loose):
    """The chat calls' older keywords (now `sampling`, a `Layout` and `ChatFormat`), or any
    misspelled option, would be a template variable that nothing reads: refused."""
    [name] = loose
    for call in (reply, replies, zoo.chat):
        conversation = ["hello"] if call is replies else "hello"
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            call(chat_gpt, TOKENIZER, conversation, max_new_tokens=2, **loose)


@needs_jinja
def test_a_prompt_the_tokenizer_cannot_spell_is_warned_about(chat_gpt, recwarn):
    from zoo.decoding.chat import UnknownTokensWarning

    reply(chat_gpt, TOKENIZER, "hello", max_new_tokens=1)
    assert not [w for w in recwarn if w.category is UnknownTokensWarning]
    # before: silent; "user:\n" and "assistant:\n" are spelt, the 5 capitals are <unk>
    with pytest.warns(UnknownTokensWarning) as caught:
        reply(chat_gpt, TOKENIZER, "HELLO", max_new_tokens=1)
    assert [str(w.message) for w in caught] == [
        "5 of 25 prompt tokens are unknown to this model's char tokenizer (<unk>): it was "
        "trained on other text, so the reply means little"
    ]
