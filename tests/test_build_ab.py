"""scripts/build_ab.py on the tiny model: two builds' evaluations alternating, paired by round."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import assert_one_error_line

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_ab.py"


def this_build() -> Path:
    """The directory of the llama.cpp libraries this environment loaded (llama-cpp-python's own
    choice, LLAMA_CPP_LIB_PATH included), not a second guess at it."""
    from llama_cpp import llama_cpp

    return Path(llama_cpp._lib._name).parent


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_one_build_against_itself_pairs_every_size(stories, tmp_path):
    out = tmp_path / "ab.json"
    lib = this_build()
    done = run("--lib-a", lib, "--lib-b", lib, "--target", stories, "--rounds", 3, "--json", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["a"]["build_id"] == report["b"]["build_id"]  # the same libraries on both sides
    assert report["rounds"] == 3 and report["target"] == str(stories)
    sizes = report["by_batch"]
    assert sorted(map(int, sizes)) == [1, 2, 3, 4, 5, 6, 8, 12, 16]
    for row in sizes.values():
        assert row["a_ms"] > 0 and row["b_ms"] > 0
        assert 0 < row["q1"] <= row["b_over_a"] <= row["q3"]


def test_a_directory_without_a_build_is_one_error_line(stories, tmp_path):
    done = run("--lib-a", tmp_path, "--lib-b", this_build(), "--target", stories)
    assert_one_error_line(done, "build A: no libllama library", code=1)


def test_a_corrupt_model_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"junk" * 64)
    done = run("--lib-a", this_build(), "--lib-b", this_build(), "--target", bad)
    assert_one_error_line(done, "build A stopped: ", code=1)
