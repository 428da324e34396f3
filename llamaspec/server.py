"""`llamaspec serve`: an OpenAI-compatible HTTP server with speculative decoding.

`--parallel N` slots share ONE target context and ONE draft context, a sequence id each.
A request waits for a free slot, then runs in a worker thread on that slot's decoder (the
library's `openai_api` over `SequenceView`s); the `SharedBatch` puts the evaluations of all
busy slots into one llama_decode per model, so concurrent users cost less than N separate
decodes. A finished, failed or disconnected request removes its sequence from both KV
caches and frees its slot. Every bad request gets an OpenAI-style error; none stops the server,
and neither does a lost RPC server holding the target (see `serve`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .decoder import SpeculativeDecoder
from .errors import LlamaSpecError
from .model import set_rpc_failure_handler
from .openai_api import create_chat_completion, create_completion, speculative_options
from .shared_batch import Cancelled, SequenceView, SharedBatch
from .speculative import GenerationStats

MAX_BODY_BYTES = 1 << 20


class ApiError(Exception):
    """An error answered with an OpenAI-style body: {"error": {"message", "type", ...}}."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


# -- request bodies -----------------------------------------------------------------------
class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI fields we do not implement are ignored

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    speculative: dict[str, Any] | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for openai_api: the fields the client set (the rest keep
        llama-cpp-python's defaults)."""
        skip = {"model", "n", "stream", "prompt", "messages", "max_completion_tokens"}
        return {key: value for key, value in self.model_dump(exclude_unset=True).items()
                if key not in skip and value is not None}


class CompletionBody(_Common):
    prompt: str | list[int] | list[str]


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str = ""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_Part] | None = None

    def as_dict(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content if part.type == "text")
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatBody(_Common):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)  # the newer name of max_tokens


# -- slots --------------------------------------------------------------------------------
@dataclass
class Slot:
    index: int
    decoder: SpeculativeDecoder
    views: list[SequenceView]

    def start(self) -> threading.Event:
        """A fresh cancel flag per request: a late cancel of an old request can't hit a new one."""
        cancelled = threading.Event()
        for view in self.views:
            view.cancelled = cancelled
        return cancelled

    def clear(self) -> None:
        for view in self.views:
            view.reset()


@dataclass
class Metrics:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    cancelled: int = 0

    def record(self, stats: Any, n_prompt: int) -> None:
        self.prompt_tokens += n_prompt
        self.generated_tokens += stats.n_generated
        self.drafted_tokens += stats.n_drafted
        self.accepted_tokens += stats.n_accepted


