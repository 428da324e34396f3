"""Guesses at the draft model's next tokens, for DraftModelDrafter to evaluate in one batch."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..policy import AdaptiveK, CostModel
from .ngram import latest_copy


class CopyLookahead:
    """Guesses by copying what followed the latest earlier occurrence of the history's last
    tokens (prompt lookup over the draft in progress). A guess costs a row of the draft's
    batch whether the draft follows it or not, so how many to make is chosen as a lookup
    draft's length is: AdaptiveK on how often the draft followed guesses by position,
    against the draft model's own batch cost curve (`draft_ms`, ms by batch size)."""

    def __init__(self, draft_ms: Mapping[int, float], k_max: int = 8, min_match: int = 2):
        self.policy = AdaptiveK(CostModel(draft_ms, draft_ms_per_token=0.0), k_max)
        self.min_match = min_match

    def guess(self, history: Sequence[int], limit: int) -> list[int]:
        n = self.policy.begin(limit)
        return latest_copy(history, n, self.min_match) if n else []

    def observe(self, n_compared: int, n_matched: int) -> None:
        self.policy.update(n_compared, n_matched)
