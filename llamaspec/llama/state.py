"""Saved sequence states, for caches that cannot cut a sequence at any position.

Recurrent and hybrid models (llama_memory_seq_rm refuses a partial removal) roll back by
restoring the newest state saved at or before the kept length and re-decoding the rest; with
none that old, from an empty sequence.
"""

from __future__ import annotations

import ctypes

from ..errors import LlamaSpecError
from .backend import ll

_KEEP = 8  # a verify step needs only the last few


class StateSnapshots:
    """(n_tokens, state bytes) of one sequence of one context, newest last."""

    def __init__(self, ctx: ctypes.c_void_p, memory: ctypes.c_void_p, seq: int, name: str):
        self._ctx, self._memory, self._seq, self._name = ctx, memory, seq, name
        self._saved: list[tuple[int, bytes]] = []

    def save(self, n_tokens: int) -> None:
        if self._saved and self._saved[-1][0] == n_tokens:
            return
        size = ll.llama_state_seq_get_size_ext(self._ctx, self._seq, 0)
        buf = (ctypes.c_uint8 * size)()
        written = ll.llama_state_seq_get_data_ext(self._ctx, buf, size, self._seq, 0)
        self._saved.append((n_tokens, bytes(buf[:written])))
        del self._saved[:-_KEEP]

    def restore(self, n_keep: int) -> int:
        """Load the newest state of at most n_keep tokens; returns its length (the caller
        re-decodes the tokens after it). With none that old (a rollback past the last few
        steps: a chat turn that rewrites history), the sequence starts empty and the caller
        re-decodes all n_keep tokens: slow, but the same tokens in the cache."""
        usable = [s for s in self._saved if s[0] <= n_keep]
        ll.llama_memory_seq_rm(self._memory, self._seq, -1, -1)
        if not usable:
            self._saved.clear()
            return 0
        n_saved, state = usable[-1]
        self._saved = [s for s in self._saved if s[0] <= n_saved]
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if ll.llama_state_seq_set_data_ext(self._ctx, buf, len(state), self._seq, 0) == 0:
            raise LlamaSpecError(f"restoring the saved state of {self._name} failed")
        return n_saved

    def clear(self) -> None:
        self._saved.clear()
