"""The suffix-trie drafter: counts against brute force, exact proposals on constructed
sequences, history across generations, and the real loop on the tiny model."""

from __future__ import annotations

import random

import pytest
from conftest import STORY_PROMPTS
from test_policy import FixedDrafter

from llamaspec.drafters.hybrid import HybridDrafter
from llamaspec.drafters.suffix import _STRIDE, END, SuffixDrafter, SuffixTrie
from llamaspec.sampling import Sampler

BLOCK = [1, 2, 3, 4, 5, 6, 7, 8]


def propose(drafter: SuffixDrafter, context: list[int], max_k: int = 8) -> list[int]:
    return drafter.propose(context, max_k, Sampler()).tokens


# --- the trie ---------------------------------------------------------------------------

def trie_stats(trie: SuffixTrie, string: list[int]) -> tuple[int, int]:
    """(occurrences, occurrences followed by a token) of `string`, read from the trie."""
    node = 0
    for i, token in enumerate(string):
        if trie.count[node] == 1:  # inside a leaf's implicit chain
            position = trie.start[node] + i
            if position >= len(trie.corpus) or trie.corpus[position] != token:
                return 0, 0
            continue
        child = trie.children.get(node * _STRIDE + token)
        if child is None:
            return 0, 0
        node = child
    if trie.count[node] == 1:
        after = trie.start[node] + len(string)
        followed = len(string) < trie.max_depth and after < len(trie.corpus) and trie.corpus[after] != END
        return 1, int(followed)
    return trie.count[node], trie.cont[node]


def brute_stats(corpus: list[int], string: list[int], max_depth: int) -> tuple[int, int]:
    n = len(string)
    starts = [i for i in range(len(corpus) - n + 1) if corpus[i: i + n] == string]
    followed = [i for i in starts if n < max_depth and i + n < len(corpus) and corpus[i + n] != END]
    return len(starts), len(followed)


