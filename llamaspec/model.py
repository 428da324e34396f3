"""The only module that touches llama.cpp through ctypes.

A `Model` owns one llama_model, one llama_context and one reusable llama_batch, and frees
all three on `close()` / context-manager exit. It tracks the tokens held in its KV cache
(sequence 0), so callers can evaluate new tokens, read logits as numpy views, and roll the
cache back to any prefix.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from .errors import ContextFullError, LlamaSpecError, ModelLoadError

try:
    import llama_cpp as _ll
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "llama-cpp-python is not installed; run scripts/install.sh (it builds it for this CPU)"
    ) from exc

FlashAttn = Literal["auto", "on", "off"]
_FLASH_ATTN = {
    "auto": _ll.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": _ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": _ll.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_GGML_LOG_LEVEL_ERROR = 4
_SEQ = 0  # every Model here decodes a single sequence

# llama.cpp logs through one process-wide callback; we keep its recent errors so a failed
# load can say why in one line instead of dumping pages of loader output on stderr.
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)


@_ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace") if text else ""
    if level == _GGML_LOG_LEVEL_ERROR and message.strip():
        _recent_errors.append(message.strip())
    if os.environ.get("LLAMASPEC_LOG"):
        print(message, end="", file=__import__("sys").stderr)


@functools.cache
def _init_backend() -> None:
    _ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
    _ll.llama_backend_init()


def _check_gguf_file(path: Path) -> None:
    """Reject missing and non-GGUF files before llama.cpp sees them (it would only log)."""
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")


@dataclass(frozen=True)
class ModelOptions:
    """How to load a model and size its context; shared by target and draft."""

    n_ctx: int = 4096
    n_threads: int = 2
    n_batch: int = 512
    n_gpu_layers: int = 0
    flash_attn: FlashAttn = "auto"
    repack: bool = True  # llama.cpp's repacked CPU weight layouts (faster batches, other kernels)

    def __post_init__(self) -> None:
        if self.n_ctx < 8:
            raise LlamaSpecError(f"context size must be at least 8, got {self.n_ctx}")
        if self.n_threads < 1:
            raise LlamaSpecError(f"threads must be at least 1, got {self.n_threads}")
        if self.n_batch < 1:
            raise LlamaSpecError(f"batch size must be at least 1, got {self.n_batch}")
        if self.flash_attn not in _FLASH_ATTN:
            raise LlamaSpecError(f"flash attention must be auto, on or off, got {self.flash_attn!r}")


class Model:
    """A loaded GGUF model with one context; evaluate tokens, read logits, roll back."""

    def __init__(self, path: str | os.PathLike[str], options: ModelOptions = ModelOptions()):
        _init_backend()
        self.path = Path(path)
        self.options = options
        self._model = self._ctx = None
        self._batch: _ll.llama_batch | None = None
        _check_gguf_file(self.path)
        _recent_errors.clear()
        model_params = _ll.llama_model_default_params()
        model_params.n_gpu_layers = options.n_gpu_layers
        model_params.use_extra_bufts = options.repack
        self._model = _ll.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {self._last_error()}")
        try:
            self._init_context()
        except BaseException:
            self.close()
            raise
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        # Recurrent state can't be cut at an arbitrary position: keep (n_tokens, state) snapshots.
        self._snapshots: list[tuple[int, bytes]] = []
        self.n_evaluated = 0  # tokens decoded over this Model's life (KV reuse is visible here)

    def _init_context(self) -> None:
        options = self.options
        ctx_params = _ll.llama_context_default_params()
        ctx_params.n_ctx = options.n_ctx
        ctx_params.n_batch = options.n_batch
        ctx_params.n_ubatch = options.n_batch
        ctx_params.n_seq_max = 1
        ctx_params.n_threads = options.n_threads
        ctx_params.n_threads_batch = options.n_threads
        ctx_params.flash_attn_type = _FLASH_ATTN[options.flash_attn]
        ctx_params.no_perf = True
        if self.n_swa > 0:
            # Rolling back after the window slid needs the full-size SWA cache.
            ctx_params.swa_full = True
        self._ctx = _ll.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            raise ModelLoadError(f"llama.cpp could not create a context for {self.path}: {self._last_error()}")
        self._vocab = _ll.llama_model_get_vocab(self._model)
        self._memory = _ll.llama_get_memory(self._ctx)
        self._batch = _ll.llama_batch_init(options.n_batch, 0, 1)
        self.n_vocab: int = _ll.llama_vocab_n_tokens(self._vocab)
        self.n_ctx: int = _ll.llama_n_ctx(self._ctx)
        self.n_batch: int = _ll.llama_n_batch(self._ctx)  # llama.cpp caps it at n_ctx
        self.needs_state_rollback = bool(
            _ll.llama_model_is_recurrent(self._model) or _ll.llama_model_is_hybrid(self._model)
        )

    @staticmethod
    def _last_error() -> str:
        # The first error of a failure names the cause; later ones only say that it failed.
        return _recent_errors[0] if _recent_errors else "no reason given (set LLAMASPEC_LOG=1 to see its log)"

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        if self._batch is not None:
            _ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            _ll.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            _ll.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # -- model facts ----------------------------------------------------------------------
    @property
    def n_swa(self) -> int:
        return int(_ll.llama_model_n_swa(self._model))

    @property
    def n_layer(self) -> int:
        return int(_ll.llama_model_n_layer(self._model))

    @property
    def vocab_type(self) -> int:
        return int(_ll.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return int(_ll.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(_ll.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(_ll.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(_ll.llama_vocab_get_add_eos(self._vocab))

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _ll.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and any other token the vocab marks as a stop."""
        return bool(_ll.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> bytes:
        """The vocabulary's raw text for a token id (used to compare vocabularies)."""
        return _ll.llama_vocab_get_text(self._vocab, token) or b""

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = _ll.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def chat_template(self) -> str | None:
        template = _ll.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", "replace") if template else None

    # -- text <-> tokens ------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; `add_special` adds BOS where the vocab wants it,
        `parse_special` turns written control tokens (e.g. <|im_start|>) into their ids."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buf = (_ll.llama_token * capacity)()
            n = _ll.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """One token's bytes; may be part of a multi-byte UTF-8 character."""
        buf = ctypes.create_string_buffer(64)
        n = _ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special) for t in tokens).decode("utf-8", "replace")

    # -- evaluation -----------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Decode `tokens` after what the cache holds and return logits.

        Returns a (rows, n_vocab) float32 array: one row per token when `all_logits`, else
        only the last token's row. It is a view into llama.cpp's buffer, valid until the
        next `eval` (copy it to keep it). Verification passes all_logits=True so that the
        whole draft is checked in ONE llama_decode call.
        """
        if not tokens:
            raise ValueError("eval needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(
                f"{self.n_past + len(tokens)} tokens do not fit in the context of {self.n_ctx}; "
                "use a shorter prompt or a larger --ctx"
            )
        if self.needs_state_rollback:
            self._snapshot()
        n_batch = self.n_batch
        chunks: list[np.ndarray] = []
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            last_chunk = start + n_batch >= len(tokens)
            n_out = self._decode(chunk, all_logits, last_chunk)
            if n_out:
                chunks.append(self._logits_view(n_out))
                if len(tokens) > n_batch and all_logits:
                    chunks[-1] = chunks[-1].copy()  # the next chunk overwrites the buffer
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def _decode(self, chunk: Sequence[int], all_logits: bool, last_chunk: bool) -> int:
        batch = self._batch
        assert batch is not None, "model is closed"
        n = len(chunk)
        pos0 = self.n_past
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = _SEQ
            batch.logits[i] = all_logits or (last_chunk and i == n - 1)
        batch.n_tokens = n
        rc = _ll.llama_decode(self._ctx, batch)
        if rc != 0:
            # A failed decode may leave part of the batch in the cache: drop it.
            _ll.llama_memory_seq_rm(self._memory, _SEQ, pos0, -1)
            raise LlamaSpecError(f"llama_decode failed with code {rc}: {self._last_error()}")
        self.tokens.extend(chunk)
        self.n_evaluated += n
        return n if all_logits else int(last_chunk)

    def _logits_view(self, n_rows: int) -> np.ndarray:
        pointer = _ll.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab))

    def rollback(self, n_keep: int) -> None:
        """Keep the first `n_keep` cached tokens and forget the rest.

        Attention caches cut the tail directly. Recurrent/hybrid caches can't
        (llama_memory_seq_rm returns False): restore the newest snapshot taken at or before
        n_keep and re-decode the kept tokens after it.
        """
        if not 0 <= n_keep <= self.n_past:
            raise ValueError(f"cannot keep {n_keep} of {self.n_past} cached tokens")
        if n_keep == self.n_past:
            return
        if not self.needs_state_rollback and _ll.llama_memory_seq_rm(self._memory, _SEQ, n_keep, -1):
            del self.tokens[n_keep:]
            return
        self._restore(n_keep)

    def reset(self) -> None:
        """Empty the cache (a new, unrelated conversation)."""
        _ll.llama_memory_clear(self._memory, True)
        self.tokens.clear()
        self._snapshots.clear()

    # -- state snapshots (recurrent / hybrid memory) ----------------------------------------
    def _snapshot(self) -> None:
        if self._snapshots and self._snapshots[-1][0] == self.n_past:
            return
        size = _ll.llama_state_seq_get_size_ext(self._ctx, _SEQ, 0)
        buf = (ctypes.c_uint8 * size)()
        written = _ll.llama_state_seq_get_data_ext(self._ctx, buf, size, _SEQ, 0)
        self._snapshots.append((self.n_past, bytes(buf[:written])))
        del self._snapshots[:-8]  # a verify step needs only the last few

    def _restore(self, n_keep: int) -> None:
        usable = [s for s in self._snapshots if s[0] <= n_keep]
        if not usable:
            raise LlamaSpecError(
                f"cannot roll back {self.path.name} to {n_keep} tokens: the cache refused a partial "
                "removal and no saved state is old enough"
            )
        n_saved, state = usable[-1]
        self._snapshots = [s for s in self._snapshots if s[0] <= n_saved]
        _ll.llama_memory_seq_rm(self._memory, _SEQ, -1, -1)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if _ll.llama_state_seq_set_data_ext(self._ctx, buf, len(state), _SEQ, 0) == 0:
            raise LlamaSpecError(f"restoring the saved state of {self.path.name} failed")
        replay = self.tokens[n_saved:n_keep]
        del self.tokens[n_saved:]
        if replay:
            self.eval(replay)


QUANT_TYPES = {
    "f16": _ll.LLAMA_FTYPE_MOSTLY_F16,
    "q8_0": _ll.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_0": _ll.LLAMA_FTYPE_MOSTLY_Q4_0,
}


def quantize(source: str | os.PathLike[str], destination: str | os.PathLike[str], quant_type: str,
             n_threads: int = 2) -> Path:
    """Re-quantize a GGUF (llama_model_quantize with allow_requantize): a cheaper draft
    (Q4_0) or a bandwidth-heavy "big target" profile (F16). Written to a temporary name
    and renamed, so an interrupted run leaves nothing that looks complete."""
    _init_backend()
    if quant_type not in QUANT_TYPES:
        raise LlamaSpecError(f"unknown quantization {quant_type!r}; choose from {', '.join(QUANT_TYPES)}")
    source, destination = Path(source), Path(destination)
    _check_gguf_file(source)
    partial = destination.with_name(destination.name + ".partial")
    params = _ll.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant_type]
    params.allow_requantize = True
    params.nthread = n_threads
    _recent_errors.clear()
    try:
        if _ll.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
            raise ModelLoadError(f"quantizing {source} failed: {Model._last_error()}")
        partial.replace(destination)
    finally:
        partial.unlink(missing_ok=True)
    return destination


def reference_greedy(path: str | os.PathLike[str], options: ModelOptions):
    """llama-cpp-python's high-level `Llama` as an independent plain greedy decoder.

    Returns a function prompt_tokens, max_tokens -> generated token ids (stopping at an
    end-of-generation token), and the Llama object to close. Bench compares against it so
    that "identical to plain decoding" is checked against code that is not ours.
    """
    _init_backend()
    llm = _ll.Llama(str(path), n_ctx=options.n_ctx, n_threads=options.n_threads,
                    n_threads_batch=options.n_threads, n_batch=options.n_batch,
                    n_gpu_layers=options.n_gpu_layers,
                    flash_attn=options.flash_attn != "off",  # auto enables it on CPU
                    verbose=False)

    def generate(prompt: Sequence[int], max_tokens: int) -> list[int]:
        out: list[int] = []
        llm.reset()  # no reuse of a previous prompt's cache: evaluate this prompt whole, as a fresh run does
        for token in llm.generate(list(prompt), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                  repeat_penalty=1.0, reset=True):
            if _ll.llama_vocab_is_eog(llm._model.vocab, token):
                break
            out.append(int(token))
            if len(out) >= max_tokens:
                break
        return out

    return generate, llm


def system_info() -> str:
    """The CPU features llama.cpp was compiled with (AVX2 = 1, ...): the build, in one line."""
    _init_backend()
    return (_ll.llama_print_system_info() or b"").decode("utf-8", "replace").strip()
