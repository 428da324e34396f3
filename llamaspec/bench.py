"""Plain vs speculative decoding side by side in one process, over a prompt suite.

Per prompt the two modes alternate (plain first on even prompts, speculative first on odd
ones) on the same loaded target, after a warm-up, so drift on a shared machine hits both.
Each greedy output is also compared token by token with plain decoding and with
llama-cpp-python's own `Llama` greedy decoder; sampled runs (temperature > 0) differ by nature
and are only timed, both modes drawing with the same seed per prompt. The target's batched
throughput at the verify size used (a perfect, free drafter) gives the physical limit,
reported as speculative / oracle.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__
from .calibrate import eval_costs
from .decoder import K_MAX, SpeculativeDecoder
from .errors import LlamaSpecError
from .llama import ModelOptions, build_id, cpu_kernel_settings, system_info
from .models import sha256_cached
from .policy import curve_at
from .prompts import load_prompts  # noqa: F401  (re-exported for the CLI)
from .reference import ReferenceGreedy
from .sampling import SamplingParams
from .stats import COUNT_FIELDS, add_counts, position_acceptance
from .verify import VerifyMode


@dataclass
class BenchConfig:
    target: Path
    draft: Path | None
    drafter: str = "auto"
    k: int | str = "auto"
    max_tokens: int = 128
    options: ModelOptions = field(default_factory=ModelOptions)
    reference: bool = True
    min_draft_prob: float = 0.0
    strict: bool = False
    sampling: SamplingParams = SamplingParams()
    verify: VerifyMode = "rejection"  # the rule for sampled runs


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None when the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def report_median(values: list[float]) -> float:
    """A report's median: three decimals, 0.0 for none (shared by the comparison scripts)."""
    return round(statistics.median(values), 3) if values else 0.0


def _summary(records: list[dict]) -> dict:
    by_category: dict[str, list[dict]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record)

    def block(items: list[dict]) -> dict:
        return {
            "n_prompts": len(items),
            "median_speedup": report_median([r["speedup"] for r in items]),
            "median_plain_tps": report_median([r["plain_tps"] for r in items]),
            "median_speculative_tps": report_median([r["speculative_tps"] for r in items]),
            "median_acceptance": report_median([r["acceptance_rate"] for r in items]),
            "median_speculative_over_oracle": report_median([r["speculative_over_oracle"] for r in items]),
            # sampled runs: None (outputs differ by nature)
            "identical": None if items[0]["identical"] is None else sum(r["identical"] for r in items),
            # plain decoding against llama-cpp-python's own Llama (--reference); None without it
            "reference_identical": None if items[0]["reference_identical"] is None
            else sum(r["reference_identical"] for r in items),
        }

    totals: dict[str, list[int]] = {name: [] for name in COUNT_FIELDS}
    for record in records:
        for name, counts in totals.items():
            add_counts(counts, record["speculative"][name])
    return {
        "overall": block(records),
        "by_category": {name: block(items) for name, items in sorted(by_category.items())},
        "accept_histogram": totals["accept_histogram"],
        "acceptance_by_position": position_acceptance(totals["accepted_by_position"], totals["reached_by_position"]),
        "divergences": [
            {"id": r["id"], "vs_plain": r["first_divergence"], "vs_reference": r["reference_first_divergence"]}
            for r in records if r["first_divergence"] is not None or r["reference_first_divergence"] is not None
        ],
    }


