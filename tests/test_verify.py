"""Verification math on synthetic distributions: no model, numpy only."""

import numpy as np
import pytest

from llamaspec.sampling import Sampler, SamplingParams
from llamaspec.verify import verify_greedy, verify_match, verify_rejection


# -- greedy ------------------------------------------------------------------------------
def test_greedy_rejects_first_token():
    assert verify_greedy([5, 6, 7], [9, 6, 7, 8]) == (0, 9)


def test_greedy_accepts_all_and_takes_bonus():
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == (3, 8)


def test_greedy_partial():
    assert verify_greedy([5, 6, 7], [5, 6, 1, 8]) == (2, 1)


def test_greedy_k1():
    assert verify_greedy([4], [4, 2]) == (1, 2)
    assert verify_greedy([4], [3, 2]) == (0, 3)


def test_greedy_no_draft_is_plain_step():
    assert verify_greedy([], [7]) == (0, 7)


def test_greedy_eos_inside_draft_is_accepted_like_any_token():
    # The loop stops at the EOS; verification itself must not treat it specially.
    eos = 2
    assert verify_greedy([5, eos, 9], [5, eos, 9, 1]) == (3, 1)


# -- speculative sampling is exact in distribution ---------------------------------------------
def _normalise(x):
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


CASES = {
    "q zero where p is not": (_normalise([0.3, 0.2, 0.1, 0.25, 0.1, 0.05]), _normalise([0.5, 0.5, 0, 0, 0, 0])),
    "p zero where q is not": (_normalise([0.6, 0.4, 0, 0, 0, 0]), _normalise([0.1, 0.1, 0.2, 0.2, 0.2, 0.2])),
    "identical": (_normalise([0.1, 0.2, 0.3, 0.2, 0.1, 0.1]), _normalise([0.1, 0.2, 0.3, 0.2, 0.1, 0.1])),
    "different": (_normalise([0.05, 0.05, 0.5, 0.1, 0.2, 0.1]), _normalise([0.4, 0.1, 0.1, 0.1, 0.2, 0.1])),
}
N_DRAWS = 200_000


def _first_token_counts(p, q, verifier, n_draws=N_DRAWS, k=2, seed=0):
    """One speculative step with k draft tokens from q; count the first emitted token."""
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed))
    counts = np.zeros(len(p))
    for _ in range(n_draws):
        tokens = [sampler.sample(q) for _ in range(k)]
        n_accepted, next_token = verifier(tokens, [q] * k, lambda i: p, sampler.uniform, sampler.sample)
        counts[tokens[0] if n_accepted > 0 else next_token] += 1
    return counts / n_draws


def _tv(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejection_sampling_first_token_marginal_is_target(case):
    p, q = CASES[case]
    assert _tv(_first_token_counts(p, q, verify_rejection), p) < 0.005


def _accept_always(tokens, probs, target_probs, uniform, sample):
    return len(tokens), sample(target_probs(len(tokens)))


def test_broken_verifier_is_detected():
    p, q = CASES["different"]
    assert _tv(_first_token_counts(p, q, _accept_always, n_draws=20_000), p) > 0.05


def test_rejection_with_deterministic_draft_is_exact():
    p, _ = CASES["different"]
    sampler = Sampler(SamplingParams(temperature=1.0, seed=3))
    counts = np.zeros(len(p))
    for _ in range(N_DRAWS):
        n_accepted, next_token = verify_rejection([0], None, lambda i: p, sampler.uniform, sampler.sample)
        counts[0 if n_accepted else next_token] += 1
    assert _tv(counts / N_DRAWS, p) < 0.005


def test_match_verification_marginal_is_target():
    p, q = CASES["different"]
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1))
    counts = np.zeros(len(p))
    for _ in range(N_DRAWS):
        tokens = [sampler.sample(q) for _ in range(2)]
        n_accepted, next_token = verify_match(tokens, lambda i: p, sampler.sample)
        counts[tokens[0] if n_accepted else next_token] += 1
    assert _tv(counts / N_DRAWS, p) < 0.005


def test_rejection_sampling_joint_of_two_steps():
    """Context-dependent p(x|prev) and q(x|prev) over 4 tokens, k=2, steps repeated until two
    tokens are out: the joint of (t1, t2) must be p(t1|s) p(t2|t1)."""
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.ones(4), size=4)
    Q = rng.dirichlet(np.ones(4) * 0.5, size=4)
    Q[:, 3] = 0  # the draft never proposes token 3
    Q /= Q.sum(axis=1, keepdims=True)
    start = 0
    sampler = Sampler(SamplingParams(temperature=1.0, seed=11))
    counts = np.zeros((4, 4))
    for _ in range(N_DRAWS):
        out = [start]
        while len(out) < 3:
            drafts, qs = [], []
            for _ in range(2):
                q = Q[(drafts or out)[-1]]
                qs.append(q)
                drafts.append(sampler.sample(q))
            rows = [out[-1], *drafts]
            n_accepted, next_token = verify_rejection(drafts, qs, lambda i: P[rows[i]], sampler.uniform, sampler.sample)
            out += drafts[:n_accepted] + [next_token]
        counts[out[1], out[2]] += 1
    expected = P[start][:, None] * P
    assert _tv(counts / N_DRAWS, expected) < 0.005
