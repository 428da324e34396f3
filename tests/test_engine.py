"""The speculative loop on real (tiny) models: identical to plain greedy, rollback leaves no trace."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import STORY_PROMPTS

from llamaspec.compat import check_vocab_compatible
from llamaspec.drafters.draft_model import DraftModelDrafter
from llamaspec.errors import ContextFullError, LlamaSpecError, VocabMismatchError
from llamaspec.llama import Model, ModelOptions, cpu_kernel_settings
from llamaspec.llama import model as llama_model
from llamaspec.policy import FixedK
from llamaspec.sampling import Sampler
from llamaspec.speculative import StepTrace, generate_tokens
from llamaspec.stats import GenerationStats

OPTIONS = ModelOptions(n_ctx=512, n_threads=2)


def plain_with_logits(target: Model, prompt: list[int], max_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """Plain greedy decoding one token per decode, keeping every step's logits. The prompt is
    evaluated whole, from an empty cache, by both runs compared: reusing the previous run's
    prefix would compute its last row alone, and a batch of one rounds otherwise than a
    prompt-sized batch (Gemma 3 270M: logits 0.69 apart, enough to flip a near tie later)."""
    target.reset()
    rows: list[np.ndarray] = []

    def keep(step: StepTrace) -> None:
        rows.append(step.rows[0].copy())

    return list(generate_tokens(target, prompt, max_tokens=max_tokens, trace=keep)), rows


def speculative_with_logits(target: Model, drafter, prompt: list[int], k: int, max_tokens: int,
                            stats: GenerationStats) -> tuple[list[int], dict[int, np.ndarray]]:
    """Speculative greedy decoding from an empty cache; logits the verify batches produced, by
    output index."""
    target.reset()
    by_index: dict[int, np.ndarray] = {}

    def keep(step: StepTrace) -> None:
        first_output = step.position + 1 - len(prompt)
        for row in range(step.n_accepted + 1):
            by_index[first_output + row] = step.rows[row].copy()

    out = list(generate_tokens(target, prompt, drafter=drafter, k=k, max_tokens=max_tokens, stats=stats, trace=keep))
    return out, by_index


def computes_rows_alone(verify_rows: int) -> bool:
    """Whether this build computes each row of a verify batch this large exactly as a batch of
    one (the patched default): then nothing excuses a speculative token that plain decoding
    did not choose."""
    settings = cpu_kernel_settings()
    return settings is not None and settings[0] >= verify_rows


def divergence_is_tie(plain_rows: list[np.ndarray], spec_rows: dict[int, np.ndarray], j: int) -> tuple[bool, str]:
    """At output j, a floating-point tie: the batched logits differ from the sequential ones by
    more than the sequential top-2 gap. That is all a build whose batches round otherwise can
    promise (stock kernels: Qwen and Gemma logits 0.4-1.1 apart, flipping gaps of 0.1-0.3), and
    it would also excuse a broken cache, whose logits move far: so on the batch-invariant build
    nothing is excused (`assert_identical_or_tie`)."""
    sequential = plain_rows[j]
    top2 = np.sort(sequential)[-2:]
    gap = float(top2[1] - top2[0])
    delta = float(np.abs(spec_rows[j] - sequential).max())
    return delta > gap, f"diverged at {j}: top-2 gap {gap:.6f}, max |batch - sequential| {delta:.6f}"


def assert_identical_or_tie(plain: list[int], plain_rows: list[np.ndarray], spec: list[int],
                            spec_rows: dict[int, np.ndarray], label: str, k: int) -> None:
    """Token-identical on a build that computes verify rows alone; elsewhere the first
    divergence may be a floating-point tie (`divergence_is_tie`)."""
    if plain == spec:
        return
    j = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
    assert not computes_rows_alone(k + 1), f"{label}: diverged at {j} on a batch-invariant build"
    tie, detail = divergence_is_tie(plain_rows, spec_rows, j)
    print(f"{label}: {detail}")
    assert tie, f"{label}: not a floating-point tie: {detail}"


def test_draft_equal_to_target_accepts_everything(stories):
    with Model(stories, OPTIONS) as target, Model(stories, OPTIONS) as draft_model:
        check_vocab_compatible(target, draft_model)
        drafter = DraftModelDrafter(draft_model)
        for text in STORY_PROMPTS[:5]:
            prompt = target.tokenize(text)
            plain = list(generate_tokens(target, prompt, max_tokens=64))
            stats = GenerationStats()
            spec = list(generate_tokens(target, prompt, drafter=drafter, k=4, max_tokens=64, stats=stats))
            assert spec == plain
            assert stats.n_drafted > 0 and stats.acceptance_rate == 1.0


def test_a_draft_model_its_policy_would_not_ask_skips_the_prompt(stories, truncated_draft):
    """A server's slot under load steps plainly (ConfidenceK.pays is false at 8 streams): its
    draft model must not decode the prompt for nothing, and when a step does draft later it
    catches up and drafts what an eagerly prefilled draft drafts."""

    class Declining(FixedK):
        def pays(self) -> bool:
            return False

    with Model(stories, OPTIONS) as target, Model(truncated_draft, OPTIONS) as draft_model:
        prompt = target.tokenize("Once upon a time")
        context = [*prompt, *generate_tokens(target, prompt, max_tokens=1)]
        eager = DraftModelDrafter(draft_model)
        eager.prefill(prompt)
        assert draft_model.tokens == prompt
        expected = eager.propose(context, 4, Sampler()).tokens
        draft_model.reset()
        lazy, evaluated = DraftModelDrafter(draft_model, Declining()), draft_model.n_evaluated
        lazy.prefill(prompt)
        assert draft_model.tokens == [] and draft_model.n_evaluated == evaluated
        assert lazy.propose(context, 4, Sampler()).tokens == expected and len(expected) == 4


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_truncated_draft_is_identical_to_plain(stories, truncated_draft, k):
    total = GenerationStats()
    with Model(stories, OPTIONS) as target, Model(truncated_draft, OPTIONS) as draft_model:
        drafter = DraftModelDrafter(draft_model)
        for text in STORY_PROMPTS:
            prompt = target.tokenize(text)
            plain, plain_rows = plain_with_logits(target, prompt, 64)
            stats = GenerationStats()
            spec, spec_rows = speculative_with_logits(target, drafter, prompt, k, 64, stats)
            assert_identical_or_tie(plain, plain_rows, spec, spec_rows, f"k={k} {text!r}", k)
            total.n_drafted += stats.n_drafted
            total.n_accepted += stats.n_accepted
    assert 0 < total.acceptance_rate < 1, total.acceptance_rate


def test_tie_check_has_power():
    """Only a divergence whose batched logits moved by more than the top-2 gap is excused; on a
    build that computes rows alone, not even that."""
    near = np.array([0.0, 3.0, 3.004])
    moved = near + np.array([0.0, 0.005, -0.005])
    assert divergence_is_tie([near], {0: moved}, 0)[0]
    assert not divergence_is_tie([near], {0: near.copy()}, 0)[0]  # same logits, other token: a bug
    assert not divergence_is_tie([near], {0: near + 0.003}, 0)[0]  # moved less than the gap
    if computes_rows_alone(2):
        with pytest.raises(AssertionError, match="batch-invariant"):
            assert_identical_or_tie([2], [near], [1], {0: moved}, "planted", 1)
    else:
        assert_identical_or_tie([2], [near], [1], {0: moved}, "planted", 1)


def test_ids_outside_the_vocabulary_have_no_text_and_a_closed_model_resets(stories):
    """A vocabulary without BOS or EOS says -1 for them (RWKV, T5): llama.cpp's
    token_to_piece would throw through the C API and abort, so the chat format's BOS text
    could not be read. And reset after close has no cache to clear."""
    model = Model(stories, OPTIONS)
    assert model.token_bytes(-1) == b"" and model.token_bytes(model.n_vocab) == b""
    assert model.token_bytes(model.tokenize("Once", add_special=False)[0]) != b""
    model.eval(model.tokenize("Once upon"))
    model.close()
    model.reset()
    assert model.tokens == []


def test_rollback_leaves_no_trace(stories):
    with Model(stories, OPTIONS) as a, Model(stories, OPTIONS) as b:
        prefix = a.tokenize("Once upon a time there was")
        x, next_token = prefix[-1], 400
        a.eval(prefix[:-1])
        b.eval(prefix[:-1])
        a.eval([x, 300, 301], all_logits=True)
        b.eval([x, 310, 311], all_logits=True)
        a.rollback(len(prefix))
        b.rollback(len(prefix))
        assert a.tokens == b.tokens == prefix
        np.testing.assert_array_equal(a.eval([next_token]), b.eval([next_token]))
        # Control with power: keep one rejected token (300 vs 310) and the logits differ.
        a.rollback(len(prefix))
        b.rollback(len(prefix))
        a.eval([300, 301])
        b.eval([310, 311])
        a.rollback(len(prefix) + 1)
        b.rollback(len(prefix) + 1)
        assert not np.array_equal(a.eval([next_token]), b.eval([next_token]))


def test_a_generation_finalized_after_close_leaves_the_freed_cache_alone(stories, monkeypatch):
    """The loop cuts the cache when a generation ends, also when a suspended generator is
    finalized late, after its models were closed: that must not reach the freed context."""
    model, draft = Model(stories, OPTIONS), Model(stories, OPTIONS)
    prompt = model.tokenize("Once upon a time")
    tokens = generate_tokens(model, prompt, drafter=DraftModelDrafter(draft), k=4, max_tokens=8)
    next(tokens), next(tokens)  # the first step accepted 4 drafted tokens: the cache holds more
    model.close()
    draft.close()
    touched = []
    for name in ("llama_memory_seq_rm", "llama_memory_seq_pos_max"):
        monkeypatch.setattr(llama_model.ll, name, lambda *args: touched.append(args) or -1)
    tokens.close()  # runs the loop's finally: a rollback on the closed model
    assert touched == [] and len(model.tokens) == len(prompt) + 1
    assert model.kv_tokens(0) == 0


def test_state_snapshot_rollback_path_matches_plain(stories, truncated_draft):
    """Recurrent/hybrid models roll back by restoring a saved state and replaying; force
    that path on an attention model and require the same output."""
    with Model(stories, OPTIONS) as target, Model(truncated_draft, OPTIONS) as draft_model:
        prompt = target.tokenize("The little dog")
        plain = list(generate_tokens(target, prompt, max_tokens=48))
        target.reset()
        target.needs_state_rollback = draft_model.needs_state_rollback = True
        stats = GenerationStats()
        spec = list(generate_tokens(target, prompt, drafter=DraftModelDrafter(draft_model), k=3,
                                    max_tokens=48, stats=stats))
        assert spec == plain
        assert 0 < stats.n_accepted < stats.n_drafted


def test_state_rollback_past_every_snapshot_replays_from_the_start(stories):
    """A rollback older than every saved state (only the last few steps keep one) empties the
    sequence and re-decodes the kept tokens: the cache then matches one built from scratch."""
    with Model(stories, OPTIONS) as model, Model(stories, OPTIONS) as fresh:
        tokens = model.tokenize("Once upon a time there was a little girl who loved the sea")
        model.needs_state_rollback = True
        for token in tokens:  # one snapshot per step: the first positions' are dropped
            model.eval([token])
        n_keep = 3
        model.rollback(n_keep)
        assert model.tokens == tokens[:n_keep] and model.kv_tokens(0) == n_keep
        fresh.eval(tokens[:n_keep])
        assert np.array_equal(model.eval([tokens[n_keep]]), fresh.eval([tokens[n_keep]]))


def test_shared_batches_refuse_recurrent_models(stories):
    """decode_many saves no snapshots, so a recurrent model's rollback would have none to restore."""
    with Model(stories, OPTIONS) as model:
        model.needs_state_rollback = True
        with pytest.raises(LlamaSpecError, match="recurrent state"):
            model.decode_many([(0, model.tokenize("Once"), False)])


