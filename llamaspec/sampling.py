"""Logits -> probabilities -> tokens, in pure numpy.

Plain and speculative decoding both go through `Sampler.probs`, so the distribution a
speculative run reproduces is exactly the one plain sampling draws from. The order follows
llama.cpp's default chain: repetition penalty, top-k, top-p, min-p, then temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import LlamaSpecError

_SAMPLE_BLOCK = 1024  # tokens per block of a draw (Sampler.sample)
_TOP_P_MARGIN = 8.0  # top-p first sorts the tokens within this many nats of the best one
_NO_WEIGHT = 746.0  # a token further below the best has softmax weight 0, even in float64


@dataclass(frozen=True)
class SamplingParams:
    """User sampling settings; temperature 0 means greedy (argmax, no randomness)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise LlamaSpecError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise LlamaSpecError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise LlamaSpecError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise LlamaSpecError(f"min-p must be in [0, 1), got {self.min_p}")
        if not self.repeat_penalty > 0:
            raise LlamaSpecError(f"repeat penalty must be > 0, got {self.repeat_penalty}")
        if self.seed is not None and self.seed < 0:
            if self.seed != -1:
                raise LlamaSpecError(f"seed must be >= 0, or -1 for a random one, got {self.seed}")
            object.__setattr__(self, "seed", None)  # llama.cpp's -1: a random seed
        if self.repeat_last_n < 0:
            raise LlamaSpecError(f"repeat window must be >= 0, got {self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repeat_penalty(logits: np.ndarray, history: Sequence[int], penalty: float, last_n: int) -> np.ndarray:
    """llama.cpp's penalty: divide positive logits, multiply negative ones, of recent tokens."""
    if penalty == 1.0 or last_n == 0 or not history:
        return logits
    recent = np.unique(np.asarray(history[-last_n:], dtype=np.int64))
    out = logits.copy()
    values = out[recent]
    out[recent] = np.where(values > 0, values / penalty, values * penalty)
    return out


def _as_logits(logits: np.ndarray) -> np.ndarray:
    """The row in its own float precision: llama.cpp's float32 rows are used without a copy
    (the full-vocabulary exponentials cost a quarter of float64's)."""
    x = np.asarray(logits)
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


def _exp_shifted(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """exp((x - max) / temperature): the unnormalised softmax, largest entry exactly 1."""
    shifted = np.subtract(x, x.max())
    if temperature != 1.0:
        shifted /= temperature
    return np.exp(shifted, out=shifted)


def _top_p_keep(x: np.ndarray, top_p: float) -> np.ndarray:
    """Indices into x of the smallest set of best tokens whose softmax mass reaches top_p.

    Sorting the full vocabulary costs milliseconds, so sort only the tokens within a margin
    of the best logit, widening the margin while their mass falls short. Everything outside
    the margin ranks below everything inside it, so the set is the one a full sort gives.
    (A partition instead of the margin takes milliseconds on a trimmed draft head, whose
    dropped tokens all share one logit.) Past _NO_WEIGHT the rest weigh nothing: with -inf
    logits and a top_p whose target rounding leaves out of reach, widening stops there.
    """
    weights = _exp_shifted(x)
    target = top_p * weights.sum(dtype=np.float64)
    top = x.max()
    margin = _TOP_P_MARGIN
    while True:
        part = np.flatnonzero(x >= top - margin)
        ordered = part[np.argsort(-x[part], kind="stable")]
        cumulative = np.cumsum(weights[ordered], dtype=np.float64)
        if cumulative[-1] >= target or len(part) == len(x) or margin > _NO_WEIGHT:
            return ordered[: int(np.searchsorted(cumulative, target)) + 1]
        margin *= 2


class Sampler:
    """Sampling settings plus a seeded generator: same seed and settings, same text."""

    def __init__(self, params: SamplingParams = SamplingParams()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._negated: np.ndarray | None = None  # top-k's -logits, kept between rows

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """A full-vocabulary float64 distribution for one row of logits.

        `history` is every token before this row (prompt, output, and for a verify row
        the drafted tokens in front of it): it feeds the repetition penalty.
        """
        params = self.params
        x = apply_repeat_penalty(_as_logits(logits), history, params.repeat_penalty, params.repeat_last_n)
        if params.greedy:  # the best token survives every truncation
            out = np.zeros(x.shape[0])
            out[int(np.argmax(x))] = 1.0
            return out
        keep = self._candidates(x)
        weights = _exp_shifted(x if keep is None else x[keep], params.temperature).astype(np.float64)
        weights /= weights.sum()
        if keep is None:
            return weights
        out = np.zeros(x.shape[0])
        out[keep] = weights
        return out

    def _candidates(self, x: np.ndarray) -> np.ndarray | None:
        """The tokens top-k, top-p and min-p leave, in no particular order; None: all of them
        (whole-vocabulary work then runs on contiguous arrays, not through index lists)."""
        params = self.params
        keep: np.ndarray | None = None
        kept = x
        if 0 < params.top_k < x.shape[0]:
            keep = np.argpartition(self._negate(x), params.top_k - 1)[: params.top_k]
            kept = x[keep]
        if params.top_p < 1.0:
            part = _top_p_keep(kept, params.top_p)
            keep, kept = (part if keep is None else keep[part]), kept[part]
        if params.min_p > 0.0:
            part = np.flatnonzero(_exp_shifted(kept) >= params.min_p)
            keep, kept = (part if keep is None else keep[part]), kept[part]
        return keep

    def _negate(self, x: np.ndarray) -> np.ndarray:
        """-x in a buffer kept between rows. A fresh one, beside the penalty's copy, freed enough
        memory at once for the C allocator to return it and fault it in again every row: 560
        page faults, over a millisecond a row on a VM."""
        if self._negated is None or self._negated.shape != x.shape or self._negated.dtype != x.dtype:
            self._negated = np.empty_like(x)
        return np.negative(x, out=self._negated)

    def argmax(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The greedy choice; skips building a distribution unless a penalty changes logits."""
        params = self.params
        if params.repeat_penalty == 1.0:
            return int(np.argmax(logits))
        return int(np.argmax(apply_repeat_penalty(np.asarray(logits, dtype=np.float64), history,
                                                  params.repeat_penalty, params.repeat_last_n)))

    def sample(self, probs: np.ndarray) -> int:
        """Draw one token id from a (possibly unnormalised) non-negative vector.

        The draw first picks a block of _SAMPLE_BLOCK tokens by the blocks' sums, then a token
        in it: two short running sums instead of one over the whole vocabulary."""
        if len(probs) <= _SAMPLE_BLOCK:
            cumulative = np.cumsum(probs, dtype=np.float64)
            return self._sample_in(probs, self.rng.random() * cumulative[-1], cumulative)
        blocks = np.add.reduceat(probs, np.arange(0, len(probs), _SAMPLE_BLOCK))
        cumulative = np.cumsum(blocks, dtype=np.float64)
        draw = self.rng.random() * cumulative[-1]
        block = self._sample_in(blocks, draw, cumulative)
        start = block * _SAMPLE_BLOCK
        before = cumulative[block - 1] if block else 0.0
        return start + self._sample_in(probs[start:start + _SAMPLE_BLOCK], draw - before)

    @staticmethod
    def _sample_in(part: np.ndarray, draw: float, cumulative: np.ndarray | None = None) -> int:
        """The entry of `part` where its running sum first exceeds `draw`: never a zero, which
        adds nothing to the sum; the last nonzero one where a draw at the very top rounded
        past the sum."""
        if cumulative is None:
            cumulative = np.cumsum(part, dtype=np.float64)
        index = int(np.searchsorted(cumulative, draw, side="right"))
        return index if index < len(part) else int(np.flatnonzero(part)[-1])

    def uniform(self) -> float:
        return float(self.rng.random())
