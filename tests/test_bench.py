"""`llamaspec bench` on the tiny models: the report's schema, not its speed."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_error_line, run_cli

from llamaspec.bench import first_divergence
from llamaspec.decoder import K_MAX
from llamaspec.errors import LlamaSpecError
from llamaspec.llama import build_id, system_info
from llamaspec.prompts import load_prompts

PER_PROMPT = {"id", "category", "n_prompt_tokens", "n_generated", "plain_tps", "speculative_tps", "speedup",
              "acceptance_rate", "mean_accepted_per_step", "mean_verify_batch", "oracle_tps",
              "speculative_over_oracle", "identical", "first_divergence", "reference_identical",
              "reference_first_divergence", "plain", "speculative"}


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_bench_report_schema(stories, truncated_draft, tmp_path, drafter):
    report_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    result = run_cli("bench", "--target", stories, "--draft", truncated_draft, "--drafter", drafter,
                     "--category", "code", "--category", "edit", "--limit", "3", "--max-tokens", "16",
                     "--json", report_path, "--plot", plot_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    meta = report["meta"]
    assert meta["threads"] == 2 and len(meta["target"]["sha256"]) == 64 and len(meta["draft"]["sha256"]) == 64
    assert meta["build"] == system_info()  # the build this process runs, not a placeholder
    assert meta["build_id"] == build_id()
    assert set(meta["verify_ms_by_batch"]) == {str(n) for n in range(1, K_MAX + 2)}
    # k=auto: the policies' curve, corrected by the timings of the runs just made (on this tiny
    # model, 0.2 ms a decode, the correction can vanish in the rounding: test_decoder_wiring
    # checks that it learns)
    assert set(meta["verify_ms_in_loop"]) == set(meta["verify_ms_by_batch"])
    assert all(ms > 0 for ms in meta["verify_ms_in_loop"].values())
    assert len(report["prompts"]) == 3
    for record in report["prompts"]:
        assert set(record) == PER_PROMPT
        # greedy speculation equals plain decoding, and plain decoding llama-cpp-python's own Llama
        assert record["identical"] is True and record["first_divergence"] is None
        assert record["reference_identical"] is True and record["reference_first_divergence"] is None
        assert record["speedup"] > 0 and record["oracle_tps"] > 0
    summary = report["summary"]
    assert summary["overall"]["n_prompts"] == 3 and set(summary["by_category"]) <= {"code", "edit"}
    assert summary["overall"]["identical"] == 3 and summary["divergences"] == []
    assert summary["overall"]["reference_identical"] == 3
    assert "identical to llama-cpp-python's own greedy decoding (Llama): 3/3" in result.stdout
    assert sum(summary["accept_histogram"]) == sum(r["speculative"]["n_steps"] for r in report["prompts"])
    first = [(r["speculative"]["accepted_by_position"][:1] or [0])[0] for r in report["prompts"]]
    reached = [(r["speculative"]["reached_by_position"][:1] or [0])[0] for r in report["prompts"]]
    expected = [round(sum(first) / sum(reached), 4)] if sum(reached) else []
    assert summary["acceptance_by_position"][:1] == expected
    assert all(0.0 <= a <= 1.0 for a in summary["acceptance_by_position"])
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "median ALL" in result.stdout


def test_bench_ngram_needs_no_draft(stories, tmp_path):
    result = run_cli("bench", "--target", stories, "--drafter", "ngram", "--limit", "2", "--max-tokens", "16",
                     "--no-reference", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["draft"] is None


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_bench_limit_below_one_is_refused(stories, limit):
    assert_one_error_line(run_cli("bench", "--target", stories, "--limit", limit), "--limit must be at least 1")


def test_bench_bad_prompts_file(stories, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "category": "code"}\n')
    result = run_cli("bench", "--target", stories, "--draft", stories, "--prompts", bad)
    assert_one_error_line(result, "line 1")
    bad.write_bytes(b'{"id": "a", "category": "code", "prompt": "caf\xe9"}\n')  # Latin-1, not UTF-8
    assert_one_error_line(run_cli("bench", "--target", stories, "--prompts", bad), "is not UTF-8 text (byte 46)")


def test_outputs_that_cannot_be_written_are_refused_before_the_run(stories, tmp_path):
    for command in (["bench", "--target", stories], ["audit", "--target", stories]):
        result = run_cli(*command, "--json", tmp_path / "no-such-dir" / "b.json")
        assert_one_error_line(result, "--json")
        assert "does not exist" in result.stderr and "prompt" not in result.stderr  # nothing ran
    assert_one_error_line(run_cli("bench", "--target", stories, "--plot", tmp_path), "is a directory")


@pytest.mark.parametrize("flags,expected", [
    (["--min-draft-prob", "0.5"], "needs a fixed k"),  # k=auto stops by the draft's confidence itself
    (["--k", "3", "--min-draft-prob", "1.5"], "between 0 and 1"),
])
def test_bench_min_draft_prob_needs_a_fixed_k_and_a_probability(stories, flags, expected):
    result = run_cli("bench", "--target", stories, "--draft", stories, *flags)
    assert_one_error_line(result, expected)


def test_shipped_suite_has_five_categories_and_thirty_prompts():
    prompts = load_prompts()
    assert len(prompts) >= 30
    assert {p["category"] for p in prompts} == {"code", "edit", "explain", "chat", "math"}
    assert len({p["id"] for p in prompts}) == len(prompts)
    with pytest.raises(LlamaSpecError, match="its categories: chat, code, edit, explain, math"):
        load_prompts(categories=["nope"])


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_sampled_bench_times_both_modes_with_one_seed_per_prompt(stories, truncated_draft, tmp_path):
    report_path = tmp_path / "bench.json"
    result = run_cli("bench", "--target", stories, "--draft", truncated_draft, "--limit", "2", "--max-tokens", "16",
                     "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--verify", "match",
                     "--json", report_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    meta = report["meta"]
    assert meta["sampling"]["temperature"] == 0.8 and meta["sampling"]["seed"] == 7 and meta["verify"] == "match"
    for record in report["prompts"]:
        # no token-by-token claims about sampled output, and no greedy reference
        assert record["identical"] is None and record["reference_identical"] is None
        assert record["plain"]["verify"] == "sample" and record["speculative"]["verify"] == "match"
        assert record["speedup"] > 0 and record["speculative"]["n_generated"] > 0
    assert report["summary"]["overall"]["identical"] is None and report["summary"]["divergences"] == []
    assert "sampled" in result.stdout
