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

_TOP_P_WINDOW = 256  # top-p first looks at this many best tokens before sorting more


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


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _top_p_keep(probs: np.ndarray, candidates: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest prefix of candidates (by probability) whose mass reaches top_p.

    Sorting the full vocabulary costs milliseconds, so look at a window of the best tokens
    first and widen it only when the window's mass falls short.
    """
    window = _TOP_P_WINDOW
    while True:
        if window < len(candidates):
            part = candidates[np.argpartition(-probs[candidates], window)[:window]]
        else:
            part = candidates
        ordered = part[np.argsort(-probs[part], kind="stable")]
        cumulative = np.cumsum(probs[ordered])
        total = probs[candidates].sum()
        if cumulative[-1] >= top_p * total or len(part) == len(candidates):
            n_keep = int(np.searchsorted(cumulative, top_p * total)) + 1
            return ordered[: min(n_keep, len(ordered))]
        window *= 4


class Sampler:
    """Sampling settings plus a seeded generator: same seed and settings, same text."""

    def __init__(self, params: SamplingParams = SamplingParams()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """A full-vocabulary float64 distribution for one row of logits.

        `history` is every token before this row (prompt, output, and for a verify row
        the drafted tokens in front of it): it feeds the repetition penalty.
        """
        params = self.params
        x = apply_repeat_penalty(np.asarray(logits, dtype=np.float64), history,
                                 params.repeat_penalty, params.repeat_last_n)
        n_vocab = x.shape[0]
        if 0 < params.top_k < n_vocab:
            candidates = np.argpartition(-x, params.top_k - 1)[: params.top_k]
        else:
            candidates = np.arange(n_vocab)
        if params.top_p < 1.0 or params.min_p > 0.0:
            base = np.zeros(n_vocab)
            base[candidates] = _softmax(x[candidates])
            if params.top_p < 1.0:
                candidates = _top_p_keep(base, candidates, params.top_p)
            if params.min_p > 0.0:
                candidates = candidates[base[candidates] >= params.min_p * base[candidates].max()]
        out = np.zeros(n_vocab)
        if params.greedy:
            out[candidates[np.argmax(x[candidates])]] = 1.0
        else:
            out[candidates] = _softmax(x[candidates] / params.temperature)
        return out

    def argmax(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The greedy choice; skips building a distribution unless a penalty changes logits."""
        params = self.params
        if params.repeat_penalty == 1.0:
            return int(np.argmax(logits))
        return int(np.argmax(apply_repeat_penalty(np.asarray(logits, dtype=np.float64), history,
                                                  params.repeat_penalty, params.repeat_last_n)))

    def sample(self, probs: np.ndarray) -> int:
        """Draw one token id from a (possibly unnormalised) non-negative vector."""
        support = np.flatnonzero(probs)
        cdf = np.cumsum(probs[support])
        index = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return int(support[min(index, len(support) - 1)])

    def uniform(self) -> float:
        return float(self.rng.random())
