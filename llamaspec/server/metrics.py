"""`GET /metrics`: the engine's counters and gauges in Prometheus text format. Runs on the
event loop, so it reads only plain attributes, never the shared batch's lock."""

from __future__ import annotations

from .slots import Engine


def metrics_text(engine: Engine) -> str:
    m, pool = engine.metrics.snapshot(), engine.pool
    slots = pool.slots if pool else []
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP llamaspec_{name} {help_text}")
        lines.append(f"# TYPE llamaspec_{name} {kind}")
        lines.extend(f"llamaspec_{name}{labels} {value:g}" for labels, value in samples)

    metric("requests_total", "counter", "HTTP requests by path and status code.",
           [(f'{{path="{path}",status="{status}"}}', n) for (path, status), n in sorted(m.requests.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens of finished generations.", [("", m.prompt_tokens)])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", m.generated_tokens)])
    metric("drafted_tokens_total", "counter", "Tokens proposed by the drafter.", [("", m.drafted_tokens)])
    metric("accepted_tokens_total", "counter", "Drafted tokens the target accepted.", [("", m.accepted_tokens)])
    metric("acceptance_ratio", "gauge", "Accepted over drafted tokens since start.",
           [("", m.accepted_tokens / m.drafted_tokens if m.drafted_tokens else 0.0)])
    metric("cancelled_total", "counter", "Generations stopped because the client went away.", [("", m.cancelled)])
    metric("target_available", "gauge", "1 while the models are loaded and serving.", [("", pool is not None)])
    metric("restarts_total", "counter", "In-place restarts after a lost RPC server.", [("", engine.restarts)])
    metric("queue_depth", "gauge", "Requests waiting for a free slot.", [("", pool.waiting if pool else 0)])
    metric("slots_total", "gauge", "Parallel slots.", [("", engine.n_slots)])
    metric("slots_busy", "gauge", "Slots running a generation.", [("", pool.n_busy if pool else 0)])
    metric("batch_decodes_total", "counter", "Shared llama_decode rounds (all slots' rows together).",
           [("", pool.batch.n_decodes if pool else 0)])
    metric("batch_tokens_total", "counter", "Tokens evaluated in shared rounds.",
           [("", pool.batch.n_rows if pool else 0)])
    metric("kv_tokens", "gauge", "Tokens llama.cpp's KV cache holds per slot and model (0 when idle).",
           [(f'{{slot="{slot.index}",model="{name}"}}', view.kv_tokens())
            for slot in slots for name, view in zip(("target", "draft"), slot.views)])
    return "\n".join(lines) + "\n"
