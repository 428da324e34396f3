"""The target on llama.cpp RPC servers (rpc-server processes on 127.0.0.1), the draft local.

Needs llama-cpp-python built with GGML_RPC=ON and .rpc/bin/rpc-server from the same build:
scripts/build_rpc.sh makes both. Without them these tests fail (they do not skip).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, STORY_PROMPTS

from llamaspec.drafters.draft_model import DraftModelDrafter
from llamaspec.errors import LlamaSpecError
from llamaspec.llama import Model, ModelOptions
from llamaspec.speculative import generate_tokens

RPC_SERVER = Path(os.environ.get("LLAMASPEC_RPC_SERVER", REPO / ".rpc" / "bin" / "rpc-server"))
N_TOKENS = 48


@pytest.fixture(scope="module")
def rpc_server_bin() -> Path:
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        pytest.fail("llama-cpp-python was built without GGML_RPC: run scripts/build_rpc.sh")
    if not os.access(RPC_SERVER, os.X_OK):
        pytest.fail(f"{RPC_SERVER} is missing: run scripts/build_rpc.sh")
    return RPC_SERVER


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """One rpc-server process on 127.0.0.1 (1 thread), stopped on close()."""

    def __init__(self, binary: Path, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:  # a bare connect is harmless: the server reads EOF and accepts the next client
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"rpc-server on port {self.port} did not start")
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def two_servers(rpc_server_bin: Path):
    servers = [RpcServer(rpc_server_bin), RpcServer(rpc_server_bin)]
    yield servers
    for server in servers:
        server.close()


def greedy(target: Model, prompt: str, draft: Model | None = None) -> list[int]:
    target.reset()
    drafter = None
    if draft is not None:
        draft.reset()
        drafter = DraftModelDrafter(draft)
    return list(generate_tokens(target, target.tokenize(prompt), drafter=drafter, k=3, max_tokens=N_TOKENS))


def test_split_target_speculative_equals_local_plain(stories, truncated_draft, two_servers, capsys, monkeypatch):
    options = ModelOptions(n_ctx=256)
    prompts = STORY_PROMPTS[:3]
    with Model(stories, options) as local:
        plain = [greedy(local, p) for p in prompts]
    assert all(len(tokens) > 8 for tokens in plain)

    capsys.readouterr()
    # log=True: llama.cpp's loader log, which says where the layers went.
    target = Model(stories, ModelOptions(n_ctx=256, rpc_servers=tuple(s.endpoint for s in two_servers), log=True))
    log = capsys.readouterr().err
    try:
        for server in two_servers:  # both servers hold part of the weights
            assert f"[{server.endpoint}] model buffer size" in log, log[-3000:]
        assert f"offloaded {target.n_layer + 1}/{target.n_layer + 1} layers" in log, log[-3000:]
        with Model(truncated_draft, options) as draft:
            assert "RPC" not in draft.description  # the draft stays local (no devices passed)
            for prompt, expected in zip(prompts, plain):
                assert greedy(target, prompt, draft) == expected, prompt
                assert greedy(target, prompt) == expected, prompt  # plain over RPC too
    finally:
        target.close()


def test_unreachable_server_is_one_clear_error_and_process_stays_usable(stories):
    dead = f"127.0.0.1:{free_port()}"  # nobody listens
    started = time.monotonic()
    with pytest.raises(LlamaSpecError, match=f"RPC server {dead} refused the connection"):
        Model(stories, ModelOptions(n_ctx=64, rpc_servers=(dead,)))
    assert time.monotonic() - started < 5
    with Model(stories, ModelOptions(n_ctx=64)) as model:  # still usable
        assert len(model.eval(model.tokenize("Once upon a time"))[-1]) == model.n_vocab


_held: list[socket.socket] = []  # accepted fake connections stay open until the end


def fake_server(reply: bytes | None) -> tuple[socket.socket, str]:
    """A listener that accepts and then answers the HELLO with `reply` (None: never answers)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        _held.append(conn)
        if reply is not None:
            conn.recv(64)
            conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


