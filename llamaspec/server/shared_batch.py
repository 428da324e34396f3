"""Several generations share one target context and one draft context: the server's slots.

Each slot runs the ordinary single-sequence loop (`speculative.generate_tokens`, the
drafters, the sampler) in its own thread, on `SequenceView`s: stand-ins for a `Model`
bound to one sequence id of a shared context. A view's `eval` does not decode by itself;
it hands its tokens to the `SharedBatch` and waits. When every busy slot is waiting, the
last one to arrive decodes all pending requests with one `decode_many` per model, so the
verify rows of all slots go through llama.cpp together, and wakes the others.

The lock is held for a whole round (and, with the target on RPC servers, up to their
timeout), so nothing on the event loop may take it: each view publishes how many tokens
the cache holds for its sequence after every round and rollback, for `/metrics` to read.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..errors import ContextFullError, LlamaSpecError

if TYPE_CHECKING:
    from pathlib import Path

    from ..llama import Model, ModelOptions


class Cancelled(LlamaSpecError):
    """The slot's client went away; raised inside the loop at its next evaluation."""


@dataclass
class _Request:
    view: SequenceView
    tokens: list[int]
    all_logits: bool
    rows: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False


class SharedBatch:
    """Gathers evaluations from busy slot threads and decodes them together.

    A slot thread marks itself busy for a whole generation; the gather waits only for
    busy threads, so one that finishes (or fails) never leaves the others stuck. All
    llama.cpp calls on the shared models happen under `lock`.
    """

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self._busy = 0
        self._pending: list[_Request] = []
        self.n_decodes = 0  # decode_many calls so far
        self.n_rows = 0  # tokens they evaluated

    @property
    def busy(self) -> int:
        return self._busy

    @contextmanager
    def working(self) -> Iterator[None]:
        """Count the calling thread as busy: the batch waits for its requests."""
        with self.lock:
            self._busy += 1
        try:
            yield
        finally:
            with self.lock:
                self._busy -= 1
                self._flush_if_ready()

    def submit(self, view: SequenceView, tokens: Sequence[int], all_logits: bool) -> np.ndarray:
        request = _Request(view, list(tokens), all_logits)
        with self.lock:
            self._pending.append(request)
            self._flush_if_ready()
            while not request.done:
                self.lock.wait()
        if request.error is not None:
            raise request.error
        assert request.rows is not None
        return request.rows

    def _flush_if_ready(self) -> None:
        if not self._pending or len(self._pending) < self._busy:
            return
        pending, self._pending = self._pending, []
        groups: dict[int, list[_Request]] = {}
        for request in pending:
            groups.setdefault(id(request.view.model), []).append(request)
        for group in groups.values():
            try:
                results = group[0].view.model.decode_many([(r.view.seq, r.tokens, r.all_logits) for r in group])
                for request, rows in zip(group, results):
                    request.rows = rows
                    request.view.publish_kv_tokens()
                self.n_decodes += 1
                self.n_rows += sum(len(r.tokens) for r in group)
            except Exception as exc:  # a failed decode fails every request in it, nothing else
                for request in group:
                    request.error = exc
            for request in group:
                request.done = True
        self.lock.notify_all()


class SequenceView:
    """What the loop and the drafters use of a `Model`, bound to one sequence.

    Model facts (vocabulary, tokenizer, path, options) come from the shared model, named
    one by one (what a slot may use of it is this list, not all of Model); the cache
    operations go through the shared batch. `n_ctx` is this slot's share.
    """

    needs_state_rollback = False

    def __init__(self, model: Model, seq: int, batch: SharedBatch, n_ctx: int):
        self.model = model
        self.seq = seq
        self.batch = batch
        self.n_ctx = n_ctx
        self.cancelled = threading.Event()
        self._kv_tokens = model.kv_tokens(seq)  # written under batch.lock, read without it

    # Model facts, read from the shared model: vocabulary and tokenizer are the same for every slot.
    @property
    def path(self) -> Path:
        return self.model.path

    @property
    def options(self) -> ModelOptions:
        return self.model.options

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def bos(self) -> int:
        return self.model.bos

    @property
    def eos(self) -> int:
        return self.model.eos

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return self.model.token_bytes(token, special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self.model.detokenize(tokens, special)

    def chat_template(self) -> str | None:
        return self.model.chat_template()

    @property
    def tokens(self) -> list[int]:
        return self.model.seq_tokens[self.seq]

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        if self.cancelled.is_set():
            raise Cancelled("the request was cancelled")
        if not tokens:
            raise ValueError("eval needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"{self.n_past + len(tokens)} tokens do not fit in a slot's context of {self.n_ctx}")
        return self.batch.submit(self, tokens, all_logits)

    def rollback(self, n_keep: int) -> None:
        with self.batch.lock:
            self.model.rollback(n_keep, self.seq)
            self.publish_kv_tokens()

    def reset(self) -> None:
        """Remove the sequence from the cache (the slot is free again)."""
        self.rollback(0)

    def publish_kv_tokens(self) -> None:
        """Read the sequence's token count from llama.cpp's cache (the caller holds batch.lock)."""
        self._kv_tokens = self.model.kv_tokens(self.seq)

    def kv_tokens(self) -> int:
        """Tokens the cache held for this sequence after the last round or rollback. Never
        waits for the lock: a scrape during a long decode round answers at once."""
        return self._kv_tokens

    def close(self) -> None:
        """Nothing to free: the shared model belongs to the server."""