def run_bench(config: BenchConfig, prompts: list[dict],
              progress: Callable[[int, int, dict], None] | None = None) -> dict:
    """Run the suite; returns the JSON-ready report (meta, per-prompt records, summary)."""
    options = config.options
    sampling, greedy = config.sampling, config.sampling.greedy
    with SpeculativeDecoder(config.target, config.draft, k=config.k, drafter=config.drafter,  # type: ignore[arg-type]
                            options=options, min_draft_prob=config.min_draft_prob,
                            strict=config.strict, verify=config.verify) as decoder:
        if decoder.drafter is None:
            raise LlamaSpecError("bench needs a drafter: pass --draft, or --drafter ngram")
        verify_ms = eval_costs(decoder.target, list(range(1, K_MAX + 2)))
        use_reference = config.reference and greedy
        reference = ReferenceGreedy(config.target, options, decoder.target.is_eog) if use_reference else None
        try:
            def encode(text: str) -> list[int]:
                return decoder.prompt_tokens(text, chat=decoder.chat_format.has_template)

            for speculative in (False, True):  # warm-up: allocations, caches, first calibrations
                list(decoder.generate(encode(prompts[0]["prompt"]), max_tokens=8, sampling=sampling,
                                      speculative=speculative))
            records = []
            for index, item in enumerate(prompts):
                tokens = encode(item["prompt"])
                # both modes draw with one seed per prompt, the base seed plus the prompt's index:
                # a reproducible suite (without --seed, or with -1, the base is 0)
                seeded = sampling if greedy else dataclasses.replace(sampling, seed=(sampling.seed or 0) + index)
                runs: dict[bool, tuple[list[int], dict]] = {}
                for speculative in ((False, True) if index % 2 == 0 else (True, False)):
                    decoder.reset()  # every run evaluates the whole prompt, like the reference
                    out = list(decoder.generate(tokens, max_tokens=config.max_tokens, sampling=seeded,
                                                speculative=speculative))
                    runs[speculative] = (out, decoder.stats.to_dict())
                (plain, plain_stats), (spec, spec_stats) = runs[False], runs[True]
                # The oracle: every step verifies the mean batch and keeps all of it, drafting free
                # (the cost curve read between its sizes)
                batch = 1 + spec_stats["n_drafted"] / max(spec_stats["n_steps"], 1)
                oracle_tps = 1000 * batch / curve_at(verify_ms, batch)
                reference_out = reference(tokens, config.max_tokens) if reference else None
                record = {
                    "id": item["id"],
                    "category": item["category"],
                    "n_prompt_tokens": len(tokens),
                    "n_generated": len(spec),
                    "plain_tps": plain_stats["tokens_per_second"],
                    "speculative_tps": spec_stats["tokens_per_second"],
                    "speedup": round(spec_stats["tokens_per_second"] / max(plain_stats["tokens_per_second"], 1e-9), 3),
                    "acceptance_rate": spec_stats["acceptance_rate"],
                    "mean_accepted_per_step": spec_stats["mean_accepted_per_step"],
                    "mean_verify_batch": round(batch, 2),
                    "oracle_tps": round(oracle_tps, 3),
                    "speculative_over_oracle": round(spec_stats["tokens_per_second"] / oracle_tps, 3),
                    "identical": plain == spec if greedy else None,
                    "first_divergence": first_divergence(plain, spec) if greedy else None,
                    # llama-cpp-python's own Llama against our plain decoding
                    "reference_identical": None if reference_out is None else reference_out == plain,
                    "reference_first_divergence": None if reference_out is None else first_divergence(reference_out,
                                                                                                      plain),
                    "plain": plain_stats,
                    "speculative": spec_stats,
                }
                records.append(record)
                if progress:
                    progress(index + 1, len(prompts), record)
        finally:
            if reference is not None:
                reference.close()
        draft_path = decoder.draft_model.path if decoder.draft_model else None
        strict_note = decoder.strict_note
        in_loop = decoder.config.verify_ms  # k=auto: the curve as the loop's timings corrected it
        batch1 = {role: model.batch1_kernels and int(model.batch1_kernels[1])
                  for role, model in (("target", decoder.target), ("draft", decoder.draft_model)) if model}
    return {
        "meta": {
            "llamaspec_version": __version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "target": {"path": str(config.target), "sha256": sha256_cached(config.target)},
            "draft": {"path": str(draft_path), "sha256": sha256_cached(draft_path)} if draft_path else None,
            "drafter": config.drafter,
            "k": config.k,
            "max_tokens": config.max_tokens,
            "threads": options.n_threads,
            "n_ctx": options.n_ctx,
            "flash_attn": options.flash_attn,
            "min_draft_prob": config.min_draft_prob,
            "strict": config.strict,
            "strict_note": strict_note,
            # the seed: the base of the prompts' seeds (prompt i draws with seed + i)
            "sampling": {**dataclasses.asdict(sampling), "seed": None if greedy else sampling.seed or 0},
            "verify": "greedy" if greedy else config.verify,
            "build": system_info(),
            "build_id": build_id(),
            # batch_invariant, multirow, control as the process is set; null: stock build
            "cpu_kernels": cpu_kernel_settings(),
            # per model, the kernels a batch of 1 runs (1: multi-row, 2: single-row), as
            # calibrate.choose_batch1_kernels measured faster for it here; null: the process's
            "batch1_kernels": batch1,
            "verify_ms_by_batch": verify_ms,
            "verify_ms_in_loop": {n: round(ms, 2) for n, ms in in_loop.items()},
        },
        "prompts": records,
        "summary": _summary(records),
    }


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="llamaspec bench: plain vs speculative (tokens/s, one process, alternating)")
    for column in ("prompt", "category", "plain", "spec", "speedup", "accept", "acc/step", "spec/oracle", "identical"):
        table.add_column(column, justify="right" if column not in ("prompt", "category") else "left")
    for r in report["prompts"]:
        same = "sampled" if r["identical"] is None else "yes" if r["identical"] else f"no @{r['first_divergence']}"
        table.add_row(r["id"], r["category"], f"{r['plain_tps']:.2f}", f"{r['speculative_tps']:.2f}",
                      f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.2f}", f"{r['mean_accepted_per_step']:.2f}",
                      f"{r['speculative_over_oracle']:.2f}", same)
    summary = report["summary"]
    for name, block in [("ALL", summary["overall"]), *summary["by_category"].items()]:
        table.add_row(f"[bold]median {name}[/bold]", "", f"{block['median_plain_tps']:.2f}",
                      f"{block['median_speculative_tps']:.2f}", f"[bold]{block['median_speedup']:.2f}x[/bold]",
                      f"{block['median_acceptance']:.2f}", "", f"{block['median_speculative_over_oracle']:.2f}",
                      "-" if block["identical"] is None else f"{block['identical']}/{block['n_prompts']}")
    import sys

    console = Console(width=None if sys.stdout.isatty() else 160)  # a log file keeps every column
    console.print(table)
    overall = summary["overall"]
    if overall["reference_identical"] is not None:
        console.print(f"plain decoding identical to llama-cpp-python's own greedy decoding (Llama): "
                      f"{overall['reference_identical']}/{overall['n_prompts']}")


