"""Shared fixtures: the tiny models in ../shared/models and drafts made from them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_MODELS = Path(os.environ.get("LLAMASPEC_TEST_MODELS", REPO.parent / "shared" / "models"))
STORIES = SHARED_MODELS / "stories260K.gguf"
TINY_RANDOM = SHARED_MODELS / "llama-2-tiny-random.gguf"

STORY_PROMPTS = [
    "Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a bird",
    "Tom had a red ball", "The sun was shining and", "Mom said", "There was a big tree",
    "Sam liked to eat", "The cat was sad because", "A girl named Sue", "In the forest",
    "The boy found a box", "It was a rainy day", "Spot the dog", "The king", "Amy wanted to fly",
    "The fish swam", "After lunch,", "Timmy saw a car",
]


@pytest.fixture(scope="session")
def stories() -> Path:
    if not STORIES.is_file():
        pytest.fail(f"test model missing: {STORIES} (set LLAMASPEC_TEST_MODELS)")
    return STORIES


@pytest.fixture(scope="session")
def tiny_random() -> Path:
    if not TINY_RANDOM.is_file():
        pytest.fail(f"test model missing: {TINY_RANDOM} (set LLAMASPEC_TEST_MODELS)")
    return TINY_RANDOM


@pytest.fixture(scope="session")
def truncated_draft(stories: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stories260K without its last block: same vocabulary, partial agreement."""
    from llamaspec.gguf_tools import truncate_layers

    return truncate_layers(stories, tmp_path_factory.mktemp("drafts") / "stories-4-layers.gguf", 4)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llamaspec.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def assert_one_error_line(result: subprocess.CompletedProcess[str], expected: str, code: int | None = None) -> None:
    """A user's mistake ends as exactly one `error: ...` line on stderr that names it, and a
    non-zero exit (`code` where given): no traceback, no usage block, no log lines."""
    assert result.returncode == code if code is not None else result.returncode != 0, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
