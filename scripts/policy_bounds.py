#!/usr/bin/env python3
"""What speculation can reach on this machine: drafting policies replayed on recorded text.

Greedy speculative output equals plain output, so one plain run per prompt fixes everything
a policy will meet: the target's tokens, and, from one batched pass of the draft over the
same text, the draft's greedy guess and its probability at every position (a draft token
is accepted iff it equals the target's token there; after a rejection the rest is moot).
With the measured verify cost per batch size and the draft's cost per token, each policy
is replayed without running the models again, including "perfect foresight" (k chosen
knowing how many tokens will be accepted): the ceiling for this drafter on this machine.

    .venv/bin/python scripts/policy_bounds.py [--target NAME|PATH] [--draft NAME|PATH ...]
        [--max-tokens 128] [--draft-ms MS] [--json FILE]

Several --draft values are replayed on the same recorded target text (draft profiles side by
side: their cost per token, how often their first guess is right, and the ceilings).

--draft-ms overrides the calibrated draft cost (in the loop a draft token costs more than
the calibration's single decode: catching up after a fully accepted step is a batch of 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.calibrate import eval_costs  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.decoder import K_MAX, SpeculativeDecoder, draft_costs  # noqa: E402
from llamaspec.drafters import common_prefix_len  # noqa: E402
from llamaspec.drafters.ngram import NgramDrafter  # noqa: E402
from llamaspec.llama import Model, ModelOptions  # noqa: E402
from llamaspec.policy import AdaptiveK, ConfidenceK, CostModel, DraftPolicy, draft_steps  # noqa: E402
from llamaspec.models import DEFAULT_DRAFT  # noqa: E402
from llamaspec.prompts import load_prompts  # noqa: E402


class Text:
    """One prompt's plain output and the draft's guess/probability before each of its tokens."""

    def __init__(self, category: str, prompt: list[int], output: list[int], guess: np.ndarray, prob: np.ndarray):
        self.category, self.prompt, self.output = category, prompt, output
        self.guess, self.prob = guess, prob  # index i: before output[i]

    def run(self, at: int, n: int) -> int:
        """Draft-model tokens accepted from output position `at`, of at most n drafted."""
        return common_prefix_len(self.guess[at : at + n].tolist(), self.output[at : at + n])


OPTIONS = ModelOptions(n_ctx=2048)


def record(target: Path, max_tokens: int) -> tuple[list[tuple[str, list[int], list[int]]], dict[int, float]]:
    """(category, prompt, plain output) per shipped prompt, and the target's verify costs."""
    recorded = []
    with SpeculativeDecoder(target, None, options=OPTIONS) as plain:
        verify_ms = eval_costs(plain.target, list(range(1, K_MAX + 2)))
        for item in load_prompts():
            prompt = plain.prompt_tokens(item["prompt"], chat=True)
            plain.reset()
            recorded.append((item["category"], prompt, list(plain.generate(prompt, max_tokens=max_tokens))))
            print(f"  recorded {item['id']}: {len(recorded[-1][2])} tokens", file=sys.stderr, flush=True)
    return recorded, verify_ms


def guesses(draft: Path, recorded: list[tuple[str, list[int], list[int]]]) -> tuple[list[Text], float]:
    """The draft's greedy guess and its probability before every recorded token (one batched
    pass per prompt), and its calibrated cost per token."""
    texts = []
    with Model(draft, OPTIONS) as drafter:
        draft_ms = draft_costs(drafter)[1]  # the measurement the decoder's policy reads
        for category, prompt, output in recorded:
            drafter.reset()
            rows = np.asarray(drafter.eval(prompt + output, all_logits=True), dtype=np.float64)[len(prompt) - 1:]
            top = rows.max(axis=1, keepdims=True)
            texts.append(Text(category, prompt, output, rows.argmax(axis=1), 1.0 / np.exp(rows - top).sum(axis=1)))
    return texts, draft_ms


Step = Callable[[Text, int], tuple[int, float]]  # (tokens emitted, ms) for a step at position


def replay(texts: list[Text], costs: CostModel, make: Callable[[], Step]) -> dict[str, float]:
    """Median speedup over plain decoding, overall and per category."""
    speedups: dict[str, list[float]] = {}
    for text in texts:
        step, at, ms = make(), 0, 0.0
        while at < len(text.output):
            emitted, step_ms = step(text, at)
            at, ms = at + emitted, ms + step_ms
        speedups.setdefault(text.category, []).append(len(text.output) * costs.verify(1) / ms)
    result = {"all": statistics.median(x for v in speedups.values() for x in v)}
    result.update({c: statistics.median(v) for c, v in sorted(speedups.items())})
    return result


