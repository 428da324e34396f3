"""llama-cpp-python's completion API on a decoder, so its users switch in one line.

`CompletionMixin.create_completion` and `create_chat_completion` take the same arguments (the
sampling subset llamaspec implements) and return the same OpenAI-style dictionaries as
`llama_cpp.Llama`, plus a "speculative" entry holding the generation's stats. Defaults are
llama-cpp-python's, so the same call samples the same way (temperature 0 is greedy). The
decoder mixes this in; this module knows it only through the small protocol below.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol, Sequence

from .errors import LlamaSpecError
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .chat import Message
    from .kv import KVModel
    from .stats import GenerationStats

Chunk = dict[str, Any]


class _Generation(Protocol):
    stats: GenerationStats

    def text(self) -> Iterator[str]: ...


class _Decoder(Protocol):
    """What the completion API needs of a decoder."""

    target: KVModel

    def prompt_tokens(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]: ...

    def chat_tokens(self, messages: Sequence[Message]) -> list[int]: ...

    def generate(self, prompt: str | Sequence[int], **options: Any) -> _Generation: ...


MAX_STOPS, MAX_STOP_CHARS = 16, 256  # far above what templates use; the check a piece stays cheap


class StopStrings:
    """Cuts streamed text at the first stop string; text that might begin one is held back
    until the following pieces show whether it does. Their number and length are capped:
    the check costs up to a string's length squared per piece, and on a server one slow
    slot holds up every slot's decode round."""

    def __init__(self, stop: str | Sequence[str] | None):
        self.stops = [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]
        if len(self.stops) > MAX_STOPS:
            raise LlamaSpecError(f"at most {MAX_STOPS} stop strings are supported, got {len(self.stops)}")
        longest = max(map(len, self.stops), default=0)
        if longest > MAX_STOP_CHARS:
            raise LlamaSpecError(f"stop strings may have at most {MAX_STOP_CHARS} characters, got one of {longest}")
        self.pending = ""
        self.hit = False

    def push(self, piece: str) -> str:
        """The text that is safe to emit now; after a hit, nothing more."""
        if self.hit:
            return ""
        text = self.pending + piece
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self.pending = True, ""
            return text[: min(found)]
        hold = max((n for s in self.stops for n in range(1, min(len(s), len(text) + 1))
                    if s[n - 1] == text[-1] and text.endswith(s[:n])), default=0)
        self.pending = text[len(text) - hold:]
        return text[: len(text) - hold]

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest


class _Completion:
    """One generation: iterate for text pieces; finish_reason and usage are set once it ends."""

    def __init__(self, decoder: _Decoder, prompt: list[int], max_tokens: int | None,
                 sampling: SamplingParams, stop: str | Sequence[str] | None,
                 speculative: Mapping[str, Any] | None):
        self.decoder = decoder
        self.prompt = prompt
        # As llama-cpp-python: None or <= 0 means "until the context is full" (at least one
        # token: a prompt the context cannot hold then fails as such, not as a negative max_tokens).
        self.max_tokens = max_tokens if max_tokens and max_tokens > 0 else max(decoder.target.n_ctx - len(prompt), 1)
        self.sampling = sampling
        self.stop = StopStrings(stop)
        self.options = speculative_options(speculative)
        self.finish_reason = "length"
        self.stats: GenerationStats | None = None  # set when the generation starts

    def __iter__(self) -> Iterator[str]:
        generation = self.decoder.generate(self.prompt, max_tokens=self.max_tokens, sampling=self.sampling,
                                           **self.options)
        self.stats = generation.stats
        pieces = generation.text()
        try:
            for piece in pieces:
                if text := self.stop.push(piece):
                    yield text
                if self.stop.hit:
                    self.finish_reason = "stop"
                    return
            if rest := self.stop.flush():
                yield rest
            if self.stats.stop_reason == "eog":
                self.finish_reason = "stop"
        finally:
            pieces.close()  # type: ignore[attr-defined]

    def usage(self) -> dict[str, int]:
        n_completion = self.stats.n_generated if self.stats else 0
        return {"prompt_tokens": len(self.prompt), "completion_tokens": n_completion,
                "total_tokens": len(self.prompt) + n_completion}

    def speculative(self) -> dict[str, Any]:
        return self.stats.to_dict() if self.stats else {}


