"""The command line: JSON output, and one clear error line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import assert_one_error_line, run_cli

PROMPT = "Once upon a time"


def test_generate_json_speculative(stories, truncated_draft):
    result = run_cli("generate", PROMPT, "--target", stories, "--draft", truncated_draft,
                     "--k", "4", "--max-tokens", "32", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) == {"text", "tokens", "stats"}
    stats = out["stats"]
    for key in ("mode", "k", "n_drafted", "n_accepted", "acceptance_rate", "n_steps",
                "tokens_per_second", "accept_histogram"):
        assert key in stats
    assert stats["mode"] == "speculative" and stats["k"] == 4
    assert len(out["tokens"]) == 32 and sum(stats["accept_histogram"]) == stats["n_steps"]
    plain = json.loads(run_cli("generate", PROMPT, "--target", stories, "--max-tokens", "32", "--json").stdout)
    assert plain["stats"]["mode"] == "plain" and plain["tokens"] == out["tokens"] and plain["text"] == out["text"]


def test_generate_streams_text(stories):
    result = run_cli("generate", PROMPT, "--target", stories, "--max-tokens", "16")
    assert result.returncode == 0 and result.stdout.strip()
    assert "tok/s" in result.stderr


def test_a_reader_that_leaves_early_ends_generate_quietly(stories):
    """`llamaspec generate ... | head -c 20`: the closed pipe stops the command with a shell's
    SIGPIPE status and nothing on stderr (no error line, no "Exception ignored" at exit). The
    reader leaves before the first piece is written: after it, a short story could fit in the
    pipe's buffer and end before the reader leaves."""
    process = subprocess.Popen([sys.executable, "-m", "llamaspec.cli", "generate", PROMPT, "--target", str(stories),
                                "--max-tokens", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(120) == 141 and stderr == "", (process.returncode, stderr)


def test_missing_file():
    assert_one_error_line(run_cli("generate", PROMPT, "--target", "/nonexistent/model.gguf"), "not found")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_text("hello")
    assert_one_error_line(run_cli("generate", PROMPT, "--target", bad), "not a GGUF file")


def test_truncated_gguf(stories, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(stories.read_bytes()[:600_000])
    assert_one_error_line(run_cli("generate", PROMPT, "--target", cut), "could not load")


def test_vocab_mismatch(stories, tiny_random):
    assert_one_error_line(run_cli("generate", PROMPT, "--target", stories, "--draft", tiny_random),
                         "vocabulary sizes differ")


@pytest.mark.parametrize("k", ["0", "-2"])
def test_bad_k(stories, k):
    assert_one_error_line(run_cli("generate", PROMPT, "--target", stories, "--draft", stories, "--k", k), "--k")


def test_prompt_longer_than_context(stories):
    assert_one_error_line(run_cli("generate", "Once upon a time " * 200, "--target", stories, "--ctx", "256"),
                         "context")


@pytest.mark.parametrize("flags,expected", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-3"], "top-k"),
    (["--flash-attn", "maybe"], "Invalid value for '--flash-attn'"),
    (["--verify", "sometimes"], "Invalid value for '--verify'"),
    (["--threads", "two"], "Invalid value for '--threads'"),
    (["--no-such-flag"], "No such option: --no-such-flag"),
    (["--threads", "0"], "threads"),
])
def test_bad_flag_values(stories, flags, expected):
    assert_one_error_line(run_cli("generate", PROMPT, "--target", stories, *flags), expected)


def test_no_command_prints_the_help_and_help_exits_0():
    bare = run_cli()
    assert bare.returncode == 2 and "Commands:" in bare.stderr and "generate" in bare.stderr
    helped = run_cli("generate", "--help")
    assert helped.returncode == 0 and "--max-tokens" in helped.stdout and not helped.stderr


def test_models_list_and_unknown_name():
    result = run_cli("models", "list")
    assert result.returncode == 0 and "qwen2.5-coder-1.5b" in result.stdout
    assert_one_error_line(run_cli("models", "path", "no-such-model"), "unknown model")
    assert_one_error_line(run_cli("models", "fetch", "no-such-model"), "unknown model")


def test_huge_pages_only_for_the_long_runs():
    """Huge pages load slowly on a VM that returns free memory to its host (8.4 s against 1.5 s
    for the Qwen target): on by default for serve and bench, which run long, off for one answer,
    a chat and an audit; the flag overrides."""
    import typer.main

    from llamaspec.cli import app

    commands = typer.main.get_command(app).commands
    defaults = {name: next(p.default for p in commands[name].params if p.name == "huge_pages")
                for name in ("generate", "chat", "audit", "bench", "serve")}
    assert defaults == {"generate": False, "chat": False, "audit": False, "bench": True, "serve": True}
    result = run_cli("generate", PROMPT, "--target", "missing.gguf", "--huge-pages")
    assert_one_error_line(result, "model file not found")
