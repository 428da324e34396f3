"""The losslessness audit and --strict on the tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import STORY_PROMPTS, run_cli

from llamaspec.audit import AuditReport, BatchComparison, compare_batched, plain_with_rows, run_audit
from llamaspec.decoder import SpeculativeDecoder
from llamaspec.llama import Model, ModelOptions, Multirow

OPTIONS = ModelOptions(n_ctx=512)


@pytest.mark.parametrize("fixture", ["stories", "tiny_random"])
def test_audit_cli_json_schema(fixture, request, tmp_path):
    path = request.getfixturevalue(fixture)
    out = tmp_path / "audit.json"
    result = run_cli("audit", "--target", path, "--limit", "2", "--max-tokens", "24", "--batch-max", "4",
                     "--json", out)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert set(report["batch_sizes"]) == {"2", "3", "4"}
    for row in report["batch_sizes"].values():
        assert set(row) == {"bit_identical", "rows_compared", "rows_different", "max_abs_diff", "argmax_flips",
                            "min_top2_margin"}
        assert row["rows_compared"] > 0 and row["bit_identical"] == (row["rows_different"] == 0)
    assert set(report["speculative_first_divergence"]) == {"1", "2", "3"}
    assert all(len(v) == 2 for v in report["speculative_first_divergence"].values())
    assert isinstance(report["bit_exact_sizes"], list) and 0 <= report["strict_max_k"] <= 3
    assert "verify" in report["summary"] and report["summary"] in result.stdout


def test_planted_difference_is_detected(stories):
    with Model(stories, OPTIONS) as model:
        prompt = model.tokenize("Once upon a time")
        plain, rows = plain_with_rows(model, prompt, 24)
        planted = list(plain)
        planted[5] = (planted[5] + 7) % model.n_vocab  # feed one row a different token
        clean, dirty = BatchComparison(), BatchComparison()
        compare_batched(model, prompt, plain, rows, 4, clean)
        compare_batched(model, prompt, planted, rows, 4, dirty)
        assert dirty.rows_different >= 1 and dirty.argmax_flips > clean.argmax_flips
        assert dirty.max_abs_diff > 10 * max(clean.max_abs_diff, 1e-3)


def test_comparison_of_identical_rows_is_bit_exact():
    rows = np.random.default_rng(0).normal(size=(4, 50)).astype(np.float32)
    comparison = BatchComparison()
    comparison.add(rows, rows.copy())
    assert comparison.bit_identical and comparison.max_abs_diff == 0.0
    comparison.add(rows + np.float32(1e-6), rows)
    assert not comparison.bit_identical and comparison.argmax_flips == 0


def test_audit_report_strict_k_stops_at_the_first_inexact_size():
    rows = np.zeros((2, 8), dtype=np.float32)
    exact, inexact = BatchComparison(), BatchComparison()
    exact.add(rows, rows.copy())
    inexact.add(rows + np.float32(1e-3), rows)
    report = AuditReport("m", batches={2: exact, 3: exact, 4: inexact, 5: exact})
    assert report.bit_exact_sizes() == [2, 3, 5]
    assert report.max_exact_k() == 2  # size 5 is exact, but k = 4 would verify batches of 4
    assert AuditReport("m", batches={2: inexact, 3: exact}).max_exact_k() == 0
    assert AuditReport("m", batches={2: exact, 3: exact}).max_exact_k() == 2


def test_audit_report_says_whether_batch_1_matches_across_kernels():
    rows = np.zeros((2, 8), dtype=np.float32)
    exact, inexact = BatchComparison(), BatchComparison()
    exact.add(rows, rows.copy())
    inexact.add(rows + np.float32(1e-3), rows)
    assert "single-row" not in AuditReport("m", batches={2: exact}).sentence()  # not checked: not said
    same = AuditReport("m", batches={2: exact}, batch1=exact)
    assert "Batch 1 is bit-identical with the multi-row and the single-row kernels" in same.sentence()
    assert same.to_dict()["batch1_kernels"]["bit_identical"]
    differs = AuditReport("m", batches={2: exact}, batch1=inexact).sentence()
    assert "Batch 1 differs between the multi-row and the single-row kernels (max |delta logit| 0.001)" in differs


def test_audit_report_names_untested_sizes_and_speculative_divergences():
    """A size no prompt reached is not called bit-exact nor different, and a divergence the loop
    itself showed (step 3) is never hidden behind bit-exact rows."""
    rows = np.zeros((2, 8), dtype=np.float32)
    exact = BatchComparison()
    exact.add(rows, rows.copy())
    untested = AuditReport("m", batches={2: exact, 3: BatchComparison()}, speculative={1: [None]})
    assert untested.sentence() == ("On m with this build, verify sizes bit-exact with plain decoding: 2; --strict "
                                   "limits k to 1. Sizes 3 were not tested: every prompt ended first (a longer "
                                   "--max-tokens tests them).")
    assert untested.to_dict()["batch_sizes"]["3"]["min_top2_margin"] is None
    diverged = AuditReport("m", batches={2: exact, 3: exact}, speculative={1: [None, None], 2: [None, 9]}).sentence()
    assert "equals plain output" not in diverged and "diverged from plain output at k = 2" in diverged


def test_audit_on_the_default_build_is_bit_exact_at_every_size(stories):
    with Model(stories, OPTIONS) as model:
        report = run_audit(model, [model.tokenize("The little dog")], 24, 5)
    assert report.bit_exact_sizes() == [2, 3, 4, 5] and report.max_exact_k() == 4


def test_strict_mode_equals_plain_for_every_k(stories, truncated_draft, tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path))
    for k in range(1, 9):
        with SpeculativeDecoder(stories, truncated_draft, k=k, options=OPTIONS, strict=True) as decoder:
            assert decoder.strict_note
            for text in STORY_PROMPTS:
                plain = list(decoder.generate(text, max_tokens=64, speculative=False))
                assert list(decoder.generate(text, max_tokens=64)) == plain, (k, text)


def test_cache_keys_tell_kernel_settings_apart(stories):
    """Cost curves and strict-mode audits measured with one kernel setting are never reused for
    another: repacking and n_batch change which kernels run, and a wider audit is another result."""
    from types import SimpleNamespace

    from llamaspec.audit import strict_cache_key
    from llamaspec.calibrate import _key

    def model(batch1_kernels=None, **options) -> SimpleNamespace:
        return SimpleNamespace(path=stories, options=ModelOptions(n_ctx=512, **options), batch1_kernels=batch1_kernels)

    base = _key(model(), [1, 2])
    assert base == _key(model(), [1, 2])
    assert len({base, _key(model(repack=False), [1, 2]), _key(model(n_batch=64), [1, 2])}) == 3
    assert strict_cache_key(model(), 9) != strict_cache_key(model(), 16)
    strict = {strict_cache_key(model(**o), 16) for o in ({}, {"repack": False}, {"n_batch": 64},
                                                          {"rpc_servers": "127.0.0.1:50052"})}
    assert len(strict) == 4  # RPC servers compute the offloaded layers with their own kernels
    assert _key(model(rpc_servers="127.0.0.1:50052"), [1, 2]) != base
    # a model's own batch-1 kernels (choose_batch1_kernels), not the process's, when it has them
    own = {_key(model(batch1_kernels=(16, mode, 0)), [1, 2]) for mode in (Multirow.ALL, Multirow.BATCHES)}
    assert len(own) == 2


def test_cache_keys_change_with_the_kernel_build(stories, tmp_path, monkeypatch):
    """A rebuilt llama.cpp (another cpp_patches/ revision) reports the same system info, yet its
    kernels cost and round differently: the libraries' digest is part of every cache key."""
    from types import SimpleNamespace

    from llamaspec import calibrate
    from llamaspec.llama import tools

    model = SimpleNamespace(path=stories, options=ModelOptions(n_ctx=512), batch1_kernels=None)
    assert tools.build_id() in calibrate._key(model, [1, 2])
    library = tmp_path / "libggml-cpu.so"
    monkeypatch.setattr(tools.ll.llama_cpp, "_base_path", tmp_path)
    keys = []
    for kernel in (b"one kernel", b"another kernel"):
        library.write_bytes(kernel)
        tools.build_id.cache_clear()
        keys.append(calibrate._key(model, [1, 2]))
    tools.build_id.cache_clear()
    assert keys[0] != keys[1]


def test_cost_curve_sizes_take_turns(monkeypatch):
    """A slow stretch of the machine (here the first five timed evals) must not land on one batch
    size: timed one size after another, batch 1 took all of it and looked 11x its cost."""
    from llamaspec import calibrate

    clock = {"now": 0.0, "timed": 0}

    class FakeModel:
        tokens: list[int] = []

        def tokenize(self, text, add_special=False):
            return list(range(100))

        def reset(self):
            pass

        def rollback(self, n):
            pass

        def eval(self, tokens, all_logits=False):
            if all_logits:
                clock["timed"] += 1
                slow = 2 <= clock["timed"] <= 6  # call 1 is the warm-up
                clock["now"] += (len(tokens) + (10 if slow else 0)) / 1000

    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: clock["now"])
    assert calibrate.measure_eval_ms(FakeModel(), [1, 2, 3, 4]) == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
