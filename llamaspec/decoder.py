"""The public Python API: load a target (and a draft) once, generate many times.

    from llamaspec import SpeculativeDecoder
    with SpeculativeDecoder("target.gguf", "draft.gguf", k=3) as decoder:
        for piece in decoder.stream("def fib(n):", max_tokens=64):
            print(piece, end="")
        print(decoder.stats.to_dict())  # the latest generation's; generate() returns a handle with its own

`SpeculativeDecoder` loads the models and resolves strict mode, calibration and the drafter
kind once, into a frozen `DecoderConfig`; a `Decoder` is that config on a pair of models (the
server runs one per slot, on views of shared contexts).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Mapping, Sequence

from .calibrate import choose_batch1_kernels, eval_costs
from .chat import ChatFormat, Message
from .compat import check_vocab_compatible
from .drafters import Drafter
from .drafters.draft_model import DraftModelDrafter
from .drafters.hybrid import HybridDrafter
from .drafters.lookahead import CopyLookahead
from .drafters.ngram import NgramDrafter
from .drafters.suffix import SuffixDrafter
from .errors import LlamaSpecError
from .kv import KVModel
from .llama import Model, ModelOptions
from .openai_api import CompletionMixin
from .policy import AdaptiveK, ConfidenceK, CostModel, DraftPolicy, FixedK, MeasuredCurve
from .sampling import Sampler, SamplingParams
from .speculative import Trace, generate_tokens
from .stats import GenerationStats
from .text import TextStream
from .verify import VerifyMode

PathLike = str | os.PathLike[str]


DrafterKind = Literal["auto", "model", "ngram", "suffix", "hybrid"]
DRAFTER_KINDS = ("auto", "model", "ngram", "suffix", "hybrid")
K_MAX = 15  # the longest draft `k="auto"` may choose (verify batches of up to 16)
LOOKAHEAD_MAX = 8  # the most guesses a draft model eval carries (drafters/lookahead.py)
LOOKUP_MS_PER_TOKEN = 0.05  # an n-gram or suffix-trie lookup: free next to any model evaluation
# Alone, the suffix trie drafts from 1-token matches too: a 2-token verify costs 1.0-1.15 decodes
# on the patched build, so a guess right a third of the time can pay (replayed on the suite with
# the classes of SuffixDrafter, edit / all: 1.31 -> 1.45x / 1.08 -> 1.14x where batch 2 costs
# 1.01x a decode, 1.32 -> 1.35x / 1.08 -> 1.11x at 1.10x). scripts/policy_bounds.py's suffix
# foresight reads it too.
SUFFIX_MIN_MATCH = 1


def compose_drafter(kind: str, lookup_policy: Callable[[], DraftPolicy], model_drafter: Drafter | None) -> Drafter:
    """The drafter of a resolved kind (model, ngram, suffix or hybrid) around a draft model's
    drafter (None for the lookup kinds): one definition for the decoder and for the replays of
    scripts/policy_bounds.py. `lookup_policy` makes a lookup drafter's k policy."""
    if kind == "ngram":
        return NgramDrafter(policy=lookup_policy())
    if kind == "suffix":
        return SuffixDrafter(min_match=SUFFIX_MIN_MATCH, policy=lookup_policy)
    assert model_drafter is not None, kind
    if kind == "model":
        return model_drafter
    # As with the n-gram lookup hybrid used before, a match of 3 tokens or more beats the model.
    return HybridDrafter(SuffixDrafter(min_match=3, policy=lookup_policy), model_drafter)


@dataclass(frozen=True)
class DecoderConfig:
    """What a decoder decided once, at construction; shared by every decoder made from it."""

    k: int  # the longest draft (0: plain decoding only)
    k_label: int | str  # as asked: a number or "auto"
    drafter_kind: str  # plain, model, ngram, suffix or hybrid ("auto" resolved)
    verify: VerifyMode
    min_draft_prob: float
    verify_ms: Mapping[int, float]  # the target's verify costs (empty: a fixed k); a MeasuredCurve learns
    draft_ms: Mapping[int, float]  # the draft model's eval cost by batch size (empty: none measured); likewise
    strict_note: str = ""


