"""Lookahead for the draft model: copied guesses evaluated in the draft's batch must leave
the draft unchanged, cost fewer evals when they are right, and report what happened."""

from __future__ import annotations

import numpy as np
import pytest

from llamaspec.drafters.draft_model import DraftModelDrafter
from llamaspec.drafters.lookahead import CopyLookahead
from llamaspec.drafters.ngram import latest_copy
from llamaspec.policy import FixedK
from llamaspec.sampling import Sampler, SamplingParams
from llamaspec.verify import verify_rejection

VOCAB = 16


class RuleModel:
    """A KVModel whose greedy next token is a fixed function of the previous two tokens,
    so text repeats (and copies are often right) without being trivially periodic."""

    n_ctx, n_vocab, needs_state_rollback = 4096, VOCAB, False

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.batches: list[int] = []  # size of every eval
        self.logit_rows: list[int] = []  # rows of logits every eval asked for

    @staticmethod
    def next_token(a: int, b: int) -> int:
        return (a * 3 + b * 5 + 1) % 7 if (a + b) % 4 else (b + 9) % VOCAB

    def eval(self, tokens, all_logits=False):
        self.batches.append(len(tokens))
        self.logit_rows.append(len(tokens) if all_logits else 1)
        rows = []
        for token in tokens:
            self.tokens.append(token)
            row = np.zeros(VOCAB, dtype=np.float32)
            row[self.next_token(*([0] + self.tokens)[-2:])] = 4.0
            rows.append(row)
        out = np.stack(rows)
        return out if all_logits else out[-1:]

    def rollback(self, n_keep):
        assert 0 <= n_keep <= len(self.tokens)
        del self.tokens[n_keep:]

    def is_eog(self, token):
        return False

    def close(self):
        pass


class Recorder:
    """A lookahead with scripted guesses that records its feedback."""

    def __init__(self, guess):
        self._guess, self.calls, self.observed = guess, [], []

    def guess(self, history, limit):
        self.calls.append((len(history), limit))
        return self._guess(list(history))[:limit]

    def observe(self, n_compared, n_matched):
        self.observed.append((n_compared, n_matched))