def speculative_options(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The per-request `speculative` object: {"enabled": bool, "k": int} (both optional);
    k caps the draft length below the decoder's own."""
    spec = dict(spec or {})
    unknown = set(spec) - {"enabled", "k"}
    if unknown:
        raise LlamaSpecError(f"unknown speculative option(s): {', '.join(sorted(unknown))} (use enabled, k)")
    enabled, k = spec.get("enabled", True), spec.get("k")
    if not isinstance(enabled, bool):
        raise LlamaSpecError(f"speculative.enabled must be true or false, got {enabled!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise LlamaSpecError(f"speculative.k must be an integer >= 1, got {k!r}")
    return {"speculative": enabled, "k": k}


def _head(kind: str, decoder: _Decoder, model: str | None) -> Chunk:
    return {"id": f"{kind}-{uuid.uuid4()}", "created": int(time.time()), "model": model or str(decoder.target.path)}


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


def _text_chunks(run: _Completion, head: Chunk, usage: bool) -> Iterator[Chunk]:
    """llama-cpp-python's stream: one chunk per piece, then an empty one with the finish reason
    (and, with `usage`, OpenAI's stream_options.include_usage, one with no choices and the usage)."""
    head = {**head, "object": "text_completion"}
    for piece in run:
        yield {**head, "choices": [_choice(piece, None)]}
    yield {**head, "choices": [_choice("", run.finish_reason)], "speculative": run.speculative()}
    if usage:
        yield {**head, "choices": [], "usage": run.usage()}


def _text_response(run: _Completion, head: Chunk) -> Chunk:
    text = "".join(run)
    return {**head, "object": "text_completion", "choices": [_choice(text, run.finish_reason)],
            "usage": run.usage(), "speculative": run.speculative()}


def check_sampling(options: Mapping[str, Any]) -> None:
    """Raise LlamaSpecError for a bad sampling value a request set (the server checks them before
    a stream begins). Each value is checked alone, so SamplingParams' defaults stand in for the
    rest; they are not the defaults a completion runs with."""
    fields = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")
    SamplingParams(**{key: options[key] for key in fields if key in options})


def _sampling(temperature: float, top_p: float, top_k: int, min_p: float, repeat_penalty: float,
              seed: int | None) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, seed=seed)


def include_usage(stream_options: Mapping[str, Any] | None) -> bool:
    """OpenAI's `stream_options.include_usage`: a last chunk with the usage (other fields ignored)."""
    value = (stream_options or {}).get("include_usage", False)
    if not isinstance(value, bool):
        raise LlamaSpecError(f"stream_options.include_usage must be true or false, got {value!r}")
    return value


def _chat_chunks(run: _Completion, head: Chunk, usage: bool) -> Iterator[Chunk]:
    """llama-cpp-python's chat stream: a role delta, content deltas, then an empty delta (and
    the usage chunk, as in `_text_chunks`)."""
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, str], finish_reason: str | None) -> Chunk:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    yield chunk({"role": "assistant"}, None)
    for piece in run:
        yield chunk({"content": piece}, None)
    yield {**chunk({}, run.finish_reason), "speculative": run.speculative()}
    if usage:
        yield {**head, "choices": [], "usage": run.usage()}


def _chat_response(run: _Completion, head: Chunk) -> Chunk:
    message = {"role": "assistant", "content": "".join(run)}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": run.finish_reason}
    return {**head, "object": "chat.completion", "choices": [choice], "usage": run.usage(),
            "speculative": run.speculative()}


class CompletionMixin:
    """llama-cpp-python's `Llama` completion methods, for a decoder to inherit."""

    def create_completion(
        self: _Decoder,
        prompt: str | list[int],
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        model: str | None = None,
        speculative: Mapping[str, Any] | None = None,
        stream_options: Mapping[str, Any] | None = None,
    ) -> Chunk | Iterator[Chunk]:
        """`Llama.create_completion`: a "text_completion" dict, or its chunks with stream=True."""
        run = _Completion(self, self.prompt_tokens(prompt), max_tokens,
                          _sampling(temperature, top_p, top_k, min_p, repeat_penalty, seed), stop, speculative)
        head = _head("cmpl", self, model)
        return _text_chunks(run, head, include_usage(stream_options)) if stream else _text_response(run, head)

    __call__ = create_completion

    def create_chat_completion(
        self: _Decoder,
        messages: Sequence[Message],
        max_tokens: int | None = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        stream: bool = False,
        model: str | None = None,
        speculative: Mapping[str, Any] | None = None,
        stream_options: Mapping[str, Any] | None = None,
    ) -> Chunk | Iterator[Chunk]:
        """`Llama.create_chat_completion` with the target's own chat template: a
        "chat.completion" dict, or "chat.completion.chunk" dicts with stream=True. Successive
        calls that extend one conversation reuse the KV cache for the shared prefix."""
        run = _Completion(self, self.chat_tokens(messages), max_tokens,
                          _sampling(temperature, top_p, top_k, min_p, repeat_penalty, seed), stop, speculative)
        head = _head("chatcmpl", self, model)
        return _chat_chunks(run, head, include_usage(stream_options)) if stream else _chat_response(run, head)
