"""Drafting policy and n-gram lookup on synthetic inputs: no model."""

import copy

import pytest

from llamaspec.drafters import Draft
from llamaspec.drafters.hybrid import HybridDrafter
from llamaspec.drafters.ngram import NgramDrafter
from llamaspec.policy import AdaptiveK, ConfidenceK, CostModel, FixedK, MeasuredCurve, draft_steps, shared_rows_ms
from llamaspec.sampling import Sampler

# The shape measured on a 2-core CPU: verify cost grows almost linearly with batch size.
STEEP = CostModel({1: 88, 2: 126, 3: 160, 4: 201, 5: 245, 6: 282, 8: 487}, draft_ms_per_token=35)
# A bandwidth-bound target (e.g. F16): verifying 8 tokens costs little more than one.
FLAT = CostModel({1: 140, 2: 145, 3: 150, 4: 155, 5: 160, 6: 165, 8: 180}, draft_ms_per_token=30)


def trained(costs, alpha, steps=400, k_max=8):
    """A policy fed with draws where each position is accepted with probability alpha."""
    import random

    rng = random.Random(0)
    policy = AdaptiveK(costs, k_max=k_max)
    for _ in range(steps):
        n_accepted = 0
        while n_accepted < k_max and rng.random() < alpha:
            n_accepted += 1
        policy.update(k_max, n_accepted)
    return policy


def test_cost_interpolation_and_extrapolation():
    assert STEEP.verify(7) == pytest.approx((282 + 487) / 2)
    assert STEEP.verify(9) == pytest.approx(487 + (487 - 282) / 2)
    assert STEEP.verify(4) == 201


def test_acceptance_estimate_converges():
    policy = trained(FLAT, 0.8)
    assert policy.acceptance()[0] == pytest.approx(0.8, abs=0.08)


def test_flat_costs_and_high_acceptance_draft_long():
    assert trained(FLAT, 0.9).choose() >= 5


def test_steep_costs_and_low_acceptance_go_plain():
    assert trained(STEEP, 0.3).choose() == 0


def test_steep_costs_with_free_drafts_and_high_acceptance_draft():
    free = CostModel(STEEP.verify_ms, draft_ms_per_token=0.0)
    assert trained(free, 0.95).choose() >= 2


def test_expected_rate_by_hand():
    """No evidence yet: every position at the prior 0.7. On FLAT, k tokens cost 30 k + verify(k + 1):
    k = 0, 1, 2, 3 give 1 / 140, 1.7 / 175, 2.19 / 210 and 2.533 / 245 tokens a ms, so k = 2."""
    policy = AdaptiveK(FLAT)
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    rates = [1 / 140, 1.7 / 175, 2.19 / 210, 2.533 / 245]
    assert [policy.expected_rate(k) for k in range(4)] == pytest.approx(rates)
    assert policy.choose() == 2 and policy.choose(max_k=1) == 1


def test_after_plain_steps_evidence_ages_and_speculation_resumes():
    policy = trained(FLAT, 0.2)
    assert policy.choose() == 0 and policy.choose() == 0  # choosing alone changes nothing
    choices = [policy.begin(8) for _ in range(200)]  # steps: the evidence fades
    first = next(i for i, k in enumerate(choices) if k)
    assert 10 < first < 200  # not at once, but it does try again
    for _ in range(5):
        policy.update(8, 0)  # and bad news stops it again
    assert policy.choose() == 0


def test_choose_respects_max_k():
    assert trained(FLAT, 0.95).choose(max_k=2) <= 2


# Measured on an AVX-512 machine: the Q4_K_M target (rows cost ~0.6 of a decode up to 8,
# then little more) and its F16 profile (bandwidth-bound), both with an 11.5 ms draft token.
Q4_AVX512 = CostModel({1: 26.4, 2: 46.1, 3: 61.6, 4: 77.4, 6: 109.6, 8: 129.2, 12: 157.2, 16: 149.4}, 11.5)
F16_AVX512 = CostModel({1: 88.0, 2: 129.2, 3: 115.6, 4: 117.1, 6: 133.7, 8: 161.1, 12: 190.3, 16: 212.4}, 11.5)


