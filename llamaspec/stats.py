"""What a generation did and where its time went, and how generations add up.

Each field says how it merges (its `merge` metadata): counters and times are summed, count
lists (histograms, per-position counts) are added element-wise, and descriptions (mode, k,
verify, stop reason) take the newest value. A session's totals and bench's summary merge by
those marks, so a new field is declared once.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

_SUM, _COUNTS = "sum", "counts"


def _summed(default: Any = 0) -> Any:
    return field(default=default, metadata={"merge": _SUM})


def _counts() -> Any:
    return field(default_factory=list, metadata={"merge": _COUNTS})


@dataclass
class GenerationStats:
    """What one generation did and where its time went (seconds)."""

    mode: str = "plain"
    k: int | str = 0
    verify: str = "greedy"
    n_prompt: int = _summed()
    n_prompt_evaluated: int = _summed()  # prompt tokens actually decoded (the rest came from the KV cache)
    n_generated: int = _summed()
    n_drafted: int = _summed()
    n_accepted: int = _summed()
    n_steps: int = _summed()
    accept_histogram: list[int] = _counts()
    # Per draft position i (0-based): steps that drafted it with 0..i-1 all accepted, and
    # steps where it was accepted too; their ratio is the acceptance by position.
    reached_by_position: list[int] = _counts()
    accepted_by_position: list[int] = _counts()
    prefill_s: float = _summed(0.0)
    draft_s: float = _summed(0.0)
    verify_s: float = _summed(0.0)
    step_s: float = _summed(0.0)  # all time inside steps: draft + verify + Python overhead
    stop_reason: str = ""

    def record_step(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float, step_s: float) -> None:
        self.n_steps += 1
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        add_counts(self.accept_histogram, [0] * n_accepted + [1])  # bucket 0: steps that drafted nothing too
        add_counts(self.reached_by_position, [1] * min(n_drafted, n_accepted + 1))
        add_counts(self.accepted_by_position, [1] * n_accepted)
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.step_s += step_s

    def merge(self, other: GenerationStats) -> None:
        """Add another generation into this one (session totals)."""
        for f in fields(self):
            how, theirs = f.metadata.get("merge"), getattr(other, f.name)
            if how == _SUM:
                setattr(self, f.name, getattr(self, f.name) + theirs)
            elif how == _COUNTS:
                add_counts(getattr(self, f.name), theirs)
            else:
                setattr(self, f.name, theirs)

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return position_acceptance(self.accepted_by_position, self.reached_by_position)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over generation time (prompt processing excluded, as llama.cpp reports)."""
        return self.n_generated / self.step_s if self.step_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        return max(self.step_s - self.draft_s - self.verify_s, 0.0)

    def to_dict(self) -> dict:
        steps = max(self.n_steps, 1)
        return {
            "mode": self.mode,
            "k": self.k,
            "verify": self.verify,
            "n_prompt": self.n_prompt,
            "n_prompt_evaluated": self.n_prompt_evaluated,
            "n_generated": self.n_generated,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "n_steps": self.n_steps,
            "mean_accepted_per_step": round(self.n_accepted / steps, 3),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "accept_histogram": list(self.accept_histogram),
            "acceptance_by_position": self.acceptance_by_position,
            "reached_by_position": list(self.reached_by_position),
            "accepted_by_position": list(self.accepted_by_position),
            "time_s": {
                "prefill": round(self.prefill_s, 4),
                "draft": round(self.draft_s, 4),
                "verify": round(self.verify_s, 4),
                "overhead": round(self.overhead_s, 4),
                "total": round(self.step_s, 4),
            },
            "overhead_ms_per_step": round(1000 * self.overhead_s / steps, 3),
            "stop_reason": self.stop_reason,
        }


# The count lists, by their marks: what bench adds up across a report's records.
COUNT_FIELDS = tuple(f.name for f in fields(GenerationStats) if f.metadata.get("merge") == _COUNTS)


def add_counts(into: list[int], more: Sequence[int]) -> None:
    """Element-wise `into += more`, growing `into` as needed (histograms, position counts)."""
    into.extend([0] * (len(more) - len(into)))
    for i, count in enumerate(more):
        into[i] += count


def position_acceptance(accepted: Sequence[int], reached: Sequence[int]) -> list[float]:
    """P(draft position i accepted | reached) for each position ever reached (a position is
    reached at least as often as it is accepted, so `accepted` may be shorter)."""
    return [round((accepted[i] if i < len(accepted) else 0) / r, 4) for i, r in enumerate(reached) if r]


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of paired ratios, the benchmarks' summary of a comparison that drift
    would blur in medians taken apart; a single value stands for all three. Inclusive: the
    quartiles stay within the values (the default method puts them outside for 2 or 3)."""
    if len(values) > 1:
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return q1, median, q3
    return values[0], values[0], values[0]