@pytest.mark.parametrize("seed", range(40))
def test_trie_counts_match_brute_force(seed):
    rng = random.Random(seed)
    max_depth = rng.randint(2, 7)
    trie = SuffixTrie(max_depth)
    alphabet = rng.choice([2, 3, 4])  # small alphabets: many repeats, overlaps and splits
    for _ in range(rng.randint(1, 80)):
        if rng.random() < 0.05:
            trie.end_document()
        else:
            trie.append(rng.randrange(alphabet))
    corpus = trie.corpus
    for begin in range(len(corpus)):
        for n in range(1, max_depth + 1):
            string = corpus[begin: begin + n]
            if len(string) == n and END not in string:
                assert trie_stats(trie, string) == brute_stats(corpus, string, max_depth), string
    # Each explicit node's best child is one of its most frequent children.
    children: dict[int, list[int]] = {}
    for key, child in trie.children.items():
        children.setdefault(key // _STRIDE, []).append(child)
    for node, kids in children.items():
        assert trie.count[trie.best[node]] == max(trie.count[kid] for kid in kids)
        assert trie.cont[node] == sum(trie.count[kid] for kid in kids)
    # The active nodes are the suffixes of the current document that occurred before.
    document = corpus[len(corpus) - corpus[::-1].index(END):] if END in corpus else corpus
    expected = [d for d in range(1, min(len(document), max_depth - 1) + 1)
                if brute_stats(corpus, document[len(document) - d:], max_depth)[0] >= 2]
    assert [trie.depth[node] for node in trie.active[1:]] == expected


def test_appending_in_steps_builds_the_same_trie_as_at_once():
    rng = random.Random(7)
    context = [rng.randrange(5) for _ in range(300)]
    at_once, in_steps = SuffixDrafter(), SuffixDrafter()
    propose(at_once, context)
    for end in range(1, len(context) + 1, 7):
        propose(in_steps, context[:end])
    propose(in_steps, context)
    assert in_steps.trie.count == at_once.trie.count and in_steps.trie.children == at_once.trie.children


# --- proposals --------------------------------------------------------------------------

def test_repeated_block_drafts_as_many_tokens_as_the_match_is_long():
    context = BLOCK + [1, 2, 3]
    assert propose(SuffixDrafter(), context) == [4, 5, 6]  # 3-token match -> 3 tokens
    assert propose(SuffixDrafter(length_factor=2.0), context) == [4, 5, 6, 7, 8, 1]
    assert propose(SuffixDrafter(min_match=1), BLOCK + [1]) == [2]
    assert propose(SuffixDrafter(min_match=1), BLOCK + [1, 2]) == [3, 4]
    assert propose(SuffixDrafter(), BLOCK + [1]) == []  # below min_match


def test_max_k_is_respected():
    drafter = SuffixDrafter(length_factor=4.0)
    assert propose(drafter, BLOCK + [1, 2, 3], 2) == [4, 5]
    assert propose(drafter, BLOCK + [1, 2, 3], 0) == []


def test_empty_and_short_contexts():
    drafter = SuffixDrafter(min_match=1)
    assert propose(drafter, []) == []
    assert propose(drafter, [7]) == []
    assert propose(drafter, [7, 7]) == [7]


def test_the_most_frequent_continuation_wins_and_ties_go_to_the_latest():
    # "5 6" -> 7 twice, -> 9 once (most recently); "5 6 7" -> 1, then -> 2 (a tie).
    context = [5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 9, 3, 5, 6]
    assert propose(SuffixDrafter(), context) == [7, 2]
    # Past the tie the draft copies the one occurrence of "5 6 7 2": "5 6".
    assert propose(SuffixDrafter(length_factor=2.0), context) == [7, 2, 5, 6]


def test_a_continuation_below_min_prob_is_not_drafted():
    context = [4, 5, 1, 4, 5, 2, 4, 5, 3, 4, 5, 8, 4, 5]  # "4 5" -> four tokens, 1/4 each
    assert propose(SuffixDrafter(min_prob=0.3), context) == []
    assert propose(SuffixDrafter(min_prob=0.2), context) == [8, 4]  # the latest; then its one occurrence


def test_a_match_longer_than_max_depth_trades_match_for_room():
    context = list(range(10)) + list(range(6))
    # Depth 4: the 3-token match may draft 1 token (3 + 1 = 4), the 2-token one 2: it wins.
    assert propose(SuffixDrafter(max_depth=4, min_match=1), context) == [6, 7]
    assert propose(SuffixDrafter(max_depth=4, min_match=1, length_factor=4.0), context) == [6, 7, 8]


def test_earlier_generations_are_recalled():
    drafter = SuffixDrafter()
    generation = [10, 11, 12, 13, 14, 15, 16, 17]  # prompt [10, 11, 12] and its output
    assert propose(drafter, generation) == []
    assert propose(drafter, [30, 31, 32, 33]) == []  # another, unrelated context
    assert propose(drafter, [10, 11, 12]) == [13, 14, 15]
    assert propose(drafter, [40, 30, 31, 32]) == [33]  # and the unrelated one


def test_a_changed_context_resyncs_and_keeps_the_old_branch():
    drafter = SuffixDrafter(length_factor=2.0)
    propose(drafter, [1, 2, 3, 4, 5, 6, 7])
    assert propose(drafter, [1, 2, 3, 4, 5, 9]) == []  # "9" is new; 6, 7 are not drafted after it
    # "1 2 3 4 5" occurs in both branches (the new one through its lead-in): -> 6 and -> 9
    # once each, and the latest wins the tie.
    assert propose(drafter, [1, 2, 3, 4, 5, 9, 1, 2, 3]) == [4, 5, 9, 1, 2, 3]
    assert drafter._context == [1, 2, 3, 4, 5, 9, 1, 2, 3]
    # Shrunk back to the shared prefix (a regenerated answer): both earlier branches count.
    assert propose(drafter, [1, 2, 3, 4, 5]) == [9, 1, 2, 3]


def test_history_is_bounded():
    drafter = SuffixDrafter(history_tokens=10)
    for start in (100, 200, 300, 400):
        propose(drafter, list(range(start, start + 8)))
    assert propose(drafter, [300, 301, 302]) == [303, 304, 305]  # within the last 10 tokens
    assert propose(drafter, [100, 101, 102]) == []  # cut
    assert len(drafter.trie.corpus) <= 2 * 10 + 3


class RecordingPolicy:
    def __init__(self, k: int):
        self.k, self.updates = k, []

    def begin(self, max_k: int) -> int:
        return min(self.k, max_k)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        self.updates.append((n_drafted, n_accepted))


def test_the_policy_caps_the_draft_and_gets_the_feedback():
    policy = RecordingPolicy(1)
    drafter = SuffixDrafter(policy=lambda: policy)  # type: ignore[arg-type,return-value]
    assert propose(drafter, BLOCK + [1, 2, 3]) == [4]
    drafter.observe(1, 1)
    policy.k = 0  # a plain step: nothing drafted, but the context is still indexed
    assert propose(drafter, BLOCK + [1, 2, 3, 4]) == []
    assert policy.updates == [(1, 1)]
    assert drafter._context == BLOCK + [1, 2, 3, 4]


def test_each_class_of_match_length_has_its_own_policy():
    """A draft's length and its feedback go to the policy of its match's class: up to 2
    tokens, up to 8, longer. A step without any match consults none."""
    def drafter_and_policies() -> tuple[SuffixDrafter, list[RecordingPolicy]]:
        made: list[RecordingPolicy] = []

        def make() -> RecordingPolicy:
            made.append(RecordingPolicy(8))
            return made[-1]

        drafter = SuffixDrafter(min_match=1, policy=make, match_classes=(2, 8))  # type: ignore[arg-type]
        made[2].k = 2  # long matches: at most 2 tokens
        return drafter, made

    cases = [([30, 31, 32, 30], 0, [31]),  # a 1-token match
             ([30, 31, 32, 30, 31], 0, [32, 30]),  # 2 tokens
             (BLOCK + [1, 2, 3], 1, [4, 5, 6]),  # 3 tokens
             (list(range(1, 11)) + list(range(1, 9)), 1, [9, 10, 1, 2, 3, 4, 5, 6]),  # 8 tokens
             (list(range(1, 21)) + list(range(1, 11)), 2, [11, 12])]  # 10 tokens, cut by its policy
    for context, used, draft in cases:
        drafter, policies = drafter_and_policies()
        assert propose(drafter, context) == draft
        drafter.observe(len(draft), 1)
        assert [p.updates for p in policies] == [[(len(draft), 1)] if i == used else [] for i in range(3)]
        assert propose(drafter, context + [99]) == []  # no match: no policy hears of it
        drafter.observe(0, 0)
        assert sum(len(p.updates) for p in policies) == 1


def test_hybrid_drafts_from_the_suffix_trie_on_a_long_match():
    model = FixedDrafter([42, 43])
    hybrid = HybridDrafter(SuffixDrafter(min_match=3), model)
    assert hybrid.propose([1, 2, 3, 4, 1, 2, 3], 4, Sampler()).tokens == [4, 1, 2]
    hybrid.observe(3, 3)
    assert model.observed == []
    assert hybrid.propose([9, 1, 2], 4, Sampler()).tokens == [42, 43]  # a 2-token match: the model
    hybrid.observe(2, 0)
    assert model.observed == [(2, 0)]


# --- the real loop ----------------------------------------------------------------------

def test_suffix_drafter_on_the_tiny_model_is_identical_to_plain(stories):
    from llamaspec.decoder import SpeculativeDecoder
    from llamaspec.llama import ModelOptions

    with SpeculativeDecoder(stories, k=4, drafter="suffix", options=ModelOptions(n_ctx=512, n_threads=2)) as decoder:
        assert isinstance(decoder.drafter, SuffixDrafter)
        n_drafted = n_accepted = 0
        for text in STORY_PROMPTS[:4]:
            tokens = decoder.prompt_tokens(text)
            decoder.reset()
            plain = list(decoder.generate(tokens, max_tokens=96, speculative=False))
            decoder.reset()
            spec = list(decoder.generate(tokens, max_tokens=96))
            assert spec == plain, text
            n_drafted += decoder.stats.n_drafted
            n_accepted += decoder.stats.n_accepted
        assert n_accepted > 0 and n_drafted > 0
        # The same prompt twice in one session (reset() starts a new one): the first answer is
        # in the session's history when the second is drafted.
        decoder.reset()
        first = decoder.prompt_tokens(STORY_PROMPTS[0])
        list(decoder.generate(first, max_tokens=96))
        again = list(decoder.generate(first, max_tokens=96))
        assert decoder.stats.acceptance_rate > 0.9 and decoder.stats.n_accepted > 0.6 * len(again)


def test_decoder_wiring(stories, truncated_draft):
    from llamaspec.decoder import SpeculativeDecoder
    from llamaspec.llama import ModelOptions
    from llamaspec.policy import AdaptiveK, MeasuredCurve

    options = ModelOptions(n_ctx=256, n_threads=2)
    with SpeculativeDecoder(stories, drafter="suffix", options=options) as decoder:  # k="auto"
        assert isinstance(decoder.drafter, SuffixDrafter) and decoder.drafter.min_match == 1
        assert all(isinstance(p, AdaptiveK) for p in decoder.drafter.policies)
        # k=auto: the verify curve learns from the loop's timings, plain generations' included
        curve = decoder.config.verify_ms
        assert isinstance(curve, MeasuredCurve) and not curve.ratios
        list(decoder.generate("Once upon a time", max_tokens=24, speculative=False))
        assert set(curve.ratios) == {1}
        learned = dict(curve.ratios)
        slot = decoder.with_models(decoder.target, None)  # a server slot's timings include waiting
        list(slot.generate("Once upon a time", max_tokens=24, speculative=False))
        assert curve.ratios == learned
    with SpeculativeDecoder(stories, truncated_draft, k=3, options=options) as decoder:  # auto: hybrid
        assert isinstance(decoder.drafter, HybridDrafter)
        assert isinstance(decoder.drafter.lookup, SuffixDrafter) and decoder.drafter.lookup.min_match == 3