def draft_with(policy, probs, max_k=15):
    """The drafter's side of the protocol on given draft probabilities: (drafted, kept)."""
    return draft_steps(policy, max_k, lambda i: (probs[i], i + 1 < len(probs)))


def test_draft_steps_calls_more_for_every_token_and_stops_where_the_drafter_must():
    calls = []

    class Recorder(FixedK):
        def more(self, top_prob):
            calls.append(top_prob)
            return True

    assert draft_with(Recorder(), [0.9, 0.8, 0.7], max_k=2) == (2, 2)  # the limit
    assert calls == [0.9, 0.8]
    assert draft_with(Recorder(), [0.9, 0.8], max_k=5) == (2, 2)  # the drafter cannot go on (end of text)
    assert calls == [0.9, 0.8, 0.9, 0.8]
    never = FixedK()
    never.begin = lambda max_k: 0
    assert draft_with(never, [0.9]) == (0, 0)  # a plain step drafts nothing


def test_fixed_k_drafts_the_loops_k_and_stops_after_an_unsure_token():
    assert draft_with(FixedK(), [0.1] * 20, max_k=4) == (4, 4)
    assert not FixedK().wants_prob  # the drafter may skip computing probabilities
    policy = FixedK(min_top_prob=0.5)
    assert policy.wants_prob
    assert draft_with(policy, [0.9, 0.6, 0.4, 0.9, 0.9], max_k=8) == (3, 3)  # the unsure token is still verified
    with pytest.raises(ValueError):
        FixedK(1.5)


def test_confidence_policy_drafts_long_while_the_draft_is_sure_and_stops_when_it_is_not():
    policy = ConfidenceK(F16_AVX512, k_max=15)
    assert draft_with(policy, [0.999] * 20) == (15, 15)
    drafted, kept = draft_with(policy, [0.99, 0.99, 0.2, 0.9, 0.9, 0.9])
    assert drafted <= 4 and kept <= 3  # an unsure token ends the draft, and is not worth verifying alone
    # The same certain draft never pays where every drafted token costs almost a decode.
    assert ConfidenceK(Q4_AVX512, k_max=3).begin(3) == 0


def test_confidence_policy_keeps_the_best_prefix_of_a_non_monotonic_curve():
    # verify(2) > verify(3) here: one sure token then an unsure one, both verified, beat one.
    policy = ConfidenceK(CostModel({1: 88.0, 2: 130.0, 3: 100.0, 4: 140.0}, 5.0), k_max=3)
    assert policy.begin(3) == 3
    policy.more(0.95)
    assert policy.more(0.3) is False
    assert policy.keep(2) == 2
    policy.more(0.1)  # drafted anyway (say, k was fixed): a third, unlikely row costs more than it brings
    assert policy.keep(3) == 2


def test_confidence_policy_gate_closes_on_failures_and_reopens():
    policy = ConfidenceK(F16_AVX512, k_max=15)
    for _ in range(40):
        policy.update(3, 0)
    assert policy.begin(15) == 0
    opened = next(i for i in range(500) if policy.begin(15) > 0)
    assert 3 <= opened < 500  # not at once, but it does try again
    rate_before = policy.rate
    for _ in range(20):
        policy.update(8, 8)  # nine tokens for one verify(9): above the plain rate
    assert policy.rate > rate_before > 0


def test_measured_curve_follows_what_the_loop_pays():
    curve = MeasuredCurve({1: 30.0, 2: 33.0, 4: 42.0, 8: 70.0})
    assert dict(curve) == {1: 30.0, 2: 33.0, 4: 42.0, 8: 70.0}  # nothing measured: the calibration
    for _ in range(60):
        curve.observe(4, 84.0)  # batch 4 costs twice what the calibration says
    assert curve[4] == pytest.approx(84.0, rel=0.01)
    assert curve[8] == pytest.approx(140.0, rel=0.01) and curve[1] == pytest.approx(60.0, rel=0.01)  # the nearest
    for _ in range(60):
        curve.observe(1, 27.0)
    assert curve[1] == pytest.approx(27.0, rel=0.01)
    assert curve[2] == pytest.approx(33.0 * 0.9, rel=0.01)  # nearer to 1 than to 4
    curve.observe(3, 500.0)  # not a calibrated size: nothing to compare with
    assert 3 not in curve.ratios and CostModel(curve, 0.0).verify(3) == pytest.approx((curve[2] + curve[4]) / 2)


