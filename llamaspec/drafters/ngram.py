"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the
context's last n tokens. Free to run, and strong when the answer repeats the input (edits,
refactors, quoting)."""

from __future__ import annotations

from typing import Sequence

from ..policy import DraftPolicy, FixedK
from ..sampling import Sampler
from . import Draft


class NgramDrafter:
    """Longest match first, from `max_ngram` down to `min_ngram` tokens.

    The index maps each n-gram to the position right after its latest occurrence; it is
    extended incrementally as the context grows and rebuilt when the context changes.
    """

    def __init__(self, min_ngram: int = 2, max_ngram: int = 5, policy: DraftPolicy | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.policy = policy or FixedK()
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def _sync(self, context: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(context) < known or list(context[:known]) != self._tokens:
            self._tokens, self._index, known = [], {}, 0
        self._tokens.extend(context[known:])
        # Index n-grams ending before the last token: those have a continuation to copy.
        for end in range(max(known, 1), len(self._tokens)):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._index[tuple(self._tokens[end - n : end])] = end

    def lookup(self, context: Sequence[int], max_k: int) -> list[int]:
        self._sync(context)
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            end = self._index.get(tuple(context[-n:]))
            if end is not None:
                return list(self._tokens[end : end + max_k])
        return []

    def prefill(self, prompt: Sequence[int]) -> None:
        self._sync(prompt)

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        max_k = self.policy.begin(max_k)
        return Draft(self.lookup(context, max_k) if max_k > 0 else [])

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.policy.update(n_drafted, n_accepted)

    def close(self) -> None:
        pass
