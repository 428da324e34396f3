"""GenerationStats: recording steps and merging generations by the fields' own marks. No model."""

from dataclasses import fields

from llamaspec.stats import COUNT_FIELDS, GenerationStats, quartiles


def two_generations() -> tuple[GenerationStats, GenerationStats]:
    a = GenerationStats(mode="plain", k=0, n_prompt=5, n_generated=3, stop_reason="eog")
    for drafted, accepted in ((0, 0), (0, 0), (0, 0)):
        a.record_step(drafted, accepted, 0.0, 0.01, 0.012)
    b = GenerationStats(mode="speculative", k="auto", verify="greedy", n_prompt=7, n_generated=6,
                        stop_reason="max_tokens")
    for drafted, accepted in ((3, 3), (3, 1)):
        b.record_step(drafted, accepted, 0.004, 0.02, 0.025)
    return a, b


def test_merge_sums_counters_adds_count_lists_and_takes_the_newest_description():
    a, b = two_generations()
    total = GenerationStats()
    total.merge(a)
    total.merge(b)
    assert (total.n_prompt, total.n_generated, total.n_steps) == (12, 9, 5)
    assert (total.n_drafted, total.n_accepted) == (6, 4)
    assert a.accept_histogram == [3] and b.accept_histogram == [0, 1, 0, 1]
    assert total.accept_histogram == [3, 1, 0, 1]
    assert total.reached_by_position == [2, 2, 1] and total.accepted_by_position == [2, 1, 1]
    assert abs(total.step_s - (3 * 0.012 + 2 * 0.025)) < 1e-12 and abs(total.draft_s - 0.008) < 1e-12
    assert (total.mode, total.k, total.verify, total.stop_reason) == ("speculative", "auto", "greedy", "max_tokens")
    assert total.acceptance_by_position == [1.0, 0.5, 1.0]


def test_every_field_has_a_merge_rule_the_counts_are_the_lists():
    # A new counter merges by its mark; a list without the "counts" mark would be replaced, not added.
    for f in fields(GenerationStats):
        if f.name in COUNT_FIELDS:
            assert f.metadata["merge"] == "counts"
        elif f.metadata.get("merge") != "sum":
            assert f.type in ("str", "int | str"), f.name
    assert set(COUNT_FIELDS) == {"accept_histogram", "reached_by_position", "accepted_by_position"}


def test_merging_does_not_alias_the_other_generations_lists():
    a, b = two_generations()
    total = GenerationStats()
    total.merge(b)
    total.merge(a)
    assert b.accept_histogram == [0, 1, 0, 1] and total.accept_histogram is not b.accept_histogram


def test_quartiles_of_paired_ratios():
    assert quartiles([0.97]) == (0.97, 0.97, 0.97)  # one round: the ratio stands for all three
    assert quartiles([1.0, 1.2, 0.9, 1.1, 1.05]) == (1.0, 1.05, 1.1)
    assert quartiles([1.0, 2.0]) == (1.25, 1.5, 1.75)  # within the two (exclusive: 0.75 and 2.25)