def test_measured_curve_takes_one_preempted_step_in_small_part():
    curve = MeasuredCurve({1: 30.0})
    curve.observe(1, 3000.0)
    assert 30.0 < curve[1] <= 30.0 * 1.05 + 1e-9  # clipped to 1.5x, then a tenth of the way
    with pytest.raises(ValueError):
        MeasuredCurve({1: 30.0}, memory=1.0)


def test_draft_cost_per_token_follows_a_measured_draft_curve():
    draft = MeasuredCurve({1: 10.0, 2: 12.0})
    costs = CostModel({1: 30.0, 2: 33.0}, draft)
    assert costs.step_ms(1) == pytest.approx(10.0 + 33.0)
    for _ in range(60):
        draft.observe(1, 5.0)
    assert costs.draft_token_ms() == pytest.approx(5.0, rel=0.01) and costs.step_ms(1) == pytest.approx(38.0, rel=0.01)
    assert CostModel({1: 30.0}, 7.0).draft_token_ms() == 7.0


def test_confidence_policy_drafts_less_once_big_batches_are_measured_dearer():
    curve = MeasuredCurve({1: 30.0, 2: 32.0, 3: 36.0, 4: 40.0, 5: 46.0, 6: 52.0, 7: 58.0, 8: 64.0, 9: 70.0})
    probs = [0.8] * 10
    cheap = draft_with(ConfidenceK(CostModel(curve, 5.0), k_max=8), probs)
    for _ in range(60):
        curve.observe(1, 30.0)
        for n in range(3, 10):
            curve.observe(n, 1.4 * curve.calibrated[n])
    dear = draft_with(ConfidenceK(CostModel(curve, 5.0), k_max=8), probs)
    assert 0 < dear[1] < cheap[1]


# The Zen 4 VM's calibration of the Qwen 1.5B Q4_K_M target and the default draft (ms by rows).
ZEN4_TARGET = {1: 24.8, 2: 24.8, 4: 37.9, 8: 60.8, 12: 91.8, 16: 115.4}
ZEN4_DRAFT = {1: 9.1, 2: 8.9, 4: 10.2, 8: 16.4, 9: 18.0}


def test_shared_rows_are_priced_in_pieces_of_the_largest_measured_batch():
    curve = {1: 10.0, 2: 12.0, 4: 20.0, 16: 100.0}
    assert shared_rows_ms(curve, 4) == 20.0
    assert shared_rows_ms(curve, 16) == 100.0
    assert shared_rows_ms(curve, 40) == pytest.approx(2 * 100.0 + 20.0 + (8 - 4) / (16 - 4) * 80.0)
    assert shared_rows_ms(curve, 33) == pytest.approx(2 * 100.0 + 10.0)


def test_a_server_slot_step_is_priced_by_what_it_adds_to_the_round_for_every_slot():
    """A slot that drafts holds up every busy slot: its k draft evals (one row: the others need
    not be drafting) and its k more rows in the round's verify, paid by all S slots."""
    streams = [1]
    costs = CostModel(ZEN4_TARGET, ZEN4_DRAFT, lambda: streams[0])
    alone = CostModel(ZEN4_TARGET, ZEN4_DRAFT)
    for k in (0, 1, 3, 7):
        assert costs.step_ms(k) == alone.step_ms(k)
    streams[0] = 4
    assert costs.verify(1) == ZEN4_TARGET[4]  # a plain step: the round itself
    assert costs.draft_token_ms() == 4 * ZEN4_DRAFT[1]
    rows_7 = (ZEN4_TARGET[4] + 3 * ZEN4_TARGET[8]) / 4
    assert costs.step_ms(3) == pytest.approx(ZEN4_TARGET[4] + 4 * (3 * ZEN4_DRAFT[1] + rows_7 - ZEN4_TARGET[4]))
    streams[0] = 16
    assert costs.verify(2) == pytest.approx(ZEN4_TARGET[16] + 16 * ZEN4_TARGET[1])  # row 17: a second decode
    streams[0] = 0  # between requests: a slot counts itself
    assert costs.step_ms(2) == alone.step_ms(2)


