#!/usr/bin/env python3
"""What speculation can reach on this machine: drafting policies replayed on recorded text.

Greedy speculative output equals plain output, so one plain run per prompt fixes everything
a policy will meet: the target's tokens, and, from one batched pass of the draft over the
same text, the draft's greedy guess and its probability at every position (a draft token
is accepted iff it equals the target's token there; after a rejection the rest is moot).
With the measured verify cost per batch size and the draft's cost per token, each policy
is replayed without running the models again, including "perfect foresight" (k chosen
knowing how many tokens will be accepted): the ceiling for this drafter on this machine.
The decoder's own drafters (draft model, suffix trie, hybrid) are replayed as the decoder
builds them (`compose_drafter`), and foresight over the suffix trie's proposals, alone and
together with the draft model's, bounds every hybrid of the two. A token tree that verifies
both drafters' proposals in one batch, rather than choosing one, is replayed beside them.

    .venv/bin/python scripts/policy_bounds.py [--target NAME|PATH] [--draft NAME|PATH ...]
        [--max-tokens 128] [--draft-ms MS] [--json FILE]

Several --draft values are replayed on the same recorded target text (draft profiles side by
side: their cost per token, how often their first guess is right, and the ceilings).

--draft-ms overrides the calibrated draft cost (in the loop a draft token costs more than
the calibration's single decode: catching up after a fully accepted step is a batch of 2).

--what-if replays the decoder's hybrid and suffix drafters and the two foresight ceilings again
on cheaper machines: every verify batch's cost above one decode scaled by 1, 0.5 and 0 (0: a
batch of 16 costs a decode), the draft model at its cost and free. A figure that no row
reaches needs more than kernels or policy: this says which cost it waits on.
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

from llamaspec.calibrate import choose_batch1_kernels, eval_costs  # noqa: E402
from llamaspec.cli_common import resolve_model  # noqa: E402
from llamaspec.decoder import (  # noqa: E402
    K_MAX, LOOKUP_MS_PER_TOKEN, SUFFIX_MIN_MATCH, SpeculativeDecoder, compose_drafter, draft_costs,
)
from llamaspec.drafters import Draft, Drafter, common_prefix_len  # noqa: E402
from llamaspec.drafters.ngram import NgramDrafter  # noqa: E402
from llamaspec.drafters.suffix import SuffixDrafter  # noqa: E402
from llamaspec.llama import Model, ModelOptions  # noqa: E402
from llamaspec.policy import AdaptiveK, ConfidenceK, CostModel, DraftPolicy, draft_steps  # noqa: E402
from llamaspec.models import DEFAULT_DRAFT  # noqa: E402
from llamaspec.prompts import load_prompts  # noqa: E402
from llamaspec.sampling import Sampler  # noqa: E402


class Text:
    """One prompt's plain output and the draft's guess/probability before each of its tokens."""

    def __init__(self, category: str, prompt: list[int], output: list[int], guess: np.ndarray, prob: np.ndarray):
        self.category, self.prompt, self.output = category, prompt, output
        self.guess, self.prob = guess, prob  # index i: before output[i]

    def run(self, at: int, n: int) -> int:
        """Draft-model tokens accepted from output position `at`, of at most n drafted."""
        return common_prefix_len(self.guess[at : at + n].tolist(), self.output[at : at + n])


OPTIONS = ModelOptions(n_ctx=2048, huge_pages=True)  # as `llamaspec bench`


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
        choose_batch1_kernels([drafter])  # one token on the kernel the decoder gives this draft
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
        if not text.output:  # the target ended at once: nothing to speed up
            continue
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


Options = Callable[[Text, int], list[tuple[int, float]]]  # a step's (tokens emitted, ms) choices at a position


def foresight_of(options: Options) -> Step:
    """Perfect foresight: the fastest way through the text when every step's options are known.
    A step's options depend on its position only (the text is fixed), so the shortest path over
    positions is the exact ceiling; choosing the best rate step by step is not (a fast long
    step can skip the positions from which faster ones start)."""
    plans: dict[int, list[tuple[int, float]]] = {}

    def step(text: Text, at: int) -> tuple[int, float]:
        if id(text) not in plans:
            n = len(text.output)
            hops = [options(text, p) for p in range(n)]  # in order: lookups follow the context
            best, plan = [0.0] * (n + 1), [(1, 0.0)] * n
            for p in reversed(range(n)):
                best[p], plan[p] = min((ms + best[min(n, p + emitted)], (emitted, ms)) for emitted, ms in hops[p])
            plans[id(text)] = plan
        return plans[id(text)][at]
    return step


def model_options(costs: CostModel, k_max: int) -> Options:
    """The draft model's steps at a position: draft j <= k_max tokens, all of them accepted."""
    return lambda text, at: [(j + 1, costs.step_ms(j))
                             for j in range(text.run(at, min(k_max, len(text.output) - at - 1)) + 1)]


