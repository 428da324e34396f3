"""Is speculative output really plain output on this model and build? Measure it.

1. Plain greedy decoding records the logits of every step (batches of one token).
2. The same sequences are re-evaluated in verify batches of b = 2..B tokens, exactly as an
   all-accepted speculative run would evaluate them; each row is compared with the plain
   row for the same position: bit-identical or not, max |delta logit|, argmax flips, and the
   smallest top-2 margin seen (how close the model came to a tie).
3. Speculative greedy decoding with a perfect drafter (it proposes the plain output) for
   each k reports where, if anywhere, the output first leaves the plain output.
4. On the patched CPU build, the plain sequences are decoded once more with the other batch-1
   kernel (the multi-row kernels can decode one token too, where that is faster, and the
   single-row kernels are stock llama.cpp's path): both must give the same logits, bit for bit,
   so plain decoding is unchanged whichever runs.
The result says which verify sizes are bit-exact, which `--strict` then restricts k to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .calibrate import announced, settings_key
from .drafters import Draft
from .llama import Model, other_batch1_kernels
from .models import remembered, sha256_cached
from .sampling import Sampler
from .speculative import StepTrace, generate_tokens


def plain_with_rows(model: Model, prompt: list[int], max_tokens: int) -> tuple[list[int], np.ndarray]:
    """Plain greedy output and, for each output token, the logits row that chose it."""
    rows: list[np.ndarray] = []

    def keep(step: StepTrace) -> None:
        rows.append(step.rows[0].copy())

    out = list(generate_tokens(model, prompt, max_tokens=max_tokens, trace=keep))
    return out, np.array(rows[: len(out)])


@dataclass
class BatchComparison:
    """How verify batches of one size compare with sequential decoding."""

    rows_compared: int = 0
    rows_different: int = 0
    max_abs_diff: float = 0.0
    argmax_flips: int = 0
    min_top2_margin: float = float("inf")

    @property
    def bit_identical(self) -> bool:
        return self.rows_compared > 0 and self.rows_different == 0

    def add(self, batch_rows: np.ndarray, sequential_rows: np.ndarray) -> None:
        for batch_row, sequential_row in zip(batch_rows, sequential_rows):
            self.rows_compared += 1
            if not np.array_equal(batch_row, sequential_row):
                self.rows_different += 1
                self.max_abs_diff = max(self.max_abs_diff, float(np.abs(batch_row - sequential_row).max()))
            self.argmax_flips += int(batch_row.argmax() != sequential_row.argmax())
            top2 = np.partition(sequential_row, -2)[-2:]
            self.min_top2_margin = min(self.min_top2_margin, float(abs(top2[1] - top2[0])))

    def to_dict(self) -> dict:
        return {
            "bit_identical": self.bit_identical,
            "rows_compared": self.rows_compared,
            "rows_different": self.rows_different,
            "max_abs_diff": self.max_abs_diff,
            "argmax_flips": self.argmax_flips,
            "min_top2_margin": None if self.rows_compared == 0 else self.min_top2_margin,
        }


def compare_batched(model: Model, prompt: list[int], generated: list[int], sequential_rows: np.ndarray,
                    batch: int, into: BatchComparison) -> None:
    """Evaluate `generated` in chunks of `batch` after the prompt (each chunk starts with the
    previous output token, as a verify batch does) and compare with the sequential rows.
    Output token 0 is skipped: plain and speculative both take it from the prompt batch."""
    sequence = prompt + generated
    model.reset()
    model.eval(prompt)
    start = 1
    while start + batch <= len(generated):
        chunk = sequence[len(prompt) + start - 1 : len(prompt) + start - 1 + batch]
        rows = model.eval(chunk, all_logits=True)
        into.add(rows, sequential_rows[start : start + batch])
        start += batch


class ScriptDrafter:
    """A perfect drafter for the audit: proposes the recorded plain continuation."""

    def __init__(self, script: list[int]):
        self.script = script

    def prefill(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        n = len(context)
        if list(context) != self.script[:n]:
            return Draft()
        return Draft(self.script[n : n + max_k])

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class AuditReport:
    model: str
    batches: dict[int, BatchComparison] = field(default_factory=dict)
    speculative: dict[int, list[int | None]] = field(default_factory=dict)  # k -> first divergence per prompt
    batch1: BatchComparison | None = None  # batch 1, multi-row against single-row kernels (step 4)

    def bit_exact_sizes(self) -> list[int]:
        return [b for b, c in sorted(self.batches.items()) if c.bit_identical]

    def max_exact_k(self) -> int:
        """The largest k whose verify sizes 2..k+1 (and the first step's 1..k) were all bit-exact."""
        k = 0
        for b in sorted(self.batches):
            if not self.batches[b].bit_identical:
                break
            k = b - 1
        return k

    def sentence(self) -> str:
        return self._verify_sentence() + self._batch1_sentence()

    def _batch1_sentence(self) -> str:
        if self.batch1 is None:
            return ""
        if self.batch1.bit_identical:
            return (" Batch 1 is bit-identical with the multi-row and the single-row kernels (stock llama.cpp's "
                    "path for one token).")
        return (f" Batch 1 differs between the multi-row and the single-row kernels (max |delta logit| "
                f"{self.batch1.max_abs_diff:.3g}): this build's output can differ from stock llama.cpp's.")

    def _verify_sentence(self) -> str:
        exact = self.bit_exact_sizes()
        untested = [b for b, c in sorted(self.batches.items()) if c.rows_compared == 0]
        inexact = [b for b in sorted(self.batches) if b not in exact and b not in untested]
        diverged = [k for k, firsts in sorted(self.speculative.items()) if any(d is not None for d in firsts)]
        notes = ""
        if untested:
            notes += (f" Sizes {', '.join(map(str, untested))} were not tested: every prompt ended first (a "
                      "longer --max-tokens tests them).")
        if diverged:  # step 3 ran the loop itself: no row comparison outweighs it
            notes += (f" Speculative greedy output diverged from plain output at k = {', '.join(map(str, diverged))}"
                      " (speculative_first_divergence).")
        if not inexact and not untested:
            claim = "" if diverged else ": speculative greedy output equals plain output"
            return (f"On {self.model} with this build, every verify size from 2 to {max(self.batches)} "
                    f"is bit-exact{claim}.{notes}")
        text = (f"On {self.model} with this build, verify sizes bit-exact with plain decoding: "
                f"{', '.join(map(str, exact)) if exact else 'none'}")
        if inexact:
            worst = max(self.batches[b].max_abs_diff for b in inexact)
            text += (f"; sizes {', '.join(map(str, inexact))} differ (max |delta logit| {worst:.3g}), so output "
                     "can change at near-ties")
        return f"{text}; --strict limits k to {self.max_exact_k()}.{notes}"

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "batch_sizes": {str(b): c.to_dict() for b, c in sorted(self.batches.items())},
            "speculative_first_divergence": {str(k): v for k, v in sorted(self.speculative.items())},
            "bit_exact_sizes": self.bit_exact_sizes(),
            "strict_max_k": self.max_exact_k(),
            "batch1_kernels": None if self.batch1 is None else self.batch1.to_dict(),
            "summary": self.sentence(),
        }


