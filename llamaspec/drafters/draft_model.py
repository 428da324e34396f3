"""A smaller GGUF model with the target's vocabulary drafts autoregressively."""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

import numpy as np

from ..kv import KVModel
from ..policy import DraftPolicy, FixedK, draft_steps
from ..sampling import Sampler
from . import Draft, common_prefix_len

# History tokens a batch of lookahead guesses may carry (all its rows get logits); a longer
# catch-up is split off, which costs one more decode: dear for the usual one or two tokens.
_CATCH_UP = 16


class DraftModelDrafter:
    """Drafts with its own model (a Model, or a slot's view of a shared one); its KV cache
    follows the context by common prefix.

    Syncing by prefix covers every case without bookkeeping: after a rejection the cache
    holds drafted tokens the target refused (cut back), and when all k were accepted the
    last draft token was never evaluated by the draft (it is decoded with the bonus token).

    `lookahead` guesses how the draft will go on: each eval carries its guesses in the same
    batch, and while the draft's own tokens equal them their rows are ready, so a run of
    drafted tokens costs one batch instead of one eval each. The draft is unchanged (a row
    of a batch equals the single eval on the batch-invariant build); only its cost drops,
    on text that repeats. `on_eval` hears each drafting eval's batch size and milliseconds (the
    policies' measured draft curve).

    `n_vocab` is the target's vocabulary size, which llama.cpp lets differ from the draft's by
    up to 128 ids (Qwen2.5 7B: 152064, its 0.5B: 151936): the draft's rows are read on the
    target's ids, so it never proposes an id the target lacks, and a sampled draft's
    distribution lines up with the target's in speculative sampling. A context holding an id
    the draft lacks (a prompt of raw ids, a padding id sampled) is not drafted on: the draft
    cannot evaluate it, and on a server its failed decode would fail every slot's round.
    """

    def __init__(self, model: KVModel, policy: DraftPolicy | None = None,
                 lookahead: Lookahead | None = None, on_eval: Callable[[int, float], None] | None = None,
                 n_vocab: int | None = None):
        self.model = model
        self.policy = policy or FixedK()
        self.lookahead = lookahead
        self.on_eval = on_eval
        self.n_vocab = model.n_vocab if n_vocab is None else n_vocab
        self._scratch = np.empty(self.n_vocab, dtype=np.float32)  # _top_prob's working row

    def prefill(self, prompt: Sequence[int]) -> None:
        """The whole prompt (the first step drafts after the first token, which the target
        chose from the prompt's last row), if the policy would draft now: a server's slot
        under load steps plainly, and its draft catches up only when a step drafts."""
        if not self.policy.pays() or self._unreadable(prompt):
            return
        n_keep = common_prefix_len(self.model.tokens, prompt)
        self.model.rollback(n_keep)
        if n_keep < len(prompt):
            self.model.eval(prompt[n_keep:])

    def _eval_ahead(self, history: list[int], limit: int) -> tuple[list[int], np.ndarray]:
        """The logits after `history` and after history + guesses[:j] for each guess the
        lookahead makes (at most `limit`): one batch, with whatever the cache lacks."""
        model = self.model
        guesses = self.lookahead.guess(history, limit) if self.lookahead and limit > 0 else []
        # Keep at least one token to evaluate: we need the logits after the history.
        n_keep = min(common_prefix_len(model.tokens, history), len(history) - 1)
        model.rollback(n_keep)
        if guesses and len(history) - n_keep > _CATCH_UP:
            # A long catch-up (a prompt the draft skipped while the server was busy) first,
            # without logits: in the guesses' batch every row would get logits, 600 KB each
            # for Qwen's vocabulary (1.8 GB for a 3000-token prompt), and the head's work.
            model.eval(history[n_keep:-1])
            n_keep = len(history) - 1
        batch = [*history[n_keep:], *guesses]
        started = time.perf_counter()
        rows = model.eval(batch, all_logits=bool(guesses))
        if self.on_eval:
            self.on_eval(len(batch), 1000.0 * (time.perf_counter() - started))
        return guesses, rows[len(rows) - len(guesses) - 1:]  # a view: read before the next eval

    def _unreadable(self, tokens: Sequence[int]) -> bool:
        return self.model.n_vocab < self.n_vocab and max(tokens, default=0) >= self.model.n_vocab

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        if self._unreadable(context):
            return Draft()
        model, policy, lookahead = self.model, self.policy, self.lookahead
        history = list(context)
        probs: list[np.ndarray] = []
        # The current batch: ready[j] holds the logits after history[:base + j]; of its
        # guesses the draft has compared `compared` and met all but `missed` (0 or 1).
        base, guesses, ready = 0, [], np.empty((0, 0), dtype=np.float32)
        compared = missed = 0

        def settle() -> None:
            if lookahead and guesses:
                lookahead.observe(compared, compared - missed)

        def next_token(i: int) -> tuple[float, bool]:
            nonlocal base, guesses, ready, compared, missed
            j = len(history) - base
            if j >= len(ready):
                settle()
                base, j, compared, missed = len(history), 0, 0, 0
                guesses, ready = self._eval_ahead(history, max_k - i - 1)
            logits = _on_vocab(ready[j], self.n_vocab)
            if sampler.greedy:
                token = sampler.argmax(logits, history)
            else:
                probs.append(sampler.probs(logits, history))
                token = sampler.sample(probs[-1])
            history.append(token)
            if j < len(guesses):
                compared += 1
                if token != guesses[j]:
                    missed, ready = 1, ready[: j + 1]  # the draft left the guesses: later rows are void
            sure = 1.0
            if policy.wants_prob:
                sure = float(probs[-1][token]) if probs else _top_prob(logits, token, self._scratch)
            return sure, not model.is_eog(token)

        drafted, n = draft_steps(policy, max_k, next_token)
        settle()
        if probs:
            # Sampled: every drafted token goes to verification. The policy may stop drafting on
            # what came before, but leaving d_i out because of q(d_i) itself (ConfidenceK's
            # `keep`) would bias rejection sampling, which is exact only for d_i drawn from q.
            n = drafted
        return Draft(history[len(context):len(context) + n], probs[:n] if probs else None)

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.policy.update(n_drafted, n_accepted)

    def close(self) -> None:
        self.model.close()


class Lookahead(Protocol):
    """Cheap guesses at the draft model's next tokens (drafters/lookahead.py)."""

    def guess(self, history: Sequence[int], limit: int) -> list[int]:
        """At most `limit` tokens the draft may produce after `history`."""
        ...

    def observe(self, n_compared: int, n_matched: int) -> None:
        """How many guesses the draft got to and how many of those (a prefix) it produced."""
        ...


def _on_vocab(logits: np.ndarray, n_vocab: int) -> np.ndarray:
    """A draft's row on the target's ids: the ids past the target's vocabulary dropped, the
    ones past the draft's impossible."""
    if len(logits) >= n_vocab:
        return logits[:n_vocab]
    out = np.full(n_vocab, -np.inf, dtype=logits.dtype)
    out[: len(logits)] = logits
    return out


def _top_prob(logits: np.ndarray, token: int, scratch: np.ndarray) -> float:
    """The softmax probability of the argmax token (float32 is precise enough here), worked
    out in `scratch`: two fresh full-vocabulary temporaries a drafted token cost more than
    the sum itself."""
    np.subtract(logits, logits[token], out=scratch)
    return 1.0 / float(np.exp(scratch, out=scratch).sum())
