"""N-gram lookup when the context offers a long match, the draft model otherwise."""

from __future__ import annotations

from typing import Sequence

from ..sampling import Sampler
from . import Draft, Drafter
from .ngram import NgramDrafter


class HybridDrafter:
    """A long n-gram match is nearly free and, in edits, usually right; short or missing
    matches fall back to the draft model. Feedback goes to whichever drafted."""

    def __init__(self, ngram: NgramDrafter, model: Drafter, min_tokens: int = 2):
        self.ngram, self.model = ngram, model
        self.min_tokens = min_tokens
        self._last: Drafter | None = None

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        draft = self.ngram.propose(context, max_k, sampler)
        if len(draft.tokens) >= min(self.min_tokens, max_k):
            self._last = self.ngram
            return draft
        self._last = self.model
        return self.model.propose(context, max_k, sampler)

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        if self._last is not None:
            self._last.observe(n_drafted, n_accepted)

    def close(self) -> None:
        self.model.close()
