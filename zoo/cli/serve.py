"""`zoo serve MODEL`: a GPT behind an OpenAI-compatible HTTP API, many requests batched at once.

    zoo serve runs/chat --port 8000 --max-batch 8
    curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "chat", "messages": [{"role": "user", "content": "Hi"}]}'

MODEL is what `zoo chat` takes (a run folder, a HuggingFace folder, a `.gguf` file, `hf:NAME`),
with the same chat template options (`--template`, `--system`). Requests share one compiled
decode step of `--max-batch` slots (`zoo.serving.Engine`); more wait in a bounded queue
(`--max-waiting`), beyond which a request is answered 429. Ctrl-C or SIGTERM stop the server:
open requests end, the engine stops, the command exits 0.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from pathlib import Path

from zoo.cli import _inference as inference
from zoo.cli._chat_data import DEFAULT_TEMPLATE_ORIGIN, read_template, warn_default_template
from zoo.extras import pip_install

DEFAULT_MAX_LEN = 2048  # positions per slot when --max-len is not given (or the model's, if fewer)
SHUTDOWN_GRACE_S = 5  # how long open requests may run on after Ctrl-C / SIGTERM


def register(commands) -> None:
    parser = commands.add_parser(
        "serve", help="serve a GPT over an OpenAI-compatible HTTP API (continuous batching)"
    )
    inference.add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on")
    parser.add_argument(
        "--max-batch", type=int, default=8, help="requests decoded together (the engine's slots)"
    )
    parser.add_argument(
        "--max-len",
        type=int,
        default=None,
        help=f"positions per request, prompt and reply (default: {DEFAULT_MAX_LEN}, or the "
        "model's max_positions if fewer)",
    )
    parser.add_argument(
        "--max-waiting", type=int, default=64, help="requests that may wait for a slot; more: 429"
    )
    parser.add_argument("--api-key", help="the bearer token every /v1 request must carry")
    parser.add_argument("--model-name", help="the model's id in the API (default: MODEL's name)")
    parser.add_argument("--system", help="a system prompt for chats that bring none")
    parser.add_argument(
        "--template",
        metavar="FILE",
        help="a Jinja chat template file to use instead of the model's own",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise ImportError(f"zoo serve needs FastAPI and uvicorn: {pip_install('serve')}") from None
    template_text = read_template(args.template)  # a bad file: before loading
    listener = _listen(args.host, args.port)  # a taken port: before loading
    served = _served(args, template_text)
    config = uvicorn.Config(
        _app(served), log_level="warning", access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )  # fmt: skip
    server = _stopping_quietly(uvicorn.Server)(config)
    address = f"http://{args.host}:{listener.getsockname()[1]}/v1"
    engine = served.engine
    logging.getLogger("zoo.serve").info(
        "serving %s at %s: %d slots of %d positions; Ctrl-C stops",
        served.model_id, address, engine.slots, engine.max_len,
    )  # fmt: skip
    try:
        server.run(sockets=[listener])
    finally:
        engine.close()
        listener.close()
    logging.getLogger("zoo.serve").info("stopped")
    return 0


def _stopping_quietly(server_class):
    """uvicorn's server, but a Ctrl-C or SIGTERM it has shut down for is not raised again
    afterwards (uvicorn re-raises it, which kills the process before the engine stops)."""

    class Server(server_class):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return Server


def _check_options(args: argparse.Namespace) -> None:
    """Refuse bad numbers and empty texts before anything loads."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a port: give 0 to 65535 (0: any free one)")
    for flag, value in (("--max-batch", args.max_batch), ("--max-len", args.max_len),
                        ("--max-waiting", args.max_waiting)):  # fmt: skip
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    for flag, text in (("--system", args.system), ("--api-key", args.api_key),
                       ("--model-name", args.model_name)):  # fmt: skip
        if text is not None and not text.strip():
            raise ValueError(f"{flag} is empty: give a value, or leave {flag} out")


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port`; a taken port is an error that says so."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise OSError(f"cannot listen on {host}:{port} ({error.strerror}): pick another --port "
                      "or --host") from None  # fmt: skip
    return listener


def _served(args: argparse.Namespace, template_text: str | None):
    from zoo.cli._serve_app import Served
    from zoo.cli._serve_prompts import Prompts
    from zoo.decoding.chat import chat_template
    from zoo.models.gpt import GPT
    from zoo.serving import Engine

    _configure_logging()
    model, tokenizer, _ = inference.load_for(_without_mesh(args), GPT)
    folder = Path(args.model) if Path(args.model).is_dir() else None
    template = chat_template(tokenizer, template_text, folder=folder)
    if template.origin == DEFAULT_TEMPLATE_ORIGIN:
        warn_default_template("serve", tokenizer)
    limit = model.config.max_positions
    max_len = args.max_len if args.max_len is not None else min(DEFAULT_MAX_LEN, limit)
    if max_len > limit:
        raise ValueError(f"--max-len {max_len} exceeds the model's {limit} positions")
    engine = Engine(
        model, tokenizer, slots=args.max_batch, max_len=max_len, max_waiting=args.max_waiting
    )
    try:
        list(engine.submit([0], max_tokens=1))  # compile the step and a prefill before serving
    except BaseException:
        engine.close()
        raise
    prompts = Prompts(tokenizer, template, args.system, model.config.vocab_size)
    name = args.model_name or Path(args.model.rstrip("/")).name.removesuffix(".gguf")
    return Served(engine, prompts, name, args.api_key, int(time.time()))


def _without_mesh(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "mesh": None})


def _app(served):
    from zoo.cli._serve_app import build_app

    return build_app(served)


def _configure_logging() -> None:
    """The server's lines (one per request, each compile) on stderr, with the time."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s zoo serve: %(message)s", "%H:%M:%S"))
    for name in ("zoo.serve", "zoo.serving"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not logger.handlers:
            logger.addHandler(handler)