def foresight(costs: CostModel, k_max: int) -> Step:
    """The draft model with k chosen knowing how many of its guesses will be accepted."""
    return foresight_of(model_options(costs, k_max))


class RecordedDraftModel:
    """The draft model as a Drafter on one recorded text: its policy runs as DraftModelDrafter
    runs it, on the recorded guesses and probabilities, and each drafted token costs draft_ms."""

    def __init__(self, text: Text, policy: DraftPolicy, draft_ms: float):
        self.text, self.policy, self.draft_ms = text, policy, draft_ms
        self.spent_ms = 0.0

    def prefill(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int], max_k: int, sampler: Sampler) -> Draft:
        at = len(context) - len(self.text.prompt)
        drafted, kept = draft_steps(self.policy, max_k, lambda i: (float(self.text.prob[at + i]), True))
        self.spent_ms += self.draft_ms * drafted
        return Draft(self.text.guess[at:at + kept].tolist())

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        self.policy.update(n_drafted, n_accepted)

    def close(self) -> None:
        pass


GREEDY = Sampler()  # the replays decode greedily, as the recorded text was


def per_text(costs: CostModel, kind: str,
             model_policy: Callable[[], DraftPolicy]) -> Callable[[Text], tuple[Drafter, RecordedDraftModel]]:
    """The decoder's drafter of a kind (k=auto) around the recorded draft model, one per text,
    made on the text's first step: lookups charged as the decoder's cost model charges them."""
    lookup_costs = CostModel(costs.verify_ms, LOOKUP_MS_PER_TOKEN)
    drafters: dict[int, tuple[Drafter, RecordedDraftModel]] = {}

    def of(text: Text) -> tuple[Drafter, RecordedDraftModel]:
        if id(text) not in drafters:
            model = RecordedDraftModel(text, model_policy(), costs.draft_token_ms())
            drafter = compose_drafter(kind, lambda: AdaptiveK(lookup_costs, K_MAX), model)
            drafter.prefill(text.prompt)
            drafters[id(text)] = drafter, model
        return drafters[id(text)]
    return of


def driven(costs: CostModel, kind: str, model_policy: Callable[[], DraftPolicy]) -> Step:
    """The decoder's drafter of a kind stepped on recorded text, the draft model charged per
    drafted token."""
    drafters = per_text(costs, kind, model_policy)

    def step(text: Text, at: int) -> tuple[int, float]:
        drafter, model = drafters(text)
        spent = model.spent_ms
        draft = drafter.propose(text.prompt + text.output[:at], min(K_MAX, len(text.output) - at - 1), GREEDY)
        accepted = common_prefix_len(draft.tokens, text.output[at:])
        drafter.observe(len(draft.tokens), accepted)
        drafting_ms = model.spent_ms - spent or LOOKUP_MS_PER_TOKEN * len(draft.tokens)
        return accepted + 1, drafting_ms + costs.verify(len(draft.tokens) + 1)
    return step


