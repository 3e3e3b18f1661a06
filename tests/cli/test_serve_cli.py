"""`zoo serve`: the real `openai` client against a server on a free port with a tiny model.

Chat and completions, streamed and whole, `n` choices, stop strings, usage counts and
log-probabilities; greedy replies equal `zoo chat`'s; errors in OpenAI's shape (unknown model,
bad JSON, a wrong field type, too long, no API key, a full queue); concurrent streaming clients
each get their own reply, and clients that go away free their slots.
"""

from __future__ import annotations

import importlib.util
import re
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import pytest

import zoo
from zoo.data import CharTokenizer
from zoo.data.chat.files import chat_template_for
from zoo.data.chat.tokens import encode_prompt
from zoo.decoding.chat import reply

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None for name in ("fastapi", "uvicorn", "openai")),
        reason="zoo serve needs the serve extra (fastapi, uvicorn) and its tests openai",
    ),
]
TOKENIZER = CharTokenizer(string.ascii_lowercase + " :\n")
MODEL_ID = "tiny"
KEY = "secret"
MESSAGES = ["hello", "abc", "what is up with you today", "zz", "a much longer message", "q"]


def chat_of(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def model():
    """A tiny GPT whose matrices are scaled up, so its greedy replies differ by prompt."""
    gpt = zoo.create("gpt-tiny", key=jax.random.key(3), vocab_size=TOKENIZER.vocab_size)
    return jax.tree.map(lambda leaf: leaf * 3 if getattr(leaf, "ndim", 0) == 2 else leaf, gpt)


def start(app):
    import uvicorn

    from zoo.cli.serve import _listen

    listener = _listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


@pytest.fixture(scope="module")
def servers(model):
    """One engine behind two servers: an open one and one that asks for an API key."""
    from zoo.cli._serve_app import Served, build_app
    from zoo.cli._serve_prompts import Prompts
    from zoo.serving import Engine

    engine = Engine(model, TOKENIZER, slots=4, max_len=96, max_waiting=6)
    prompts = Prompts(TOKENIZER, chat_template_for(TOKENIZER), None, TOKENIZER.vocab_size)
    running = [start(build_app(Served(engine, prompts, MODEL_ID, key, 0))) for key in (None, KEY)]
    yield engine, running[0][2], running[1][2]
    for server, thread, _ in running:
        server.should_exit = True
        thread.join()
    engine.close()


@pytest.fixture(scope="module")
def client(servers):
    from openai import OpenAI

    return OpenAI(base_url=servers[1], api_key="unused", max_retries=0, timeout=120)


def slow_down(monkeypatch, engine) -> None:
    """Make each decode step take 20 ms more, so a client leaves while its request runs."""
    decode = engine.programs.decode

    def slow_decode(*args, **named):
        time.sleep(0.02)
        return decode(*args, **named)

    monkeypatch.setattr(engine.programs, "decode", slow_decode)


def ask(client, text: str, **options):
    return client.chat.completions.create(
        model=MODEL_ID, messages=chat_of(text), temperature=0, **options
    )


def test_a_greedy_chat_reply_is_zoo_chats_with_its_usage(client, model):
    answer = ask(client, "hello", max_tokens=12)
    expected = reply(model, TOKENIZER, "hello", max_new_tokens=12)
    (choice,) = answer.choices
    assert choice.message.content == expected.text and choice.message.role == "assistant"
    assert choice.finish_reason == expected.finish_reason
    assert answer.usage.prompt_tokens == len(encode_prompt(chat_of("hello"), TOKENIZER))
    assert answer.usage.completion_tokens == len(expected.tokens)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + len(expected.tokens)
    assert answer.model == MODEL_ID and answer.object == "chat.completion"
    assert [card.id for card in client.models.list().data] == [MODEL_ID]


def test_a_streamed_chat_joins_to_the_whole_reply(client):
    whole = ask(client, "abc", max_completion_tokens=10)
    stream = ask(client, "abc", max_completion_tokens=10, stream=True,
                 stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10


def test_completions_with_n_choices_and_a_seed(client, model):
    prompt = "hello wor"
    greedy = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0)
    expected = zoo.generate(model, [TOKENIZER.encode(prompt)], max_new_tokens=8)[0]
    assert greedy.choices[0].text == TOKENIZER.decode(expected)
    options = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 8, "n": 3, "seed": 11}
    first = client.completions.create(temperature=1.5, **options)
    again = client.completions.create(temperature=1.5, stream=True, **options)
    texts = ["", "", ""]
    for chunk in again:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [choice.index for choice in first.choices] == [0, 1, 2]
    assert [choice.text for choice in first.choices] == texts  # the seed fixes every draw
    assert len(set(texts)) > 1  # each choice draws on its own
    assert first.usage.completion_tokens <= 24