def test_confidence_policy_stops_drafting_when_many_slots_share_the_batch():
    """Measured with scripts/serve_load.py before this was priced in: 8 streams drafting as if
    alone ran at 41 tok/s against 77 plain. A sure draft still pays for one stream, not for 8."""
    streams = [1]
    policy = ConfidenceK(CostModel(ZEN4_TARGET, ZEN4_DRAFT, lambda: streams[0]), k_max=15)
    sure = [0.95] * 20
    assert policy.pays() and draft_with(policy, sure)[1] >= 3
    streams[0] = 8
    assert not policy.pays()  # so a slot's draft model need not decode the prompt
    assert policy.begin(15) == 0
    streams[0] = 2  # measured: slots drafting at 2 streams ran 0.85-1.09x of plain decoding
    assert not policy.pays() and policy.begin(15) == 0
    streams[0] = 1
    assert policy.pays() and draft_with(policy, sure)[1] >= 3


def test_pays_says_whether_begin_would_draft_without_changing_the_policy():
    for adaptive, drafts in ((AdaptiveK(CostModel(ZEN4_TARGET, ZEN4_DRAFT[1])), True), (trained(STEEP, 0.3), False)):
        assert adaptive.pays() == drafts and (copy.deepcopy(adaptive).begin(adaptive.k_max) > 0) == drafts
    assert FixedK().pays()
    costly = ConfidenceK(CostModel({1: 30.0, 2: 60.0, 3: 90.0}, 30.0), k_max=2)  # a draft as dear as a decode
    assert not costly.pays() and costly.begin(2) == 0
    policy = ConfidenceK(CostModel(ZEN4_TARGET, ZEN4_DRAFT), k_max=15)
    before = vars(policy).copy()
    assert policy.pays() and vars(policy) == before


def test_ngram_copies_what_followed_the_latest_match():
    drafter = NgramDrafter(min_ngram=2, max_ngram=3)
    context = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3]
    assert drafter.propose(context, 4, Sampler()).tokens == [7, 8, 6, 1]


def test_ngram_prefers_longer_matches():
    drafter = NgramDrafter(min_ngram=1, max_ngram=3)
    #            "5 2 3" -> 4 ;  later "2 3" -> 9 ; the suffix is "5 2 3"
    context = [5, 2, 3, 4, 0, 2, 3, 9, 0, 5, 2, 3]
    assert drafter.propose(context, 1, Sampler()).tokens == [4]


def test_ngram_without_match_drafts_nothing_and_follows_a_changed_context():
    drafter = NgramDrafter(min_ngram=2)
    assert drafter.propose([1, 2, 3, 4], 4, Sampler()).tokens == []
    assert drafter.propose([1, 2, 3, 4, 1, 2], 4, Sampler()).tokens == [3, 4, 1, 2]
    # A different conversation: the old index must not leak into it.
    assert drafter.propose([7, 1, 2], 4, Sampler()).tokens == []


class FixedDrafter:
    def __init__(self, tokens):
        self.tokens, self.observed = tokens, []

    def prefill(self, prompt):
        pass

    def propose(self, context, max_k, sampler):
        return Draft(self.tokens[:max_k])

    def observe(self, n_drafted, n_accepted):
        self.observed.append((n_drafted, n_accepted))

    def close(self):
        pass


def test_hybrid_uses_ngram_when_it_matches_and_routes_feedback():
    model = FixedDrafter([42, 43])
    hybrid = HybridDrafter(NgramDrafter(min_ngram=2), model)
    assert hybrid.propose([1, 2, 3, 1, 2], 3, Sampler()).tokens == [3, 1, 2]
    hybrid.observe(3, 3)
    assert model.observed == []
    assert hybrid.propose([5, 6, 7], 3, Sampler()).tokens == [42, 43]
    hybrid.observe(2, 1)
    assert model.observed == [(2, 1)]
