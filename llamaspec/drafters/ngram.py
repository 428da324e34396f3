"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the
context's last n tokens. Free to run, and strong when the answer repeats the input (edits,
refactors, quoting)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..policy import DraftPolicy, FixedK
from ..sampling import Sampler
from . import Draft


class NgramDrafter:
    """Longest match first, from `max_ngram` down to `min_ngram` tokens (`latest_copy`)."""

    def __init__(self, min_ngram: int = 2, max_ngram: int = 5, policy: DraftPolicy | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.policy = policy or FixedK()

    def lookup(self, context: Sequence[int], max_k: int) -> list[int]:
        return latest_copy(context, max_k, self.min_ngram, self.max_ngram)

    def prefill(self, prompt: Sequence[int]) -> None:
        pass  # nothing to index: each lookup scans the context

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        max_k = self.policy.begin(max_k)
        return Draft(self.lookup(context, max_k) if max_k > 0 else [])

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.policy.update(n_drafted, n_accepted)

    def close(self) -> None:
        pass


def latest_copy(tokens: Sequence[int], limit: int, min_n: int = 2, max_n: int = 5) -> list[int]:
    """What followed the latest earlier occurrence of the longest suffix of `tokens` (min_n
    to max_n tokens long), at most `limit` tokens. Stateless: it serves contexts that change
    every call (a draft in progress, a new conversation) at O(len) numpy work a call: 0.1 ms
    for thousands of tokens, nothing next to a model eval."""
    seq = np.asarray(tokens, dtype=np.int64)
    if len(seq) < 2 or limit <= 0:
        return []
    ends = np.flatnonzero(seq[:-1] == seq[-1]) + 1  # after each earlier occurrence of the last token
    n = 1
    while n < max_n and len(ends):
        longer = ends[(ends > n) & (seq[np.maximum(ends - n - 1, 0)] == seq[-n - 1])]
        if not len(longer):
            break
        ends, n = longer, n + 1
    if n < min_n or not len(ends):
        return []
    return seq[ends[-1]: ends[-1] + limit].tolist()
