"""Cost-aware draft length: decide k each step to maximise tokens per second.

On CPU a verify batch of n tokens costs far more than one decode (and not monotonically in
n), and a draft model is only a few times cheaper than the target. A fixed k therefore often
loses to plain decoding. Two adaptive policies, both allowed to answer k = 0 (a plain step):

- `AdaptiveK` (drafters without probabilities: n-gram lookup) keeps an online estimate of
  the probability alpha_i that draft position i is accepted given 1..i-1 were, and picks
  k* = argmax_k E[tokens | k] / (draft_cost(k) + verify_cost(k + 1)) up front, where
  E[tokens | k] = 1 + sum_{i<=k} prod_{j<=i} alpha_j.
- `ConfidenceK` (the draft model) decides token by token from the draft's own probability.

`FixedK` is a fixed k (the user's `--k`), optionally cut short by the draft's confidence.
`draft_steps` runs the drafting side of the protocol for every drafter that drafts token by
token (and for the replay in scripts/policy_bounds.py), so the sequence exists once.

Pure Python; costs come from `calibrate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Protocol


class MeasuredCurve(Mapping[int, float]):
    """A model's eval cost by batch size (the target's verify, the draft's): the calibrated
    curve, corrected by what the loop measures (`observe`).

    The calibration is measured once and cached, but the relative costs of this machine move:
    on the Zen 4 VM a batch of 4 cost 1.41x a decode in one stretch and 1.75x in the next (big
    batches slower, batch 1 faster), and a policy deciding on the stale ratios drafts too much.
    So each batch size keeps a running ratio of measured to calibrated time; a size not measured
    yet borrows the ratio of the nearest size that was. One measurement moves its ratio by
    (1 - memory) and counts at most `clip` times the current one either way, so a preempted
    step does not swing it."""

    def __init__(self, calibrated: Mapping[int, float], memory: float = 0.9, clip: float = 1.5):
        if not 0.0 <= memory < 1.0 or clip < 1.0:
            raise ValueError("need 0 <= memory < 1 and clip >= 1")
        self.calibrated = dict(calibrated)
        self.memory, self.clip = memory, clip
        self.ratios: dict[int, float] = {}
        # the corrected costs, refreshed per measurement: a policy step reads them hundreds of times
        self._corrected = dict(self.calibrated)

    def ratio(self, n_tokens: int) -> float:
        if not self.ratios:
            return 1.0
        nearest = min(self.ratios, key=lambda n: (abs(n - n_tokens), n))
        return self.ratios[nearest]

    def observe(self, n_tokens: int, ms: float) -> None:
        if n_tokens not in self.calibrated or ms <= 0.0:
            return
        current = self.ratio(n_tokens)
        measured = min(max(ms / self.calibrated[n_tokens], current / self.clip), current * self.clip)
        self.ratios[n_tokens] = self.memory * self.ratios.get(n_tokens, current) + (1.0 - self.memory) * measured
        self._corrected = {n: cost * self.ratio(n) for n, cost in self.calibrated.items()}

    def __getitem__(self, n_tokens: int) -> float:
        return self._corrected[n_tokens]

    def __iter__(self) -> Iterator[int]:
        return iter(self.calibrated)

    def __len__(self) -> int:
        return len(self.calibrated)


def curve_at(curve: Mapping[int, float], n_tokens: float) -> float:
    """A cost curve read at any batch size (a mean too): measured sizes as they are, gaps interpolated,
    sizes past the largest extrapolated with the slope of the last two measurements."""
    if n_tokens in curve:
        return curve[n_tokens]
    largest = max(curve)
    if n_tokens > largest:
        previous = max((n for n in curve if n < largest), default=0)
        slope = (curve[largest] - curve.get(previous, 0.0)) / (largest - previous)
        return curve[largest] + slope * (n_tokens - largest)
    below = max(n for n in curve if n < n_tokens)
    above = min(n for n in curve if n > n_tokens)
    weight = (n_tokens - below) / (above - below)
    return curve[below] * (1 - weight) + curve[above] * weight


def shared_rows_ms(curve: Mapping[int, float], n_rows: int) -> float:
    """What n_rows of several sequences cost decoded together in pieces of at most the
    curve's largest size, as `Model.decode_many` does on a batch-invariant build."""
    largest = max(curve)
    full, rest = divmod(n_rows, largest)
    return full * curve[largest] + (curve_at(curve, rest) if rest else 0.0)