def tree(costs: CostModel, model_policy: Callable[[], DraftPolicy]) -> Step:
    """The hybrid's two drafters verified together instead of chosen between: the suffix
    trie's proposal and the draft model's chain as two branches of one token tree (their
    common prefix shared) in one batch, the longer agreeing branch kept. The decoder verifies
    one chain (a tree needs a KV sequence per branch); this row says what a tree would gain."""
    hybrids = per_text(costs, "hybrid", model_policy)

    def step(text: Text, at: int) -> tuple[int, float]:
        hybrid, model = hybrids(text)
        lookup = hybrid.lookup  # a HybridDrafter: its suffix trie, built as the decoder builds it
        context, limit, spent = text.prompt + text.output[:at], min(K_MAX, len(text.output) - at - 1), model.spent_ms
        branches = [drafter.propose(context, limit, GREEDY).tokens for drafter in (lookup, model)]
        accepted = [common_prefix_len(branch, text.output[at:]) for branch in branches]
        lookup.observe(len(branches[0]), accepted[0])
        model.observe(len(branches[1]), accepted[1])
        n_batch = 1 + len(branches[0]) + len(branches[1]) - common_prefix_len(*branches)
        drafting_ms = model.spent_ms - spent + LOOKUP_MS_PER_TOKEN * len(branches[0])
        return max(accepted) + 1, drafting_ms + costs.verify(n_batch)
    return step


def lookup_foresight(costs: CostModel, make: Callable[[], NgramDrafter | SuffixDrafter], model: bool = False) -> Step:
    """Perfect foresight over a lookup drafter's proposals (the lookup free); with `model`, over
    the draft model's guesses too, either at every step: the ceiling of any hybrid of the two."""
    lookups: dict[int, NgramDrafter | SuffixDrafter] = {}
    drafted = model_options(costs, K_MAX)

    def options(text: Text, at: int) -> list[tuple[int, float]]:
        lookup = lookups.setdefault(id(text), make())
        limit = min(K_MAX, len(text.output) - at - 1)
        a = common_prefix_len(lookup.lookup(text.prompt + text.output[:at], limit), text.output[at:])
        found = [(j + 1, costs.verify(j + 1)) for j in range(a + 1)]
        return found + drafted(text, at) if model else found
    return foresight_of(options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", action="append", help="repeatable (default: the default draft)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-ms", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every draft's figures here")
    parser.add_argument("--what-if", action="store_true", help="also replay on cheaper verify curves and a free draft")
    args = parser.parse_args()
    if args.draft_ms is not None and args.draft_ms < 0:
        parser.exit(2, f"error: --draft-ms must be at least 0, got {args.draft_ms:g}\n")
    recorded, verify_ms = record(resolve_model(args.target), args.max_tokens)
    print(f"verify ms by batch: {verify_ms}")
    report = {"verify_ms": verify_ms, "drafts": {}}
    for draft in args.draft or [DEFAULT_DRAFT]:
        texts, draft_ms = guesses(resolve_model(draft), recorded)
        costs = CostModel(verify_ms, draft_ms if args.draft_ms is None else args.draft_ms)
        report["drafts"][draft] = replay_all(texts, costs, draft, draft_ms)
        if args.what_if:
            report["drafts"][draft]["what_if"] = what_if(texts, costs)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def suffix_trie() -> SuffixDrafter:
    """The suffix trie as the suffix drafter uses it (its shortest match included)."""
    return SuffixDrafter(min_match=SUFFIX_MIN_MATCH)


def policy_rows(costs: CostModel) -> list[tuple[str, Callable[[], Step]]]:
    """Every replayed policy on `costs`, by name, in the order they are reported."""
    return [("fixed k=3", lambda: fixed(costs, 3)), ("fixed k=4", lambda: fixed(costs, 4)),
            ("AdaptiveK (k up front)", lambda: driven(costs, "model", lambda: AdaptiveK(costs, K_MAX))),
            ("ConfidenceK (default)", lambda: driven(costs, "model", lambda: ConfidenceK(costs, K_MAX))),
            ("suffix drafter", lambda: driven(costs, "suffix", lambda: ConfidenceK(costs, K_MAX))),
            ("hybrid (default drafter)", lambda: driven(costs, "hybrid", lambda: ConfidenceK(costs, K_MAX))),
            ("tree: suffix and model", lambda: tree(costs, lambda: ConfidenceK(costs, K_MAX))),
            ("foresight, k <= 3", lambda: foresight(costs, 3)),
            (f"foresight, k <= {K_MAX}", lambda: foresight(costs, K_MAX)),
            (f"n-gram foresight, k <= {K_MAX}", lambda: lookup_foresight(costs, lambda: NgramDrafter(2, 5))),
            (f"suffix foresight, k <= {K_MAX}", lambda: lookup_foresight(costs, suffix_trie)),
            (f"foresight, model or suffix, k <= {K_MAX}", lambda: lookup_foresight(costs, suffix_trie, model=True))]


