"""The public Python API: load a target (and a draft) once, generate many times.

    from llamaspec import SpeculativeDecoder
    with SpeculativeDecoder("target.gguf", "draft.gguf", k=3) as decoder:
        for piece in decoder.stream("def fib(n):", max_tokens=64):
            print(piece, end="")
        print(decoder.stats.to_dict())
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

from .chat import ChatFormat, Message
from .compat import check_vocab_compatible
from .drafters import Drafter
from .drafters.draft_model import DraftModelDrafter
from .errors import LlamaSpecError
from .model import Model, ModelOptions
from .sampling import Sampler, SamplingParams
from .speculative import GenerationStats, Trace, generate_tokens
from .text import TextStream
from .verify import VerifyMode

PathLike = str | os.PathLike[str]


class SpeculativeDecoder:
    """A target model plus an optional draft model; without a draft it decodes plainly."""

    def __init__(
        self,
        target: PathLike,
        draft: PathLike | None = None,
        *,
        k: int = 3,
        options: ModelOptions = ModelOptions(),
        verify: VerifyMode = "rejection",
    ):
        if k <= 0:
            raise LlamaSpecError(f"k must be at least 1, got {k}")
        if verify not in ("rejection", "match"):
            raise LlamaSpecError(f"verify must be rejection or match, got {verify!r}")
        self.k = k
        self.verify: VerifyMode = verify
        self.target = Model(target, options)
        self.drafter: Drafter | None = None
        try:
            if draft is not None:
                draft_model = Model(draft, options)
                self.drafter = DraftModelDrafter(draft_model)
                check_vocab_compatible(self.target, draft_model)
        except BaseException:
            self.close()
            raise
        self.chat_format = ChatFormat(self.target)
        self.stats = GenerationStats()

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()

    def __enter__(self) -> SpeculativeDecoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def prompt_tokens(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        """Raw text is tokenized as is (with BOS); `chat=True` wraps it as one user message."""
        if not isinstance(prompt, str):
            return list(prompt)
        if chat:
            return self.chat_format.tokens([{"role": "user", "content": prompt}])
        return self.target.tokenize(prompt)

    def chat_tokens(self, messages: Sequence[Message]) -> list[int]:
        return self.chat_format.tokens(messages)

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams = SamplingParams(),
        speculative: bool = True,
        chat: bool = False,
        trace: Trace | None = None,
    ) -> Iterator[int]:
        """Yield token ids; `self.stats` describes this generation while and after it runs."""
        drafter = self.drafter if speculative else None
        self.stats = GenerationStats(
            mode="speculative" if drafter else "plain",
            k=self.k if drafter else 0,
            verify="greedy" if sampling.greedy else self.verify,
        )
        return generate_tokens(
            self.target, self.prompt_tokens(prompt, chat), drafter=drafter, k=self.k,
            max_tokens=max_tokens, sampler=Sampler(sampling), verify=self.verify, stats=self.stats,
            trace=trace,
        )

    def stream(self, prompt: str | Sequence[int], **options: object) -> Iterator[str]:
        """Like generate, but yields text pieces that never split a UTF-8 character."""
        text = TextStream(self.target.token_bytes)
        for token in self.generate(prompt, **options):  # type: ignore[arg-type]
            if piece := text.push(token):
                yield piece
        if rest := text.flush():
            yield rest

    def generate_text(self, prompt: str | Sequence[int], **options: object) -> str:
        return "".join(self.stream(prompt, **options))