def test_context_full_stops_cleanly(stories, truncated_draft):
    options = ModelOptions(n_ctx=64, n_threads=2)  # llama.cpp may round the size up
    with Model(stories, options) as target, Model(truncated_draft, options) as draft_model:
        prompt = target.tokenize("Once upon a time")
        stats = GenerationStats()
        out = list(generate_tokens(target, prompt, drafter=DraftModelDrafter(draft_model), k=8,
                                   max_tokens=1000, stats=stats))
        assert stats.stop_reason == "context_full"
        assert len(prompt) + len(out) == target.n_ctx + 1
        target.reset()
        assert out == list(generate_tokens(target, prompt, max_tokens=1000))


def test_prompt_longer_than_context_is_an_error(stories):
    with Model(stories, ModelOptions(n_ctx=16)) as target:
        prompt = target.tokenize("Once upon a time " * 100)
        assert len(prompt) > target.n_ctx
        with pytest.raises(ContextFullError):
            list(generate_tokens(target, prompt, max_tokens=4))


def test_vocab_mismatch_names_the_problem(stories, tiny_random):
    with Model(stories, OPTIONS) as target, Model(tiny_random, OPTIONS) as draft:
        with pytest.raises(VocabMismatchError, match="vocabulary sizes differ"):
            check_vocab_compatible(target, draft)