def test_silent_server_times_out(stories):
    listener, endpoint = fake_server(None)
    started = time.monotonic()
    with pytest.raises(LlamaSpecError, match="did not answer within 5 s"):
        Model(stories, ModelOptions(n_ctx=64, rpc_servers=(endpoint,)))
    assert time.monotonic() - started < 8
    listener.close()


def test_protocol_mismatch_is_refused_before_llama_cpp_connects(stories):
    listener, endpoint = fake_server(struct.pack("<QBBBB", 28, 3, 0, 0, 0) + bytes(24))
    with pytest.raises(LlamaSpecError, match=r"speaks RPC protocol 3\.0\.0"):
        Model(stories, ModelOptions(n_ctx=64, rpc_servers=(endpoint,)))
    listener.close()


@pytest.mark.parametrize("bad", ["localhost", "host:0", ":50052", "::1:50052", "h:port"])
def test_bad_server_addresses(bad):
    with pytest.raises(LlamaSpecError, match="HOST:PORT"):
        ModelOptions(rpc_servers=(bad,))


# A client that generates until it is stopped: target over RPC, local draft.
CLIENT = """
import sys
from llamaspec.drafters.draft_model import DraftModelDrafter
from llamaspec.llama import Model, ModelOptions
from llamaspec.speculative import generate_tokens
target = Model(sys.argv[1], ModelOptions(n_ctx=512, rpc_servers=tuple(sys.argv[3].split(","))))
draft = Model(sys.argv[2], ModelOptions(n_ctx=512))
n = 0
while True:
    target.reset(); draft.reset()
    for _ in generate_tokens(target, target.tokenize("Once upon a time"), drafter=DraftModelDrafter(draft),
                             k=3, max_tokens=400):
        n += 1
        if n == 100:
            print("GENERATING", flush=True)
"""


def run_and_break(stories: Path, draft: Path, servers: list[RpcServer], how: signal.Signals,
                  env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(stories), str(draft),
                             ",".join(s.endpoint for s in servers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until it is mid-generation (or dead)
        assert line.strip() == "GENERATING", proc.communicate(timeout=30)
        broken = time.monotonic()
        servers[1].proc.send_signal(how)
        out, err = proc.communicate(timeout=60)  # the test's own bound: far above the 30 s required
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - broken
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def assert_one_clear_error(result: subprocess.CompletedProcess[str], server: RpcServer) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])  # not -6 (SIGABRT)
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: "), lines
    assert server.endpoint in lines[0] or "RPC server" in lines[0], lines


def test_killing_an_rpc_server_mid_generation(stories, truncated_draft, two_servers, rpc_server_bin):
    result, seconds = run_and_break(stories, truncated_draft, two_servers, signal.SIGKILL)
    assert seconds < 30, seconds
    assert_one_clear_error(result, two_servers[1])
    assert f"RPC server {two_servers[1].endpoint} (refused) is gone" in result.stderr
    # The surviving server serves the next client; the killed one comes back on its port.
    two_servers[1].close()
    two_servers[1] = RpcServer(rpc_server_bin, two_servers[1].port)
    with Model(stories, ModelOptions(n_ctx=128)) as local:
        expected = greedy(local, "Once upon a time")
    with Model(stories, ModelOptions(n_ctx=128, rpc_servers=tuple(s.endpoint for s in two_servers))) as target:
        assert greedy(target, "Once upon a time") == expected


def test_hung_rpc_server_fails_within_the_rpc_timeout(stories, truncated_draft, two_servers):
    # SIGSTOP: the kernel still acknowledges, the server never answers; without the receive
    # timeout llama.cpp would wait forever.
    result, seconds = run_and_break(stories, truncated_draft, two_servers, signal.SIGSTOP,
                                    env={"LLAMASPEC_RPC_TIMEOUT": "3"})
    assert seconds < 30, seconds
    assert_one_clear_error(result, two_servers[1])


