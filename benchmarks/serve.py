"""Serving throughput: `zoo serve` against a plain transformers `generate` server, both behind
the same OpenAI chat endpoint, at 1, 4, 16 and 32 concurrent streaming clients.

    python benchmarks/serve.py                                  # SmolLM2-135M-Instruct
    python benchmarks/serve.py --model path/to/hf-folder --clients 1 4 --max-tokens 32

Each server runs in its own process on a free port. `zoo serve` batches the clients' requests
into one compiled decode step (`--max-batch` = the most clients); the peer, the simplest
honest server around transformers, answers one request at a time with `model.generate` and a
`TextIteratorStreamer` (a naive server: what one writes without a batching engine). Every
client streams a greedy chat reply of at most `--max-tokens` tokens to its own prompt and
reads the usage counts from the last chunk.

Per level: total completion tokens per second (all clients' tokens over the wall time of the
level), and the time to first token (median and 90th percentile over the clients). Each level
runs once untimed first (compiles, caches). Writes `benchmarks/results/serve-<platform>-<date>.json`
with the device, versions, command line and machine load. The peer needs the `hf` extra.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_MODEL = "hf:HuggingFaceTB/SmolLM2-135M-Instruct"
TOPICS = ["the sea", "a cat", "mountains", "rain", "a city at night", "bread", "a clock", "snow"]
READY = re.compile(r"(?:serving .* at|peer ready at) (http://\S+/v1)")


def prompt(index: int) -> str:
    return f"Write a short story about {TOPICS[index % len(TOPICS)]} (number {index})."


def stream_one(url: str, model: str, index: int, max_tokens: int) -> tuple[float, int]:
    """One streaming chat request: (seconds to the first text, completion tokens)."""
    body = {
        "model": model,
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt(index)}],
        "stream_options": {"include_usage": True},
    }
    start, first, tokens = time.perf_counter(), None, 0
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            texts = [c.get("delta", {}).get("content") for c in chunk.get("choices", [])]
            if first is None and any(texts):
                first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start), tokens


def level(url: str, model: str, clients: int, max_tokens: int) -> dict[str, float]:
    """`clients` streams at once: tokens/s over the wall time, and time-to-first-token."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda i: stream_one(url, model, i, max_tokens), range(clients)))
    wall = time.perf_counter() - start
    firsts = sorted(first for first, _ in results)
    tokens = sum(count for _, count in results)
    return {
        "clients": clients,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_median_s": statistics.median(firsts),
        "ttft_p90_s": firsts[min(len(firsts) - 1, int(0.9 * len(firsts)))],
    }


def start_server(command: list[str]) -> tuple[subprocess.Popen, str]:
    """Start a server process; return it and its base URL once it says it is ready."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        sys.stderr.write(f"  | {line}")
        found = READY.search(line)
        if found:
            threading.Thread(target=_drain, args=(process.stderr,), daemon=True).start()
            return process, found.group(1)
    raise RuntimeError(f"the server exited ({process.wait()}) before it was ready: {command}")


def _drain(stream) -> None:
    for _ in stream:
        pass


def measure(name: str, command: list[str], model_id: str, args) -> list[dict[str, float]]:
    process, url = start_server(command)
    try:
        rows = []
        for clients in args.clients:
            level(url, model_id, clients, args.max_tokens)  # untimed: compiles and warms
            row = level(url, model_id, clients, args.max_tokens)
            print(
                f"{name:>4} {clients:>3} clients: {row['tokens_per_s']:8.1f} tokens/s, "
                f"first token {row['ttft_median_s']:.3f} s median",
                flush=True,
            )
            rows.append(row)
        return rows
    finally:
        process.terminate()
        process.wait(timeout=60)


def peer_server(model_spec: str, port: int) -> None:
    """The peer: transformers `generate`, one request at a time, OpenAI's streaming shape."""
    import torch
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route
    from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

    name = model_spec.removeprefix("hf:")
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()
    one_at_a_time = threading.Lock()

    async def chat(request) -> StreamingResponse:
        body = await request.json()
        encoded = tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        counted: list[int] = []

        def run() -> None:
            try:
                with one_at_a_time, torch.inference_mode():
                    out = model.generate(
                        **encoded, max_new_tokens=body["max_tokens"], do_sample=False,
                        streamer=streamer,
                    )  # fmt: skip
                counted.append(out.shape[1] - encoded["input_ids"].shape[1])
            except Exception:
                streamer.end()  # the client's stream ends instead of waiting forever
                raise

        worker = threading.Thread(target=run, daemon=True)
        worker.start()

        def events():
            for text in streamer:
                yield f"data: {json.dumps({'choices': [{'delta': {'content': text}}]})}\n\n"
            worker.join()  # the streamer ends inside generate: wait for its count
            usage = {"completion_tokens": counted[0] if counted else 0}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    print(f"peer ready at http://127.0.0.1:{port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="what zoo serve takes (hf:NAME, a folder)"
    )
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512, help="zoo serve --max-len")
    parser.add_argument("--no-peer", action="store_true", help="measure zoo serve alone")
    parser.add_argument("--peer-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.peer_server is not None:
        peer_server(args.model, args.peer_server)
        return {}
    load_before = os.getloadavg()
    zoo_command = [
        sys.executable,
        "-m",
        "zoo",
        "serve",
        args.model,
        "--port",
        "0",
        "--model-name",
        "bench",
        "--max-batch",
        str(max(args.clients)),
        "--max-len",
        str(args.max_len),
        "--max-waiting",
        str(4 * max(args.clients)),
    ]
    runs = {"zoo": measure("zoo", zoo_command, "bench", args)}
    if not args.no_peer:
        port = free_port()
        peer_command = [sys.executable, __file__, "--model", args.model, "--peer-server", str(port)]
        runs["transformers"] = measure("hf", peer_command, "bench", args)
        for ours, theirs in zip(runs["zoo"], runs["transformers"], strict=True):
            ours["speedup_vs_transformers"] = ours["tokens_per_s"] / theirs["tokens_per_s"]
    import jax

    device = jax.devices()[0]
    today = dt.date.today().isoformat()
    result = {
        "benchmark": "serve",
        "date": today,
        "command": " ".join(
            [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
        ),
        "device": {
            "platform": device.platform,
            "device_kind": device.device_kind,
            "cpu_count": os.cpu_count(),
        },
        "versions": {
            name: _version(name)
            for name in ("jax", "jaxlib", "equinox", "fastapi", "uvicorn", "torch", "transformers")
        }
        | {
            "python": platform.python_version(),
            "zoo": _version("jax-transformer-zoo"),
        },
        "setup": {
            "model": args.model,
            "max_tokens": args.max_tokens,
            "decoding": "greedy",
            "peer": "transformers generate + TextIteratorStreamer, one request at a time",
            "zoo_max_batch": max(args.clients),
        },
        "machine_load": {"before": load_before, "after": os.getloadavg()},
        "runs": runs,
    }
    out = args.out or RESULTS / f"serve-{device.platform}-{today}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
