#!/usr/bin/env python3
"""A bounded load generator for `llamaspec serve`, loopback only.

For each concurrency level and speculation on/off, it sends that many streaming chat
requests at once (prompts from the shipped suite, greedy, --max-tokens each) and reports
aggregate tokens/s, p50/p99 time to first token, p50/p99 per-token latency per stream, and how
many tokens the slots drafted per generated token. With --repeats N each level runs N rounds,
speculation off and on alternating in order, and the summary gives each round's ratio and their
median: the machine's state moves between rounds by more than small differences. Each round
takes the next prompts of the suite (off and on get the same ones): a server slot's suffix
trie remembers the answers it gave, so a prompt sent again drafts its old answer and favours
speculation. It says so when the suite runs out and prompts repeat.

    llamaspec serve --parallel 8 --port 8080 &
    python scripts/serve_load.py --url http://127.0.0.1:8080 --streams 1,8 --json load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from urllib.parse import urlparse

import httpx

from llamaspec.prompts import load_prompts


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def one_stream(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, speculative: bool,
                     headers: dict[str, str]) -> dict[str, float]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "speculative": {"enabled": speculative}}
    start = time.perf_counter()
    first = last = None
    n_tokens = n_drafted = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
            if "speculative" in chunk:
                n_tokens = chunk["speculative"]["n_generated"]
                n_drafted = chunk["speculative"]["n_drafted"]
    assert first is not None and last is not None
    return {"ttft_s": first - start, "tokens": n_tokens, "drafted": n_drafted, "end_s": last - start,
            "per_token_ms": 1000 * (last - first) / max(n_tokens - 1, 1)}


async def level(url: str, prompts: list[str], max_tokens: int, speculative: bool,
                headers: dict[str, str]) -> dict[str, object]:
    """One stream per prompt, all at once."""
    streams = len(prompts)
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one_stream(client, url, prompt, max_tokens, speculative, headers)
                                         for prompt in prompts))
        wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft_s"] for r in results]
    per_token = [r["per_token_ms"] for r in results]
    return {"streams": streams, "speculative": speculative, "tokens": tokens, "wall_s": round(wall, 3),
            "aggregate_tokens_per_s": round(tokens / wall, 3),
            "drafted_per_token": round(sum(r["drafted"] for r in results) / max(tokens, 1), 3),
            "ttft_s": {"p50": round(percentile(ttft, 50), 3), "p99": round(percentile(ttft, 99), 3)},
            "per_token_ms": {"p50": round(percentile(per_token, 50), 2), "p99": round(percentile(per_token, 99), 2)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--streams", default="1,8", help="Comma-separated concurrency levels.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--category", default="code", help="Prompt category from the shipped suite, or all.")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--repeats", type=int, default=1, help="Rounds per level, off/on order alternating.")
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    if args.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        print("error: the load generator only targets loopback servers", file=sys.stderr)
        return 2
    prompts = [p["prompt"] for p in load_prompts(categories=None if args.category == "all" else [args.category])]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rows = []
    ratios: dict[int, list[float]] = {}
    sent = 0  # prompts taken so far, in suite order
    for n in (int(s) for s in args.streams.split(",")):
        for round_ in range(args.repeats):
            if sent + n > len(prompts) >= sent:
                print(f"warning: the {len(prompts)} prompts repeat from here; a slot's suffix trie has seen "
                      "their answers, which favours speculation", file=sys.stderr)
            chosen = [prompts[(sent + i) % len(prompts)] for i in range(n)]
            sent += n
            pair = {}
            for speculative in (False, True) if round_ % 2 == 0 else (True, False):
                row = asyncio.run(level(args.url, chosen, args.max_tokens, speculative, headers))
                row["round"] = round_
                print(json.dumps(row), flush=True)
                rows.append(row)
                pair[speculative] = row["aggregate_tokens_per_s"]
            ratios.setdefault(n, []).append(round(pair[True] / pair[False], 3))
    first = [r for r in rows if r["round"] == 0]
    base = {r["speculative"]: r["aggregate_tokens_per_s"] for r in first if r["streams"] == first[0]["streams"]}
    summary = {"levels": rows, "aggregate_vs_first_level": {
        f"{r['streams']}x{'spec' if r['speculative'] else 'plain'}":
            round(r["aggregate_tokens_per_s"] / base[r["speculative"]], 3) for r in first},
        "speculative_over_plain": {str(n): {"rounds": values, "median": round(statistics.median(values), 3)}
                                   for n, values in ratios.items()}}
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=2)
    print(json.dumps(summary["aggregate_vs_first_level"]))
    print(json.dumps(summary["speculative_over_plain"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