def test_latest_copy_follows_the_longest_latest_match():
    assert latest_copy([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 4) == [4, 5, 1, 2]  # latest of two 3-token matches
    assert latest_copy([1, 2, 3, 9, 7, 2, 3, 4, 5, 1, 2, 3], 4) == [9, 7, 2, 3]  # the longer match wins
    assert latest_copy([1, 2, 3, 9, 7, 2, 3, 4, 5, 1, 2, 3], 2) == [9, 7]
    assert latest_copy([4, 1, 4, 1], 5) == [4, 1]  # a copy may run into the suffix itself
    assert latest_copy([5, 6, 7, 6], 3) == []  # one token matched, below min_n
    assert latest_copy([5, 6, 7, 6], 3, min_n=1) == [7, 6]
    assert latest_copy([1], 3) == [] and latest_copy([1, 2], 0) == []


def rule_text(n: int) -> list[int]:
    text = [3, 1]
    while len(text) < n:
        text.append(RuleModel.next_token(*text[-2:]))
    return text


def drafts(drafter: DraftModelDrafter, prompt: list[int], steps: int, k: int) -> list[list[int]]:
    """Drafts of `steps` steps where the target accepts the first half of each draft and then
    adds a token of its own (the rule's: the text stays on it)."""
    context, out = list(prompt), []
    drafter.prefill(context)
    for _ in range(steps):
        draft = drafter.propose(context, k, Sampler()).tokens
        out.append(draft)
        n_accepted = len(draft) // 2
        drafter.observe(len(draft), n_accepted)
        context += draft[:n_accepted]
        context.append(RuleModel.next_token(*context[-2:]))
    return out


@pytest.mark.parametrize("k", [1, 3, 8])
def test_lookahead_leaves_the_draft_unchanged_and_saves_evals(k):
    prompt = rule_text(40)  # the rule has come round to earlier pairs: copies are right
    plain_model, ahead_model = RuleModel(), RuleModel()
    plain = drafts(DraftModelDrafter(plain_model, FixedK()), prompt, 12, k)
    lookahead = CopyLookahead({1: 8.0, 2: 9.0, 3: 10.0, 4: 11.0, 5: 13.0}, k_max=4)
    ahead = drafts(DraftModelDrafter(ahead_model, FixedK(), lookahead), prompt, 12, k)
    assert ahead == plain
    if k > 1:
        assert len(ahead_model.batches) < len(plain_model.batches)
    else:  # one token a step leaves nothing to guess
        assert ahead_model.batches == plain_model.batches


def test_wrong_guesses_are_cut_from_the_cache_and_reported():
    model = RuleModel()
    wrong = Recorder(lambda history: [99, 99, 99])  # not even in the vocabulary
    drafter = DraftModelDrafter(model, FixedK(), wrong)
    prompt = [1, 2, 3, 4]
    drafter.prefill(prompt)
    draft = drafter.propose(prompt, 4, Sampler()).tokens
    assert draft == drafts(DraftModelDrafter(RuleModel(), FixedK()), prompt, 1, 4)[0]
    assert model.tokens == prompt + draft[:-1]  # the last draft token is evaluated next step
    # Each eval carries guesses (limit: the tokens still to draft after its first row); the first
    # guess is compared and missed every time.
    assert wrong.calls == [(4, 3), (5, 2), (6, 1)]
    assert wrong.observed == [(1, 0), (1, 0), (1, 0)]


def test_right_guesses_are_used_and_reported():
    model = RuleModel()
    prompt = [1, 2, 3, 4]
    truth = drafts(DraftModelDrafter(RuleModel(), FixedK()), prompt, 1, 6)[0]
    right = Recorder(lambda history: truth[len(history) - len(prompt):][:2])  # 2 right guesses an eval
    drafter = DraftModelDrafter(model, FixedK(), right)
    drafter.prefill(prompt)
    assert drafter.propose(prompt, 6, Sampler()).tokens == truth
    assert model.batches[1:] == [3, 3]  # the prompt's last token + 2 guesses, then a draft token + 2
    assert right.observed == [(2, 2), (2, 2)]


def test_a_context_with_an_id_the_smaller_draft_lacks_is_not_drafted_on():
    """The target's ids past the draft's vocabulary (a prompt of raw ids, a padding id sampled):
    the draft cannot evaluate them, so the step goes undrafted (plain decoding) instead of failing."""
    narrow = OtherVocab(-4)
    drafter = DraftModelDrafter(narrow, FixedK(), n_vocab=VOCAB)
    context = [1, 2, VOCAB - 1, 3]
    drafter.prefill(context)
    assert drafter.propose(context, 4, Sampler()).tokens == [] and narrow.batches == []
    assert drafter.propose([1, 2, 3], 4, Sampler()).tokens  # readable again: drafted


@pytest.mark.parametrize("n_prompt, first_batches", [(12, [12 + 3]), (200, [199, 1 + 3])])
def test_a_long_catch_up_goes_before_the_guesses_without_logits(n_prompt, first_batches):
    """A server slot's draft skips the prompt while drafting does not pay; when it drafts again,
    the prompt it lacks must not ride in the guesses' batch, where every row gets logits (for
    Qwen's vocabulary 1.8 GB at 3000 tokens). A short catch-up stays in that one batch."""
    prompt = rule_text(n_prompt)
    truth = drafts(DraftModelDrafter(RuleModel(), FixedK()), prompt, 1, 4)[0]
    model = RuleModel()
    guesses = Recorder(lambda history: truth[len(history) - len(prompt):][:3])
    drafter = DraftModelDrafter(model, FixedK(), guesses)  # no prefill: the draft's cache is empty
    assert drafter.propose(prompt, 4, Sampler()).tokens == truth
    assert model.batches[: len(first_batches)] == first_batches
    assert max(model.logit_rows) <= 3 + (n_prompt if n_prompt <= 16 else 1)


# --- on the tiny model ------------------------------------------------------------------

def test_on_the_tiny_model_drafts_are_unchanged_and_output_equals_plain(stories, truncated_draft):
    """Rows of the draft's lookahead batches are bit-identical to its single evals on the
    batch-invariant build, so the drafts are the same token for token; and `k=auto` wires
    the lookahead in."""
    from conftest import STORY_PROMPTS

    from llamaspec.decoder import SpeculativeDecoder
    from llamaspec.llama import Model, ModelOptions

    options = ModelOptions(n_ctx=512, n_threads=2)
    with SpeculativeDecoder(stories, truncated_draft, drafter="model", options=options) as decoder:
        drafter = decoder.drafter
        assert isinstance(drafter, DraftModelDrafter) and isinstance(drafter.lookahead, CopyLookahead)
        texts = []
        for text in STORY_PROMPTS[:6]:
            decoder.reset()
            plain = list(decoder.generate(text, max_tokens=80, speculative=False))
            decoder.reset()
            assert list(decoder.generate(text, max_tokens=80)) == plain, text
            texts.append(decoder.prompt_tokens(text) + plain)
        # k=auto: the draft's evals feed its measured cost curve (on this pair drafting never pays,
        # so the hook itself is tested below); a server slot's do not
        assert decoder.drafter.on_eval == decoder.config.draft_ms.observe
        assert decoder.with_models(decoder.target, decoder.draft_model).drafter.on_eval is None
    with Model(truncated_draft, options) as one, Model(truncated_draft, options) as two:
        heard: list[int] = []
        alone = DraftModelDrafter(one, FixedK(), on_eval=lambda n, ms: heard.append(n))
        lookahead = Recorder(lambda history: latest_copy(history, 6))
        ahead = DraftModelDrafter(two, FixedK(), lookahead)
        for tokens in texts:
            for drafter in (alone, ahead):
                drafter.prefill(tokens[:8])
            for end in range(8, len(tokens), 5):
                assert ahead.propose(tokens[:end], 7, Sampler()).tokens == alone.propose(tokens[:end], 7, Sampler()).tokens
    assert sum(matched for _, matched in lookahead.observed) > 20  # the rows of right guesses were used
    # the drafter's evals, each heard once: catch-up batches, then one token at a time
    assert heard and min(heard) >= 1 and heard.count(1) > len(heard) // 2


class OtherVocab(RuleModel):
    """A draft whose vocabulary is `extra` ids larger (or smaller) than the target's, as llama.cpp
    allows up to 128 (Qwen2.5 7B and its 0.5B draft); the ids past the target's it likes best."""

    def __init__(self, extra: int) -> None:
        super().__init__()
        self.n_vocab = VOCAB + extra

    def eval(self, tokens, all_logits=False):
        assert max(tokens) < self.n_vocab, "llama.cpp refuses an id past the vocabulary"
        rows = super().eval(tokens, all_logits)
        if self.n_vocab < VOCAB:
            return rows[:, : self.n_vocab]
        return np.hstack([rows, np.full((len(rows), self.n_vocab - VOCAB), 9.0, dtype=np.float32)])


@pytest.mark.parametrize("extra", [4, -4])
def test_a_draft_with_another_vocabulary_size_drafts_on_the_targets_ids(extra):
    """Greedy: never an id the target lacks. Sampled: distributions over the target's ids, so
    speculative sampling can subtract them from the target's (before, a shape error)."""
    context = [1, 2, 3]
    greedy = DraftModelDrafter(OtherVocab(extra), FixedK(), n_vocab=VOCAB).propose(context, 6, Sampler())
    assert len(greedy.tokens) == 6 and max(greedy.tokens) < min(VOCAB, VOCAB + extra)
    sampled = DraftModelDrafter(OtherVocab(extra), FixedK(), n_vocab=VOCAB).propose(
        context, 6, Sampler(SamplingParams(temperature=1.0, seed=3)))
    assert len(sampled.probs) == 6
    for token, q in zip(sampled.tokens, sampled.probs):
        assert q.shape == (VOCAB,) and q.sum() == pytest.approx(1.0) and q[token] > 0
        assert not q[VOCAB + extra:].any()  # ids the draft lacks: impossible (none when it has more)
    p = np.full(VOCAB, 1.0 / VOCAB)
    n_accepted, token = verify_rejection(sampled.tokens, sampled.probs, lambda i: p, np.random.default_rng(0).random,
                                         lambda weights: int(np.argmax(weights)))
    assert 0 <= n_accepted <= 6 and 0 <= token < VOCAB