def test_rpc_server_survives_its_client_dying(stories, truncated_draft, two_servers):
    for server in two_servers:  # built by scripts/build_rpc.sh with SIGPIPE ignored
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        sig_ign = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
        assert sig_ign & (1 << (signal.SIGPIPE - 1)), "rpc-server dies of SIGPIPE when a client vanishes"
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(stories), str(truncated_draft),
                                 ",".join(s.endpoint for s in two_servers)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.stdout is not None and proc.stdout.readline().strip() == "GENERATING"
        proc.kill()
        proc.wait()
    assert all(server.proc.poll() is None for server in two_servers)
    with Model(stories, ModelOptions(n_ctx=128)) as local:
        expected = greedy(local, "Once upon a time")
    with Model(stories, ModelOptions(n_ctx=128, rpc_servers=tuple(s.endpoint for s in two_servers))) as target:
        assert greedy(target, "Once upon a time") == expected


def test_serve_survives_a_lost_rpc_server(stories, truncated_draft, two_servers, rpc_server_bin):
    """The server answers the running and the queued request with an error, stays up (same
    pid, same port) answering 503, and serves again once the rpc-server is back."""
    import httpx
    from test_serve import Server

    server = Server("--target", stories, "--draft", truncated_draft, "--k", "3", "--parallel", "1", "--ctx", "256",
                    "--target-rpc", ",".join(s.endpoint for s in two_servers))
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}
        expected = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        assert expected

        victim = two_servers[1]
        victim.proc.send_signal(signal.SIGSTOP)  # the next request blocks inside llama.cpp's RPC call
        answers: dict[str, httpx.Response] = {}

        def request(name: str, stream: bool) -> None:
            answers[name] = httpx.post(server.url + "/v1/completions", json={**body, "stream": stream}, timeout=60)

        def metric_reaches(name: str, value: float) -> None:  # /metrics answers while a slot is stuck
            deadline = time.monotonic() + 30
            while server.metrics()[name] != value:
                assert time.monotonic() < deadline, (name, server.metrics())
                time.sleep(0.05)

        running = threading.Thread(target=request, args=("running", True))
        running.start()
        metric_reaches("llamaspec_slots_busy", 1)  # in the slot, blocked in llama.cpp's RPC call
        queued = threading.Thread(target=request, args=("queued", False))
        queued.start()
        metric_reaches("llamaspec_queue_depth", 1)  # waiting for that slot
        assert "running" not in answers and "queued" not in answers
        broken = time.monotonic()
        victim.proc.kill()
        running.join(30)
        queued.join(30)
        assert time.monotonic() - broken < 30
        events = [line[6:] for line in answers["running"].text.splitlines() if line.startswith("data: ")]
        assert json.loads(events[-2])["error"]["message"].startswith("the target model was lost: RPC server"), events
        assert events[-1] == "[DONE]"
        assert answers["queued"].status_code == 502, answers["queued"].text
        assert victim.endpoint in answers["queued"].json()["error"]["message"]

        deadline = time.monotonic() + 30
        while "restarted after a lost RPC server" not in "".join(server.log) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.process.poll() is None, "".join(server.log)
        health = httpx.get(server.url + "/health", timeout=10)  # the same port, no refused connection
        assert health.status_code == 503 and health.json()["status"] == "unavailable", health.text
        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=10)
        assert refused.status_code == 503 and "unavailable" in refused.json()["error"]["message"], refused.text
        assert server.metrics()["llamaspec_restarts_total"] == 1

        two_servers[1] = RpcServer(rpc_server_bin, victim.port)  # back on its port: the target reloads
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "".join(server.log)
            time.sleep(0.5)
        again = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert again.json()["choices"][0]["text"] == expected, again.text
        assert server.metrics()["llamaspec_target_available"] == 1
    finally:
        server.stop()