@dataclass(frozen=True)
class CostModel:
    """Milliseconds: the target's verify pass by batch size, the drafter's cost per token (a
    number, or a draft model's eval curve, read at batch 1 each time: a MeasuredCurve moves).

    `streams` (a server's slots) says how many sequences S share every eval now, and a slot's
    step is priced by what it adds to the shared round, paid by all S slots, which wait for
    it: k draft evals of its own row (the other slots need not be drafting) and k more rows in
    the round's verify. In the per-slot units the policies use (plain rate 1 / verify(1)):
    verify(n) = c(S) + S * (c(S + n - 1) - c(S)) and a drafted token S * d(1), where c is
    the verify curve read in decodes of at most its largest size (`shared_rows_ms`). With
    S = 1 this is the plain curve. Why not share the drafting among the slots: measured with
    `scripts/serve_load.py --repeats`, slots that priced a round as if every slot drafted
    drafted 0.6 tokens per token at 2 streams and 0.1-0.3 at 4, and ran 0.73-0.94x of plain
    decoding; a slot drafting alone holds up the others for its whole draft."""

    verify_ms: Mapping[int, float]
    draft_ms_per_token: float | Mapping[int, float]
    streams: Callable[[], int] | None = None

    def _sharing(self) -> int:
        return max(1, self.streams()) if self.streams is not None else 1

    def draft_token_ms(self) -> float:
        draft = self.draft_ms_per_token
        return self._sharing() * (draft[1] if isinstance(draft, Mapping) else draft)

    def verify(self, n_tokens: int) -> float:
        sharing = self._sharing()
        if sharing == 1:
            return curve_at(self.verify_ms, n_tokens)
        round_ms = shared_rows_ms(self.verify_ms, sharing)
        return round_ms + sharing * (shared_rows_ms(self.verify_ms, sharing + n_tokens - 1) - round_ms)

    def step_ms(self, k: int) -> float:
        return self.draft_token_ms() * k + self.verify(k + 1)


class DraftPolicy(Protocol):
    """How long a draft to make, step by step; a drafter calls these in this order."""

    wants_prob: bool  # False: `more` ignores its argument, so the drafter need not compute it

    def begin(self, max_k: int) -> int:
        """At most this many tokens this step (0: a plain step, draft nothing)."""
        ...

    def pays(self) -> bool:
        """Whether a step now would draft at all (no side effects): a draft model that would
        not be asked need not decode a prompt (a server's slot under load)."""
        ...

    def more(self, top_prob: float) -> bool:
        """After each drafted token, with the drafter's probability for it: draft another?"""
        ...

    def keep(self, n_drafted: int) -> int:
        """How many of the drafted tokens to send to verification."""
        ...

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """What verification accepted (called for plain steps too, with 0 drafted)."""
        ...


def draft_steps(policy: DraftPolicy, max_k: int, next_token: Callable[[int], tuple[float, bool]]) -> tuple[int, int]:
    """begin, then per drafted token `more`, then `keep`: `next_token(i)` drafts token i and
    returns the drafter's probability for it and whether drafting can go on after it (not at
    an end of generation). Returns (tokens drafted, tokens to verify); `update` follows once
    verification has spoken."""
    limit = policy.begin(max_k)
    drafted = 0
    while drafted < limit:
        prob, can_go_on = next_token(drafted)
        drafted += 1
        if not policy.more(prob) or not can_go_on:  # `more` sees every token: ConfidenceK's keep needs it
            break
    return drafted, policy.keep(drafted) if drafted else 0


class FixedK:
    """The loop's k every step; drafting stops early after a token whose draft probability is
    below `min_top_prob` (0: never)."""

    def __init__(self, min_top_prob: float = 0.0):
        if not 0.0 <= min_top_prob <= 1.0:
            raise ValueError("min_top_prob must be between 0 and 1")
        self.min_top_prob = min_top_prob
        self.wants_prob = min_top_prob > 0.0

    def begin(self, max_k: int) -> int:
        return max_k

    def pays(self) -> bool:
        return True

    def more(self, top_prob: float) -> bool:
        return top_prob >= self.min_top_prob

    def keep(self, n_drafted: int) -> int:
        return n_drafted

    def update(self, n_drafted: int, n_accepted: int) -> None:
        pass


class AdaptiveK:
    """Online acceptance estimates per draft position + a cost model -> the best k.

    Each estimate is (prior pseudo-counts + observed counts); observed counts fade by `decay`
    at every step, observed or not. So evidence ages: after a run of plain steps the
    estimates drift back to the (optimistic) prior and speculation is tried again, which is
    how a drafter that disappointed on one kind of text gets another chance on the next.
    The prior 0.7: replayed on the suite (scripts/policy_bounds.py data), 0.85 lost 2-3 % to
    futile n-gram retries where drafting does not pay and 0.7 nothing, with the same gains
    where it does."""

    wants_prob = False

    def __init__(self, costs: CostModel, k_max: int = 8, prior_acceptance: float = 0.7,
                 prior_weight: float = 2.0, decay: float = 0.98):
        if k_max < 1:
            raise ValueError("k_max must be at least 1")
        self.costs = costs
        self.k_max = k_max
        self.decay = decay
        self._prior_accepted = prior_acceptance * prior_weight
        self._prior_seen = prior_weight
        self._accepted = [0.0] * k_max
        self._seen = [0.0] * k_max

    def acceptance(self) -> list[float]:
        """Estimated P(position i accepted | positions before it accepted), i = 1..k_max."""
        return [(self._prior_accepted + a) / (self._prior_seen + s) for a, s in zip(self._accepted, self._seen)]

    def expected_tokens(self, k: int) -> float:
        expected, reach = 1.0, 1.0
        for alpha in self.acceptance()[:k]:
            reach *= alpha
            expected += reach
        return expected

    def expected_rate(self, k: int) -> float:
        """Expected tokens per millisecond with k drafted tokens."""
        return self.expected_tokens(k) / self.costs.step_ms(k)

    def choose(self, max_k: int | None = None) -> int:
        """The k with the best expected rate under the current estimates (no side effects)."""
        limit = self.k_max if max_k is None else min(max_k, self.k_max)
        return max(range(limit + 1), key=self.expected_rate)

    def begin(self, max_k: int) -> int:
        """One step: the evidence fades (drafting or not), then k is chosen."""
        self._accepted = [a * self.decay for a in self._accepted]
        self._seen = [s * self.decay for s in self._seen]
        return self.choose(max_k)

    def pays(self) -> bool:
        return self.choose() > 0

    def more(self, top_prob: float) -> bool:
        return True  # k was chosen up front

    def keep(self, n_drafted: int) -> int:
        return n_drafted

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """Positions 1..n_accepted were accepted; position n_accepted+1 (if drafted) was not."""
        for i in range(min(n_drafted, self.k_max)):
            self._seen[i] += 1.0
            if i < n_accepted:
                self._accepted[i] += 1.0
            else:
                break  # later positions were not reached