def replay_all(texts: list[Text], costs: CostModel, name: str, draft_ms: float) -> dict:
    """Print and return one draft's cost, acceptance by position and replayed policies."""
    print(f"\n{name}: draft ms/token {costs.draft_token_ms():g} (calibrated {draft_ms:g}; "
          f"{costs.draft_token_ms() / costs.verify(1):.3f}x a target decode)")
    runs = [text.run(at, K_MAX) for text in texts for at in range(len(text.output))]
    by_position = [sum(r >= i for r in runs) / max(sum(r >= i - 1 for r in runs), 1) for i in range(1, 9)]
    print("draft acceptance by position (P(i accepted | 1..i-1 accepted)), i = 1..8: "
          + " ".join(f"{a:.2f}" for a in by_position))
    # the cost the replays used (--draft-ms, if given) and the calibrated one
    result = {"draft_ms": costs.draft_token_ms(), "draft_ms_calibrated": draft_ms,
              "draft_over_decode": round(costs.draft_token_ms() / costs.verify(1), 3),
              "acceptance_by_position": [round(a, 4) for a in by_position], "policies": {}}
    for policy, make in policy_rows(costs):
        speedups = replay(texts, costs, make)
        result["policies"][policy] = {c: round(v, 3) for c, v in speedups.items()}
        print(f"{policy:26} " + "  ".join(f"{c} {v:.2f}x" for c, v in speedups.items()))
    return result


WHAT_IF_SCALES = (1.0, 0.5, 0.0)
WHAT_IF_POLICIES = ("hybrid (default drafter)", "suffix drafter", f"suffix foresight, k <= {K_MAX}",
                    f"foresight, model or suffix, k <= {K_MAX}")


def cheaper(costs: CostModel, scale: float, draft_ms: float) -> CostModel:
    """`costs` with each verify batch's cost above one decode times `scale`, the draft at draft_ms a token."""
    one = costs.verify(1)
    return CostModel({n: one + scale * (ms - one) for n, ms in costs.verify_ms.items()}, draft_ms)


def what_if(texts: list[Text], costs: CostModel) -> list[dict]:
    """The decoder's drafters and the foresight ceilings replayed on cheaper verify curves and
    with a free draft model: what each figure waits on."""
    print("\nwhat if: verify batches' cost above one decode x scale; the draft model at its cost or free")
    rows = []
    for scale in WHAT_IF_SCALES:
        for draft_ms in (costs.draft_token_ms(), 0.0):
            c = cheaper(costs, scale, draft_ms)
            every = dict(policy_rows(c))
            row = {"scale": scale, "draft_ms": draft_ms,
                   "verify_ratio": {n: round(c.verify(n) / c.verify(1), 2) for n in (4, 8, 16)},
                   "policies": {name: {k: round(v, 3) for k, v in replay(texts, c, every[name]).items()}
                                for name in WHAT_IF_POLICIES}}
            rows.append(row)
            ratios = " / ".join(f"{v:.2f}" for v in row["verify_ratio"].values())
            print(f"  scale {scale:g} (batch 4 / 8 / 16: {ratios}x a decode), draft {draft_ms:g} ms:")
            for name, by in row["policies"].items():
                print(f"    {name:40} all {by['all']:.2f}x  code {by.get('code', 0):.2f}x  edit {by.get('edit', 0):.2f}x")
    return rows


if __name__ == "__main__":
    main()
