#!/usr/bin/env python3
"""Which draft is faster? Two or more drafts paired prompt by prompt in one process.

`llamaspec bench` pairs plain and speculative decoding; comparing two drafts across two bench
runs mixes the drafts' difference with the machine's drift between the runs (on the Zen 4 VM a
decode moves between 25 and 34 ms within minutes, more than drafts differ by). Here every
prompt runs plain and with each draft back to back, the order rotating from prompt to prompt,
and the drafts are compared by the median of their per-prompt ratios. Each draft gets its own
decoder, so the target is loaded once per draft.

    .venv/bin/python scripts/compare_drafts.py --draft NAME --draft NAME [--category code]
        [--max-tokens 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.bench import report_median  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.decoder import SpeculativeDecoder  # noqa: E402
from llamaspec.errors import LlamaSpecError  # noqa: E402
from llamaspec.models import DEFAULT_TARGET  # noqa: E402
from llamaspec.prompts import load_prompts  # noqa: E402


def paired_runs(args: argparse.Namespace) -> list[dict]:
    """Per prompt: tokens/s plain and with each draft, back to back, and whether all agree."""
    prompts = load_prompts(None, args.category, None)
    with ExitStack() as stack:
        decoders = {name: stack.enter_context(SpeculativeDecoder(resolve_model(args.target), resolve_model(name)))
                    for name in args.draft}
        first = decoders[args.draft[0]]
        runs = ["plain", *args.draft]
        rows = []
        for index, item in enumerate(prompts):
            order = runs[index % len(runs):] + runs[:index % len(runs)]
            # one target for every decoder, so one tokenization serves every run
            tokens = first.prompt_tokens(item["prompt"], chat=first.chat_format.has_template)
            tps, outputs = {}, {}
            for run in order:
                decoder = first if run == "plain" else decoders[run]
                decoder.reset()
                outputs[run] = list(decoder.generate(tokens, max_tokens=args.max_tokens, speculative=run != "plain"))
                tps[run] = decoder.stats.tokens_per_second
            identical = all(outputs[name] == outputs["plain"] for name in args.draft)
            rows.append({"id": item["id"], "category": item["category"], "tokens_per_second": tps, "identical": identical})
            print(f"{item['id']:12} plain {tps['plain']:5.1f} tok/s  "
                  + "  ".join(f"{name} {tps[name] / tps['plain']:.2f}x" for name in args.draft)
                  + f"  identical {identical}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="append", required=True, help="repeatable: the drafts to compare")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--category", action="append", help="repeatable (default: the whole suite)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if len(set(args.draft)) < 2:
        print("error: name at least two different drafts", file=sys.stderr)
        return 2
    try:
        rows = paired_runs(args)
    except LlamaSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    base = args.draft[0]

    def ratios(name: str, to: str) -> list[float]:
        return [r["tokens_per_second"][name] / r["tokens_per_second"][to] for r in rows]

    summary = {
        "n_prompts": len(rows),
        "identical": sum(row["identical"] for row in rows),
        "median_speedup": {name: report_median(ratios(name, "plain")) for name in args.draft},
        f"median_ratio_to_{base}": {name: report_median(ratios(name, base)) for name in args.draft[1:]},
        f"faster_than_{base}": {name: sum(r["tokens_per_second"][name] > r["tokens_per_second"][base] for r in rows)
                                for name in args.draft[1:]},
    }
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "prompts": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
