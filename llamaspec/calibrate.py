"""Measure what a verify batch and a draft token cost on this machine, once per model pair.

The adaptive policy needs the target's cost for each batch size (not monotonic on CPU) and
the drafter's cost per token. Results are cached per model file (path, size, mtime), llama.cpp
build, thread count and flash-attention setting, since they change with any of these.
"""

from __future__ import annotations

import statistics
import time

from .llama import Model, build_id, system_info
from .models import remembered

_FILLER = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
N_CONTEXT = 64  # measure at a realistic cache depth, not at position 0
MEASURE_METHOD = 2  # in the cache key: curves measured another way are measured again


def settings_key(model: Model) -> str:
    """Everything besides the model file that decides which kernels run and how they round:
    the one place cached measurements (cost curves, strict-mode audits) are keyed by. The build
    is part of it: a patched or differently compiled llama.cpp has other costs and results."""
    options = model.options
    return (f"{system_info()}|build={build_id()}|threads={options.n_threads}|fa={options.flash_attn}|repack={options.repack}"
            f"|n_batch={options.n_batch}|gpu={options.n_gpu_layers}|rpc={','.join(options.rpc_servers)}")


def _key(model: Model, sizes: list[int]) -> str:
    stat = model.path.stat()
    return (f"{model.path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}|{settings_key(model)}|sizes={','.join(map(str, sizes))}"
            f"|method={MEASURE_METHOD}")


def filler_tokens(model: Model) -> list[int]:
    """N_CONTEXT tokens of code: the cache depth and the batch contents costs are measured with."""
    return model.tokenize(_FILLER * 8, add_special=False)[:N_CONTEXT]


def measure_eval_ms(model: Model, sizes: list[int], repeats: int = 5) -> dict[int, float]:
    """Median milliseconds of one `eval(all_logits=True)` of n tokens, for each n.

    The sizes take turns (1, 2, ..., 1, 2, ...) rather than being timed one after another, so a
    slow stretch of a shared machine lands on every size a little instead of on one size: a
    batch-1 cost inflated by 25 % once made batch 2 look cheap and the policy draft at a loss."""
    saved = list(model.tokens)
    base = filler_tokens(model)
    model.reset()
    model.eval(base)
    model.eval(base[: max(sizes)], all_logits=True)  # warm-up: first calls allocate
    model.rollback(len(base))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            start = time.perf_counter()
            model.eval(base[:n], all_logits=True)
            times[n].append(time.perf_counter() - start)
            model.rollback(len(base))
    model.reset()
    if saved:
        model.eval(saved)
    return {n: round(1000 * statistics.median(t), 2) for n, t in times.items()}


def eval_costs(model: Model, sizes: list[int]) -> dict[int, float]:
    """measure_eval_ms, remembered across runs."""
    costs = remembered("costs", _key(model, sizes), lambda: measure_eval_ms(model, sizes))
    return {int(n): float(ms) for n, ms in costs.items()}