class Generation:
    """One `generate` call: iterate it for token ids; `stats` describes it while and after it runs."""

    def __init__(self, tokens: Iterator[int], stats: GenerationStats, token_bytes: Callable[[int], bytes]):
        self._tokens, self.stats, self._token_bytes = tokens, stats, token_bytes

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> int:
        return next(self._tokens)

    def close(self) -> None:
        """Stop generating (between tokens: the caches hold exactly what they list)."""
        self._tokens.close()  # type: ignore[attr-defined]

    @property
    def suspended(self) -> bool:
        """Started and not finished: its tokens sit in the caches, and its end will cut them."""
        return inspect.getgeneratorstate(self._tokens) == inspect.GEN_SUSPENDED  # type: ignore[arg-type]

    def text(self) -> Iterator[str]:
        """The generation as text pieces that never split a UTF-8 character."""
        stream = TextStream(self._token_bytes)
        try:
            for token in self:
                if piece := stream.push(token):
                    yield piece
            if rest := stream.flush():
                yield rest
        finally:
            self.close()


class Decoder(CompletionMixin):
    """A config on a target (and a draft model): generates, many times. It closes nothing;
    `SpeculativeDecoder` owns the models it loads. With `measure_costs` its evals' times
    correct the config's cost curves (MeasuredCurves): not for a server slot, whose evals wait
    for the other slots' rows; `streams` (a slot's) says how many sequences share them now,
    which the draft-length policies price in (`CostModel`)."""

    def __init__(self, config: DecoderConfig, target: KVModel, draft_model: KVModel | None,
                 measure_costs: bool = True, streams: Callable[[], int] | None = None):
        self.config, self.target, self.draft_model = config, target, draft_model
        self._measure_costs, self._streams = measure_costs, streams
        self.drafter = self._make_drafter()
        self.chat_format = ChatFormat(target)  # type: ignore[arg-type]
        self.last: Generation | None = None

    @property
    def stats(self) -> GenerationStats:
        """The latest generation's stats (empty before the first)."""
        return self.last.stats if self.last is not None else GenerationStats()

    @property
    def strict_note(self) -> str:
        return self.config.strict_note

    def _make_drafter(self) -> Drafter | None:
        config = self.config
        kind, k = config.drafter_kind, config.k
        if kind == "plain" or not k:
            return None
        auto = bool(config.verify_ms)
        # Lookup drafts carry no calibrated confidence (one earlier occurrence reads as
        # certain): k is chosen from the acceptance so far, by the n-gram drafter up front, by
        # the suffix drafter after its lookup, apart for each class of match length.
        lookup_costs = CostModel(config.verify_ms, LOOKUP_MS_PER_TOKEN, self._streams)
        lookup_policy: Callable[[], DraftPolicy] = (lambda: AdaptiveK(lookup_costs, k)) if auto else FixedK
        if kind in ("ngram", "suffix"):
            return compose_drafter(kind, lookup_policy, None)
        assert self.draft_model is not None
        if auto:
            model_policy: DraftPolicy = ConfidenceK(CostModel(config.verify_ms, config.draft_ms, self._streams), k)
        else:
            model_policy = FixedK(config.min_draft_prob)
        # The draft's own batches are cheap too: copied guesses ride along (k=auto only, it
        # needs the draft's cost curve to decide how many).
        lookahead = CopyLookahead(config.draft_ms, LOOKAHEAD_MAX) if auto else None
        model_drafter = DraftModelDrafter(self.draft_model, model_policy, lookahead, self._observer(config.draft_ms),
                                          n_vocab=self.target.n_vocab)
        return compose_drafter(kind, lookup_policy, model_drafter)

    def _observer(self, curve: Mapping[int, float]) -> Callable[[int, float], None] | None:
        return curve.observe if self._measure_costs and isinstance(curve, MeasuredCurve) else None

    def with_models(self, target: KVModel, draft_model: KVModel | None,
                    streams: Callable[[], int] | None = None) -> Decoder:
        """This decoder's config on other models, with fresh drafter state: one decoder per
        server slot, on that slot's sequence views (whose timings are not their batches' costs;
        `streams`: how many slots share each batch now)."""
        return Decoder(self.config, target, draft_model, measure_costs=False, streams=streams)

    def reset(self) -> None:
        """Empty both KV caches: the next prompt is evaluated whole, as in a fresh process.
        (Reusing a cached prefix changes which batches the prompt is evaluated in, and with
        it the floating-point result; comparisons between runs reset first.) The drafter starts
        afresh too: no session history (suffix drafter) or learned acceptance carries over."""
        self.reset_caches()
        self.drafter = self._make_drafter()  # the old one's only resource is the draft model, kept

    def reset_caches(self) -> None:
        """Empty both KV caches, keeping the drafter (a chat after an evaluation was interrupted:
        the conversation, and the drafter's memory of it, go on)."""
        self.target.reset()
        if self.draft_model is not None:
            self.draft_model.reset()

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
    ) -> Generation:
        """Token ids, lazily, with this generation's stats on the handle (and `self.stats`).
        `k` lowers this call's longest draft below the decoder's (a per-request limit)."""
        if k is not None and k <= 0:
            raise LlamaSpecError(f"k must be at least 1, got {k}")
        if self.last is not None and self.last.suspended:
            # One cache, one generation at a time: an unfinished one ends now, before this one
            # runs (closed later, its cut of the caches would land under this one's tokens).
            self.last.close()
        config = self.config
        drafter = self.drafter if speculative else None
        stats = GenerationStats(
            mode="speculative" if drafter else "plain",
            k=config.k_label if drafter else 0,
            verify="greedy" if sampling.greedy else (config.verify if drafter else "sample"),
        )
        tokens = generate_tokens(
            self.target, self.prompt_tokens(prompt, chat), drafter=drafter, k=min(k or config.k, config.k),
            max_tokens=max_tokens, sampler=Sampler(sampling), verify=config.verify, stats=stats, trace=trace,
            on_verify=self._observer(config.verify_ms),
        )
        self.last = Generation(tokens, stats, self.target.token_bytes)
        return self.last

    def stream(self, prompt: str | Sequence[int], **options: object) -> Iterator[str]:
        """Like generate, but yields text pieces that never split a UTF-8 character."""
        return self.generate(prompt, **options).text()  # type: ignore[arg-type]

    def generate_text(self, prompt: str | Sequence[int], **options: object) -> str:
        return "".join(self.stream(prompt, **options))


