"""The public Python API: load a target (and a draft) once, generate many times.

    from llamaspec import SpeculativeDecoder
    with SpeculativeDecoder("target.gguf", "draft.gguf", k=3) as decoder:
        for piece in decoder.stream("def fib(n):", max_tokens=64):
            print(piece, end="")
        print(decoder.stats.to_dict())
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Iterator, Literal, Sequence

from .chat import ChatFormat, Message
from .compat import check_vocab_compatible
from .calibrate import eval_costs
from .drafters import Drafter
from .drafters.draft_model import DraftModelDrafter
from .drafters.hybrid import HybridDrafter
from .drafters.ngram import NgramDrafter
from .drafters.suffix import SuffixDrafter
from .errors import LlamaSpecError
from .kv import KVModel
from .llama import Model, ModelOptions
from .policy import AdaptiveK, ConfidenceK, CostModel, DraftPolicy, FixedK
from .sampling import Sampler, SamplingParams
from .speculative import GenerationStats, Trace, generate_tokens
from .text import TextStream
from .verify import VerifyMode

PathLike = str | os.PathLike[str]


DrafterKind = Literal["auto", "model", "ngram", "suffix", "hybrid"]
DRAFTER_KINDS = ("auto", "model", "ngram", "suffix", "hybrid")
K_MAX = 15  # the longest draft `k="auto"` may choose (verify batches of up to 16)
LOOKUP_MS_PER_TOKEN = 0.05  # an n-gram or suffix-trie lookup: free next to any model evaluation


class SpeculativeDecoder:
    """A target model plus a drafter; without one it decodes plainly.

    `drafter="model"` drafts with the `draft` GGUF, `"ngram"` by prompt lookup (no second
    model), `"suffix"` from a suffix trie over this decoder's contexts so far (no second
    model), `"hybrid"` with a long suffix-trie match when there is one and the draft model
    otherwise; `"auto"` is hybrid with a draft and plain decoding without one. `k="auto"`
    measures this machine's costs once (cached) and picks the draft length each step to
    maximise expected tokens per second, down to plain steps.
    """

    def __init__(
        self,
        target: PathLike,
        draft: PathLike | None = None,
        *,
        k: int | Literal["auto"] = "auto",
        drafter: DrafterKind = "auto",
        options: ModelOptions = ModelOptions(),
        verify: VerifyMode = "rejection",
        k_max: int = K_MAX,
        min_draft_prob: float = 0.0,
        strict: bool = False,
    ):
        if k != "auto" and (not isinstance(k, int) or k <= 0):
            raise LlamaSpecError(f"k must be 'auto' or at least 1, got {k!r}")
        if drafter not in DRAFTER_KINDS:
            raise LlamaSpecError(f"drafter must be one of {', '.join(DRAFTER_KINDS)}, got {drafter!r}")
        if min_draft_prob and k == "auto":
            raise LlamaSpecError("a minimum draft probability needs a fixed k: with k=auto the draft's own "
                                 "confidence decides when to stop drafting")
        if not 0.0 <= min_draft_prob <= 1.0:
            raise LlamaSpecError(f"the minimum draft probability must be between 0 and 1, got {min_draft_prob}")
        if verify not in ("rejection", "match"):
            raise LlamaSpecError(f"verify must be rejection or match, got {verify!r}")
        self.k_label: int | str = k
        self.k = k_max if k == "auto" else k
        self.verify: VerifyMode = verify
        self.target = Model(target, options)
        self.draft_model: Model | None = None
        self.strict_note = ""
        self.min_draft_prob = min_draft_prob
        self.drafter_kind = drafter
        try:
            if strict:
                self._apply_strict()
            if drafter == "auto":
                self.drafter_kind = "hybrid" if draft is not None else "plain"
            if self.drafter_kind in ("model", "hybrid") and self.k:
                if draft is None:
                    raise LlamaSpecError(f"the {self.drafter_kind} drafter needs a draft model")
                # The draft stays local even when the target's layers are on RPC servers.
                self.draft_model = Model(draft, dataclasses.replace(options, rpc_servers=()))
                check_vocab_compatible(self.target, self.draft_model)
            self._measure_costs(k == "auto")
            self.drafter = self._make_drafter()
        except BaseException:
            self.close()
            raise
        self.chat_format = ChatFormat(self.target)
        self.stats = GenerationStats()

    def _apply_strict(self) -> None:
        """Limit k to the verify sizes the audit found bit-exact on this model and build."""
        from .audit import strict_max_k
        from .prompts import load_prompts

        prompts = [self.target.tokenize(p["prompt"]) for p in load_prompts(limit=3)]
        max_k = strict_max_k(self.target, prompts)
        self.k = min(self.k, max_k)
        self.strict_note = (f"strict: verify sizes up to {max_k + 1} are bit-exact here, k <= {max_k}" if max_k else
                            "strict: no verify size is bit-exact on this model and build, decoding plainly")

    def _measure_costs(self, auto: bool) -> None:
        """The adaptive policy's inputs (cached per model and machine); none for a fixed k."""
        self.verify_ms = eval_costs(self.target, list(range(1, self.k + 2))) if auto and self.k else {}
        self.draft_ms = eval_costs(self.draft_model, [1])[1] if auto and self.draft_model else 0.0

    def _make_drafter(self) -> Drafter | None:
        kind = self.drafter_kind
        if kind == "plain" or not self.k:
            return None

        auto = bool(self.verify_ms)
        # Lookup drafts carry no calibrated confidence (one earlier occurrence reads as
        # certain): k's ceiling is chosen up front from the acceptance so far, and the suffix
        # drafter's own rule (match length, frequencies) drafts up to it.
        lookup_policy = AdaptiveK(CostModel(self.verify_ms, LOOKUP_MS_PER_TOKEN), self.k) if auto else FixedK()
        if kind == "ngram":
            return NgramDrafter(policy=lookup_policy)
        if kind == "suffix":
            return SuffixDrafter(policy=lookup_policy)
        assert self.draft_model is not None
        if auto:
            model_policy: DraftPolicy = ConfidenceK(CostModel(self.verify_ms, self.draft_ms), self.k)
        else:
            model_policy = FixedK(self.min_draft_prob)
        model_drafter = DraftModelDrafter(self.draft_model, model_policy)
        if kind == "model":
            return model_drafter
        # As with the n-gram lookup hybrid used before, a match of 3 tokens or more beats the model.
        return HybridDrafter(SuffixDrafter(min_match=3, policy=lookup_policy), model_drafter)

    def with_models(self, target: KVModel, draft_model: KVModel | None) -> SpeculativeDecoder:
        """This decoder's settings and measured costs on other Model objects, with fresh
        drafter state: one decoder per server slot, on that slot's sequence views."""
        other = copy.copy(self)
        other.target, other.draft_model = target, draft_model
        other.drafter = other._make_drafter()
        other.chat_format = ChatFormat(target)
        other.stats = GenerationStats()
        return other

    def reset(self) -> None:
        """Empty both KV caches: the next prompt is evaluated whole, as in a fresh process.
        (Reusing a cached prefix changes which batches the prompt is evaluated in, and with
        it the floating-point result; comparisons between runs reset first.) The drafter starts
        afresh too: no session history (suffix drafter) or learned acceptance carries over."""
        self.target.reset()
        if self.draft_model is not None:
            self.draft_model.reset()
        self.drafter = self._make_drafter()  # the old one's only resource is the draft model, kept

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
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
        k: int | None = None,
    ) -> Iterator[int]:
        """Yield token ids; `self.stats` describes this generation while and after it runs.
        `k` lowers this call's longest draft below the decoder's (a per-request limit)."""
        if k is not None and k <= 0:
            raise LlamaSpecError(f"k must be at least 1, got {k}")
        drafter = self.drafter if speculative else None
        self.stats = GenerationStats(
            mode="speculative" if drafter else "plain",
            k=self.k_label if drafter else 0,
            verify="greedy" if sampling.greedy else (self.verify if drafter else "sample"),
        )
        return generate_tokens(
            self.target, self.prompt_tokens(prompt, chat), drafter=drafter, k=min(k or self.k, self.k),
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

    # llama-cpp-python's completion API (arguments and return values: llamaspec.openai_api),
    # so code written for llama_cpp.Llama switches by changing the constructor line.
    def create_completion(self, prompt: str | Sequence[int], **options: object) -> dict | Iterator[dict]:
        from .openai_api import create_completion

        return create_completion(self, prompt, **options)  # type: ignore[arg-type]

    __call__ = create_completion

    def create_chat_completion(self, messages: Sequence[Message], **options: object) -> dict | Iterator[dict]:
        from .openai_api import create_chat_completion

        return create_chat_completion(self, messages, **options)  # type: ignore[arg-type]