def run_audit(model: Model, prompts: list[list[int]], max_tokens: int, batch_max: int,
              batch1: bool = True) -> AuditReport:
    """Steps 1-3 for every prompt, and step 4 where `batch1` and the model runs on the CPU.
    Every decode runs with the process's kernel settings, which step 4 switches: a batch-1
    choice of the model's own (Model.batch1_kernels) is set aside meanwhile."""
    chosen, model.batch1_kernels = model.batch1_kernels, None
    try:
        report = AuditReport(model.path.name, {b: BatchComparison() for b in range(2, batch_max + 1)},
                             {k: [] for k in range(1, batch_max)})
        batch1 = batch1 and model.options.on_this_cpu
        for prompt in prompts:
            model.reset()
            plain, rows = plain_with_rows(model, prompt, max_tokens)
            if batch1:
                with other_batch1_kernels() as switched:
                    if switched:
                        report.batch1 = report.batch1 or BatchComparison()
                        compare_batched(model, prompt, plain, rows, 1, report.batch1)
            for batch, comparison in report.batches.items():
                compare_batched(model, prompt, plain, rows, batch, comparison)
            for k in report.speculative:
                model.reset()
                out = list(generate_tokens(model, prompt, drafter=ScriptDrafter(prompt + plain), k=k,
                                           max_tokens=max_tokens))
                report.speculative[k].append(next((i for i, (a, b) in enumerate(zip(out, plain)) if a != b),
                                                  None if len(out) == len(plain) else min(len(out), len(plain))))
        model.reset()
        return report
    finally:
        model.batch1_kernels = chosen


def strict_cache_key(model: Model, batch_max: int) -> str:
    return f"{sha256_cached(model.path)}|{settings_key(model)}|batch_max={batch_max}"


def strict_max_k(model: Model, prompts: list[list[int]], max_tokens: int = 48, batch_max: int = 16) -> int:
    """The k --strict may use on this model + build + settings, audited once and cached.
    batch_max 16: the longest verify batch k = "auto" uses (K_MAX 15), all exact on the default build."""
    def audit() -> dict:
        report = run_audit(model, prompts, max_tokens, batch_max, batch1=False)
        return {"max_k": report.max_exact_k(), "summary": report.sentence()}

    what = f"which verify sizes are bit-exact for {model.path.name} (--strict)"
    return int(remembered("strict", strict_cache_key(model, batch_max), announced(what, audit))["max_k"])
