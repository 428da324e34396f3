"""The model seam: what the loop and the drafters use of a model.

A `Model` (one context of its own) and a server slot's `SequenceView` (one sequence of a
shared context) both provide it, so the loop and the drafters run unchanged on either.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class KVModel(Protocol):
    n_ctx: int  # tokens this model (or slot) may hold
    n_vocab: int
    needs_state_rollback: bool  # recurrent state: rollback replays from a snapshot

    @property
    def tokens(self) -> list[int]:
        """What the KV cache holds, position by position."""
        ...

    def eval(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Decode `tokens` after the cache; logits rows (all, or only the last)."""
        ...

    def rollback(self, n_keep: int) -> None:
        """Keep the first n_keep cached tokens."""
        ...

    def reset(self) -> None: ...

    def is_eog(self, token: int) -> bool: ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def token_bytes(self, token: int, special: bool = False) -> bytes: ...

    def close(self) -> None: ...
