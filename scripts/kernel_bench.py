#!/usr/bin/env python3
"""Verify-batch cost of the CPU kernels, stock against patched, side by side in one process.

For each n the target evaluates n tokens (logits on every row) at a cache depth of 64, the
way a verify batch does. The kernel modes alternate inside every repeat, so drift on a shared
machine hits all of them alike:

  stock     GGML_CPU_BATCH_INVARIANT=0: llama.cpp's own kernels (sgemm, repacked gemm, ...)
  per-row   batch-invariant, every row its own gemv / vec_dot (cpp_patches/0001)
  multirow  batch-invariant with the multi-row kernels (cpp_patches/0002; the default build),
            a batch of 1 included

Printed: ms per eval (the median over rounds) and the ratio to n = 1 for each mode; for
multirow also the ratio to the faster batch-1 kernel (single-row, per-row's n = 1, or
multi-row), the one llamaspec decodes with (calibrate.choose_batch1_kernels), so a verify
batch's true cost; batch 1 of per-row and multirow over stock's in the same round (quartiles
of the paired ratios, which keep the machine's drift out of the comparison); the achieved
weight bandwidth at n = 1 (GB/s: matmul weight bytes read per token / time) and the effective
int8 multiply-add rate at n = 16 (GMAC/s: 16 x weight elements / time) — the two physical
limits.

--by-type then loads the model again with every graph node timed alone (llama/profile.py)
and prints, for stock and multirow, ms per weight type (the matrix products by their weights'
type), attention, and the rest: where a verify batch's cost goes at each n.

    .venv/bin/python scripts/kernel_bench.py [--target NAME|PATH] [--threads 2] [--repeats 5]
        [--by-type] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.calibrate import N_CONTEXT, filler_tokens  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.errors import LlamaSpecError  # noqa: E402
from llamaspec.llama import Model, ModelOptions, Multirow, set_cpu_kernels, system_info  # noqa: E402
from llamaspec.llama.profile import by_operation  # noqa: E402
from llamaspec.models import DEFAULT_TARGET, sha256_cached  # noqa: E402
from llamaspec.stats import quartiles  # noqa: E402

SIZES = [1, 2, 3, 4, 6, 8, 12, 16]
MODES = {"stock": (0, Multirow.OFF), "per-row": (16, Multirow.OFF), "multirow": (16, Multirow.ALL)}
BY_TYPE_MODES = {mode: MODES[mode] for mode in ("stock", "multirow")}


def matmul_weights(path: Path) -> tuple[int, int]:
    """Bytes and elements of the weights a token's forward pass multiplies with (every 2-D
    tensor but the embedding lookup, which is the output head too when the model has none)."""
    import gguf

    tensors = [t for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2]
    has_output = any(t.name == "output.weight" for t in tensors)
    used = [t for t in tensors if t.name != "token_embd.weight" or not has_output]
    return sum(int(t.n_bytes) for t in used), sum(int(t.n_elements) for t in used)


def measure(model: Model, modes: dict[str, tuple[int, Multirow]], repeats: int,
            parts: Callable[[Model, float], dict[str, float]] = lambda _model, ms: {"eval": ms},
            ) -> dict[str, dict[int, dict[str, list[float]]]]:
    """Milliseconds by mode, batch size and part, one per round: `parts` splits one
    evaluation's time (by default the whole eval; with --by-type its profile by weight type)."""
    base = filler_tokens(model)
    model.reset()
    model.eval(base)
    times: dict[str, dict[int, dict[str, list[float]]]] = {
        mode: {n: defaultdict(list) for n in SIZES} for mode in modes}
    for round_ in range(repeats + 1):  # round 0 warms up every mode
        for mode, (batch_invariant, multirow) in modes.items():
            set_cpu_kernels(batch_invariant, multirow)
            for n in SIZES:
                start = time.perf_counter()
                model.eval(base[:n], all_logits=True)
                elapsed = 1000 * (time.perf_counter() - start)
                model.rollback(len(base))
                for part, ms in parts(model, elapsed).items():
                    if round_:
                        times[mode][n][part].append(ms)
    set_cpu_kernels(16)
    return times


def medians(times: dict[str, dict[int, dict[str, list[float]]]]) -> dict[str, dict[int, dict[str, float]]]:
    return {mode: {n: {part: round(statistics.median(t), 2) for part, t in by_part.items()}
                   for n, by_part in by_n.items()} for mode, by_n in times.items()}


