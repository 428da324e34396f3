"""Run the server: bind, serve until Ctrl-C, and survive a lost RPC server by replacing the
process image in place (same pid, same listening socket), then reloading the models."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from typing import Callable

from ..decoder import SpeculativeDecoder
from ..errors import LlamaSpecError
from ..llama import set_rpc_failure_handler
from .app import MAX_BODY_BYTES, ServerConfig, create_app
from .schemas import ApiError
from .slots import Engine

_RESTART_ENV = "LLAMASPEC_SERVE_RESTART"  # set for the process image that replaces a broken one
_BACKLOG = 2048


def serve(load: Callable[[], SpeculativeDecoder], *, host: str, port: int, n_slots: int, n_ctx: int,
          model_id: str, api_key: str | None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Bind, load the models, listen, print where, serve until Ctrl-C (errors: one line, not a
    log). The port is bound first, so a port in use fails at once, not after the models load;
    it listens only once they are loaded, so until then a connection is refused, not queued.

    A lost RPC server leaves llama.cpp no way back inside this process, so the server then
    answers its running and queued requests with an error, and replaces itself in place
    (exec: same pid, same listening socket, so no connection is refused); the new image
    answers 503 until the target loads again from the RPC servers, retrying every 2 s.
    """
    import uvicorn

    restart = os.environ.pop(_RESTART_ENV, None)
    if restart is None:
        sock = _bind(host, port)
        engine = Engine(n_slots, n_ctx)
        try:
            engine.start(load())
        except BaseException:
            sock.close()
            raise
        sock.listen(_BACKLOG)  # before "serving ... on" is printed: from then on connections queue
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


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the listener
    # says TCP, and without it every response after the first on a keep-alive connection (an SSE
    # chunk, a scrape) waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
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
