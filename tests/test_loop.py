"""The loop's bookkeeping against a scripted fake target: numpy only, no llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from llamaspec.drafters import Draft
from llamaspec.errors import ContextFullError, LlamaSpecError
from llamaspec.speculative import generate_tokens
from llamaspec.stats import GenerationStats

EOS = 0
VOCAB = 16


class ScriptedTarget:
    """Greedy target whose next token after position i is script[i+1]; token 0 is EOS."""

    def __init__(self, script: list[int], n_ctx: int = 64):
        self.script = script
        self.n_ctx = n_ctx
        self.tokens: list[int] = []
        self.batch_sizes: list[int] = []

    def eval(self, tokens, all_logits=False):
        assert len(self.tokens) + len(tokens) <= self.n_ctx
        start = len(self.tokens)
        self.tokens.extend(tokens)
        self.batch_sizes.append(len(tokens))
        rows = np.zeros((len(tokens), VOCAB), dtype=np.float32)
        for i in range(len(tokens)):
            rows[i, self.script[start + i + 1]] = 1.0
        return rows if all_logits else rows[-1:]

    def rollback(self, n_keep):
        assert 0 <= n_keep <= len(self.tokens)
        del self.tokens[n_keep:]

    def is_eog(self, token):
        return token == EOS


class ListDrafter:
    """Proposes the given guesses for the continuation, position by position."""

    def __init__(self, guesses: list[int]):
        self.guesses = guesses
        self.observed: list[tuple[int, int]] = []

    def prefill(self, prompt):
        pass

    def propose(self, context, max_k, sampler):
        return Draft(self.guesses[len(context): len(context) + max_k])

    def observe(self, n_drafted, n_accepted):
        self.observed.append((n_drafted, n_accepted))

    def close(self):
        pass


PROMPT = [5, 6, 7]
SCRIPT = PROMPT + [8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15] * 3


def test_perfect_draft_emits_k_plus_one_per_step():
    target = ScriptedTarget(SCRIPT)
    stats = GenerationStats()
    out = list(generate_tokens(target, PROMPT, drafter=ListDrafter(SCRIPT), k=3, max_tokens=12, stats=stats))
    assert out == SCRIPT[3:15]
    # The prompt (its row gives the first token), then [last, d1, d2, d3] twice, then
    # [last, d1, d2]: the last step drafts no more than max_tokens leaves room for.
    assert stats.n_steps == 3 and stats.accept_histogram == [0, 0, 1, 2]
    assert target.batch_sizes == [3, 4, 4, 3]


def test_on_verify_hears_every_target_eval_after_the_prompt():
    target = ScriptedTarget(SCRIPT)
    heard: list[tuple[int, float]] = []
    list(generate_tokens(target, PROMPT, drafter=ListDrafter(SCRIPT), k=3, max_tokens=12,
                         on_verify=lambda n, ms: heard.append((n, ms))))
    assert [n for n, _ in heard] == target.batch_sizes[1:] == [4, 4, 3]
    assert all(ms >= 0.0 for _, ms in heard)


def test_wrong_draft_still_gives_target_tokens_and_rolls_back():
    guesses = [t if i % 3 != 1 else 1 for i, t in enumerate(SCRIPT)]  # every third guess wrong
    target = ScriptedTarget(SCRIPT)
    stats = GenerationStats()
    out = list(generate_tokens(target, PROMPT, drafter=ListDrafter(guesses), k=4, max_tokens=21, stats=stats))
    assert out == SCRIPT[3:24]
    assert 0 < stats.acceptance_rate < 1
    assert target.tokens == SCRIPT[: len(target.tokens)]  # the cache never keeps a rejected token
    # Acceptance by draft position: every position is reached as often as the ones before it
    # were accepted, and the counts agree with the totals.
    reached, accepted = stats.reached_by_position, stats.accepted_by_position
    assert sum(accepted) == stats.n_accepted and 0 < reached[0] <= stats.n_steps  # (a last step may draft none)
    assert all(reached[i + 1] == accepted[i] for i in range(len(reached) - 1))
    padded = accepted + [0] * (len(reached) - len(accepted))
    assert stats.acceptance_by_position == [round(a / r, 4) for a, r in zip(padded, reached)]
    assert stats.acceptance_by_position[0] < 1.0


def test_acceptance_by_position_counts():
    stats = GenerationStats()
    for drafted, accepted in [(3, 3), (3, 1), (2, 0), (0, 0)]:
        stats.record_step(drafted, accepted, 0.0, 0.0, 0.0)
    assert stats.reached_by_position == [3, 2, 1] and stats.accepted_by_position == [2, 1, 1]
    assert stats.acceptance_by_position == [0.6667, 0.5, 1.0]
    assert stats.accept_histogram == [2, 1, 0, 1]


def test_eos_inside_accepted_draft_stops_without_emitting_it():
    script = PROMPT + [8, 9, EOS, 10, 11, 12]
    target = ScriptedTarget(script)
    stats = GenerationStats()
    out = list(generate_tokens(target, PROMPT, drafter=ListDrafter(script), k=4, max_tokens=10, stats=stats))
    assert out == [8, 9]
    assert stats.stop_reason == "eog"
    assert target.tokens == PROMPT + [8, 9]  # the accepted EOS and 10 are cut, as plain leaves it


def _cache_after(script: list[int], drafter: ListDrafter | None, max_tokens: int, take: int) -> list[int]:
    """The target's cache once the caller has taken `take` tokens and let the generator go."""
    target = ScriptedTarget(script)
    tokens = generate_tokens(target, PROMPT, drafter=drafter, k=4, max_tokens=max_tokens)
    for _ in zip(range(take), tokens):
        pass
    tokens.close()
    return target.tokens


