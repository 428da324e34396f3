"""scripts/compare_drafts.py on the tiny models: drafts paired prompt by prompt, plain alongside."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import assert_one_error_line

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_drafts.py"


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_two_drafts_paired_on_every_prompt(stories, truncated_draft, tmp_path):
    out = tmp_path / "pair.json"
    done = run("--target", stories, "--draft", stories, "--draft", truncated_draft,
               "--category", "code", "--max-tokens", 12, "--json", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    rows, summary = report["prompts"], report["summary"]
    assert rows and all(row["category"] == "code" for row in rows)
    assert summary["n_prompts"] == len(rows)
    assert summary["identical"] == len(rows)  # greedy speculation is lossless with either draft
    for row in rows:
        assert set(row["tokens_per_second"]) == {"plain", str(stories), str(truncated_draft)}
        assert all(tps > 0 for tps in row["tokens_per_second"].values())
    assert set(summary[f"median_ratio_to_{stories}"]) == {str(truncated_draft)}
    assert 0 <= summary[f"faster_than_{stories}"][str(truncated_draft)] <= len(rows)


def test_one_draft_named_twice_is_refused(stories):
    done = run("--target", stories, "--draft", stories, "--draft", stories)
    assert_one_error_line(done, "at least two different drafts")


def test_a_missing_draft_is_one_error_line(stories, tmp_path):
    done = run("--target", stories, "--draft", stories, "--draft", tmp_path / "missing.gguf")
    assert_one_error_line(done, "missing.gguf", code=1)
