"""A multi-turn chat over a SpeculativeDecoder that pays only for what is new.

Each turn renders the whole conversation with the target's chat template and hands the
tokens to `decoder.generate`; `prefill` keeps the common prefix in the target's KV cache and
the draft model syncs its own cache the same way, so a turn evaluates only the tokens added
since the last one. When a turn would not fit, the oldest exchanges are dropped (never the
system prompt) and the turn says how many messages went.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generator, Iterator

from .errors import ContextFullError
from .sampling import SamplingParams
from .speculative import Trace
from .stats import GenerationStats

if TYPE_CHECKING:
    from .chat import Message
    from .decoder import Decoder


@dataclass
class Turn:
    """One exchange. Iterate it for the reply's text; stats and text fill in as it streams,
    and closing it early (Ctrl-C) keeps what was said so far."""

    user: str
    n_prompt: int
    dropped: int  # earlier messages dropped so that this turn fits in the context
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)
    first_token_s: float | None = None
    interrupted: bool = False
    _pieces: Generator[str, None, None] = field(init=False, repr=False)

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def close(self) -> None:
        """Stop generating; the caches stay consistent because the loop is paused between tokens."""
        self._pieces.close()


@dataclass
class SessionTotals:
    """Sums over every turn of a session, kept as a GenerationStats so rates read the same."""

    turns: int = 0
    stats: GenerationStats = field(default_factory=GenerationStats)
    first_token_s: list[float] = field(default_factory=list)

    def add(self, turn: Turn) -> None:
        self.turns += 1
        self.stats.merge(turn.stats)
        if turn.first_token_s is not None:
            self.first_token_s.append(turn.first_token_s)

    @property
    def mean_first_token_s(self) -> float:
        return sum(self.first_token_s) / len(self.first_token_s) if self.first_token_s else 0.0


class ChatSession:
    """The message list of one conversation (system prompt kept) and its running totals."""

    def __init__(self, decoder: Decoder, *, system: str | None = None, max_tokens: int = 512,
                 sampling: SamplingParams = SamplingParams()):
        self.decoder = decoder
        self.system: list[Message] = [{"role": "system", "content": system}] if system else []
        self.history: list[Message] = []  # alternating user / assistant messages
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.totals = SessionTotals()

    @property
    def messages(self) -> list[Message]:
        return self.system + self.history

    def send(self, text: str, trace: Trace | None = None) -> Turn:
        """Start a turn: fit the conversation into the context, then stream the reply.

        Raises ContextFullError, with the history untouched, when the message cannot fit
        even with every earlier exchange dropped."""
        started = time.perf_counter()
        user: Message = {"role": "user", "content": text}
        prompt, dropped = self._fit(user)
        del self.history[:dropped]
        turn = Turn(text, len(prompt), dropped)
        turn._pieces = self._reply(turn, prompt, started, trace)
        return turn

    def ask(self, text: str) -> str:
        """A whole reply at once (for scripts and tests)."""
        return "".join(self.send(text))

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays): both KV caches, and the drafter's
        own memory of it (the suffix drafter's earlier turns, learned acceptance)."""
        self.history.clear()
        self.decoder.reset()

    def _fit(self, user: Message) -> tuple[list[int], int]:
        """Prompt tokens for the next turn and how many leading history messages to drop so
        that the prompt leaves room for an answer: max_tokens, or half the context if that
        is less (a max_tokens as large as the context would otherwise drop all history
        every turn; an answer that outgrows its room stops when the context is full)."""
        n_ctx = self.decoder.target.n_ctx
        room = min(self.max_tokens, n_ctx // 2)
        dropped = 0
        while True:
            prompt = self.decoder.chat_tokens([*self.system, *self.history[dropped:], user])
            if len(prompt) + room <= n_ctx or dropped == len(self.history):
                break
            dropped = min(dropped + 2, len(self.history))  # a user message and its answer
        if len(prompt) >= n_ctx:
            what = "with the system prompt " if self.system else ""
            raise ContextFullError(
                f"that message is {len(prompt)} tokens {what}and the context holds {n_ctx}; "
                "send something shorter or restart with a larger --ctx"
            )
        return prompt, dropped

    def _reply(self, turn: Turn, prompt: list[int], started: float,
               trace: Trace | None) -> Generator[str, None, None]:
        generation = self.decoder.generate(prompt, max_tokens=self.max_tokens, sampling=self.sampling, trace=trace)
        turn.stats = generation.stats
        pieces = generation.text()
        completed = False
        try:
            for piece in pieces:
                if turn.first_token_s is None:
                    turn.first_token_s = time.perf_counter() - started
                turn.text += piece
                yield piece
            completed = True
        except GeneratorExit:
            # Closed while paused between tokens: the caches hold exactly the tokens they list.
            turn.interrupted = True
            raise
        except BaseException:
            # Stopped inside an evaluation (a hard Ctrl-C, a llama.cpp error): the caches may
            # hold tokens their lists lack, so start the next turn from empty ones.
            turn.interrupted = True
            self.decoder.reset_caches()
            raise
        finally:
            pieces.close()  # type: ignore[attr-defined]
            if completed or turn.text:
                # Templates put their own separator before the answer ("Assistant: "); a
                # leading space kept here would double it and cost the answer's KV reuse.
                self.history += [{"role": "user", "content": turn.user},
                                 {"role": "assistant", "content": turn.text.lstrip()}]
            self.totals.add(turn)
