"""Speculative sampling on a real model: same distribution as plain sampling (a test with power)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

import llamaspec.speculative as speculative
from llamaspec.drafters.draft_model import DraftModelDrafter
from llamaspec.llama import Model, ModelOptions
from llamaspec.policy import ConfidenceK, CostModel
from llamaspec.sampling import Sampler, SamplingParams
from llamaspec.speculative import generate_tokens

N_SAMPLES = 3000
ALPHA = 0.001
PARAMS = dict(temperature=1.0, top_k=40)
OPTIONS = ModelOptions(n_ctx=256)


def first_two(target, prompt, drafter, n, seed0, verify="rejection"):
    """Counts of the second and third tokens: the first step's verified pair (the first token
    is sampled from the prompt's row, before any drafting)."""
    out = Counter()
    for i in range(n):
        sampler = Sampler(SamplingParams(seed=seed0 + i, **PARAMS))
        out[tuple(generate_tokens(target, prompt, drafter=drafter, k=3, max_tokens=3, sampler=sampler,
                                  verify=verify))[1:]] += 1
    return out


def two_sample_p_value(a: Counter, b: Counter) -> float:
    """Chi-square test of homogeneity; rare outcomes are pooled so expected counts stay >= 5."""
    keys = sorted(set(a) | set(b), key=lambda key: -(a[key] + b[key]))
    table, pooled = [], [0, 0]
    for key in keys:
        if a[key] + b[key] >= 10:
            table.append([a[key], b[key]])
        else:
            pooled[0] += a[key]
            pooled[1] += b[key]
    if sum(pooled) >= 10:
        table.append(pooled)
    return float(chi2_contingency(np.array(table).T)[1])


@pytest.fixture(scope="module")
def setup(stories, truncated_draft):
    with Model(stories, OPTIONS) as target, Model(truncated_draft, OPTIONS) as draft:
        prompt = target.tokenize("Once upon a time")
        plain = first_two(target, prompt, None, N_SAMPLES, seed0=10_000)
        yield target, DraftModelDrafter(draft), prompt, plain


@pytest.mark.parametrize("verify", ["rejection", "match"])
def test_speculative_sampling_matches_plain(setup, verify):
    target, drafter, prompt, plain = setup
    spec = first_two(target, prompt, drafter, N_SAMPLES, seed0=50_000, verify=verify)
    assert len(plain) > 10  # the test means something only if there is real variety
    p_value = two_sample_p_value(plain, spec)
    print(f"{verify}: p = {p_value:.4f} over {len(set(plain) | set(spec))} outcomes")
    assert p_value >= ALPHA


def test_confidence_policy_keeps_every_sampled_draft_token(setup):
    """ConfidenceK picks the prefix of a greedy draft worth verifying from the tokens' own
    probabilities. Done to a sampled draft, that would verify d_i or not depending on q(d_i),
    and rejection sampling is exact only when it does not: with these costs `keep` dropped the
    tokens below q = 0.5 (114 of 300 first drafts), and the pairs' distribution moved (p < 1e-4).
    Every sampled token drafted is verified; the policy still decides, from the tokens before,
    whether to draft another."""
    target, drafter, prompt, plain = setup
    steep = CostModel({1: 10.0, 2: 15.0, 3: 20.0, 4: 25.0}, draft_ms_per_token=0.5)
    confident = DraftModelDrafter(drafter.model, ConfidenceK(steep, k_max=3))
    spec = first_two(target, prompt, confident, N_SAMPLES, seed0=50_000)
    p_value = two_sample_p_value(plain, spec)
    print(f"ConfidenceK: p = {p_value:.4f}")
    assert p_value >= ALPHA


def test_broken_verifier_is_rejected(setup, monkeypatch):
    target, drafter, prompt, plain = setup

    def accept_always(tokens, probs, target_probs, uniform, sample):
        return len(tokens), sample(target_probs(len(tokens)))

    monkeypatch.setattr(speculative, "verify_rejection", accept_always)
    spec = first_two(target, prompt, drafter, N_SAMPLES, seed0=50_000)
    assert two_sample_p_value(plain, spec) < ALPHA


def test_seed_reproducibility_and_temperature_zero(stories, truncated_draft):
    with Model(stories, OPTIONS) as target, Model(truncated_draft, OPTIONS) as draft:
        drafter = DraftModelDrafter(draft)
        prompt = target.tokenize("The little dog")

        def run(seed, **params):
            sampler = Sampler(SamplingParams(seed=seed, **params))
            return list(generate_tokens(target, prompt, drafter=drafter, k=3, max_tokens=40, sampler=sampler))

        assert run(7, temperature=0.8, top_p=0.9) == run(7, temperature=0.8, top_p=0.9)
        assert run(7, temperature=0.8, top_p=0.9) != run(8, temperature=0.8, top_p=0.9)
        assert run(1, temperature=0.0) == list(generate_tokens(target, prompt, max_tokens=40))