def batch1_against_stock(times: dict[str, dict[int, dict[str, list[float]]]]) -> dict[str, dict[str, float]]:
    """Each batch-invariant mode's batch 1 over stock's in the same round, as quartiles: on a
    noisy machine medians taken apart swing by +-10 %, while the rounds' paired ratios keep
    the drift that hits both out of the comparison."""
    stock = times["stock"][1]["eval"]
    out = {}
    for mode in times:
        if mode != "stock":
            ratios = [ms / base for ms, base in zip(times[mode][1]["eval"], stock)]
            q1, median, q3 = quartiles(ratios)
            out[mode] = {"q1": round(q1, 3), "median": round(median, 3), "q3": round(q3, 3)}
    return out


def profiled(model: Model, _elapsed: float) -> dict[str, float]:
    """The nodes of the evaluation just made, summed by weight type (llama/profile.py)."""
    assert model.op_timer is not None
    return by_operation(model.op_timer.take())


def print_by_type(by_type: dict[str, dict[int, dict[str, float]]]) -> None:
    for mode, by_n in by_type.items():
        parts = sorted({part for ms in by_n.values() for part in ms}, key=lambda p: (p == "other", p))
        print(f"{mode}, ms per part (each node computed alone):")
        print("n".rjust(4) + "".join(part.rjust(11) for part in parts) + "sum".rjust(9))
        for n, ms in by_n.items():
            print(str(n).rjust(4) + "".join(f"{ms.get(part, 0.0):11.2f}" for part in parts)
                  + f"{sum(ms.values()):9.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="GGUF path or registered name (default: the Qwen target)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--by-type", action="store_true",
                        help="also profile every graph node: ms per weight type, attention and the rest")
    args = parser.parse_args()
    if args.repeats < 1 or args.threads < 1:
        print("error: --repeats and --threads must be >= 1", file=sys.stderr)
        return 2
    try:
        path = resolve_model(args.target or DEFAULT_TARGET)
        if not set_cpu_kernels(16):
            raise LlamaSpecError("this llama-cpp-python has no kernel switch: it is not the patched build "
                                 "(scripts/install.sh builds it; LLAMASPEC_STOCK=1 builds stock)")
        with Model(path, ModelOptions(n_threads=args.threads, n_ctx=512, huge_pages=True)) as model:
            times = measure(model, MODES, args.repeats)
        costs = {mode: {n: ms["eval"] for n, ms in by_n.items()} for mode, by_n in medians(times).items()}
        if args.by_type:
            with Model(path, ModelOptions(n_threads=args.threads, n_ctx=512, profile_ops=True, huge_pages=True)) as model:
                by_type = medians(measure(model, BY_TYPE_MODES, args.repeats, profiled))
    except LlamaSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    weight_bytes, weight_elements = matmul_weights(path)
    report = {
        "target": str(path), "sha256": sha256_cached(path), "threads": args.threads, "repeats": args.repeats,
        "cache_depth": N_CONTEXT, "build": system_info(), "ms": costs,
        "ratio_to_1": {mode: {n: round(ms / by_n[1], 3) for n, ms in by_n.items()} for mode, by_n in costs.items()},
        "gb_per_s_at_1": {mode: round(weight_bytes / (by_n[1] / 1000) / 1e9, 1) for mode, by_n in costs.items()},
        "gmac_per_s_at_16": {mode: round(16 * weight_elements / (by_n[16] / 1000) / 1e9, 1)
                             for mode, by_n in costs.items()},
    }
    best_1 = min(costs["per-row"][1], costs["multirow"][1])
    report["multirow_ratio_to_faster_1"] = {n: round(ms / best_1, 3) for n, ms in costs["multirow"].items()}
    report["batch1_over_stock"] = batch1_against_stock(times)
    print(f"{path.name}, {args.threads} threads, median of {args.repeats}; ms per eval (ratio to n = 1)")
    print("n".rjust(4) + "".join(mode.rjust(20) for mode in MODES) + "  multirow / faster n=1")
    for n in SIZES:
        print(str(n).rjust(4) + "".join(f"{costs[m][n]:10.1f} ({report['ratio_to_1'][m][n]:5.2f}x)".rjust(20)
                                        for m in MODES) + f"{report['multirow_ratio_to_faster_1'][n]:20.2f}x")
    print("GB/s at n = 1:    " + "  ".join(f"{m} {v}" for m, v in report["gb_per_s_at_1"].items()))
    print("GMAC/s at n = 16: " + "  ".join(f"{m} {v}" for m, v in report["gmac_per_s_at_16"].items()))
    print("n = 1 over stock, paired by round (q1 / median / q3): " + "  ".join(
        f"{m} {q['q1']:.3f} / {q['median']:.3f} / {q['q3']:.3f}" for m, q in report["batch1_over_stock"].items()))
    if args.by_type:
        report["ms_by_type"] = by_type
        print_by_type(by_type)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
