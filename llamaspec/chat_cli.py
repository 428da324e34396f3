"""`llamaspec chat`: a terminal chat whose answers are decoded speculatively.

Answers stream as they are verified; a dim line after each says how fast and how well the
draft did. Ctrl-C stops an answer (the loop finishes the step it is in, so both KV caches
stay consistent and the next turn still reuses them); Ctrl-C twice at the prompt, Ctrl-D
or /exit leaves.
"""

from __future__ import annotations

import contextlib
import signal
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.text import Text

from .chat_session import ChatSession, Turn
from .cli_common import (
    CtxOpt, Drafter, DrafterOpt, DraftOpt, FlashAttn, FlashOpt, GpuOpt, KOpt, MinPOpt, RepeatPenaltyOpt, SeedOpt,
    StrictOpt, TargetOpt, TargetRpcOpt, TemperatureOpt, ThreadsOpt, TopKOpt, TopPOpt, Verify, VerifyOpt, friendly,
    huge_pages_opt, model_options, parse_k, resolve_pair, run_app, sampling_params,
)
from .errors import LlamaSpecError
from .sampling import SamplingParams
from .speculative import StepTrace
from .stats import GenerationStats

if TYPE_CHECKING:
    from .decoder import SpeculativeDecoder

PROMPT = "> "
COMMANDS = {
    "/stats": "session totals and the accept histogram",
    "/reset": "forget the conversation and the KV caches (keeps the system prompt)",
    "/trace on|off": "show every verify batch",
    "/exit": "leave (also Ctrl-D)",
}


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """While an answer streams, Ctrl-C only raises a flag that is read between tokens, so
    generation never stops between a llama_decode and the cache bookkeeping after it.
    A second Ctrl-C interrupts at once (for a long prompt evaluation)."""
    pressed: list[bool] = []

    def handler(_signum: int, _frame: object) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)


def _token_text(decoder: SpeculativeDecoder, token: int) -> str:
    return repr(decoder.target.token_bytes(token, special=True).decode("utf-8", "replace"))


def render_step(decoder: SpeculativeDecoder, step: StepTrace) -> Text:
    """One verify batch: each row's position, the token evaluated there (drafted ones green
    when accepted, red when rolled back) and the target's greedy choice for the next
    position (its argmax; when sampling, the token drawn may differ)."""
    n_drafted = len(step.evaluated) - 1
    text = Text()
    text.append(f"verify @{step.position}: accepted {step.n_accepted}/{n_drafted}, "
                f"then {_token_text(decoder, step.next_token)}\n", style="bold")
    choices = step.rows.argmax(axis=1).tolist()
    for i, (token, choice) in enumerate(zip(step.evaluated, choices, strict=True)):
        if i == 0:
            style, mark = "", "  "
        elif i <= step.n_accepted:
            style, mark = "green", "✓ "
        else:
            style, mark = "red", "✗ "
        text.append(f"  {step.position + i:>6} {mark}", style=style)
        text.append(f"{_token_text(decoder, token):<16}", style=style)
        text.append(f" → {_token_text(decoder, choice)}\n", style="dim" if i > step.n_accepted else "")
    return text


def accepted_per_step(stats: GenerationStats) -> float:
    return stats.n_accepted / max(stats.n_steps, 1)


