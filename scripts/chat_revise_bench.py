#!/usr/bin/env python3
"""A multi-turn chat that writes code and then revises it: plain vs lookup drafters, in one process.

Each revision asks for the whole code again, so most of every answer repeats an earlier one:
the case the suffix drafter (whose trie holds the whole session) is for. The conversation runs
once per mode and round (mode order reversed in the second round, so drift hits all alike);
printed per mode: median tokens/s over the rounds, speedup over plain, acceptance, and whether
every reply equals plain decoding's.

    .venv/bin/python scripts/chat_revise_bench.py [--target NAME] [--draft NAME] [--max-tokens 320]
        [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.chat_session import ChatSession  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.decoder import SpeculativeDecoder  # noqa: E402
from llamaspec.llama import ModelOptions  # noqa: E402
from llamaspec.models import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402

TURNS = [
    "Write a Python class Inventory that stores item names with quantities, with methods add, remove "
    "(raising KeyError for unknown items) and report (one line per item). Show only the code.",
    "Add a docstring to the class and to every method. Show the whole class again, only the code.",
    "Rename the class to Stock and the method report to summary. Show the whole class again, only the code.",
    "Add type hints to every method. Show the whole class again, only the code.",
]


def converse(decoder: SpeculativeDecoder, max_tokens: int) -> dict:
    decoder.reset()
    session = ChatSession(decoder, max_tokens=max_tokens)
    replies = [session.ask(text) for text in TURNS]
    stats = session.totals.stats
    return {"replies": replies, "tps": stats.tokens_per_second, "acceptance": stats.acceptance_rate,
            "n_generated": stats.n_generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    target, draft, options = resolve_model(args.target), resolve_model(args.draft), ModelOptions(n_ctx=4096, huge_pages=True)
    decoders = {"plain": SpeculativeDecoder(target, None, options=options),
                "suffix": SpeculativeDecoder(target, None, drafter="suffix", options=options),
                "hybrid": SpeculativeDecoder(target, draft, drafter="hybrid", options=options)}
    runs: dict[str, list[dict]] = {mode: [] for mode in decoders}
    for round_ in range(args.rounds):
        for mode in list(decoders)[:: 1 if round_ % 2 == 0 else -1]:
            runs[mode].append(converse(decoders[mode], args.max_tokens))
            print(f"round {round_ + 1} {mode}: {runs[mode][-1]['tps']:.2f} tok/s", file=sys.stderr, flush=True)
    plain_tps = statistics.median(r["tps"] for r in runs["plain"])
    report = {}
    for mode, results in runs.items():
        tps = statistics.median(r["tps"] for r in results)
        report[mode] = {"median_tps": round(tps, 3), "speedup": round(tps / plain_tps, 3),
                        "acceptance": round(statistics.median(r["acceptance"] for r in results), 3),
                        "n_generated": results[0]["n_generated"],
                        "identical": all(r["replies"] == runs["plain"][0]["replies"] for r in results)}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    for decoder in decoders.values():
        decoder.close()


if __name__ == "__main__":
    main()
