"""scripts/policy_bounds.py's replays, model-free: the decoder's drafters stepped on recorded text."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from llamaspec.policy import ConfidenceK, CostModel

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "policy_bounds.py"


@pytest.fixture(scope="module")
def bounds():
    spec = importlib.util.spec_from_file_location("policy_bounds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COSTS = CostModel({n: 10.0 + n for n in range(1, 17)}, 5.0)  # cheap verify batches, a 5 ms draft token


def copy_text(bounds, draft_right: bool):
    """An answer that copies its 30-token prompt three times; the draft model's guesses are
    all right (probability 0.99) or all wrong (probability 0.05)."""
    prompt = list(range(100, 130))
    output = prompt * 3
    guess = np.array(output) if draft_right else np.full(len(output), 7)
    prob = np.full(len(output), 0.99 if draft_right else 0.05)
    return bounds.Text("edit", prompt, output, guess, prob)


def speedup(bounds, text, make) -> float:
    return bounds.replay([text], COSTS, make)["all"]


def test_hybrid_replay_takes_the_suffix_tries_copies(bounds):
    """A wrong draft model drafts nothing worth verifying; the default hybrid's suffix trie
    copies the prompt at lookup cost, as the decoder's drafter would."""
    text = copy_text(bounds, draft_right=False)
    model_only = speedup(bounds, text, lambda: bounds.driven(COSTS, "model", lambda: ConfidenceK(COSTS, 15)))
    hybrid = speedup(bounds, text, lambda: bounds.driven(COSTS, "hybrid", lambda: ConfidenceK(COSTS, 15)))
    suffix = speedup(bounds, text, lambda: bounds.driven(COSTS, "suffix", lambda: ConfidenceK(COSTS, 15)))
    assert model_only < 1.05
    assert hybrid > 3.0 and suffix > 3.0


def test_draft_model_replay_charges_every_drafted_token(bounds):
    """All guesses right: ConfidenceK drafts long, and each step costs its drafted tokens at
    5 ms plus the verify batch, so the speedup stays below the free-draft ceiling."""
    text = copy_text(bounds, draft_right=True)
    replayed = speedup(bounds, text, lambda: bounds.driven(COSTS, "model", lambda: ConfidenceK(COSTS, 15)))
    assert 1.5 < replayed < len(text.output) * COSTS.verify(1) / (COSTS.verify(16) * len(text.output) / 16)


def test_foresight_over_both_drafters_bounds_each(bounds):
    for draft_right in (False, True):
        text = copy_text(bounds, draft_right)
        suffix = speedup(bounds, text, lambda: bounds.lookup_foresight(COSTS, bounds.SuffixDrafter))
        model = speedup(bounds, text, lambda: bounds.foresight(COSTS, 15))
        both = speedup(bounds, text, lambda: bounds.lookup_foresight(COSTS, bounds.SuffixDrafter, model=True))
        assert both >= max(suffix, model) - 1e-9
        assert both > 3.0


def test_tree_keeps_the_longer_branch_and_shares_the_common_prefix(bounds):
    """A wrong draft model: the tree keeps the trie's copies. A right one: the trie's copies
    run on past the model's chain and repeat it first, so sharing that prefix the tree pays
    only for the rows beyond it, and beats the model alone (charged twice for the shared
    prefix it would not: 1.68x against the model's 1.66x, where it replays to 1.81x)."""
    wrong = copy_text(bounds, draft_right=False)
    assert speedup(bounds, wrong, lambda: bounds.tree(COSTS, lambda: ConfidenceK(COSTS, 15))) > 3.0
    right = copy_text(bounds, draft_right=True)
    model_only = speedup(bounds, right, lambda: bounds.driven(COSTS, "model", lambda: ConfidenceK(COSTS, 15)))
    tree = speedup(bounds, right, lambda: bounds.tree(COSTS, lambda: ConfidenceK(COSTS, 15)))
    assert tree > 1.05 * model_only


def test_what_if_cheaper_costs_never_lower_a_ceiling(bounds):
    """--what-if: six replays from the measured costs down to free verify batches and a free
    draft; the foresight ceilings only rise as costs fall, and with both free a right draft
    emits a whole verify batch per decode."""
    rows = bounds.what_if([copy_text(bounds, draft_right=True)], COSTS)
    assert [(row["scale"], row["draft_ms"]) for row in rows] == [
        (1.0, 5.0), (1.0, 0.0), (0.5, 5.0), (0.5, 0.0), (0.0, 5.0), (0.0, 0.0)]
    assert rows[2]["verify_ratio"] == {4: round(12.5 / 11, 2), 8: round(14.5 / 11, 2), 16: round(18.5 / 11, 2)}
    assert rows[-1]["verify_ratio"] == {4: 1.0, 8: 1.0, 16: 1.0}
    ceiling = [row["policies"]["foresight, model or suffix, k <= 15"]["all"] for row in rows]
    for cheap, dear in ((1, 0), (3, 2), (5, 4), (2, 0), (4, 2), (5, 3)):
        assert ceiling[cheap] >= ceiling[dear] - 1e-9
    assert ceiling[-1] > 12.0
