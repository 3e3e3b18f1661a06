"""The HTTP face of `zoo serve`: OpenAI's endpoints over a `zoo.serving.Engine`.

`/health`, `/v1/models`, `/v1/chat/completions` and `/v1/completions`, streamed as server-sent
events or answered whole. Every error has OpenAI's shape (`{"error": {"message", "type",
"param", "code"}}`), and one line is logged per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zoo.cli._serve_choices import Choices, Piece, run_all
from zoo.cli._serve_prompts import PromptError, Prompts
from zoo.cli._serve_schema import ChatRequest, CompletionRequest, Sampling
from zoo.serving.engine import Engine, EngineFull, PromptTooLong

log = logging.getLogger("zoo.serve")
Body = TypeVar("Body", bound=BaseModel)
DISCONNECT_POLL_S = 0.5  # how often a whole answer's wait checks that its client is still there


class APIError(Exception):
    """An error answered with OpenAI's shape."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status, message, kind, param, code,
        )  # fmt: skip

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param,
                 "code": self.code}  # fmt: skip
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True)
class Served:
    """What the app serves: the engine, the prompts it renders, and who may call it."""

    engine: Engine
    prompts: Prompts
    model_id: str  # the id /v1/models lists and requests name
    api_key: str | None  # the bearer token every /v1 call must carry; None: open
    created: int  # when the server started (Unix seconds), as /v1/models reports it


def build_app(served: Served) -> FastAPI:
    app = FastAPI(title="zoo serve", docs_url=None, redoc_url=None)
    app.state.served = served

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> Response:
        _log(request, error.status, f"error: {error.message}")
        return error.response()

    @app.exception_handler(PromptError)
    async def bad_prompt(request: Request, error: PromptError) -> Response:
        return await api_error(request, APIError(400, str(error), param=error.param))

    app.add_middleware(Guard, served=served)

    @app.get("/health")
    async def health() -> dict[str, object]:
        engine = served.engine
        return {"status": "ok", "slots": engine.slots, "busy_slots": engine.busy_slots(),
                "finished": dict(engine.finished)}  # fmt: skip

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [_model_card(served)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, object]:
        _check_model(served, model_id)
        return _model_card(served)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = _parse(ChatRequest, await request.body())
        _check(served, body)
        ask = served.prompts.chat(body)
        groups = _submit(served, [ask], body.n)
        return await _answer(request, body, groups, "chat.completion", _chat_choice)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await request.body())
        _check(served, body)
        asks = served.prompts.completions(body)
        groups = _submit(served, asks, body.n)
        return await _answer(request, body, groups, "text_completion", _text_choice)

    return app


class Guard:
    """The middleware around every request: the API key, one log line, and a 500 in OpenAI's
    shape for an error nothing else caught (the server outlives any request). Written for ASGI
    directly, so a streamed answer still hears its client go away (and cancels its choices)."""

    def __init__(self, app: ASGIApp, served: Served):
        self.app, self.served = app, served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request.state.start = time.perf_counter()
        key = self.served.api_key
        given = request.headers.get("authorization", "")
        if key and request.url.path.startswith("/v1") and given != f"Bearer {key}":
            error = APIError(401, "a wrong or missing API key: send the header "
                             "'Authorization: Bearer KEY' with the key given to zoo serve "
                             "--api-key", code="invalid_api_key")  # fmt: skip
            _log(request, 401, f"error: {error.message}")
            await error.response()(scope, receive, send)
            return
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as error:
            log.exception("request failed")
            failure = APIError(500, f"internal error: {error}", kind="server_error")
            _log(request, 500, f"error: {failure.message}")
            if not status:
                await failure.response()(scope, receive, send)
            return
        if not getattr(request.state, "logged", False):
            _log(request, status[0] if status else 500)


def _parse(schema: type[Body], body: bytes) -> Body:
    """The request body read as `schema` (whatever the Content-Type says), or a 400 naming the
    first field that is wrong."""
    try:
        return schema.model_validate_json(body)
    except ValidationError as error:
        first = error.errors()[0]
        if first.get("type") == "json_invalid":
            raise APIError(400, "the body is not valid JSON: send a JSON object") from None
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = f"{where or 'the body'}: {first.get('msg')}"
        raise APIError(400, message, param=where or None) from None


def _model_card(served: Served) -> dict[str, object]:
    return {"id": served.model_id, "object": "model", "created": served.created,
            "owned_by": "zoo"}  # fmt: skip


def _check_model(served: Served, name: str | None) -> None:
    if name is not None and name != served.model_id:
        raise APIError(404, f"the model {name!r} is not served here; this server serves "
                       f"{served.model_id!r}", param="model", code="model_not_found")  # fmt: skip


def _check(served: Served, body: Sampling) -> None:
    _check_model(served, body.model)
    field = body.unsupported()
    if field is not None:
        raise APIError(400, f"{field} is not supported by zoo serve: leave it out", param=field)


