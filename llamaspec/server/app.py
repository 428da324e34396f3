"""The FastAPI app: the auth and body-size guard, the OpenAI routes, and the answers (one
JSON object, or SSE chunks) relayed from the slot's worker thread."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..decoder import Decoder
from ..errors import LlamaSpecError
from ..openai_api import StopStrings, check_sampling, include_usage, speculative_options
from .metrics import metrics_text
from .schemas import ApiError, ChatBody, CompletionBody, GenerationBody, error_body, refuse_unsupported
from .slots import Engine, Metrics, SlotPool

MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerConfig:
    model_id: str
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES


class Guard:
    """ASGI middleware: authentication and the body size limit before any handler runs,
    and the per-path request counters. (Plain ASGI, so streams and disconnects pass through.)
    Requests for any path but the app's `paths` are counted as "other": a scanner's paths
    would add a counter each, and a decoded path may hold quotes and newlines that break
    the /metrics text."""

    def __init__(self, app: Any, config: ServerConfig, metrics: Metrics, paths: frozenset[str]):
        self.app, self.config, self.metrics, self.paths = app, config, metrics, paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if self.config.api_key and scope["path"] != "/health":
                _check_key(headers.get("authorization", ""), self.config.api_key)
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.config.max_body_bytes):
                raise ApiError(413, f"request body larger than {self.config.max_body_bytes} bytes")
        except ApiError as exc:
            await _error_response(exc)(scope, receive, send_and_note)
        else:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.count_request(scope["path"] if scope["path"] in self.paths else "other", status)


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="llamaspec", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    metrics = engine.metrics

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
        return _error_response(ApiError.internal(exc))

    @app.get("/health")
    async def health() -> Any:
        pool = engine.pool
        if pool is None:
            return JSONResponse({"status": "unavailable", "error": engine.unavailable}, status_code=503)
        return {"status": "ok", "slots_idle": len(pool.slots) - pool.n_busy, "slots_processing": pool.n_busy,
                "queue_depth": pool.waiting}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model_id, "object": "model", "created": started,
                                            "owned_by": "llamaspec"}]}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(engine), media_type="text/plain; version=0.0.4")

    async def generation(request: Request, body_type: type[GenerationBody],
                         prepare: Callable[[Any, Decoder], tuple[list[int], Callable[..., Any]]]) -> Response:
        body = await _read_body(request, body_type, config.max_body_bytes)
        decoder, pool = engine.ready()
        if body.model is not None and body.model != config.model_id:
            raise ApiError(400, f"unknown model {body.model!r}; this server serves {config.model_id!r}", param="model")
        if body.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        options = body.options()
        try:  # checked here, so that a stream answers 400 rather than 200 and an error event
            speculative_options(options.get("speculative"))
            check_sampling(options)
            StopStrings(options.get("stop"))
            include_usage(options.get("stream_options"))
            prompt, create = prepare(body, decoder)
        except LlamaSpecError as exc:
            raise ApiError(400, str(exc)) from None
        if not prompt:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if not all(0 <= token < decoder.target.n_vocab for token in prompt):
            # Checked here: a bad id inside a shared decode round would fail every slot in it.
            raise ApiError(400, f"prompt token ids must be in [0, {decoder.target.n_vocab})", param="prompt")
        if len(prompt) >= pool.n_ctx:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens; a slot's context holds {pool.n_ctx}",
                           param="prompt")
        options["model"] = config.model_id

        if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
            options.setdefault("max_tokens", body.max_completion_tokens)

        def job(slot_decoder: Decoder) -> Any:
            return create(slot_decoder, stream=body.stream, **options)

        return await _respond(request, pool, job, len(prompt), body.stream)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        def prepare(body: CompletionBody, decoder: Decoder) -> tuple[list[int], Callable[..., Any]]:
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise LlamaSpecError("only one prompt per request is supported")
                prompt = prompt[0]
            tokens = decoder.prompt_tokens(prompt)  # type: ignore[arg-type]

            def create(slot_decoder: Decoder, **options: Any) -> Any:
                return slot_decoder.create_completion(tokens, **options)

            return tokens, create

        return await generation(request, CompletionBody, prepare)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        def prepare(body: ChatBody, decoder: Decoder) -> tuple[list[int], Callable[..., Any]]:
            messages = [m.as_dict() for m in body.messages]

            def create(slot_decoder: Decoder, **options: Any) -> Any:
                return slot_decoder.create_chat_completion(messages, **options)

            return decoder.chat_tokens(messages), create

        return await generation(request, ChatBody, prepare)

    app.add_middleware(Guard, config=config, metrics=metrics, paths=frozenset(route.path for route in app.routes))
    return app


def _check_key(header: str, key: str) -> None:
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)", "authentication_error")


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.kind, exc.param), status_code=exc.status)


async def _read_body(request: Request, body_type: type[GenerationBody], limit: int) -> Any:
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            raise ApiError(413, f"request body larger than {limit} bytes")
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "the request body must be a JSON object")
    refuse_unsupported(payload)
    try:
        return body_type.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ApiError(400, f"{where}: {first['msg']}", param=where) from None


async def _respond(request: Request, pool: SlotPool, job: Callable[[Decoder], Any], n_prompt: int,
                   stream: bool) -> Response:
    """Wait for a slot, run the job there, and answer: SSE chunks, or one JSON object."""
    slot = await pool.acquire()
    cancelled = slot.start()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def emit(kind: str, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone: the server is shutting down
            cancelled.set()

    pool.run(slot, job, n_prompt, emit)
    if stream:
        return EventSourceResponse(_events(queue, cancelled), ping=15)
    result: dict[str, Any] | None = None
    error: ApiError | None = None
    while True:
        try:
            kind, value = await asyncio.wait_for(queue.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                cancelled.set()  # the worker stops at its next evaluation and frees the slot
            continue
        if kind == "result":
            result = value
        elif kind == "error":
            error = error or value  # the first: a cleanup that fails after it is a consequence
        elif kind == "end":
            break
    if result is None:
        raise error or ApiError(499, "the request was cancelled", "cancelled")
    return JSONResponse(result)


async def _events(queue: asyncio.Queue[tuple[str, Any]], cancelled: threading.Event) -> AsyncIterator[dict[str, str]]:
    try:
        while True:
            kind, value = await queue.get()
            if kind == "chunk":
                yield {"data": json.dumps(value, ensure_ascii=False)}
            elif kind == "error":
                yield {"data": json.dumps(error_body(value.message, value.kind))}
            elif kind == "end":
                break
        yield {"data": "[DONE]"}
    finally:
        cancelled.set()  # the client went away (or we are done): stop the worker if it still runs
