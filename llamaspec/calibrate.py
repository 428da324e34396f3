"""Measure what a verify batch and a draft token cost on this machine, once per model pair.

The adaptive policy needs the target's cost for each batch size (not monotonic on CPU) and
the drafter's cost per token. Results are cached per model file (path, size, mtime), llama.cpp
build, thread count and flash-attention setting, since they change with any of these.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from typing import Callable, Iterator, Sequence, TypeVar

from .llama import Model, Multirow, batch1_kernel_choice, build_id, cpu_kernel_settings, set_cpu_kernels, system_info
from .models import remembered

_FILLER = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
N_CONTEXT = 64  # measure at a realistic cache depth, not at position 0
PROMPT_TOKENS = 128  # the prompt choose_prompt_rows times
MEASURE_METHOD = 3  # in the cache key: curves measured another way are measured again
T = TypeVar("T")


def settings_key(model: Model) -> str:
    """Everything besides the model file that decides which kernels run and how they round:
    the one place cached measurements (cost curves, strict-mode audits) are keyed by. The build
    is part of it: a patched or differently compiled llama.cpp has other costs and results."""
    options = model.options
    kernels = model.batch1_kernels or cpu_kernel_settings()
    return (f"{system_info()}|build={build_id()}|kernels={kernels}|threads={options.n_threads}"
            f"|fa={options.flash_attn}|repack={options.repack}|n_batch={options.n_batch}|gpu={options.n_gpu_layers}"
            f"|rpc={','.join(options.rpc_servers)}")


def _key(model: Model, sizes: list[int]) -> str:
    stat = model.path.stat()
    return (f"{model.path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}|{settings_key(model)}|sizes={','.join(map(str, sizes))}"
            f"|method={MEASURE_METHOD}")


def filler_tokens(model: Model) -> list[int]:
    """N_CONTEXT tokens of code: the cache depth and the batch contents costs are measured with."""
    return model.tokenize(_FILLER * 8, add_special=False)[:N_CONTEXT]


@contextlib.contextmanager
def at_filler_depth(models: Sequence[Model]) -> Iterator[list[list[int]]]:
    """Each model's cache holding its filler tokens for the block (yielded, one list per model),
    then what it held before."""
    saved = [list(model.tokens) for model in models]
    bases = [filler_tokens(model) for model in models]
    for model, base in zip(models, bases):
        model.reset()
        model.eval(base)
    try:
        yield bases
    finally:
        for model, tokens in zip(models, saved):
            model.reset()
            if tokens:
                model.eval(tokens)


def first_is_faster(model: Model, first: Callable[[list[int]], object], second: Callable[[list[int]], object],
                    repeats: int) -> bool:
    """Whether `first` runs faster than `second` on the model here: each is given the filler
    tokens the cache holds and is timed, the cache rolled back after it; the two take turns,
    the order flipping every round (round 0 warms up), and the median of their ratios within
    each round decides, so a slow stretch of a shared machine weighs on both alike."""
    runs, times = (first, second), ([], [])
    with at_filler_depth([model]) as (base,):
        for round_ in range(repeats + 1):
            for i in (1, 0) if round_ % 2 else (0, 1):
                start = time.perf_counter()
                runs[i](base)
                if round_:
                    times[i].append(time.perf_counter() - start)
                model.rollback(len(base))
    return statistics.median(a / b for a, b in zip(*times)) < 1


def measure_eval_ms(model: Model, sizes: list[int], repeats: int = 5) -> dict[int, float]:
    """The fastest of `repeats` timings of one `eval(all_logits=True)` of n tokens, for each n.

    Noise on a shared machine only ever adds time, and the policies need the sizes' ratios
    more than their absolute cost: a batch-1 cost inflated by 25 % once made batch 2 look
    cheap and the policy draft at a loss. So the sizes take turns (1, 2, ..., 1, 2, ...),
    spreading a slow stretch over every size, and the minimum stands for each: the median
    of 5 still let a batch-1 cost 20 % above the norm into the cache (37.3 ms against 30–31)."""
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with at_filler_depth([model]) as (base,):
        model.eval(base[: max(sizes)], all_logits=True)  # warm-up: first calls allocate
        model.rollback(len(base))
        for _ in range(repeats):
            for n in sizes:
                start = time.perf_counter()
                model.eval(base[:n], all_logits=True)
                times[n].append(time.perf_counter() - start)
                model.rollback(len(base))
    return {n: round(1000 * min(t), 2) for n, t in times.items()}


def announced(what: str, measure: Callable[[], T]) -> Callable[[], T]:
    """`measure`, said on a terminal first: a first run on a new model or build spends tens of
    seconds on it, once, and would otherwise look hung. Not in logs or pipes (tests, servers)."""
    def run() -> T:
        if sys.stderr.isatty():
            print(f"llamaspec: measuring {what} on this machine (once; remembered)", file=sys.stderr, flush=True)
        return measure()
    return run


def eval_costs(model: Model, sizes: list[int]) -> dict[int, float]:
    """measure_eval_ms, remembered across runs."""
    costs = remembered("costs", _key(model, sizes), announced(
        f"{model.path.name}'s cost for batches of {min(sizes)}-{max(sizes)} tokens", lambda: measure_eval_ms(model, sizes)))
    return {int(n): float(ms) for n, ms in costs.items()}


def choose_batch1_kernels(models: Sequence[Model], repeats: int = 15) -> dict[str, Multirow]:
    """Have each model decode single tokens with whichever batch-1 kernel is faster for it here
    (`Model.batch1_kernels`), and return the choices by file name. Both are bit-identical (the
    audit proves it), only speed differs, by CPU and by model: on an Intel Xeon the multi-row
    kernels made a Q4_K_M token 13 % cheaper; on a Zen 4 VM they make a token of the 0.5B Q4_0
    draft 5 % cheaper and one of the 1.5B Q4_K_M target 2 % dearer. Measured once per model and
    settings (the kernels taking turns, the faster by the median of their ratios within each
    round), remembered. Empty where there is no choice (batch1_kernel_choice), for models off
    this CPU, or with GGML_CPU_MULTIROW set by the user (then it stands)."""
    models = [model for model in models if model.options.on_this_cpu]
    settings = batch1_kernel_choice()
    if not models or settings is None or os.environ.get("GGML_CPU_MULTIROW"):
        return {}
    batch_invariant, _, control = settings

    def measure(model: Model) -> int:
        def one_token(mode: Multirow) -> Callable[[list[int]], object]:
            return lambda base: (set_cpu_kernels(batch_invariant, mode, control), model.eval(base[:1], all_logits=True))

        faster = first_is_faster(model, one_token(Multirow.ALL), one_token(Multirow.BATCHES), repeats)
        return int(Multirow.ALL if faster else Multirow.BATCHES)

    chosen: dict[str, Multirow] = {}
    for model in models:
        model.batch1_kernels = None  # measured with the process's switch, which measure() sets
        set_cpu_kernels(batch_invariant, Multirow.BATCHES, control)  # one key, whichever ran before
        mode = Multirow(remembered("batch1_kernels", _key(model, [1]), announced(
            f"which kernels decode one token of {model.path.name} faster", lambda: measure(model))))
        model.batch1_kernels = (batch_invariant, mode, control)
        chosen[model.path.name] = mode
    set_cpu_kernels(batch_invariant, Multirow.BATCHES, control)
    return chosen


def choose_prompt_rows(models: Sequence[Model], repeats: int = 5) -> dict[str, int]:
    """For the server: have each model's prompts go through llama.cpp in pieces of its
    batch-invariant size (the multi-row kernels) where that is faster here than decodes of up
    to n_batch rows (stock's kernels), and return the choices by file name. On the Zen 4 VM
    512 tokens into the Qwen 1.5B Q4_K_M took 22-39 % less time in pieces of 16. Each prompt
    row is then computed alike whatever other requests share its round. Single-sequence
    decoding keeps llama.cpp's own prompt evaluation, which `bench` compares with
    llama-cpp-python's `Llama`. Measured once per model and settings (the two ways taking
    turns, the faster by the median of their ratios within each round), remembered."""
    chosen: dict[str, int] = {}
    for model in models:
        exact = model.exact_rows()
        n_tokens = min(PROMPT_TOKENS, model.n_ctx - N_CONTEXT)  # a small context gets a shorter prompt
        if exact < 2 or model.n_batch <= exact or n_tokens < 2 * exact:
            continue

        def measure(model: Model = model, exact: int = exact, n_tokens: int = n_tokens) -> int:
            prompt = model.tokenize(_FILLER * 32, add_special=False)[:n_tokens]

            def in_pieces(rows: int) -> Callable[[list[int]], object]:
                return lambda _: [model.eval(prompt[piece : piece + rows]) for piece in range(0, len(prompt), rows)]

            return exact if first_is_faster(model, in_pieces(exact), in_pieces(model.n_batch), repeats) else model.n_batch

        model.prompt_rows = int(remembered("prompt_rows", _key(model, [n_tokens]), announced(
            f"how {model.path.name} evaluates a prompt faster", measure)))
        chosen[model.path.name] = model.prompt_rows
    return chosen
