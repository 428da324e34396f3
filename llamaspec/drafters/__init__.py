"""Drafters propose tokens for the target to verify; adding one is adding a file here.

A drafter sees the whole context (prompt + accepted output) at every step and keeps any
state of its own in sync with it, so the loop never has to tell it what was rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ..sampling import Sampler


@dataclass
class Draft:
    """Proposed tokens; `probs[i]` is the distribution tokens[i] was sampled from, or None
    for a deterministic proposal (greedy draft model, n-gram lookup)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] | None = None


class Drafter(Protocol):
    def prefill(self, prompt: Sequence[int]) -> None:
        """Catch up with the prompt before the first step, so that work counts as prompt
        processing (llama.cpp's speculative example decodes the prompt with both models before
        it starts timing generation) and not as the first step's drafting."""
        ...

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        """Up to max_k tokens likely to follow `context` (may return fewer, even none)."""
        ...

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """Feedback after verification, for drafters that adapt."""
        ...

    def close(self) -> None:
        ...


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
