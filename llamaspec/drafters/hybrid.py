"""A lookup drafter (suffix trie, n-gram) when the context offers a long match, the draft model otherwise."""

from __future__ import annotations

from typing import Sequence

from ..sampling import Sampler
from . import Draft, Drafter


class HybridDrafter:
    """A long match is nearly free and, in edits, usually right; short or missing matches
    fall back to the draft model. Feedback goes to whichever drafted. The lookup drafter
    decides what a long match is (its minimum match length); `min_tokens` is the shortest
    lookup draft worth taking over the model's."""

    def __init__(self, lookup: Drafter, model: Drafter, min_tokens: int = 2):
        self.lookup, self.model = lookup, model
        self.min_tokens = min_tokens
        self._last: Drafter | None = None

    def prefill(self, prompt: Sequence[int]) -> None:
        self.lookup.prefill(prompt)
        self.model.prefill(prompt)

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        draft = self.lookup.propose(context, max_k, sampler)
        if len(draft.tokens) >= min(self.min_tokens, max_k):
            self._last = self.lookup
            return draft
        self._last = self.model
        return self.model.propose(context, max_k, sampler)

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        if self._last is not None:
            self._last.observe(n_drafted, n_accepted)

    def close(self) -> None:
        self.model.close()
