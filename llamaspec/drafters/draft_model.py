"""A smaller GGUF model with the target's vocabulary drafts autoregressively."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..kv import KVModel
from ..policy import DraftPolicy
from ..sampling import Sampler
from . import Draft, common_prefix_len


class DraftModelDrafter:
    """Drafts with its own model (a Model, or a slot's view of a shared one); its KV cache
    follows the context by common prefix.

    Syncing by prefix covers every case without bookkeeping: after a rejection the cache
    holds drafted tokens the target refused (cut back), and when all k were accepted the
    last draft token was never evaluated by the draft (it is decoded with the bonus token).
    """

    def __init__(self, model: KVModel, min_top_prob: float = 0.0, policy: DraftPolicy | None = None):
        self.model = model
        self.min_top_prob = min_top_prob  # stop drafting when the draft itself is unsure
        self.policy = policy

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        policy = self.policy
        if policy is not None:
            max_k = policy.begin(max_k)
        if max_k <= 0:
            return Draft()
        model = self.model
        # Keep at least one token to evaluate: we need the logits after the context.
        n_keep = min(common_prefix_len(model.tokens, context), len(context) - 1)
        model.rollback(n_keep)
        logits = model.eval(context[n_keep:])[-1]
        history = list(context)
        probs: list[np.ndarray] = []
        for i in range(max_k):
            if sampler.greedy:
                token = sampler.argmax(logits, history)
            else:
                q = sampler.probs(logits, history)
                token = sampler.sample(q)
                probs.append(q)
            history.append(token)
            sure = 1.0
            if policy is not None or self.min_top_prob > 0.0:
                sure = float(probs[-1][token]) if probs else _top_prob(logits, token)
            go_on = policy.more(sure) if policy is not None else True
            if not go_on or i == max_k - 1 or model.is_eog(token) or sure < self.min_top_prob:
                break
            logits = model.eval([token])[-1]
        tokens = history[len(context):]
        n = policy.keep(len(tokens)) if policy is not None else len(tokens)
        return Draft(tokens[:n], probs[:n] if probs else None)

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        if self.policy is not None:
            self.policy.update(n_drafted, n_accepted)

    def close(self) -> None:
        self.model.close()


def _top_prob(logits: np.ndarray, token: int) -> float:
    """The softmax probability of the argmax token (float32 is precise enough here)."""
    return 1.0 / float(np.exp(np.asarray(logits, dtype=np.float32) - logits[token]).sum())