class SlotPool:
    """The slots and the shared batch; requests queue (asyncio) for a free slot."""

    def __init__(self, decoder: SpeculativeDecoder, n_slots: int, n_ctx: int, metrics: Metrics):
        self.batch = SharedBatch()
        self.n_ctx = n_ctx
        self.slots: list[Slot] = []
        for seq in range(n_slots):
            views = [SequenceView(m, seq, self.batch, n_ctx) for m in (decoder.target, decoder.draft_model) if m]
            slot_decoder = decoder.with_models(views[0], views[1] if len(views) > 1 else None)
            self.slots.append(Slot(seq, slot_decoder, views))
        self._free: asyncio.Queue[Slot | ApiError] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waiting = 0
        self.threads: set[threading.Thread] = set()
        self.metrics = metrics
        self.running: dict[int, Callable[[str, Any], None]] = {}  # slot index -> its request's emit

    def free_queue(self) -> asyncio.Queue[Slot | ApiError]:
        if self._free is None:  # made inside the running loop
            self._loop = asyncio.get_running_loop()
            self._free = asyncio.Queue()
            for slot in self.slots:
                self._free.put_nowait(slot)
        return self._free

    @property
    def n_busy(self) -> int:
        return len(self.slots) - self.free_queue().qsize()

    async def acquire(self) -> Slot:
        self.waiting += 1
        try:
            slot = await self.free_queue().get()
        finally:
            self.waiting -= 1
        if isinstance(slot, ApiError):  # the pool broke while this request queued
            raise slot
        return slot

    def run(self, slot: Slot, job: Callable[[SpeculativeDecoder], Any], n_prompt: int,
            emit: Callable[[str, Any], None]) -> None:
        """Start a worker thread: run `job` on the slot's decoder inside the shared batch,
        emit ("chunk", dict) for a stream (or ("result", dict)), ("error", ApiError) on
        failure, then ("end", None); the slot is cleaned and freed by the worker itself."""
        loop = asyncio.get_running_loop()
        free = self.free_queue()

        def work() -> None:
            self.running[slot.index] = emit
            slot.decoder.stats = GenerationStats()  # a job that fails early must not recount the last one
            try:
                with self.batch.working():
                    result = job(slot.decoder)
                    if isinstance(result, dict):
                        emit("result", result)
                    else:
                        for chunk in result:
                            emit("chunk", chunk)
            except Cancelled:
                self.metrics.cancelled += 1
            except LlamaSpecError as exc:
                emit("error", ApiError(400, str(exc)))
            except Exception as exc:  # noqa: BLE001 - the server must outlive any request
                emit("error", ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))
            finally:
                self.running.pop(slot.index, None)
                self.metrics.record(slot.decoder.stats, n_prompt)
                slot.clear()
                emit("end", None)
                self.threads.discard(threading.current_thread())
                loop.call_soon_threadsafe(free.put_nowait, slot)

        thread = threading.Thread(target=work, name=f"slot-{slot.index}", daemon=True)
        self.threads.add(thread)
        thread.start()

    def fail_all(self, error: ApiError) -> None:
        """Answer every running and queued request with `error` now (from any thread): the
        running ones' threads are stuck in llama.cpp, the queued ones would wait forever."""
        for emit in list(self.running.values()):
            emit("error", error)
            emit("end", None)
        if self._loop is not None and self._free is not None:
            for _ in range(self.waiting):
                self._loop.call_soon_threadsafe(self._free.put_nowait, error)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel running generations and wait for their threads (before models are freed)."""
        for slot in self.slots:
            for view in slot.views:
                view.cancelled.set()
        deadline = time.monotonic() + timeout
        for thread in list(self.threads):
            thread.join(max(deadline - time.monotonic(), 0))


class Engine:
    """The loaded models and their slots, or why there are none (the target's RPC server was
    lost): the app asks for them per request, so it can answer 503 while they are reloaded."""

    def __init__(self, n_slots: int, n_ctx: int, unavailable: str | None = None, restarts: int = 0):
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.metrics = Metrics()
        self.decoder: SpeculativeDecoder | None = None
        self.pool: SlotPool | None = None
        self.unavailable = unavailable
        self.restarts = restarts

    def start(self, decoder: SpeculativeDecoder) -> None:
        self.decoder = decoder
        self.pool = SlotPool(decoder, self.n_slots, self.n_ctx, self.metrics)
        self.unavailable = None

    def ready(self) -> tuple[SpeculativeDecoder, SlotPool]:
        if self.decoder is None or self.pool is None:
            raise ApiError(503, f"the target model is unavailable: {self.unavailable}", "server_error")
        return self.decoder, self.pool

    def lose(self, why: str) -> SlotPool | None:
        """Stop handing out the slots (their models are broken); the old pool, if any."""
        pool, self.pool, self.decoder, self.unavailable = self.pool, None, None, why
        return pool


# -- the app ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerConfig:
    model_id: str
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES


class Guard:
    """ASGI middleware: authentication and the body size limit before any handler runs,
    and the per-path request counters. (Plain ASGI, so streams and disconnects pass through.)"""

    def __init__(self, app: Any, config: ServerConfig, metrics: Metrics):
        self.app, self.config, self.metrics = app, config, metrics

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
            key = (scope["path"], status)
            self.metrics.requests[key] = self.metrics.requests.get(key, 0) + 1


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="llamaspec", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    metrics = engine.metrics

    app.add_middleware(Guard, config=config, metrics=metrics)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"),
                            status_code=500)

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
        return PlainTextResponse(_metrics_text(engine), media_type="text/plain; version=0.0.4")

    async def generation(request: Request, body_type: type[_Common],
                         prepare: Callable[[Any, SpeculativeDecoder], tuple[list[int], Callable[..., Any]]]) -> Response:
        body = await _read_body(request, body_type, config.max_body_bytes)
        decoder, pool = engine.ready()
        if body.model is not None and body.model != config.model_id:
            raise ApiError(400, f"unknown model {body.model!r}; this server serves {config.model_id!r}", param="model")
        if body.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        options = body.options()
        try:
            speculative_options(options.get("speculative"))
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

        def job(slot_decoder: SpeculativeDecoder) -> Any:
            return create(slot_decoder, stream=body.stream, **options)

        return await _respond(request, pool, job, len(prompt), body.stream)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        def prepare(body: CompletionBody, decoder: SpeculativeDecoder) -> tuple[list[int], Callable[..., Any]]:
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise LlamaSpecError("only one prompt per request is supported")
                prompt = prompt[0]
            tokens = decoder.prompt_tokens(prompt)  # type: ignore[arg-type]

            def create(slot_decoder: SpeculativeDecoder, **options: Any) -> Any:
                return create_completion(slot_decoder, tokens, **options)

            return tokens, create

        return await generation(request, CompletionBody, prepare)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        def prepare(body: ChatBody, decoder: SpeculativeDecoder) -> tuple[list[int], Callable[..., Any]]:
            messages = [m.as_dict() for m in body.messages]

            def create(slot_decoder: SpeculativeDecoder, **options: Any) -> Any:
                return create_chat_completion(slot_decoder, messages, **options)

            return decoder.chat_tokens(messages), create

        return await generation(request, ChatBody, prepare)

    return app


def _check_key(header: str, key: str) -> None:
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)", "authentication_error")


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.kind, exc.param), status_code=exc.status)


async def _read_body(request: Request, body_type: type[_Common], limit: int) -> Any:
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
    try:
        return body_type.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ApiError(400, f"{where}: {first['msg']}", param=where) from None


async def _respond(request: Request, pool: SlotPool, job: Callable[[SpeculativeDecoder], Any], n_prompt: int,
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
            error = value
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


def _metrics_text(engine: Engine) -> str:
    m, pool = engine.metrics, engine.pool
    slots = pool.slots if pool else []
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP llamaspec_{name} {help_text}")
        lines.append(f"# TYPE llamaspec_{name} {kind}")
        lines.extend(f"llamaspec_{name}{labels} {value:g}" for labels, value in samples)

    metric("requests_total", "counter", "HTTP requests by path and status code.",
           [(f'{{path="{path}",status="{status}"}}', n) for (path, status), n in sorted(m.requests.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens of finished generations.", [("", m.prompt_tokens)])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", m.generated_tokens)])
    metric("drafted_tokens_total", "counter", "Tokens proposed by the drafter.", [("", m.drafted_tokens)])
    metric("accepted_tokens_total", "counter", "Drafted tokens the target accepted.", [("", m.accepted_tokens)])
    metric("acceptance_ratio", "gauge", "Accepted over drafted tokens since start.",
           [("", m.accepted_tokens / m.drafted_tokens if m.drafted_tokens else 0.0)])
    metric("cancelled_total", "counter", "Generations stopped because the client went away.", [("", m.cancelled)])
    metric("target_available", "gauge", "1 while the models are loaded and serving.", [("", pool is not None)])
    metric("restarts_total", "counter", "In-place restarts after a lost RPC server.", [("", engine.restarts)])
    metric("queue_depth", "gauge", "Requests waiting for a free slot.", [("", pool.waiting if pool else 0)])
    metric("slots_total", "gauge", "Parallel slots.", [("", engine.n_slots)])
    metric("slots_busy", "gauge", "Slots running a generation.", [("", pool.n_busy if pool else 0)])
    metric("batch_decodes_total", "counter", "Shared llama_decode rounds (all slots' rows together).",
           [("", pool.batch.n_decodes if pool else 0)])
    metric("batch_tokens_total", "counter", "Tokens evaluated in shared rounds.",
           [("", pool.batch.n_rows if pool else 0)])
    metric("kv_tokens", "gauge", "Tokens llama.cpp's KV cache holds per slot and model (0 when idle).",
           [(f'{{slot="{slot.index}",model="{name}"}}', view.kv_tokens())
            for slot in slots for name, view in zip(("target", "draft"), slot.views)])
    return "\n".join(lines) + "\n"


_RESTART_ENV = "LLAMASPEC_SERVE_RESTART"  # set for the process image that replaces a broken one


def serve(load: Callable[[], SpeculativeDecoder], *, host: str, port: int, n_slots: int, n_ctx: int,
          model_id: str, api_key: str | None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Load the models, bind (errors: one line, not a log), print where, serve until Ctrl-C.

    A lost RPC server leaves llama.cpp no way back inside this process, so the server then
    answers its running and queued requests with an error, and replaces itself in place
    (exec: same pid, same listening socket, so no connection is refused); the new image
    answers 503 until the target loads again from the RPC servers, retrying every 2 s.
    """
    import uvicorn

    restart = os.environ.pop(_RESTART_ENV, None)
    if restart is None:
        engine = Engine(n_slots, n_ctx)
        engine.start(load())
        try:
            sock = _listen(host, port)
        except LlamaSpecError:
            engine.decoder.close()  # type: ignore[union-attr]
            raise
        print(f"llamaspec: serving {model_id} on http://{host}:{sock.getsockname()[1]}/v1 with {n_slots} slot(s)",
              file=sys.stderr, flush=True)
    else:
        state = json.loads(restart)
        sock = _adopt_listener(state["fd"])
        engine = Engine(n_slots, n_ctx, unavailable=state["why"], restarts=state["restarts"])
        threading.Thread(target=_reload, args=(engine, load), name="reload", daemon=True).start()
        print(f"llamaspec: restarted after a lost RPC server; answering 503 until {model_id} loads again",
              file=sys.stderr, flush=True)
    set_rpc_failure_handler(functools.partial(_restart_in_place, engine, sock))
    app = create_app(engine, ServerConfig(model_id, api_key, max_body_bytes))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it already handled: a normal stop
        pass
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cleanup below is bounded: let it finish
        set_rpc_failure_handler(None)
        if engine.pool is not None:
            engine.pool.shutdown()
        if engine.decoder is not None:
            engine.decoder.close()
        sock.close()
    print("llamaspec: server stopped", file=sys.stderr, flush=True)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # before "serving ... on" is printed: from then on connections queue, none is refused
    except OSError as exc:
        sock.close()
        raise LlamaSpecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _restart_in_place(engine: Engine, sock: socket.socket, why: str) -> None:
    """Runs on the slot (or reload) thread whose llama.cpp call failed; never returns on success."""
    pool = engine.lose(why)
    print(f"llamaspec: {why}; answering the running requests with an error and restarting",
          file=sys.stderr, flush=True)
    if pool is not None:
        pool.fail_all(ApiError(502, f"the target model was lost: {why}", "server_error"))
        time.sleep(1.0)  # the event loop sends those answers meanwhile
    os.set_inheritable(sock.fileno(), True)
    state = json.dumps({"fd": sock.fileno(), "restarts": engine.restarts + 1, "why": why})
    sys.stdout.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, _RESTART_ENV: state})


def _adopt_listener(fd: int) -> socket.socket:
    """The listening socket the previous image passed on. Every other socket it left open
    (connections to RPC servers, which serve one client at a time) is closed."""
    for name in os.listdir("/dev/fd"):
        other = int(name)
        if other > 2 and other != fd:
            try:
                if stat.S_ISSOCK(os.fstat(other).st_mode):
                    os.close(other)
            except OSError:
                pass
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    return sock


def _reload(engine: Engine, load: Callable[[], SpeculativeDecoder]) -> None:
    lost = engine.unavailable
    while True:
        time.sleep(2.0)
        try:
            decoder = load()
        except Exception as exc:  # noqa: BLE001 - keep answering 503 and retry
            engine.unavailable = f"{lost}; reloading: {exc}"
            continue
        engine.start(decoder)
        print("llamaspec: the target is loaded again; serving", file=sys.stderr, flush=True)
        return
