#!/usr/bin/env python3
"""Plain vs speculative tokens/s with the target on two loopback rpc-servers, at added latencies.

Starts two `.rpc/bin/rpc-server` processes on 127.0.0.1 and a TCP proxy in front of each that
delays every chunk by half the added round-trip time in each direction (a userspace stand-in
for `tc netem`, which this kernel lacks). The target's layers go to the servers through the
proxies, the draft stays local; for each added RTT, plain and speculative greedy decoding
alternate (order flipped per repeat) on the same loaded models. One JSON row per measurement.

    python scripts/rpc_latency_bench.py --delays 0,1,5,20 --max-tokens 128 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python function that returns the prime numbers below n with the sieve of Eratosthenes."


class DelayProxy:
    """listen port -> target port on 127.0.0.1, each chunk forwarded `delay_ms / 2` later."""

    def __init__(self, targets: list[int]):
        self.delay_s = 0.0
        self.ports: list[int] = []
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(targets, ready), daemon=True).start()
        ready.wait()

    def _run(self, targets: list[int], ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        for target in targets:
            server = self._loop.run_until_complete(
                asyncio.start_server(lambda r, w, t=target: self._handle(r, w, t), "127.0.0.1", 0))
            self.ports.append(server.sockets[0].getsockname()[1])
        ready.set()
        self._loop.run_forever()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            while True:
                data = await reader.read(1 << 20)
                await queue.put((time.monotonic() + self.delay_s / 2, data))
                if not data:
                    return

        async def write() -> None:
            while True:
                due, data = await queue.get()
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        await asyncio.gather(read(), write())

    async def _handle(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter, target: int) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", target)
        for w in (w1, w2):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(self._pump(r1, w2), self._pump(r2, w1))
        except (ConnectionError, OSError):
            pass
        finally:
            w1.close()
            w2.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-q4_0")
    parser.add_argument("--delays", default="0,1,5,20", help="Added round-trip times in ms.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="Threads of the client and of each server.")
    args = parser.parse_args()

    from llamaspec.cli_common import resolve_model
    from llamaspec.decoder import SpeculativeDecoder
    from llamaspec.llama import ModelOptions

    binary = REPO / ".rpc" / "bin" / "rpc-server"
    ports = [free_port(), free_port()]
    servers = [subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(p), "-t", str(args.threads)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    try:
        time.sleep(1.0)
        proxy = DelayProxy(ports)
        options = ModelOptions(n_ctx=1024, n_threads=args.threads,
                               rpc_servers=tuple(f"127.0.0.1:{p}" for p in proxy.ports))
        with SpeculativeDecoder(resolve_model(args.target), resolve_model(args.draft), k=args.k, drafter="model",
                                options=options) as decoder:
            prompt = decoder.prompt_tokens(PROMPT, chat=True)

            def run(speculative: bool) -> tuple[list[int], float, float]:
                decoder.reset()
                tokens = list(decoder.generate(prompt, max_tokens=args.max_tokens, speculative=speculative))
                return tokens, decoder.stats.tokens_per_second, decoder.stats.acceptance_rate

            run(False)  # warm-up
            for delay in (float(d) for d in args.delays.split(",")):
                proxy.delay_s = delay / 1000
                for repeat in range(args.repeats):
                    order = (False, True) if repeat % 2 == 0 else (True, False)
                    result = {spec: run(spec) for spec in order}
                    (plain, plain_tps, _), (spec, spec_tps, acceptance) = result[False], result[True]
                    print(json.dumps({"added_rtt_ms": delay, "repeat": repeat, "plain_tps": round(plain_tps, 2),
                                      "speculative_tps": round(spec_tps, 2),
                                      "speedup": round(spec_tps / plain_tps, 3), "acceptance": round(acceptance, 3),
                                      "identical": plain == spec, "k": args.k}), flush=True)
    finally:
        for server in servers:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