def status_line(turn: Turn) -> str:
    stats = turn.stats
    parts = [f"{stats.n_generated} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.n_drafted:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
        parts.append(f"{accepted_per_step(stats):.2f} accepted/step")
    if turn.first_token_s is not None:
        parts.append(f"first token {turn.first_token_s:.2f} s")
    parts.append(f"prompt {stats.n_prompt_evaluated}/{stats.n_prompt} evaluated")
    return " · ".join(parts)


class ChatApp:
    """The read-answer loop; `run` returns when the user leaves."""

    def __init__(self, session: ChatSession, console: Console, trace: bool):
        self.session = session
        self.console = console
        self.trace = trace
        self.at_line_start = True

    def write(self, text: str) -> None:
        """Model text goes out raw: rich markup in an answer must print as written."""
        if not text:
            return
        self.console.file.write(text)
        self.console.file.flush()
        self.at_line_start = text.endswith("\n")

    def end_line(self) -> None:
        if not self.at_line_start:
            self.write("\n")

    def note(self, message: str, style: str = "dim") -> None:
        self.end_line()
        self.console.print(Text(message, style=style), soft_wrap=True)

    def run(self) -> None:
        pressed_ctrl_c = False
        while True:
            try:
                line = self.read()
                pressed_ctrl_c = False
                if line and not self.handle(line):
                    return
            except EOFError:  # Ctrl-D at the prompt
                self.end_line()
                return
            except KeyboardInterrupt:  # at the prompt or in a command (answers catch their own)
                self.end_line()
                if pressed_ctrl_c:
                    return
                pressed_ctrl_c = True
                self.note("(Ctrl-C again, Ctrl-D or /exit to leave)")

    def read(self) -> str:
        self.at_line_start = False  # the prompt and the typing stay on one line until Enter
        line = input(PROMPT)
        self.at_line_start = True
        return line.strip()

    def handle(self, line: str) -> bool:
        """Answer a message or run a slash command; False means leave."""
        if line.startswith("/"):
            return self.command(line)
        self.answer(line)
        return True

    def answer(self, text: str) -> None:
        turn: Turn | None = None
        try:
            with deferred_interrupt() as interrupted:
                turn = self.session.send(text, trace=self.show_step if self.trace else None)
                if turn.dropped:
                    self.note(f"(context full: dropped the {turn.dropped} oldest messages)", style="yellow")
                started = False
                for piece in turn:
                    # The answer starts on its own line: drop the space a template leaves before it.
                    piece = piece if started else piece.lstrip()
                    started = started or bool(piece)
                    self.write(piece)
                    if interrupted():
                        turn.close()
        except KeyboardInterrupt:  # the second Ctrl-C
            if turn is not None:
                turn.close()
        except LlamaSpecError as exc:
            self.note(str(exc), style="yellow")
            return
        finally:
            self.end_line()
        if turn is None:
            return
        if turn.interrupted:
            self.note("(stopped)", style="yellow")
        self.note(status_line(turn))

    def show_step(self, step: StepTrace) -> None:
        self.end_line()
        self.console.print(render_step(self.session.decoder, step), end="")

    def command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if name == "/exit":
            return False
        if name == "/stats":
            self.print_stats()
        elif name == "/reset":
            self.session.reset()
            self.note("(conversation cleared)")
        elif name == "/trace" and argument in ("on", "off"):
            self.trace = argument == "on"
            self.note(f"(trace {argument})")
        else:
            listing = "\n".join(f"  {command:<14} {what}" for command, what in COMMANDS.items())
            self.note(f"unknown command {line!r}; commands:\n{listing}", style="yellow")
        return True

    def print_stats(self) -> None:
        totals = self.session.totals
        stats = totals.stats
        lines = [
            f"turns {totals.turns} · {stats.n_generated} tokens generated · {stats.tokens_per_second:.1f} tok/s",
            f"prompt tokens {stats.n_prompt}, evaluated {stats.n_prompt_evaluated} (the rest reused from the cache)",
            f"first token {totals.mean_first_token_s:.2f} s on average",
        ]
        if stats.n_drafted:
            lines.append(f"drafted {stats.n_drafted} · accepted {stats.n_accepted} ({stats.acceptance_rate:.0%})"
                         f" · {accepted_per_step(stats):.2f} accepted/step in {stats.n_steps} steps")
            lines.append("accepted per step (0: none accepted, or a step that did not draft):")
            widest = max(stats.accept_histogram, default=0) or 1
            for n_accepted, count in enumerate(stats.accept_histogram):
                lines.append(f"  {n_accepted:>2} {'█' * round(30 * count / widest):<30} {count}")
        self.end_line()
        self.console.print(Text("\n".join(lines)))


def run_chat(decoder: SpeculativeDecoder, *, system: str | None = None, max_tokens: int = 512,
             sampling: SamplingParams = SamplingParams(), trace: bool = False,
             console: Console | None = None) -> ChatSession:
    """The terminal loop over one decoder; returns the session (its totals) when the user
    leaves. Call it from the main thread: it handles Ctrl-C itself."""
    try:
        import readline  # noqa: F401  line editing and history for input()
    except ImportError:  # pragma: no cover - not on every platform
        pass
    # Ctrl-C must reach the prompt even when the chat was started with SIGINT ignored (a
    # background job of a non-interactive shell passes that on): answers already take it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    console = console or Console(highlight=False)
    session = ChatSession(decoder, system=system, max_tokens=max_tokens, sampling=sampling)
    draft = decoder.draft_model.path.name if decoder.draft_model else "no draft"
    console.print(Text(f"llamaspec chat · {decoder.target.path.name} + {draft} · /stats /reset /trace /exit",
                       style="dim"))
    try:
        ChatApp(session, console, trace).run()
    finally:
        signal.signal(signal.SIGINT, previous)
    return session


def chat_command(
    target: Optional[str] = TargetOpt,
    draft: Optional[str] = DraftOpt,
    system: Optional[str] = typer.Option(None, "--system", help="System prompt, kept for the whole chat."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Most tokens per answer."),
    temperature: float = TemperatureOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    min_p: float = MinPOpt,
    repeat_penalty: float = RepeatPenaltyOpt,
    seed: Optional[int] = SeedOpt,
    verify: Verify = VerifyOpt,
    k: str = KOpt,
    drafter: Drafter = DrafterOpt,
    trace: bool = typer.Option(False, "--trace", help="Show every verify batch."),
    threads: int = ThreadsOpt,
    ctx: int = CtxOpt,
    gpu_layers: int = GpuOpt,
    flash_attn: FlashAttn = FlashOpt,
    huge_pages: bool = huge_pages_opt(False),
    target_rpc: Optional[str] = TargetRpcOpt,
    strict: bool = StrictOpt,
) -> None:
    """Chat in the terminal; answers are decoded speculatively."""
    from .decoder import SpeculativeDecoder

    if max_tokens <= 0:
        raise LlamaSpecError(f"--max-tokens must be at least 1, got {max_tokens}")
    k_value = parse_k(k)
    sampling = sampling_params(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    options = model_options(ctx, threads, gpu_layers, flash_attn, target_rpc=target_rpc, huge_pages=huge_pages)
    target_path, draft_path = resolve_pair(target, draft, drafter)
    with SpeculativeDecoder(target_path, draft_path, k=k_value, drafter=drafter.value, options=options,
                            verify=verify.value, strict=strict) as decoder:
        if decoder.strict_note:
            typer.echo(decoder.strict_note, err=True)
        run_chat(decoder, system=system, max_tokens=max_tokens, sampling=sampling, trace=trace)


def main() -> None:
    """`python -m llamaspec.chat_cli`: the chat command on its own."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command()(friendly(chat_command))
    run_app(app)


if __name__ == "__main__":
    main()
