"""The batch-invariant llama.cpp build (cpp_patches/, scripts/build_patched.sh) in .venv-patched:
verify batches of every size up to 16 must give logits bit-identical to sequential decoding.

Runs `llamaspec audit` with .venv-patched/bin/python in a subprocess (the test process itself
uses the stock build). Fails, with instructions, when .venv-patched has not been built.
The Gemma 3 270M case is marked slow (it fetches the model on first use, like tests/test_slow.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

PATCHED_PYTHON = Path(os.environ.get("LLAMASPEC_PATCHED_VENV", REPO / ".venv-patched")) / "bin" / "python"
BATCH_MAX = 16
# a prompt long enough that the KV cache passes 256 and 512 cells, where flash attention's
# stock kernel switches from one pass to KV chunks split by thread count
LONG_TEXT = ("Once upon a time there was a little girl who lived in a village near the forest. "
             "Every day she walked to the river with her dog and her grandmother's basket. ") * 24


def patched_python() -> Path:
    if not PATCHED_PYTHON.is_file():
        pytest.fail(f"{PATCHED_PYTHON} is missing: run scripts/build_patched.sh first "
                    "(builds the patched llama-cpp-python into .venv-patched, several minutes)")
    info = subprocess.run(
        [str(PATCHED_PYTHON), "-c", ("import llama_cpp; llama_cpp.llama_backend_init(); "
                                    "print(llama_cpp.llama_print_system_info().decode())")],
        capture_output=True, text=True, timeout=120, check=False)
    if "BATCH_INVARIANT" not in info.stdout:
        pytest.fail(f"{PATCHED_PYTHON} does not hold the patched build (system info: {info.stdout.strip()!r} "
                    f"{info.stderr.strip()[-500:]}); run LLAMASPEC_REBUILD=1 scripts/build_patched.sh")
    return PATCHED_PYTHON


def audit(tmp_path: Path, target: Path, *extra: str, prompts: list[str] | None = None,
          max_tokens: int = 32, limit: int = 2, timeout: int = 1800) -> dict:
    python = patched_python()
    out = tmp_path / f"audit-{target.stem}-{'-'.join(e.strip('-') for e in extra) or 'default'}.json"
    command = [str(python), "-m", "llamaspec.cli", "audit", "--target", str(target),
               "--limit", str(limit), "--max-tokens", str(max_tokens), "--batch-max", str(BATCH_MAX),
               "--json", str(out), *extra]
    if prompts is not None:
        prompt_file = tmp_path / "prompts.jsonl"
        prompt_file.write_text("".join(json.dumps({"id": f"p{i}", "category": "test", "prompt": p}) + "\n"
                                       for i, p in enumerate(prompts)), encoding="utf-8")
        command += ["--prompts", str(prompt_file)]
    env = dict(os.environ)
    env.pop("GGML_CPU_BATCH_INVARIANT", None)
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout, check=False)
    assert done.returncode == 0, f"audit failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


def assert_bit_exact(report: dict) -> None:
    sizes = report["batch_sizes"]
    assert sorted(map(int, sizes)) == list(range(2, BATCH_MAX + 1))
    bad = {size: (row["max_abs_diff"], row["rows_different"], row["rows_compared"])
           for size, row in sizes.items() if row["rows_compared"] == 0 or row["max_abs_diff"] != 0
           or row["rows_different"] != 0}
    assert not bad, f"not bit-exact (size: max |dlogit|, rows different, rows compared): {bad}"
    assert report["bit_exact_sizes"] == list(range(2, BATCH_MAX + 1))


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_patched_stories_bit_exact(tmp_path, stories, flash_attn):
    assert_bit_exact(audit(tmp_path, stories, "--flash-attn", flash_attn))


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_patched_tiny_random_bit_exact(tmp_path, tiny_random, flash_attn):
    assert_bit_exact(audit(tmp_path, tiny_random, "--flash-attn", flash_attn))


def test_patched_tiny_random_long_context_bit_exact(tmp_path, tiny_random):
    """Batches that straddle the 256- and 512-cell KV boundaries (flash attention chunking)."""
    assert_bit_exact(audit(tmp_path, tiny_random, "--flash-attn", "on", prompts=[LONG_TEXT], limit=1,
                           max_tokens=48))


@pytest.mark.slow
def test_patched_gemma_bit_exact(tmp_path):
    from llamaspec import models

    gemma = models.fetch("gemma-3-270m")
    assert_bit_exact(audit(tmp_path, gemma))


@pytest.mark.slow
def test_patched_gemma_long_context_bit_exact(tmp_path):
    """Past Gemma 3's 512-token sliding window."""
    from llamaspec import models

    gemma = models.fetch("gemma-3-270m")
    assert_bit_exact(audit(tmp_path, gemma, prompts=[LONG_TEXT * 2], limit=1, max_tokens=32))
