"""What the CLI commands share: error handling, model resolution, option definitions."""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, TypeVar

import typer

from . import models as registry
from .errors import LlamaSpecError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def run_app(app: typer.Typer) -> NoReturn:
    """Run a command line and exit. Click's own usage errors (an unknown flag, a value of
    the wrong kind) end as one `error:` line too, not as its four-line usage block; no
    arguments at all still print the help."""
    try:
        code = app(standalone_mode=False)  # a typer.Exit's code, or the command's None
    except typer.TyperException as exc:  # the base of typer's (vendored) Click exceptions
        if type(exc).__name__ == "NoArgsIsHelpError":  # its message is the help text
            exc.show()
            code = exc.exit_code
        else:
            context = getattr(exc, "ctx", None)
            hint = f" (see: {context.command_path} --help)" if context is not None else ""
            code = fail(" ".join(exc.format_message().split()) + hint, exc.exit_code).exit_code
    except typer.Abort:
        code = fail("interrupted", 130).exit_code
    sys.exit(code or 0)


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
        except BrokenPipeError:  # the reader left (`| head`): stop quietly, as other tools do
            try:  # the exit's flush of stdout would fail again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # a stdout without a descriptor (run in-process)
                pass
            raise typer.Exit(141) from None  # what a shell reports for a command SIGPIPE ended
        except OSError as exc:
            raise fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None

    return wrapper  # type: ignore[return-value]


def check_output(path: Optional[Path], flag: str) -> None:
    """Refuse an output file that cannot be written before a long run, not after it."""
    if path is None:
        return
    if path.is_dir():
        raise LlamaSpecError(f"{flag} {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise LlamaSpecError(f"{flag} {path}: the directory {path.parent} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise LlamaSpecError(f"{flag} {path}: not writable")


class FlashAttn(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


class Drafter(str, Enum):
    auto = "auto"
    model = "model"
    ngram = "ngram"
    suffix = "suffix"
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


def resolve_pair(target: Optional[str], draft: Optional[str],
                 drafter: Drafter = Drafter.auto) -> tuple[Path, Optional[Path]]:
    """No --target and no --draft: the default Qwen pair (no draft for a drafter that needs
    none). --target alone: plain decoding."""
    if target is None:
        target = registry.DEFAULT_TARGET
        if drafter not in (Drafter.ngram, Drafter.suffix):
            draft = draft or registry.DEFAULT_DRAFT
    return resolve_model(target), resolve_model(draft) if draft else None


# Options shared by the commands that load models.
TargetOpt = typer.Option(None, "--target", help="Target GGUF path or registered model name.")
DraftOpt = typer.Option(None, "--draft", help="Draft GGUF path or registered model name.")
KOpt = typer.Option("auto", "--k", help="Tokens drafted per step, or auto (cost-aware, per step).")
DrafterOpt = typer.Option(Drafter.auto, "--drafter",
                          help="auto (hybrid with a draft), model, ngram (prompt lookup), suffix (suffix trie over "
                               "the session's contexts) or hybrid.")
ThreadsOpt = typer.Option(2, "--threads", help="CPU threads for both models.")
CtxOpt = typer.Option(4096, "--ctx", help="Context size in tokens.")
GpuOpt = typer.Option(0, "--gpu-layers", help="Layers to offload (Metal/CUDA builds).")
FlashOpt = typer.Option(FlashAttn.auto, "--flash-attn", help="Flash attention.")
RepackOpt = typer.Option(True, "--repack/--no-repack", help="llama.cpp's repacked CPU weights (kernel choice).")


def huge_pages_opt(default: bool) -> Any:
    """--huge-pages: a per-command default, on for the long runs (ModelOptions.huge_pages)."""
    return typer.Option(default, "--huge-pages/--no-huge-pages",
                        help="Weights on transparent huge pages (Linux): decoding about 7 % faster, loading "
                             "slower on a VM that returns free memory to its host.")


TargetRpcOpt = typer.Option(None, "--target-rpc", metavar="HOST:PORT[,HOST:PORT...]",
                            help="Put the target's layers on llama.cpp rpc-servers (scripts/build_rpc.sh); "
                                 "the draft stays local. Trusted networks only.")
StrictOpt = typer.Option(False, "--strict", help="Only verify sizes the audit found bit-exact on this model and build.")
TemperatureOpt = typer.Option(0.0, "--temperature", help="0 = greedy.")
TopKOpt = typer.Option(0, "--top-k", help="0 = off.")
TopPOpt = typer.Option(1.0, "--top-p")
MinPOpt = typer.Option(0.0, "--min-p")
RepeatPenaltyOpt = typer.Option(1.0, "--repeat-penalty")
SeedOpt = typer.Option(None, "--seed")
VerifyOpt = typer.Option(Verify.rejection, "--verify", help="Sampling verification rule.")


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


def model_options(ctx: int, threads: int, gpu_layers: int, flash_attn: FlashAttn, repack: bool = True,
                  n_seq: int = 1, target_rpc: Optional[str] = None, huge_pages: bool = False) -> Any:
    """ModelOptions from the shared flags (it validates them)."""
    from .llama import ModelOptions

    return ModelOptions(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers, flash_attn=flash_attn.value,
                        repack=repack, n_seq=n_seq, rpc_servers=target_rpc or (), huge_pages=huge_pages)


def sampling_params(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
                    seed: Optional[int]) -> Any:
    from .sampling import SamplingParams

    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, seed=seed)