def check_plot() -> None:
    """Checked before the run: --plot needs the optional matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise LlamaSpecError("--plot needs matplotlib: pip install 'llamaspec[plot]'") from None


def plot(report: dict, path: Path) -> None:
    """Speedup per prompt (coloured by category) and the accept-count histogram."""
    check_plot()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = report["prompts"]
    categories = sorted({r["category"] for r in records})
    colours = {c: plt.get_cmap("tab10")(i) for i, c in enumerate(categories)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 1]})
    left.bar(range(len(records)), [r["speedup"] for r in records], color=[colours[r["category"]] for r in records])
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks(range(len(records)), [r["id"] for r in records], rotation=90, fontsize=7)
    left.set_ylabel("speedup over plain decoding")
    left.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[c]) for c in categories], labels=categories)
    histogram = report["summary"]["accept_histogram"]
    right.bar(range(len(histogram)), histogram)
    right.set_xticks(range(len(histogram)))
    right.set_xlabel("draft tokens accepted in a step (0: none, or no draft)")
    right.set_ylabel("steps")
    meta = report["meta"]
    fig.suptitle(f"{Path(meta['target']['path']).name} | drafter {meta['drafter']} k={meta['k']} | "
                 f"median {report['summary']['overall']['median_speedup']:.2f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
