"""The server's slots: one sequence id each of the shared target and draft contexts, a
decoder on `SequenceView`s of them, a worker thread per request; the pool queues requests for
a free slot, and the `Engine` holds the pool, or why there is none (a lost RPC server), and
the `Metrics` counters that the pool and the app's guard keep (`metrics.py` renders them)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..calibrate import choose_prompt_rows
from ..decoder import Decoder, SpeculativeDecoder
from ..errors import LlamaSpecError
from ..stats import GenerationStats
from .schemas import ApiError
from .shared_batch import Cancelled, SequenceView, SharedBatch


@dataclass
class Slot:
    index: int
    decoder: Decoder
    views: list[SequenceView]

    def start(self) -> threading.Event:
        """A fresh cancel flag per request: a late cancel of an old request can't hit a new one."""
        cancelled = threading.Event()
        for view in self.views:
            view.cancelled = cancelled
        return cancelled

    def clear(self) -> None:
        """Both sequences out of the caches, and a fresh drafter: the suffix drafter's trie of
        this request's text would otherwise draft the next client's request (its acceptance
        and timings a window on another client's text)."""
        self.decoder.reset()


@dataclass
class Metrics:
    """Counters that slot threads and the event loop both add to. An unlocked read-modify-write
    loses updates when another thread comes between the read and the write (the request
    counts' get-then-set can switch threads at the call; on a free-threaded Python any `+=`),
    so every change and the scrape's `snapshot` take `lock` (a few additions, never a decode)."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    cancelled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, stats: Any, n_prompt: int) -> None:
        with self.lock:
            self.prompt_tokens += n_prompt
            self.generated_tokens += stats.n_generated
            self.drafted_tokens += stats.n_drafted
            self.accepted_tokens += stats.n_accepted

    def count_request(self, path: str, status: int) -> None:
        with self.lock:
            self.requests[(path, status)] = self.requests.get((path, status), 0) + 1

    def count_cancelled(self) -> None:
        with self.lock:
            self.cancelled += 1

    def snapshot(self) -> Metrics:
        """A consistent copy for one scrape."""
        with self.lock:
            return Metrics(dict(self.requests), self.prompt_tokens, self.generated_tokens, self.drafted_tokens,
                           self.accepted_tokens, self.cancelled)


class SlotPool:
    """The slots and the shared batch; requests queue (asyncio) for a free slot."""

    def __init__(self, decoder: SpeculativeDecoder, n_slots: int, n_ctx: int, metrics: Metrics):
        self.batch = SharedBatch()
        self.n_ctx = n_ctx
        self.slots: list[Slot] = []
        for seq in range(n_slots):
            views = [SequenceView(m, seq, self.batch, n_ctx) for m in (decoder.target, decoder.draft_model) if m]
            slot_decoder = decoder.with_models(views[0], views[1] if len(views) > 1 else None, self.busy_streams)
            self.slots.append(Slot(seq, slot_decoder, views))
        self._free: asyncio.Queue[Slot | ApiError] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.waiting = 0
        self.threads: set[threading.Thread] = set()
        self.metrics = metrics
        self.running: dict[int, Callable[[str, Any], None]] = {}  # slot index -> its request's emit

    def free_queue(self) -> asyncio.Queue[Slot | ApiError]:
        if self._free is None:  # made inside the running loop
            self._loop = asyncio.get_running_loop()
            self._free = asyncio.Queue()
            for slot in self.slots:
                self._free.put_nowait(slot)
        return self._free

    def busy_streams(self) -> int:
        """Generations sharing the batch now (read without the lock: the slots' policies ask
        at every draft step, and a count one round stale is as good; CostModel counts an idle
        slot's own stream)."""
        return self.batch.busy

    @property
    def n_busy(self) -> int:
        return len(self.slots) - self.free_queue().qsize()

    async def acquire(self) -> Slot:
        self.waiting += 1
        try:
            slot = await self.free_queue().get()
        finally:
            self.waiting -= 1
        if isinstance(slot, ApiError):  # the pool broke while this request queued
            raise slot
        return slot

    def run(self, slot: Slot, job: Callable[[Decoder], Any], n_prompt: int,
            emit: Callable[[str, Any], None]) -> None:
        """Start a worker thread: run `job` on the slot's decoder inside the shared batch,
        emit ("chunk", dict) for a stream (or ("result", dict)), ("error", ApiError) on
        failure, then ("end", None); the slot is cleaned and freed by the worker itself."""
        loop = asyncio.get_running_loop()
        free = self.free_queue()

        def work() -> None:
            self.running[slot.index] = emit
            before = slot.decoder.last
            try:
                with self.batch.working():
                    result = job(slot.decoder)
                    if isinstance(result, dict):
                        emit("result", result)
                    else:
                        for chunk in result:
                            emit("chunk", chunk)
            except Cancelled:
                self.metrics.count_cancelled()
            except LlamaSpecError as exc:
                emit("error", ApiError(400, str(exc)))
            except Exception as exc:  # noqa: BLE001 - the server must outlive any request
                emit("error", ApiError.internal(exc))
            finally:
                self.running.pop(slot.index, None)
                try:
                    latest = slot.decoder.last  # a job that failed before generating has none of its own
                    self.metrics.record(latest.stats if latest is not before and latest else GenerationStats(),
                                        n_prompt)
                    slot.clear()
                except Exception as exc:  # noqa: BLE001 - the client must still hear the end, the pool get its slot
                    emit("error", ApiError.internal(exc))
                emit("end", None)
                self.threads.discard(threading.current_thread())
                loop.call_soon_threadsafe(free.put_nowait, slot)

        thread = threading.Thread(target=work, name=f"slot-{slot.index}", daemon=True)
        self.threads.add(thread)
        thread.start()

    def fail_all(self, error: ApiError) -> None:
        """Answer every running and queued request with `error` now (from any thread): the
        running ones' threads are stuck in llama.cpp, the queued ones would wait forever."""
        for emit in list(self.running.values()):
            emit("error", error)
            emit("end", None)
        if self._loop is not None and self._free is not None:
            for _ in range(self.waiting):
                self._loop.call_soon_threadsafe(self._free.put_nowait, error)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel running generations and wait for their threads (before models are freed)."""
        for slot in self.slots:
            for view in slot.views:
                view.cancelled.set()
        deadline = time.monotonic() + timeout
        for thread in list(self.threads):
            thread.join(max(deadline - time.monotonic(), 0))


class Engine:
    """The loaded models and their slots, or why there are none (the target's RPC server was
    lost): the app asks for them per request, so it can answer 503 while they are reloaded."""

    def __init__(self, n_slots: int, n_ctx: int, unavailable: str | None = None, restarts: int = 0):
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.metrics = Metrics()
        self.decoder: SpeculativeDecoder | None = None
        self.pool: SlotPool | None = None
        self.unavailable = unavailable
        self.restarts = restarts

    def start(self, decoder: SpeculativeDecoder) -> None:
        choose_prompt_rows([model for model in (decoder.target, decoder.draft_model) if model is not None])
        self.decoder = decoder
        self.pool = SlotPool(decoder, self.n_slots, self.n_ctx, self.metrics)
        self.unavailable = None

    def ready(self) -> tuple[SpeculativeDecoder, SlotPool]:
        if self.decoder is None or self.pool is None:
            raise ApiError(503, f"the target model is unavailable: {self.unavailable}", "server_error")
        return self.decoder, self.pool

    def lose(self, why: str) -> SlotPool | None:
        """Stop handing out the slots (their models are broken); the old pool, if any."""
        pool, self.pool, self.decoder, self.unavailable = self.pool, None, None, why
        return pool