def _submit(served: Served, asks, n: int) -> list[Choices]:
    groups: list[Choices] = []
    try:
        for number, ask in enumerate(asks):
            groups.append(Choices(served.engine, served.prompts.tokenizer, ask, n, number * n))
    except EngineFull as error:
        _cancel(groups)
        raise APIError(429, str(error), kind="rate_limit_error") from None
    except ValueError as error:  # the prompt and max_tokens do not fit, or bad numbers
        _cancel(groups)
        param = "max_tokens" if isinstance(error, PromptTooLong) else None
        raise APIError(400, str(error), param=param) from None
    return groups


def _cancel(groups: list[Choices]) -> None:
    for group in groups:
        group.cancel()


async def _answer(request: Request, body: Sampling, groups, kind: str, shape) -> Response:
    ident = f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}"
    model_id = request.app.state.served.model_id
    head = {"id": ident, "object": kind, "created": int(time.time()), "model": model_id}
    if body.stream:
        request.state.logged = True
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(request, groups, head, shape, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream")
    texts: dict[int, list[Piece]] = {}
    try:
        async for piece in _watched(request, run_all(groups)):
            texts.setdefault(piece.index, []).append(piece)
    finally:
        _cancel(groups)
    choices = [shape(index, pieces, whole=True) for index, pieces in sorted(texts.items())]
    usage = _usage(groups)
    _log(request, 200, f"prompt {usage['prompt_tokens']}, completion {usage['completion_tokens']}")
    return JSONResponse({**head, "choices": choices, "usage": usage})


async def _watched(request: Request, pieces: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    """`pieces`, ending early (cancelling the choices) when the client goes away: checked at
    least every `DISCONNECT_POLL_S`, whether pieces keep coming or not."""
    task: asyncio.Task | None = None
    iterator = pieces.__aiter__()
    checked = time.monotonic()
    while True:
        task = task or asyncio.ensure_future(iterator.__anext__())
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if time.monotonic() - checked >= DISCONNECT_POLL_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "the client closed the connection")
        if not done:
            continue
        try:
            piece = task.result()
        except StopAsyncIteration:
            return
        task = None
        yield piece


async def _stream(request, groups, head, shape, include_usage) -> AsyncIterator[str]:
    status, note = 200, ""
    chat = head["object"] == "chat.completion"
    head = {**head, "object": "chat.completion.chunk"} if chat else head
    try:
        if chat:  # OpenAI's first chunk of each choice names the role
            for index in range(sum(len(group.choices) for group in groups)):
                opening = {"index": index, "delta": {"role": "assistant", "content": ""},
                           "logprobs": None, "finish_reason": None}  # fmt: skip
                yield _event({**head, "choices": [opening]})
        async for piece in run_all(groups):
            yield _event({**head, "choices": [shape(piece.index, [piece], whole=False)]})
        if include_usage:
            yield _event({**head, "choices": [], "usage": _usage(groups)})
        yield "data: [DONE]\n\n"
    except asyncio.CancelledError:
        status, note = 499, "the client closed the connection"
        raise
    except Exception as error:  # the stream has begun: say it in the stream
        status, note = 500, f"error: {error}"
        yield _event({"error": {"message": str(error), "type": "server_error", "param": None,
                                "code": None}})  # fmt: skip
    finally:
        _cancel(groups)
        usage = _usage(groups)
        counts = f"prompt {usage['prompt_tokens']}, completion {usage['completion_tokens']}"
        _log(request, status, f"stream, {counts}{'; ' + note if note else ''}")


def _event(payload: dict[str, object]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(groups: list[Choices]) -> dict[str, int]:
    prompt = sum(group.prompt_tokens for group in groups)
    completion = sum(group.completion_tokens for group in groups)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def _chat_choice(index: int, pieces: list[Piece], *, whole: bool) -> dict[str, object]:
    text = "".join(piece.text for piece in pieces)
    reason = next((piece.finish_reason for piece in pieces if piece.finish_reason), None)
    logprobs = [
        {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.token.encode()),
         "top_logprobs": [{"token": token, "logprob": value, "bytes": list(token.encode())}
                          for token, value in entry.top]}
        for piece in pieces for entry in piece.logprobs
    ]  # fmt: skip
    has_logprobs = any(piece.logprobs for piece in pieces)
    message = {"role": "assistant", "content": text}
    return {
        "index": index,
        ("message" if whole else "delta"): message if whole or text else {},
        "logprobs": {"content": logprobs} if has_logprobs else None,
        "finish_reason": reason,
    }


def _text_choice(index: int, pieces: list[Piece], *, whole: bool) -> dict[str, object]:
    text = "".join(piece.text for piece in pieces)
    reason = next((piece.finish_reason for piece in pieces if piece.finish_reason), None)
    entries = [entry for piece in pieces for entry in piece.logprobs]
    logprobs = None
    if any(piece.logprobs for piece in pieces):
        logprobs = {
            "tokens": [entry.token for entry in entries],
            "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [dict(entry.top) for entry in entries],
        }
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def _log(request: Request, status: int, note: str = "") -> None:
    start = getattr(request.state, "start", time.perf_counter())
    seconds = time.perf_counter() - start
    client = request.client.host if request.client else "-"
    line = f"{client} {request.method} {request.url.path} {status} {seconds:.3f}s"
    log.info("%s%s", line, f" {note}" if note else "")
    request.state.logged = True
