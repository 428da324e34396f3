"""An independent plain greedy decoder: llama-cpp-python's high-level `Llama`.

Bench compares speculative output with it, so that "identical to plain decoding" is also
checked against code that is not ours (ours is `Model` plus the loop without a drafter).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from .llama import ModelOptions


class ReferenceGreedy:
    """prompt tokens, max_tokens -> generated ids, stopping at a token `is_eog` accepts."""

    def __init__(self, path: str | os.PathLike[str], options: ModelOptions, is_eog: Callable[[int], bool]):
        from llama_cpp import Llama

        self._is_eog = is_eog
        self._llm = Llama(str(path), n_ctx=options.n_ctx, n_threads=options.n_threads,
                          n_threads_batch=options.n_threads, n_batch=options.n_batch,
                          n_gpu_layers=options.n_gpu_layers,
                          flash_attn=options.flash_attn != "off",  # auto enables it on CPU
                          verbose=False)

    def __call__(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        out: list[int] = []
        self._llm.reset()  # no reuse of a previous prompt's cache: evaluate this prompt whole, as a fresh run does
        for token in self._llm.generate(list(prompt), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                        repeat_penalty=1.0, reset=True):
            if self._is_eog(int(token)):
                break
            out.append(int(token))
            if len(out) >= max_tokens:
                break
        return out

    def close(self) -> None:
        self._llm.close()
