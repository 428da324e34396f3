"""Vocabulary-trimmed drafts: token choice (numpy), the derived files, and losslessness."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import STORY_PROMPTS, assert_one_error_line, run_cli

from llamaspec import derive, trim
from llamaspec.errors import LlamaSpecError

CORPUS = [" ".join(STORY_PROMPTS) * 3, "Once upon a time there was a little girl named Lily."]


def test_choose_tokens_keeps_always_then_most_frequent_ties_by_id():
    counts = np.array([0, 5, 0, 9, 1, 0, 5, 0])
    kept = trim.choose_tokens(counts, 5, always=np.array([7, 0]))
    # 0 and 7 always; then 3 (9), then 1 and 6 (5 each, lower id first would be 1 then 6)
    assert kept.tolist() == [0, 1, 3, 6, 7]
    kept = trim.choose_tokens(counts, 4, always=np.array([7, 0]))
    assert kept.tolist() == [0, 1, 3, 7]  # the tie 1 vs 6 goes to the lower id
    kept = trim.choose_tokens(counts, 7, always=np.array([7]))
    assert kept.tolist() == [0, 1, 2, 3, 4, 6, 7]  # unseen tokens by id: 0 and 2 before 5


@pytest.mark.parametrize("n_keep", [0, -3, 2, 9])
def test_choose_tokens_refuses_sizes_out_of_range(n_keep):
    with pytest.raises(LlamaSpecError, match="between 3 and 8 tokens"):
        trim.choose_tokens(np.ones(8, dtype=np.int64), n_keep, always=np.array([0, 1]))


def test_expand_scatters_and_cuts():
    vocab = trim.TrimmedVocab(np.array([1, 3]), np.array([-1, 0, -1, 1]), np.zeros((4, 1), np.uint8), 0, [])
    out = np.full((1, 4), -np.inf, dtype=np.float32)
    full = vocab.expand(np.array([[2.0, 5.0]], dtype=np.float32), out)
    assert full.tolist() == [[-np.inf, 2.0, -np.inf, 5.0]]
    full = vocab.expand(np.array([[-1.0, 0.5]], dtype=np.float32), out)  # the buffer again
    assert full.tolist() == [[-np.inf, -1.0, -np.inf, 0.5]]
    assert (vocab.local(3), vocab.local(2), vocab.local(4), vocab.local(-1)) == (1, -1, -1, -1)


@pytest.fixture(scope="module")
def trimmed(stories, tmp_path_factory):
    return derive.derive(stories, tmp_path_factory.mktemp("trim") / "stories-v400.gguf", 400, texts=CORPUS)


def test_derived_draft_speaks_target_ids_with_full_width_logits(stories, trimmed):
    from llamaspec.llama import Model, ModelOptions

    options = ModelOptions(n_ctx=256)
    with Model(stories, options) as full, Model(trimmed, options) as draft:
        assert draft.trimmed is not None and len(draft.trimmed.ids) == 400
        assert (draft.n_vocab, draft.n_vocab_local, draft.bos, draft.eos) == (full.n_vocab, 400, full.bos, full.eos)
        assert [draft.token_text(t) for t in range(full.n_vocab)] == [full.token_text(t) for t in range(full.n_vocab)]
        prompt = full.tokenize(STORY_PROMPTS[0])
        cut = [t for t in range(full.n_vocab) if draft.trimmed.local(t) < 0]
        assert cut and any(draft.trimmed.local(t) >= 0 for t in prompt)
        # The input side reads every token, the cut ones too (embeddings of the full table).
        tokens = [*prompt, cut[0], cut[-1]]
        want, got = full.eval(tokens, all_logits=True), draft.eval(tokens, all_logits=True)
        assert got.shape == want.shape
        kept = draft.trimmed.ids
        np.testing.assert_allclose(got[:, kept], want[:, kept], rtol=1e-4, atol=1e-4)
        assert np.isneginf(got[:, cut]).all()
        with pytest.raises(LlamaSpecError, match="not in the trimmed vocabulary"):
            draft.token_bytes(cut[0])


def _generate_all(target, draft) -> tuple[list[list[int]], float]:
    """Greedy outputs on the story prompts, and the acceptance rate over all of them."""
    from llamaspec import SpeculativeDecoder
    from llamaspec.llama import ModelOptions

    outputs, drafted, accepted = [], 0, 0
    with SpeculativeDecoder(target, draft, k=4, drafter="model" if draft else "auto",
                            options=ModelOptions(n_ctx=256)) as decoder:
        for text in STORY_PROMPTS:
            outputs.append(list(decoder.generate(text, max_tokens=48)))
            drafted, accepted = drafted + decoder.stats.n_drafted, accepted + decoder.stats.n_accepted
    return outputs, accepted / drafted if drafted else 0.0


def test_trimmed_draft_is_lossless(stories, trimmed, tmp_path):
    plain, _ = _generate_all(stories, None)
    spec, acceptance = _generate_all(stories, trimmed)
    assert spec == plain
    assert 0.0 < acceptance < 1.0  # the target's own model, but cut tokens are never drafted
    # Keeping every token, the draft is the target itself, fed embeddings: all drafts accepted.
    whole = derive.derive(stories, tmp_path / "stories-all.gguf", 512, texts=CORPUS)
    spec, acceptance = _generate_all(stories, whole)
    assert spec == plain and acceptance == 1.0


def test_trimmed_draft_with_another_vocabulary_is_refused(trimmed, tiny_random):
    result = run_cli("generate", "--target", tiny_random, "--draft", trimmed, "--max-tokens", "4", "Hello")
    assert_one_error_line(result, "vocabulary")


def test_missing_or_altered_inputs_file_is_one_clear_error(trimmed, tmp_path):
    import shutil

    from llamaspec.llama import Model

    copy = shutil.copy(trimmed, tmp_path / trimmed.name)
    with pytest.raises(LlamaSpecError, match="inputs file .* is missing"):
        Model(copy)
    inputs = shutil.copy(trim.inputs_path(trimmed), trim.inputs_path(tmp_path / trimmed.name))
    with open(inputs, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)[0]
        f.seek(-1, 2)
        f.write(bytes([last ^ 1]))
    with pytest.raises(LlamaSpecError, match="does not match the trimmed draft"):
        Model(copy)


def test_interrupted_derive_leaves_no_model(stories, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(derive, "trim_vocab", broken)
    destination = tmp_path / "half.gguf"
    with pytest.raises(KeyboardInterrupt):
        derive.derive(stories, destination, 400, texts=CORPUS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half.inputs.gguf"]  # no model, no .partial


@pytest.mark.parametrize("vocab", ["0", "100000"])
def test_derive_cli_refuses_bad_sizes(stories, tmp_path, vocab):
    result = run_cli("models", "derive", stories, tmp_path / "x.gguf", "--vocab", vocab)
    assert_one_error_line(result, "tokens")
    assert not any(tmp_path.iterdir())


def test_trimmed_draft_in_a_shared_batch_matches_separate_evals(trimmed):
    """The server decodes several slots' draft tokens in one batch: the embeddings of each
    part must land in its own rows. On the default build the 17 rows share decodes of at most
    16 (batch-invariant) rows, so they equal the evals alone bit for bit; stock kernels round
    them otherwise (up to 0.023 apart here). A row in the wrong place is whole logits off."""
    from llamaspec.llama import Model, ModelOptions

    with Model(trimmed, ModelOptions(n_ctx=128)) as alone, Model(trimmed, ModelOptions(n_ctx=128, n_seq=2)) as shared:
        first, second = alone.tokenize(STORY_PROMPTS[1]), alone.tokenize(STORY_PROMPTS[2])
        want = [alone.eval(first, all_logits=True).copy()]
        alone.reset()
        want.append(alone.eval(second)[-1:].copy())
        got = shared.decode_many([(0, first, True), (1, second, False)])
        kept = alone.trimmed.ids
        for w, g in zip(want, got):
            np.testing.assert_allclose(g[:, kept], w[:, kept], rtol=0, atol=0.0 if shared.exact_rows() else 0.1)
        assert np.abs(want[0][1:, kept] - want[0][:-1, kept]).max() > 1.0  # what a shifted row would show


def test_quantize_head_type_sets_the_output_and_embedding_tables(stories, tmp_path):
    """Draft profiles: the head's type is chosen apart from the body's."""
    import gguf

    from llamaspec.llama import quantize

    types = {}
    for head in ("q8_0", "q4_0"):
        path = quantize(stories, tmp_path / f"{head}.gguf", "q4_0", head=head)
        types[head] = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["q8_0"]["output.weight"] == "Q8_0" and types["q4_0"]["output.weight"] == "Q4_0"
    assert types["q4_0"]["token_embd.weight"] == "Q4_0"
    with pytest.raises(LlamaSpecError, match="unknown head type"):
        quantize(stories, tmp_path / "x.gguf", "q4_0", head="q3_x")


@pytest.mark.parametrize("head", [None, "q4_0"])
def test_token_table_reads_as_gguf_reader_does(stories, tmp_path, head):
    """The sidecar's own reader (152K token texts took gguf.GGUFReader seconds at every load)
    gives what GGUFReader gives: ids, texts, the table's rows (F32 numbers or quantized bytes)."""
    import gguf

    from llamaspec.gguf_tools import read_token_table, write_token_table
    from llamaspec.llama import quantize

    source = stories if head is None else quantize(stories, tmp_path / "q.gguf", "q4_0", head=head)
    path = tmp_path / "table.gguf"
    write_token_table(source, path, trim.EMBD, np.array([3, 1, 4, 159]), trim.IDS_KEY)
    fields, table, kind = read_token_table(path, trim.EMBD)
    reader = gguf.GGUFReader(str(path))
    expected = next(t for t in reader.tensors if t.name == trim.EMBD)
    assert fields[trim.IDS_KEY].tolist() == [3, 1, 4, 159]
    assert fields["tokenizer.ggml.tokens"] == [t.encode() for t in reader.fields["tokenizer.ggml.tokens"].contents()]
    assert kind == int(expected.tensor_type) and table.dtype == expected.data.dtype
    assert table.shape == expected.data.shape and np.array_equal(table, expected.data)
    assert (table.dtype == np.float32) == (head is None)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ValueError, match="truncated.gguf"):
        read_token_table(truncated, trim.EMBD)
