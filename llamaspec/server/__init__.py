"""`llamaspec serve`: an OpenAI-compatible HTTP server with speculative decoding.

`--parallel N` slots share ONE target context and ONE draft context, a sequence id each.
A request waits for a free slot, then runs in a worker thread on that slot's decoder (the
library's `openai_api` over `SequenceView`s); the `SharedBatch` puts the evaluations of all
busy slots into one llama_decode per model, so concurrent users cost less than N separate
decodes. A finished, failed or disconnected request removes its sequence from both KV
caches and frees its slot. Every bad request gets an OpenAI-style error; none stops the server,
and neither does a lost RPC server holding the target (see `serve`).

Modules: `schemas` (request bodies, the error body), `shared_batch` (sequence views and the
shared decode rounds), `slots` (slots, the pool, the engine, counters), `metrics` (the
Prometheus text), `app` (the guard, the routes, SSE), `supervisor` (listen, serve, restart
in place after a lost RPC server, reload).
"""

from __future__ import annotations

from .app import MAX_BODY_BYTES, ServerConfig, create_app
from .schemas import ApiError, ChatBody, CompletionBody, error_body
from .shared_batch import Cancelled, SequenceView, SharedBatch
from .slots import Engine, Metrics, Slot, SlotPool
from .supervisor import serve

__all__ = [
    "MAX_BODY_BYTES", "ApiError", "Cancelled", "ChatBody", "CompletionBody", "Engine", "Metrics", "SequenceView",
    "ServerConfig", "SharedBatch", "Slot", "SlotPool", "create_app", "error_body", "serve",
]
