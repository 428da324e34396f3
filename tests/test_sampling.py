"""Logits -> probabilities, numpy only."""

import numpy as np
import pytest

from llamaspec.errors import LlamaSpecError
from llamaspec.sampling import Sampler, SamplingParams, apply_repeat_penalty

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def probs(**params):
    return Sampler(SamplingParams(**params)).probs(LOGITS)


def test_seed_minus_one_is_random_as_in_llama_cpp_other_negatives_are_refused():
    assert SamplingParams(temperature=1.0, seed=-1).seed is None
    with pytest.raises(LlamaSpecError, match="seed"):
        SamplingParams(temperature=1.0, seed=-2)


def test_temperature_one_is_softmax():
    np.testing.assert_allclose(probs(temperature=1.0), [0.5, 0.2, 0.15, 0.1, 0.05])


def test_greedy_is_one_hot_argmax():
    np.testing.assert_array_equal(probs(temperature=0.0), [1, 0, 0, 0, 0])


def test_low_temperature_sharpens():
    assert probs(temperature=0.5)[0] > 0.5


def test_top_k():
    np.testing.assert_allclose(probs(temperature=1.0, top_k=2), [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])


def test_top_p_keeps_smallest_set_reaching_p():
    np.testing.assert_allclose(probs(temperature=1.0, top_p=0.7), [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    np.testing.assert_allclose(probs(temperature=1.0, top_p=0.71)[:3].sum(), 1.0)


def test_top_p_on_a_wide_flat_vocabulary_widens_its_window():
    logits = np.zeros(5000)
    p = Sampler(SamplingParams(temperature=1.0, top_p=0.4999)).probs(logits)
    assert np.count_nonzero(p) == 2500
    np.testing.assert_allclose(p.sum(), 1.0)


def test_min_p():
    np.testing.assert_allclose(probs(temperature=1.0, min_p=0.3), [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])


def test_repeat_penalty_divides_positive_and_multiplies_negative():
    out = apply_repeat_penalty(np.array([2.0, -2.0, 1.0]), [0, 1], 2.0, 64)
    np.testing.assert_array_equal(out, [1.0, -4.0, 1.0])


def test_repeat_penalty_window():
    out = apply_repeat_penalty(np.array([2.0, 2.0]), [0, 1], 2.0, 1)
    np.testing.assert_array_equal(out, [2.0, 1.0])


def test_greedy_argmax_respects_penalty():
    sampler = Sampler(SamplingParams(repeat_penalty=10.0))
    assert sampler.argmax(LOGITS, history=[]) == 0
    assert sampler.argmax(np.array([3.0, 2.9]), history=[0]) == 1


def test_same_seed_same_draws():
    a = Sampler(SamplingParams(temperature=1.0, seed=42))
    b = Sampler(SamplingParams(temperature=1.0, seed=42))
    p = a.probs(LOGITS)
    assert [a.sample(p) for _ in range(50)] == [b.sample(p) for _ in range(50)]


def test_sample_matches_distribution():
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0))
    p = sampler.probs(LOGITS)
    draws = np.bincount([sampler.sample(p) for _ in range(50_000)], minlength=5) / 50_000
    assert 0.5 * np.abs(draws - p).sum() < 0.01


@pytest.mark.parametrize(
    "bad",
    [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(min_p=1.0),
     dict(repeat_penalty=0.0), dict(temperature=float("nan"))],
)
def test_bad_settings_are_rejected(bad):
    with pytest.raises(LlamaSpecError):
        SamplingParams(**bad)


def _top_p_by_full_sort(logits, top_p):
    """Reference: sort the whole vocabulary, keep the smallest prefix reaching top_p."""
    order = np.argsort(-logits, kind="stable")
    weights = np.exp(logits.astype(np.float64) - logits.max())[order]
    n_keep = int(np.searchsorted(np.cumsum(weights), top_p * weights.sum())) + 1
    return set(order[:n_keep].tolist())


@pytest.mark.parametrize("scale", [0.01, 1.0, 3.0, 6.0, 30.0])
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_top_p_equals_a_full_sort(scale, top_p):
    # peaked rows (scale 30) keep a few tokens; rows spread wider than the first margin
    # (scales 3 and 6 at top-p 0.999) need it widened; flat ones fall inside it whole
    rng = np.random.default_rng(int(scale * 100) + int(top_p * 1000))
    logits = (rng.standard_normal(20_000) * scale).astype(np.float32)
    logits[rng.integers(0, 20_000, 5_000)] = -np.inf  # a trimmed draft head's dropped tokens
    p = Sampler(SamplingParams(temperature=1.0, top_p=top_p)).probs(logits)
    assert set(np.flatnonzero(p).tolist()) == _top_p_by_full_sort(logits, top_p)
    assert p.dtype == np.float64 and abs(p.sum() - 1.0) < 1e-9


def test_top_p_just_below_one_stops_widening_past_the_last_weighted_token(monkeypatch):
    """With -inf logits (a trimmed draft head) and a top_p whose target the rounded sum of the
    kept weights may never reach, the margin doubled about a thousand times until it overflowed;
    it now stops once every token with weight is inside, with the full sort's answer."""
    rng = np.random.default_rng(13)  # a row where it happens (before: 126 widenings)
    logits = (rng.standard_normal(50_000) * 10).astype(np.float32)
    logits[rng.integers(0, 50_000, 20_000)] = -np.inf
    top_p = 0.99999999999999
    widenings = []
    flatnonzero = np.flatnonzero
    monkeypatch.setattr(np, "flatnonzero", lambda a: widenings.append(1) or flatnonzero(a))
    p = Sampler(SamplingParams(temperature=1.0, top_p=top_p)).probs(logits)
    monkeypatch.undo()
    weighted = set(np.flatnonzero(np.exp(logits - logits.max())).tolist())  # float32 weight above 0
    assert set(np.flatnonzero(p).tolist()) == _top_p_by_full_sort(logits, top_p) & weighted
    assert len(widenings) <= 12, len(widenings)


def test_large_vocabulary_draws_follow_the_distribution_and_skip_zeros():
    # spans many sampling blocks, with whole blocks of zeros and a zero tail
    rng = np.random.default_rng(3)
    p = np.zeros(9_000)
    support = rng.choice(7_000, 40, replace=False)
    p[support] = rng.random(40)
    p[100:1100] = 0.0
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1))
    draws = np.bincount([sampler.sample(p) for _ in range(40_000)], minlength=len(p)) / 40_000
    assert draws[p == 0].sum() == 0
    assert 0.5 * np.abs(draws - p / p.sum()).sum() < 0.02


def test_a_draw_at_the_very_top_lands_on_the_last_nonzero_token():
    class Top:
        def random(self) -> float:
            return 1.0  # past any real draw: the sums' rounding at the end must not escape

    for n in (10, 5_000):
        p = np.zeros(n)
        p[[3, n // 2]] = 0.5
        sampler = Sampler()
        sampler.rng = Top()
        assert sampler.sample(p) == n // 2