def test_a_stop_string_ends_the_reply_before_it(client):
    full = ask(client, "what is up with you today", max_tokens=16).choices[0].message.content
    stop = full[5:7]
    cut = ask(client, "what is up with you today", max_tokens=16, stop=[stop, "never"])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = ask(client, "what is up with you today", max_tokens=16, stop=stop, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == full[: full.index(stop)]


def test_logprobs_name_the_tokens_and_the_most_likely_is_chosen(client):
    answer = ask(client, "zz", max_tokens=4, logprobs=True, top_logprobs=3)
    entries = answer.choices[0].logprobs.content
    assert "".join(entry.token for entry in entries) == answer.choices[0].message.content
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.logprob <= 0


def test_errors_have_openais_shape(client, servers):
    import httpx
    import openai

    with pytest.raises(openai.NotFoundError, match="'gpt-4' is not served here"):
        client.chat.completions.create(model="gpt-4", messages=chat_of("hi"))
    with pytest.raises(openai.BadRequestError, match="max_tokens: Input should be a valid int"):
        client.completions.create(model=MODEL_ID, prompt="a", extra_body={"max_tokens": "3"})
    with pytest.raises(openai.BadRequestError, match=r"prompt has \d+ tokens and 500 more"):
        ask(client, "hello", max_tokens=500)
    with pytest.raises(openai.BadRequestError, match="echo is not supported"):
        client.completions.create(model=MODEL_ID, prompt="a", echo=True)
    with pytest.raises(openai.BadRequestError, match="'image_url' part"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}])  # fmt: skip
    response = httpx.post(f"{servers[1]}/chat/completions", content=b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("the body is not valid JSON")
    locked = openai.OpenAI(base_url=servers[2], api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="--api-key"):
        locked.models.list()
    allowed = openai.OpenAI(base_url=servers[2], api_key=KEY, max_retries=0)
    assert allowed.models.list().data[0].id == MODEL_ID
    assert httpx.get(servers[2].removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_a_full_queue_is_answered_429(client, servers):
    import openai

    engine = servers[0]
    running = [engine.submit([1, 2, 3], max_tokens=90) for _ in range(engine.slots)]
    for generation in running:
        next(iter(generation))
    waiting = [engine.submit([1, 2], max_tokens=1) for _ in range(engine.max_waiting)]
    try:
        with pytest.raises(openai.RateLimitError, match="slots are busy"):
            ask(client, "hello", max_tokens=2)
    finally:
        for generation in running + waiting:
            generation.cancel()


def test_concurrent_streams_each_get_their_own_reply_and_leavers_free_their_slots(
    client, servers, monkeypatch
):
    lengths = [12, 3, 9, 12, 5, 12, 7, 10]
    texts = [MESSAGES[i % len(MESSAGES)] for i in range(len(lengths))]
    alone = [ask(client, t, max_tokens=n).choices[0].message.content
             for t, n in zip(texts, lengths, strict=True)]  # fmt: skip

    def streamed(index: int) -> str:
        stream = ask(client, texts[index], max_tokens=lengths[index], stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(len(lengths)) as pool:
        assert list(pool.map(streamed, range(len(lengths)))) == alone

    def leave_early(index: int) -> None:
        stream = ask(client, "hello", max_tokens=60, stream=True)
        for _ in zip(range(3), stream, strict=False):
            pass
        stream.close()

    engine = servers[0]
    slow_down(monkeypatch, engine)  # the leavers leave long before their 60 tokens
    cancelled = engine.finished["cancelled"]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(leave_early, range(4)))
    deadline = time.monotonic() + 60
    while engine.busy_slots() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine.busy_slots() == 0
    assert engine.finished["cancelled"] == cancelled + 4, dict(
        engine.finished
    )  # each stopped when its client left
    assert ask(client, texts[0], max_tokens=lengths[0]).choices[0].message.content == alone[0]


def test_bad_options_are_refused_before_loading(capsys):
    from zoo.cli import main

    assert main(["serve", "no-such-model", "--port", "70000"]) == 2
    assert "--port 70000 is not a port" in capsys.readouterr().err
    assert main(["serve", "no-such-model", "--max-batch", "0"]) == 2
    assert "--max-batch must be a positive integer" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        assert main(["serve", "no-such-model", "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_the_command_serves_a_saved_model_logs_each_request_and_stops_on_sigterm(model, tmp_path):
    import httpx

    zoo.save(model, tmp_path / "tiny", tokenizer=TOKENIZER)
    command = [sys.executable, "-m", "zoo", "serve", str(tmp_path / "tiny"), "--port", "0",
               "--max-batch", "2", "--max-len", "64"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in process.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if " serving tiny at " in line:
                break
        url = re.search(r"at (http://\S+/v1):", lines[-1]).group(1)  # type: ignore[union-attr]
        body = {"model": "tiny", "messages": chat_of("hello"), "max_tokens": 6, "temperature": 0}
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=120).json()
        expected = reply(model, TOKENIZER, "hello", max_new_tokens=6).text
        assert answer["choices"][0]["message"]["content"] == expected
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        rest = process.stderr.read()  # type: ignore[union-attr]
    finally:
        process.kill()
    logged = [line for line in rest.splitlines() if "POST /v1/chat/completions 200" in line]
    assert len(logged) == 1 and "prompt 25, completion 6" in logged[0]
    assert rest.rstrip().endswith("zoo serve: stopped")


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_tools_reach_a_template_that_writes_them_and_are_refused_by_one_that_does_not(client):
    import openai

    from zoo.cli._serve_prompts import Prompts
    from zoo.cli._serve_schema import ChatRequest
    from zoo.data.chat.template import ChatTemplate

    source = (
        "{% if tools %}tools: {% for t in tools %}{{ t.function.name }}{% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    template = ChatTemplate(
        source, {"eos_token": TOKENIZER.decode([TOKENIZER.eos_id], skip_special=False)}
    )
    prompts = Prompts(TOKENIZER, template, None, TOKENIZER.vocab_size)
    body = ChatRequest(messages=chat_of("hi"), tools=TOOLS)
    text = TOKENIZER.decode(prompts.chat(body).prompt)
    assert text.startswith("tools: weather") and "user: hi" in text
    unused = ChatRequest(messages=chat_of("hi"), tools=TOOLS, tool_choice="none")
    assert "weather" not in TOKENIZER.decode(prompts.chat(unused).prompt)
    with pytest.raises(openai.BadRequestError, match="cannot be rendered"):
        ask(client, "hi", max_tokens=2, tools=TOOLS)  # zoo's default template has no tools


def test_a_client_that_leaves_before_a_whole_answer_frees_its_slot(client, servers, monkeypatch):
    import httpx

    engine, url = servers[0], servers[1]
    slow_down(monkeypatch, engine)  # 70 steps take over a second, whatever the machine
    cancelled = engine.finished["cancelled"]
    body = {"model": MODEL_ID, "messages": chat_of("hello"), "max_tokens": 70, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    deadline = time.monotonic() + 60
    while engine.finished["cancelled"] == cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert engine.finished["cancelled"] == cancelled + 1, dict(engine.finished)
