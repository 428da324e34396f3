#!/usr/bin/env python3
"""Which target quantization should a CPU user pick? `llamaspec bench` for each target type.

For every target (default: the shipped 1.5B as Q4_K_M and requantized to Q4_0, Q8_0 and F16)
the same draft, prompts and settings run through `run_bench` (plain and speculative
alternating in one process), and one markdown table row is printed: plain tok/s,
speculative tok/s, speedup, acceptance, identical outputs and the verify cost of 2/4/8/16
tokens relative to one decode.

    .venv/bin/python scripts/quant_matrix.py [--target NAME ...] [--draft NAME] [--category code]
        [--max-tokens 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.bench import BenchConfig, run_bench  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.models import DEFAULT_DRAFT  # noqa: E402
from llamaspec.prompts import load_prompts  # noqa: E402

TARGETS = ["qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-q4_0", "qwen2.5-coder-1.5b-q8_0", "qwen2.5-coder-1.5b-f16"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", help=f"repeatable (default: {', '.join(TARGETS)})")
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--category", action="append", help="repeatable (default: code)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    prompts = load_prompts(None, args.category or ["code"], None)
    print("| target | plain tok/s | speculative tok/s | speedup | acceptance | identical "
          "| verify 2 / 4 / 8 / 16 (x one decode) |\n|---|---|---|---|---|---|---|", flush=True)
    reports = {}
    for name in args.target or TARGETS:
        config = BenchConfig(resolve_model(name), resolve_model(args.draft), max_tokens=args.max_tokens, reference=False)
        report = reports[name] = run_bench(config, prompts)
        s, curve = report["summary"]["overall"], report["meta"]["verify_ms_by_batch"]
        ratios = " / ".join(f"{curve[n] / curve[1]:.2f}" for n in (2, 4, 8, 16))
        print(f"| {name} | {s['median_plain_tps']:.1f} | {s['median_speculative_tps']:.1f} | "
              f"{s['median_speedup']:.2f}x | {s['median_acceptance']:.2f} | {s['identical']}/{s['n_prompts']} "
              f"| {ratios} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
