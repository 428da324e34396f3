"""The speculative decoding loop, and plain decoding as the same loop with no drafter.

Invariant at the top of every step: the target's KV cache holds `context[:-1]`, and
`context[-1]` is the newest token, not yet evaluated. A step evaluates `[context[-1], d1..dk]`
in ONE batch with logits on every row, keeps the agreeing prefix plus one token of the
target's own, and cuts the rejected tail from the cache. The first token comes from the
prompt's last row (prefill), which establishes the invariant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from .drafters import Draft, Drafter, common_prefix_len
from .errors import ContextFullError, LlamaSpecError
from .sampling import Sampler
from .stats import GenerationStats
from .verify import VerifyMode, verify_greedy, verify_match, verify_rejection

if TYPE_CHECKING:
    from .kv import KVModel


@dataclass
class StepTrace:
    """One verify step, for --trace and for tests: the batch the target evaluated at
    positions `position..position+k`, and what became of it. The first token's trace is the
    prompt's last token and row (evaluated with the prompt, nothing drafted). `rows` is a view
    into llama.cpp's logits, valid only during the callback."""

    position: int
    evaluated: list[int]
    n_accepted: int
    next_token: int
    rows: np.ndarray


Trace = Callable[[StepTrace], None]


def prefill(target: KVModel, context: Sequence[int]) -> tuple[int, np.ndarray]:
    """Evaluate the prompt as llama.cpp does (one batch, logits for the last token), reusing
    any prefix already cached (a chat's earlier turns). Returns how many tokens were
    decoded and a copy of the last row: the first step's prediction for the next token."""
    if not context:
        raise LlamaSpecError("the prompt is empty")
    if len(context) > target.n_ctx:
        raise ContextFullError(
            f"the prompt has {len(context)} tokens but the context holds {target.n_ctx}; "
            "shorten it or raise --ctx"
        )
    n_keep = min(common_prefix_len(target.tokens, context), len(context) - 1)
    target.rollback(n_keep)
    last_row = target.eval(context[n_keep:])[-1:].copy()
    return len(context) - n_keep, last_row


def _target_choice(
    draft: Draft, rows: np.ndarray, context: list[int], sampler: Sampler, verify: VerifyMode
) -> tuple[int, int]:
    def history(i: int) -> list[int]:
        return context + draft.tokens[:i]

    if sampler.greedy:
        if sampler.params.repeat_penalty == 1.0:
            choices = rows.argmax(axis=1).tolist()  # one C call, no probability vectors
        else:
            choices = [sampler.argmax(rows[i], history(i)) for i in range(len(rows))]
        return verify_greedy(draft.tokens, choices)

    def target_probs(i: int) -> np.ndarray:
        return sampler.probs(rows[i], history(i))

    if verify == "match":
        return verify_match(draft.tokens, target_probs, sampler.sample)
    return verify_rejection(draft.tokens, draft.probs, target_probs, sampler.uniform, sampler.sample)


def generate_tokens(
    target: KVModel,
    prompt: Sequence[int],
    *,
    drafter: Drafter | None = None,
    k: int = 4,
    max_tokens: int = 256,
    sampler: Sampler | None = None,
    verify: VerifyMode = "rejection",
    stats: GenerationStats | None = None,
    trace: Trace | None = None,
    on_verify: Callable[[int, float], None] | None = None,
) -> Iterator[int]:
    """Yield generated token ids; without a drafter this is plain decoding (one token a step).

    Stops at any end-of-generation token (not yielded), after `max_tokens`, or when the
    context is full. `stats` is filled in as it goes; `on_verify` hears each target eval's
    batch size and milliseconds (a policy's measured cost curve).
    """
    if k <= 0 and drafter is not None:
        raise LlamaSpecError(f"k must be at least 1 with a drafter, got {k}")
    if max_tokens < 0:
        raise LlamaSpecError(f"max tokens must be >= 0, got {max_tokens}")
    sampler = sampler or Sampler()
    stats = stats if stats is not None else GenerationStats()
    context = list(prompt)
    stats.n_prompt = len(context)
    started = time.perf_counter()
    stats.n_prompt_evaluated, prompt_row = prefill(target, context)
    if drafter:
        drafter.prefill(context)
    stats.prefill_s = time.perf_counter() - started
    stats.stop_reason = "max_tokens"
    try:
        # The first token comes from the prompt's last row, as in plain decoding: no draft
        # guesses what is already known, and it streams out before any drafting.
        emit = [_target_choice(Draft(), prompt_row, context, sampler, verify)[1]] if max_tokens else []
        if trace and emit:
            trace(StepTrace(len(context) - 1, context[-1:], 0, emit[0], prompt_row))
        while emit:
            for token in emit:
                if target.is_eog(token):
                    stats.stop_reason = "eog"
                    return
                context.append(token)
                stats.n_generated += 1
                yield token
            if stats.n_generated >= max_tokens:
                return
            room = target.n_ctx - len(context)  # draft tokens that still fit after context[-1]
            if room < 0:
                stats.stop_reason = "context_full"
                return
            t_start = time.perf_counter()
            k_step = min(k, room, max_tokens - stats.n_generated - 1) if drafter else 0
            draft = drafter.propose(context, k_step, sampler) if k_step > 0 else Draft()
            t_drafted = time.perf_counter()
            evaluated = [context[-1], *draft.tokens]
            rows = target.eval(evaluated, all_logits=True)
            t_verified = time.perf_counter()
            if on_verify:
                on_verify(len(evaluated), 1000.0 * (t_verified - t_drafted))
            n_accepted, next_token = _target_choice(draft, rows, context, sampler, verify)
            if trace:
                trace(StepTrace(len(context) - 1, evaluated, n_accepted, next_token, rows))
            target.rollback(len(context) + n_accepted)
            if drafter:
                drafter.observe(len(draft.tokens), n_accepted)
            stats.record_step(len(draft.tokens), n_accepted, t_drafted - t_start, t_verified - t_drafted,
                              time.perf_counter() - t_start)
            emit = [*draft.tokens[:n_accepted], next_token]
    finally:
        # Leave the cache as plain decoding would: without the accepted draft tokens past an
        # end of generation or past where the caller stopped. The next turn's prompt is then
        # evaluated in the same batch as after plain decoding, and so to the same bits.
        target.rollback(min(len(target.tokens), len(context) - (stats.stop_reason != "eog")))