def test_kv_reuse_evaluates_only_new_tokens(stories):
    with Model(stories, OPTIONS) as target:
        first = target.tokenize("Once upon a time")
        out = list(generate_tokens(target, first, max_tokens=10))
        follow = first + out + target.tokenize(" Then", add_special=False)
        stats = GenerationStats()
        list(generate_tokens(target, follow, max_tokens=5, stats=stats))
        # Everything but the new text and the last generated token was already cached.
        assert stats.n_prompt_evaluated <= len(follow) - len(first) - len(out) + 1


def test_rpc_timeout_option_defaults_to_the_environment(monkeypatch):
    from llamaspec.errors import LlamaSpecError

    monkeypatch.setenv("LLAMASPEC_RPC_TIMEOUT", "7.5")
    assert ModelOptions().rpc_timeout == 7.5
    monkeypatch.delenv("LLAMASPEC_RPC_TIMEOUT")
    assert ModelOptions().rpc_timeout == 120 and ModelOptions(rpc_timeout=3).rpc_timeout == 3
    with pytest.raises(LlamaSpecError, match="RPC timeout must be positive"):
        ModelOptions(rpc_timeout=0)


def test_weights_are_read_only_where_the_cpu_runs_them(monkeypatch):
    """A GGUF is read into memory (huge pages) only when asked for huge pages and every layer
    runs on this CPU on Linux: otherwise llama.cpp's own loading (a mapped file), and so with
    LLAMASPEC_MMAP (a model larger than free memory)."""
    import llamaspec.llama.options as options

    monkeypatch.setattr(options.sys, "platform", "linux")
    monkeypatch.delenv("LLAMASPEC_MMAP", raising=False)
    huge = ModelOptions(huge_pages=True)
    assert huge.reads_weights and not ModelOptions().reads_weights
    assert not replace(huge, mmap=True).reads_weights
    monkeypatch.setenv("LLAMASPEC_MMAP", "1")
    assert not ModelOptions(huge_pages=True).reads_weights
    monkeypatch.delenv("LLAMASPEC_MMAP")
    assert not replace(huge, n_gpu_layers=99).reads_weights
    assert not replace(huge, rpc_servers=("127.0.0.1:50052",)).reads_weights
    monkeypatch.setattr(options.sys, "platform", "darwin")
    assert not ModelOptions(huge_pages=True).reads_weights