class ConfidenceK:
    """Draft length decided token by token from the draft model's own confidence.

    The draft's probability for its greedy token is close to the chance the target accepts
    it (measured on the prompt suite: 0.99 -> 1.00, 0.5 -> 0.56, 0.3 -> 0.39), so after i
    drafted tokens the expected output of verifying them is E_i = 1 + sum_j prod_{l<=j} p_l.
    A step is worth E_k - rate * ms_k, where `rate` is the tokens per ms achieved so far
    (at least plain decoding's): the renewal-reward criterion for the long-run rate. Drafting
    continues while some longer draft, its tokens assumed as likely as the last one, is
    worth more than verifying now; then the best prefix is verified (the drafting time is
    spent either way; a sampled draft is verified whole, see `DraftModelDrafter.propose`:
    leaving a token out for its own probability would bias speculative sampling). Before
    drafting, a running estimate of the first token's acceptance decides whether drafting can
    pay at all; when it cannot, the step is plain and the estimate drifts back to its prior,
    so drafting is tried again later.
    """

    wants_prob = True

    def __init__(self, costs: CostModel, k_max: int = 8, prior_first: float = 0.9, memory: float = 0.9):
        if k_max < 1:
            raise ValueError("k_max must be at least 1")
        self.costs, self.k_max = costs, k_max
        self.prior_first, self.memory = prior_first, memory
        self.first = prior_first  # running P(first drafted token accepted)
        self.rate = self.plain_rate
        self._tokens = self._ms = 0.0
        self._limit = 0
        self._expected = [1.0]  # E_i for i = 0..drafted
        self._reach = 1.0

    @property
    def plain_rate(self) -> float:
        """Tokens per ms of plain decoding: a measured curve moves it."""
        return 1.0 / self.costs.verify(1)

    def _worth(self, k: int, expected: float) -> float:
        return expected - self.rate * self.costs.step_ms(k)

    def _best_from(self, p: float, k: int, expected: float, reach: float, limit: int) -> float:
        """The best worth of drafting on from k drafted tokens (E_k = expected, reaching the
        k-th with `reach`) up to `limit`, each further token accepted with p."""
        best = float("-inf")
        for j in range(k + 1, limit + 1):
            reach *= p
            expected += reach
            best = max(best, self._worth(j, expected))
        return best

    def _best_ahead(self, p: float) -> float:
        return self._best_from(p, len(self._expected) - 1, self._expected[-1], self._reach, self._limit)

    def pays(self) -> bool:
        return self._best_from(self.first, 0, 1.0, 1.0, self.k_max) > self._worth(0, 1.0)

    def begin(self, max_k: int) -> int:
        self._limit = min(max_k, self.k_max)
        self._expected, self._reach = [1.0], 1.0
        if self._limit <= 0 or self._best_ahead(self.first) <= self._worth(0, 1.0):
            self.first += (self.prior_first - self.first) * (1.0 - self.memory)
            return 0
        return self._limit

    def more(self, top_prob: float) -> bool:
        self._reach *= top_prob
        self._expected.append(self._expected[-1] + self._reach)
        k = len(self._expected) - 1
        return k < self._limit and self._best_ahead(top_prob) > self._worth(k, self._expected[-1])

    def keep(self, n_drafted: int) -> int:
        expected = self._expected[: n_drafted + 1]
        return max(range(len(expected)), key=lambda k: expected[k] - self.rate * self.costs.verify(k + 1))

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted:
            self.first = self.memory * self.first + (1.0 - self.memory) * (n_accepted > 0)
        fade = 0.98  # the rate follows the text: recent steps count most
        self._tokens = fade * self._tokens + n_accepted + 1
        self._ms = fade * self._ms + self.costs.step_ms(n_drafted)
        self.rate = max(self.plain_rate, self._tokens / self._ms)
