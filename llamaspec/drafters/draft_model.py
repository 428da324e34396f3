"""A smaller GGUF model with the target's vocabulary drafts autoregressively."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..kv import KVModel
from ..policy import DraftPolicy, FixedK, draft_steps
from ..sampling import Sampler
from . import Draft, common_prefix_len


class DraftModelDrafter:
    """Drafts with its own model (a Model, or a slot's view of a shared one); its KV cache
    follows the context by common prefix.

    Syncing by prefix covers every case without bookkeeping: after a rejection the cache
    holds drafted tokens the target refused (cut back), and when all k were accepted the
    last draft token was never evaluated by the draft (it is decoded with the bonus token).
    """

    def __init__(self, model: KVModel, policy: DraftPolicy | None = None):
        self.model = model
        self.policy = policy or FixedK()

    def prefill(self, prompt: Sequence[int]) -> None:
        """The prompt but its last token, which the first step evaluates for its logits."""
        n_keep = common_prefix_len(self.model.tokens, prompt[:-1])
        self.model.rollback(n_keep)
        if n_keep < len(prompt) - 1:
            self.model.eval(prompt[n_keep:-1])

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        model, policy = self.model, self.policy
        history = list(context)
        probs: list[np.ndarray] = []

        def next_token(i: int) -> tuple[float, bool]:
            if i == 0:
                # Keep at least one token to evaluate: we need the logits after the context.
                n_keep = min(common_prefix_len(model.tokens, context), len(context) - 1)
                model.rollback(n_keep)
                logits = model.eval(context[n_keep:])[-1]
            else:
                logits = model.eval(history[-1:])[-1]
            if sampler.greedy:
                token = sampler.argmax(logits, history)
            else:
                probs.append(sampler.probs(logits, history))
                token = sampler.sample(probs[-1])
            history.append(token)
            sure = 1.0
            if policy.wants_prob:
                sure = float(probs[-1][token]) if probs else _top_prob(logits, token)
            return sure, not model.is_eog(token)

        _, n = draft_steps(policy, max_k, next_token)
        return Draft(history[len(context):len(context) + n], probs[:n] if probs else None)

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.policy.update(n_drafted, n_accepted)

    def close(self) -> None:
        self.model.close()


def _top_prob(logits: np.ndarray, token: int) -> float:
    """The softmax probability of the argmax token (float32 is precise enough here)."""
    return 1.0 / float(np.exp(np.asarray(logits, dtype=np.float32) - logits[token]).sum())
