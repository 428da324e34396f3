"""Deciding how much of a draft to keep, in pure numpy (no llama.cpp here).

The target evaluated `[last, d1..dk]` in one batch; row i of its output is its prediction
for the token after `d1..di` (row 0: after `last`). Every verifier returns
`(n_accepted, next_token)`: keep `d1..d_n_accepted`, then emit `next_token`, which is the
target's own choice at the first rejection or a bonus token from row k when all k agree.

- greedy: accept while the draft equals the target's argmax; identical to plain greedy.
- rejection: Leviathan et al. / Chen et al. 2023 speculative sampling; the emitted tokens
  follow the target's sampling distribution exactly, whatever the draft proposes.
- match: llama.cpp's rule; the target samples each row and the draft token is kept while
  equal. Also distribution-exact, but accepts less often than rejection sampling.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import numpy as np

VerifyMode = Literal["rejection", "match"]
RowProbs = Callable[[int], np.ndarray]  # row index -> target distribution at that row


def verify_greedy(draft_tokens: Sequence[int], target_choices: Sequence[int]) -> tuple[int, int]:
    """`target_choices[i]` is the target's argmax at row i (len(draft_tokens) + 1 rows)."""
    n_accepted = 0
    for drafted, chosen in zip(draft_tokens, target_choices):
        if drafted != chosen:
            break
        n_accepted += 1
    return n_accepted, int(target_choices[n_accepted])


def verify_rejection(
    draft_tokens: Sequence[int],
    draft_probs: Sequence[np.ndarray] | None,
    target_probs: RowProbs,
    uniform: Callable[[], float],
    sample: Callable[[np.ndarray], int],
) -> tuple[int, int]:
    """Speculative sampling. `draft_probs[i]` is the distribution d_{i+1} was drawn from;
    None means the drafter is deterministic (q is one-hot on the drafted token).
    Target rows are requested lazily: rows after the first rejection are never built."""
    for i, drafted in enumerate(draft_tokens):
        p = target_probs(i)
        if draft_probs is None:
            q_drafted = 1.0
        else:
            q_drafted = float(draft_probs[i][drafted])
        if q_drafted > 0 and uniform() * q_drafted < p[drafted]:  # u < p/q without dividing
            continue
        if draft_probs is None:
            residual = p.copy()
            residual[drafted] = 0.0
        else:
            residual = np.maximum(p - draft_probs[i], 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: the residual is empty, p is exact
            residual = p
        return i, sample(residual)
    return len(draft_tokens), sample(target_probs(len(draft_tokens)))


def verify_match(
    draft_tokens: Sequence[int], target_probs: RowProbs, sample: Callable[[np.ndarray], int]
) -> tuple[int, int]:
    """llama.cpp's exact-match rule: sample the target at each row, keep while equal."""
    for i, drafted in enumerate(draft_tokens):
        chosen = sample(target_probs(i))
        if chosen != drafted:
            return i, chosen
    return len(draft_tokens), sample(target_probs(len(draft_tokens)))
