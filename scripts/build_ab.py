#!/usr/bin/env python3
"""Which build verifies faster? Two llama.cpp builds, one model, their evaluations alternating.

`scripts/kernel_bench.py` compares the kernel modes of one build in one process; two builds
(two `cpp_patches/` revisions) cannot share a process, and runs taken one after the other mix
the change with the VM's drift (on the Zen 3 VM a verify batch's cost moved 10-20 % between
runs, more than a kernel change moves it). Here each build runs in its own process with the
model loaded and the two take turns: for every round and batch size each evaluates the same
batch at the same cache depth, the order alternating. The idle build is stopped (SIGSTOP), so
its OpenMP threads neither spin nor compete, and each turn's first evaluation, cold after the
other build's, is not counted. Builds are compared by the median of the paired ratios B / A.
Both take the multi-row kernels at every size (batch 1 included), as far as a build has them.

    .venv/bin/python scripts/build_ab.py --lib-a DIR --lib-b DIR [--target NAME] [--threads 2]
        [--rounds 40] [--json FILE]

DIR holds a build's libllama and libggml* libraries (what LLAMA_CPP_LIB_PATH names), e.g. a
copy of .venv/lib/python3.*/site-packages/llama_cpp/lib before rebuilding. POSIX only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.calibrate import N_CONTEXT, at_filler_depth  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.errors import LlamaSpecError  # noqa: E402
from llamaspec.models import DEFAULT_TARGET, sha256_cached  # noqa: E402
from llamaspec.stats import quartiles  # noqa: E402

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def child(target: Path, threads: int) -> None:
    """One build's side: announce the build, then for every batch size read on stdin print the
    milliseconds of its second evaluation."""
    from llamaspec.llama import Model, ModelOptions, Multirow, build_id, set_cpu_kernels, system_info

    with (Model(target, ModelOptions(n_threads=threads, n_ctx=512, huge_pages=True)) as model,
          at_filler_depth([model]) as (base,)):
        set_cpu_kernels(16, Multirow.ALL)  # False on a stock build: it runs its own kernels
        print(json.dumps({"build_id": build_id(), "system_info": system_info()}), flush=True)
        for line in sys.stdin:
            n = int(line)
            for _ in range(2):
                start = time.perf_counter()
                model.eval(base[:n], all_logits=True)
                elapsed = 1000 * (time.perf_counter() - start)
                model.rollback(len(base))
            print(f"{elapsed:.3f}", flush=True)


class Build:
    """A child process running one build, stopped whenever it is not its turn."""

    def __init__(self, label: str, lib: Path, target: Path, threads: int) -> None:
        if not any(lib.glob("libllama*")):
            raise LlamaSpecError(f"build {label}: no libllama library in {lib}")
        self.label = label
        self.errors = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would block the child
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--child", str(target), "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True,
            env=os.environ | {"LLAMA_CPP_LIB_PATH": str(lib)})
        self.info = json.loads(self._line())
        self.process.send_signal(signal.SIGSTOP)

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            self.errors.seek(0)
            errors = [e for e in self.errors.read().strip().splitlines() if e.strip()]
            raise LlamaSpecError(f"build {self.label} stopped: {errors[-1] if errors else 'no message'}")
        return line

    def eval_ms(self, n: int) -> float:
        assert self.process.stdin is not None
        self.process.send_signal(signal.SIGCONT)
        self.process.stdin.write(f"{n}\n")
        self.process.stdin.flush()
        ms = float(self._line())
        self.process.send_signal(signal.SIGSTOP)
        return ms

    def close(self) -> None:
        self.process.send_signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait()
        self.errors.close()


def alternate(builds: list[Build], rounds: int) -> dict[int, list[tuple[float, float]]]:
    """(ms of A, ms of B) per batch size and round; round 0 warms up and is dropped."""
    pairs: dict[int, list[tuple[float, float]]] = {n: [] for n in SIZES}
    for round_ in range(rounds + 1):
        for n in SIZES:
            first = (round_ + n) % 2  # who goes first alternates by round and by size
            ms = {i: builds[i].eval_ms(n) for i in (first, 1 - first)}
            if round_:
                pairs[n].append((ms[0], ms[1]))
    return pairs


def summarize(pairs: dict[int, list[tuple[float, float]]]) -> dict[int, dict[str, float]]:
    out = {}
    for n, ab in pairs.items():
        ratios = [b / a for a, b in ab]
        q1, median, q3 = quartiles(ratios)
        out[n] = {"a_ms": round(statistics.median(a for a, _ in ab), 2),
                  "b_ms": round(statistics.median(b for _, b in ab), 2),
                  "b_over_a": round(median, 3), "q1": round(q1, 3), "q3": round(q3, 3)}
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        try:
            child(Path(sys.argv[2]), int(sys.argv[4]))
        except LlamaSpecError as exc:
            print(exc, file=sys.stderr)  # the parent reports this line
            return 1
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib-a", type=Path, required=True)
    parser.add_argument("--lib-b", type=Path, required=True)
    parser.add_argument("--target", default=None, help="GGUF path or registered name (default: the Qwen target)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1:
        print("error: --rounds and --threads must be >= 1", file=sys.stderr)
        return 2
    builds: list[Build] = []
    # a terminated run still ends its builds (the finally below): a stopped child would linger
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        path = resolve_model(args.target or DEFAULT_TARGET)
        if not path.is_file():
            raise LlamaSpecError(f"model file not found: {path}")
        for label, lib in (("A", args.lib_a), ("B", args.lib_b)):
            builds.append(Build(label, lib, path, args.threads))
        summary = summarize(alternate(builds, args.rounds))
    except LlamaSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        for build in builds:
            build.close()
    report = {"target": str(path), "sha256": sha256_cached(path), "threads": args.threads, "rounds": args.rounds,
              "cache_depth": N_CONTEXT, "a": {"lib": str(args.lib_a), **builds[0].info},
              "b": {"lib": str(args.lib_b), **builds[1].info}, "by_batch": summary}
    print(f"{path.name}, {args.threads} threads, {args.rounds} rounds; A = {args.lib_a}, B = {args.lib_b}")
    print("   n      A ms      B ms   B / A (paired: q1 / median / q3)")
    for n, row in summary.items():
        print(f"{n:4d}{row['a_ms']:10.2f}{row['b_ms']:10.2f}   {row['q1']:.3f} / {row['b_over_a']:.3f} / {row['q3']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