class SpeculativeDecoder(Decoder):
    """Loads a target model plus a drafter; without one it decodes plainly.

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
        target_model = Model(target, options)
        draft_model: Model | None = None
        try:
            k_value, strict_note = k_max if k == "auto" else k, ""
            if strict:
                max_k, strict_note = _strict_limit(target_model)
                k_value = min(k_value, max_k)
            kind = ("hybrid" if draft is not None else "plain") if drafter == "auto" else drafter
            if kind in ("model", "hybrid") and k_value:
                if draft is None:
                    raise LlamaSpecError(f"the {kind} drafter needs a draft model")
                # The draft stays local even when the target's layers are on RPC servers.
                draft_model = Model(draft, dataclasses.replace(options, rpc_servers=()))
                check_vocab_compatible(target_model, draft_model)
            choose_batch1_kernels([target_model] + ([draft_model] if draft_model else []))
            auto = k == "auto" and k_value > 0
            config = DecoderConfig(
                k=k_value, k_label=k, drafter_kind=kind, verify=verify, min_draft_prob=min_draft_prob,
                # The adaptive policies' inputs, cached per model and machine; the verify curve
                # then follows what the loop measures.
                verify_ms=MeasuredCurve(eval_costs(target_model, list(range(1, k_value + 2)))) if auto else {},
                draft_ms=MeasuredCurve(draft_costs(draft_model)) if auto and draft_model else {},
                strict_note=strict_note,
            )
            super().__init__(config, target_model, draft_model)
        except BaseException:
            if draft_model is not None:
                draft_model.close()
            target_model.close()
            raise

    def close(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
        self.target.close()

    def __enter__(self) -> SpeculativeDecoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def draft_costs(draft_model: Model) -> dict[int, float]:
    """The draft's eval cost by batch size, 1..LOOKAHEAD_MAX + 1 (measured once, cached):
    ConfidenceK reads batch 1, the lookahead the rest."""
    return eval_costs(draft_model, list(range(1, LOOKAHEAD_MAX + 2)))


def _strict_limit(target: Model) -> tuple[int, str]:
    """The longest draft whose verify sizes the audit found bit-exact on this model and build."""
    from .audit import strict_max_k
    from .prompts import load_prompts

    prompts = [target.tokenize(p["prompt"]) for p in load_prompts(limit=3)]
    max_k = strict_max_k(target, prompts)
    note = (f"strict: verify sizes up to {max_k + 1} are bit-exact here, k <= {max_k}" if max_k else
            "strict: no verify size is bit-exact on this model and build, decoding plainly")
    return max_k, note
