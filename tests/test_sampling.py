"""Logits -> probabilities, numpy only."""

import numpy as np
import pytest

from llamaspec.errors import LlamaSpecError
from llamaspec.sampling import Sampler, SamplingParams, apply_repeat_penalty

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def probs(**params):
    return Sampler(SamplingParams(**params)).probs(LOGITS)


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