@pytest.mark.parametrize("stop", ["eog", "caller", "max_tokens"])
def test_the_cache_ends_as_plain_decoding_leaves_it(stop):
    """A chat's next turn evaluates its prompt after what the cache holds; for that batch (and so
    the next reply) to be the same bits as after plain decoding, speculation must leave the same
    cache: not the accepted draft tokens past an end of generation or where the caller stopped."""
    ending_early = PROMPT + [8, 9, 10, EOS, 11, 12, 13, 14, 15, 8, 9, 10, 11]
    script, max_tokens, take = {"eog": (ending_early, 10, 10), "caller": (SCRIPT, 10, 2),
                                "max_tokens": (SCRIPT, 6, 10)}[stop]
    plain = _cache_after(script, None, max_tokens, take)
    speculative = _cache_after(script, ListDrafter(script), max_tokens, take)
    assert speculative == plain


def test_max_tokens_trims_the_last_step():
    target = ScriptedTarget(SCRIPT)
    drafter = ListDrafter(SCRIPT)
    out = list(generate_tokens(target, PROMPT, drafter=drafter, k=4, max_tokens=8))
    assert out == SCRIPT[3:11]
    assert drafter.observed == [(4, 4), (1, 1)]  # no drafting past the limit


def test_context_full():
    target = ScriptedTarget(SCRIPT, n_ctx=10)
    stats = GenerationStats()
    out = list(generate_tokens(target, PROMPT, drafter=ListDrafter(SCRIPT), k=4, max_tokens=50, stats=stats))
    assert out == SCRIPT[3:11] and stats.stop_reason == "context_full"


def test_plain_is_one_token_per_step():
    target = ScriptedTarget(SCRIPT)
    out = list(generate_tokens(target, PROMPT, max_tokens=5))
    assert out == SCRIPT[3:8] and target.batch_sizes == [3, 1, 1, 1, 1]


def test_bad_arguments():
    with pytest.raises(LlamaSpecError):
        list(generate_tokens(ScriptedTarget(SCRIPT), PROMPT, drafter=ListDrafter(SCRIPT), k=0))
    with pytest.raises(LlamaSpecError):
        list(generate_tokens(ScriptedTarget(SCRIPT), PROMPT, max_tokens=-1))
    with pytest.raises(ContextFullError):
        list(generate_tokens(ScriptedTarget(SCRIPT, n_ctx=2), PROMPT))
    with pytest.raises(LlamaSpecError):
        list(generate_tokens(ScriptedTarget(SCRIPT), []))
