"""SharedBatch on a fake model: who waits for whom, and what one decode round contains."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from llamaspec.errors import ContextFullError
from llamaspec.server.shared_batch import Cancelled, SequenceView, SharedBatch


class FakeModel:
    """Records each decode_many call; logits row = [seq, position]."""

    def __init__(self, n_seq: int, fail: bool = False):
        self.seq_tokens: list[list[int]] = [[] for _ in range(n_seq)]
        self.calls: list[list[tuple[int, int]]] = []
        self.fail = fail

    def decode_many(self, items):
        if self.fail:
            raise RuntimeError("decode failed")
        self.calls.append([(seq, len(tokens)) for seq, tokens, _ in items])
        out = []
        for seq, tokens, all_logits in items:
            start = len(self.seq_tokens[seq])
            self.seq_tokens[seq].extend(tokens)
            rows = np.array([[seq, start + i] for i in range(len(tokens))], dtype=np.float32)
            out.append(rows if all_logits else rows[-1:])
        return out

    def rollback(self, n_keep: int, seq: int) -> None:
        del self.seq_tokens[seq][n_keep:]

    def kv_tokens(self, seq: int) -> int:
        return len(self.seq_tokens[seq])


def _run_slots(batch: SharedBatch, views: list[SequenceView], steps: int, results: dict[int, list]) -> None:
    barrier = threading.Barrier(len(views))

    def work(view: SequenceView) -> None:
        with batch.working():
            barrier.wait()  # all slots busy before anyone submits
            for step in range(steps):
                results.setdefault(view.seq, []).append(view.eval([1] * (view.seq + 1), all_logits=True))

    threads = [threading.Thread(target=work, args=(v,)) for v in views]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


def test_all_busy_slots_share_each_decode_round() -> None:
    model, batch = FakeModel(3), SharedBatch()
    views = [SequenceView(model, seq, batch, n_ctx=100) for seq in range(3)]
    results: dict[int, list] = {}
    _run_slots(batch, views, steps=4, results=results)
    assert len(model.calls) == 4  # 4 rounds, not 12 decodes
    assert all(sorted(call) == [(0, 1), (1, 2), (2, 3)] for call in model.calls)
    # Each slot got its own rows back, at its own positions.
    np.testing.assert_array_equal(results[2][1], [[2, 3], [2, 4], [2, 5]])
    assert batch.n_rows == 4 * (1 + 2 + 3)


def test_a_finishing_slot_does_not_leave_others_waiting() -> None:
    model, batch = FakeModel(2), SharedBatch()
    short, long = SequenceView(model, 0, batch, 100), SequenceView(model, 1, batch, 100)
    done = threading.Barrier(2)

    def run(view: SequenceView, steps: int) -> None:
        with batch.working():
            done.wait()
            for _ in range(steps):
                view.eval([7])

    threads = [threading.Thread(target=run, args=(short, 1)), threading.Thread(target=run, args=(long, 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert [len(c) for c in model.calls] == [2, 1, 1, 1, 1]


def test_errors_reach_the_submitters_and_cancel_and_context_checks() -> None:
    batch = SharedBatch()
    failing = SequenceView(FakeModel(1, fail=True), 0, batch, 100)
    with pytest.raises(RuntimeError, match="decode failed"):
        failing.eval([1])
    view = SequenceView(FakeModel(1), 0, batch, n_ctx=4)
    view.eval([1, 2, 3])
    with pytest.raises(ContextFullError):
        view.eval([4, 5])
    view.rollback(1)
    assert view.tokens == [1]
    view.cancelled.set()
    with pytest.raises(Cancelled):
        view.eval([2])


def test_kv_tokens_is_published_per_round_and_read_without_the_lock() -> None:
    batch = SharedBatch()
    view = SequenceView(FakeModel(1), 0, batch, n_ctx=100)
    view.eval([1, 2, 3])
    assert view.kv_tokens() == 3
    view.rollback(1)
    assert view.kv_tokens() == 1
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a slot thread in the middle of a long decode round
        with batch.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        start = time.monotonic()
        assert view.kv_tokens() == 1
        assert time.monotonic() - start < 0.1
    finally:
        release.set()
        holder.join(10)