def fixed(costs: CostModel, k: int) -> Step:
    return lambda text, at: (text.run(at, k) + 1, costs.step_ms(k))


def foresight(costs: CostModel, k_max: int) -> Step:
    def step(text: Text, at: int) -> tuple[int, float]:
        a = text.run(at, k_max)
        k = max(range(a + 1), key=lambda j: (j + 1) / costs.step_ms(j))
        return k + 1, costs.step_ms(k)
    return step


def with_policy(costs: CostModel, policy: DraftPolicy) -> Step:
    """The policy driven by `draft_steps`, as DraftModelDrafter drives it, on recorded guesses."""
    def step(text: Text, at: int) -> tuple[int, float]:
        drafted, kept = draft_steps(policy, min(K_MAX, len(text.output) - at - 1),
                                    lambda i: (float(text.prob[at + i]), True))
        accepted = text.run(at, kept)
        policy.update(kept, accepted)
        return accepted + 1, costs.draft_token_ms() * drafted + costs.verify(kept + 1)
    return step


def ngram_foresight(costs: CostModel) -> Step:
    drafters: dict[int, NgramDrafter] = {}

    def step(text: Text, at: int) -> tuple[int, float]:
        lookup = drafters.setdefault(id(text), NgramDrafter(2, 5))
        proposal = lookup.lookup(text.prompt + text.output[:at], K_MAX)
        a = common_prefix_len(proposal, text.output[at:])
        k = max(range(a + 1), key=lambda j: (j + 1) / costs.verify(j + 1))
        return k + 1, costs.verify(k + 1)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", action="append", help="repeatable (default: the default draft)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-ms", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every draft's figures here")
    args = parser.parse_args()
    recorded, verify_ms = record(resolve_model(args.target), args.max_tokens)
    print(f"verify ms by batch: {verify_ms}")
    report = {"verify_ms": verify_ms, "drafts": {}}
    for draft in args.draft or [DEFAULT_DRAFT]:
        texts, draft_ms = guesses(resolve_model(draft), recorded)
        report["drafts"][draft] = replay_all(texts, CostModel(verify_ms, args.draft_ms or draft_ms), draft, draft_ms)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def replay_all(texts: list[Text], costs: CostModel, name: str, draft_ms: float) -> dict:
    """Print and return one draft's cost, acceptance by position and replayed policies."""
    print(f"\n{name}: draft ms/token {costs.draft_token_ms():g} (calibrated {draft_ms:g}, "
          f"{draft_ms / costs.verify(1):.3f}x a target decode)")
    rows = [("fixed k=3", lambda: fixed(costs, 3)), ("fixed k=4", lambda: fixed(costs, 4)),
            ("AdaptiveK (k up front)", lambda: with_policy(costs, AdaptiveK(costs, K_MAX))),
            ("ConfidenceK (default)", lambda: with_policy(costs, ConfidenceK(costs, K_MAX))),
            ("foresight, k <= 3", lambda: foresight(costs, 3)),
            (f"foresight, k <= {K_MAX}", lambda: foresight(costs, K_MAX)),
            (f"n-gram foresight, k <= {K_MAX}", lambda: ngram_foresight(costs))]
    runs = [text.run(at, K_MAX) for text in texts for at in range(len(text.output))]
    by_position = [sum(r >= i for r in runs) / max(sum(r >= i - 1 for r in runs), 1) for i in range(1, 9)]
    print("draft acceptance by position (P(i accepted | 1..i-1 accepted)), i = 1..8: "
          + " ".join(f"{a:.2f}" for a in by_position))
    result = {"draft_ms": draft_ms, "draft_over_decode": round(draft_ms / costs.verify(1), 3),
              "acceptance_by_position": [round(a, 4) for a in by_position], "policies": {}}
    for policy, make in rows:
        speedups = replay(texts, costs, make)
        result["policies"][policy] = {c: round(v, 3) for c, v in speedups.items()}
        print(f"{policy:26} " + "  ".join(f"{c} {v:.2f}x" for c, v in speedups.items()))
    return result


if __name__ == "__main__":
    main()
