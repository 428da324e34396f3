"""The only module that touches llama.cpp through ctypes.

A `Model` owns one llama_model, one llama_context and one reusable llama_batch, and frees
all three on `close()` / context-manager exit. It tracks the tokens held in its KV cache
(sequence 0), so callers can evaluate new tokens, read logits as numpy views, and roll the
cache back to any prefix. A context made with `n_seq > 1` also holds that many sequences
side by side, decoded together by `decode_many` (the server's shared batch).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np

from . import trim
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
_SEQ = 0  # the sequence of the single-sequence API (eval, rollback, tokens)

# llama.cpp logs through one process-wide callback; we keep its recent errors so a failed
# load can say why in one line instead of dumping pages of loader output on stderr.
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)


@_ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace") if text else ""
    if level == _GGML_LOG_LEVEL_ERROR and message.strip():
        _recent_errors.append(message.strip())
    if os.environ.get("LLAMASPEC_LOG"):
        print(message, end="", file=sys.stderr)


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
    n_seq: int = 1  # sequences in the context, each with up to n_ctx tokens (server slots)
    rpc_servers: tuple[str, ...] = ()  # HOST:PORT of llama.cpp rpc-servers that hold the layers
    # Seconds an RPC call may wait for a server before failing (a vanished host, a hung server).
    rpc_timeout: float = field(default_factory=lambda: float(os.environ.get("LLAMASPEC_RPC_TIMEOUT") or 120))

    def __post_init__(self) -> None:
        if self.n_ctx < 8:
            raise LlamaSpecError(f"context size must be at least 8, got {self.n_ctx}")
        if self.n_threads < 1:
            raise LlamaSpecError(f"threads must be at least 1, got {self.n_threads}")
        if self.n_batch < 1:
            raise LlamaSpecError(f"batch size must be at least 1, got {self.n_batch}")
        if not 1 <= self.n_seq <= 256:
            raise LlamaSpecError(f"parallel sequences must be between 1 and 256, got {self.n_seq}")
        if self.flash_attn not in _FLASH_ATTN:
            raise LlamaSpecError(f"flash attention must be auto, on or off, got {self.flash_attn!r}")
        servers = tuple(self.rpc_servers.split(",") if isinstance(self.rpc_servers, str) else self.rpc_servers)
        object.__setattr__(self, "rpc_servers", servers)
        for server in servers:
            host, _, port = str(server).rpartition(":")
            if not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
                raise LlamaSpecError(f"an RPC server is HOST:PORT (IPv4 address or host name), got {server!r}")
        if not self.rpc_timeout > 0:
            raise LlamaSpecError(f"the RPC timeout must be positive, got {self.rpc_timeout}")
        if len(set(servers)) != len(servers):
            raise LlamaSpecError(f"RPC servers listed twice: {','.join(servers)}")


class Model:
    """A loaded GGUF model with one context; evaluate tokens, read logits, roll back."""

    def __init__(self, path: str | os.PathLike[str], options: ModelOptions = ModelOptions()):
        _init_backend()
        self.path = Path(path)
        self.options = options
        self._model = self._ctx = None
        self._batch: _ll.llama_batch | None = None
        self.trimmed: trim.TrimmedVocab | None = None
        _check_gguf_file(self.path)
        _recent_errors.clear()
        model_params = _ll.llama_model_default_params()
        model_params.n_gpu_layers = options.n_gpu_layers
        model_params.use_extra_bufts = options.repack
        _place_on_rpc_servers(model_params, options.rpc_servers, options.rpc_timeout)
        self._model = _ll.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {self._last_error()}")
        try:
            inputs = self.metadata(trim.INPUTS_KEY)
            # A trimmed draft: fed embeddings, speaks target ids (trim.py).
            self.trimmed = trim.load(self.path, inputs, self.metadata(trim.INPUTS_SHA_KEY) or "") if inputs else None
            self._init_context()
        except BaseException:
            self.close()
            raise
        # What the KV cache holds, per sequence, position by position.
        self.seq_tokens: list[list[int]] = [[] for _ in range(options.n_seq)]
        self.tokens: list[int] = self.seq_tokens[_SEQ]
        # Recurrent state can't be cut at an arbitrary position: keep (n_tokens, state) snapshots.
        self._snapshots: list[tuple[int, bytes]] = []
        self.n_evaluated = 0  # tokens decoded over this Model's life (KV reuse is visible here)

    def _init_context(self) -> None:
        options = self.options
        ctx_params = _ll.llama_context_default_params()
        ctx_params.n_ctx = options.n_ctx * options.n_seq
        ctx_params.n_batch = options.n_batch
        ctx_params.n_ubatch = options.n_batch
        ctx_params.n_seq_max = options.n_seq
        # One KV buffer for all sequences: a batch mixing sequences of different lengths
        # stays one ubatch (per-sequence buffers would split it into equal-length pieces).
        ctx_params.kv_unified = True
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
        n_embd = _ll.llama_model_n_embd(self._model) if self.trimmed is not None else 0
        self._batch = _ll.llama_batch_init(options.n_batch, n_embd, 1)
        self._embd = None if not n_embd else np.ctypeslib.as_array(self._batch.embd, shape=(options.n_batch, n_embd))
        self.n_vocab_local: int = _ll.llama_vocab_n_tokens(self._vocab)  # rows of the logits llama.cpp computes
        self.n_vocab: int = self.trimmed.n_full if self.trimmed is not None else self.n_vocab_local
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
        return self._full(_ll.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return self._full(_ll.llama_vocab_eos(self._vocab))

    def _full(self, local: int) -> int:
        """A llama.cpp token id as a target id (they differ only in a trimmed draft)."""
        return int(local) if self.trimmed is None or local < 0 else int(self.trimmed.ids[local])

    def _local(self, token: int) -> int:
        """A target id as llama.cpp's id; LlamaSpecError for a token a trimmed draft cut."""
        if self.trimmed is None:
            return token
        local = self.trimmed.local(token)
        if local < 0:
            raise LlamaSpecError(f"token {token} is not in the trimmed vocabulary of {self.path.name}")
        return local

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
        if self.trimmed is not None and self.trimmed.local(token) < 0:
            return False  # every stop token is kept, so a cut one is none
        return bool(_ll.llama_vocab_is_eog(self._vocab, self._local(token)))

    def token_text(self, token: int) -> bytes:
        """The vocabulary's raw text for a token id (used to compare vocabularies)."""
        if self.trimmed is not None:
            return self.trimmed.texts[token] if 0 <= token < self.n_vocab else b""
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
                return [self._full(t) for t in buf[:n]]
            capacity = -n

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """One token's bytes; may be part of a multi-byte UTF-8 character."""
        buf = ctypes.create_string_buffer(64)
        token = self._local(token)
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
        self._check_room(len(tokens))
        if self.needs_state_rollback:
            self._snapshot()
        n_batch = self.n_batch
        chunks: list[np.ndarray] = []
        for start in range(0, len(tokens), n_batch):
            chunk = tokens[start : start + n_batch]
            last_chunk = start + n_batch >= len(tokens)
            n_out = self._decode([(_SEQ, chunk, all_logits, last_chunk)])
            if n_out:
                chunks.append(self._logits_view(n_out))
                if len(tokens) > n_batch and all_logits:
                    chunks[-1] = chunks[-1].copy()  # the next chunk overwrites the buffer
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def decode_many(self, items: Sequence[tuple[int, Sequence[int], bool]]) -> list[np.ndarray]:
        """Decode several sequences' new tokens together: (seq, tokens, all_logits) each.

        Rows of all items share llama_decode calls (as few as n_batch allows), so N
        sequences cost one batched pass instead of N. Returns, per item, a copy of its
        logits rows: every row with all_logits, else the last one.
        """
        seqs = [seq for seq, _, _ in items]
        if len(set(seqs)) != len(seqs) or not all(0 <= seq < len(self.seq_tokens) for seq in seqs):
            raise ValueError(f"decode_many needs distinct sequences below {len(self.seq_tokens)}, got {seqs}")
        if self.needs_state_rollback and len(self.seq_tokens) > 1:
            raise LlamaSpecError(f"{self.path.name} keeps recurrent state, which parallel sequences do not support")
        self._check_room(sum(len(tokens) for _, tokens, _ in items))
        results: list[list[np.ndarray]] = [[] for _ in items]
        parts: list[tuple[int, Sequence[int], bool, bool]] = []
        owners: list[int] = []

        def flush() -> None:
            view, row = self._logits_view(self._decode(parts)), 0
            for owner, (_, tokens, all_rows, last_row) in zip(owners, parts):
                n_rows = len(tokens) if all_rows else int(last_row)
                if n_rows:
                    results[owner].append(view[row : row + n_rows].copy())
                    row += n_rows
            parts.clear()
            owners.clear()

        size = 0
        for owner, (seq, tokens, all_logits) in enumerate(items):
            if not tokens:
                raise ValueError("decode_many needs at least one token per sequence")
            start = 0
            while start < len(tokens):
                end = min(len(tokens), start + self.n_batch - size)
                parts.append((seq, tokens[start:end], all_logits, end == len(tokens)))
                owners.append(owner)
                size, start = size + end - start, end
                if size == self.n_batch:
                    flush()
                    size = 0
        if parts:
            flush()
        return [rows[0] if len(rows) == 1 else np.concatenate(rows) for rows in results]

    def _check_room(self, n_new: int) -> None:
        n_cached = sum(len(tokens) for tokens in self.seq_tokens)
        if n_cached + n_new > self.n_ctx:
            raise ContextFullError(
                f"{n_cached + n_new} tokens do not fit in the context of {self.n_ctx}; "
                "use a shorter prompt or a larger --ctx"
            )

    def _decode(self, parts: Sequence[tuple[int, Sequence[int], bool, bool]]) -> int:
        """One llama_decode of (seq, tokens, logits on every row, logits on the last row)
        parts; returns the number of logits rows it produced."""
        batch = self._batch
        assert batch is not None, "model is closed"
        n = n_out = 0
        for seq, tokens, all_rows, last_row in parts:
            pos0 = len(self.seq_tokens[seq])
            if self._embd is not None:
                self._embd[n : n + len(tokens)] = self.trimmed.inputs(tokens)
            for i, token in enumerate(tokens):
                if self._embd is None:
                    batch.token[n] = token
                batch.pos[n] = pos0 + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = all_rows or (last_row and i == len(tokens) - 1)
                n += 1
            n_out += len(tokens) if all_rows else int(last_row)
        batch.n_tokens = n
        rc = _ll.llama_decode(self._ctx, batch)
        if rc != 0:
            # A failed decode may leave part of the batch in the cache: drop it.
            for seq, _, _, _ in parts:
                _ll.llama_memory_seq_rm(self._memory, seq, len(self.seq_tokens[seq]), -1)
            raise LlamaSpecError(f"llama_decode failed with code {rc}: {self._last_error()}")
        for seq, tokens, _, _ in parts:
            self.seq_tokens[seq].extend(tokens)
        self.n_evaluated += n
        return n_out

    def _logits_view(self, n_rows: int) -> np.ndarray:
        pointer = _ll.llama_get_logits(self._ctx)
        view = np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab_local))
        return view if self.trimmed is None else self.trimmed.expand(view)

    def rollback(self, n_keep: int, seq: int = _SEQ) -> None:
        """Keep the first `n_keep` cached tokens of a sequence and forget the rest.

        Attention caches cut the tail directly. Recurrent/hybrid caches can't
        (llama_memory_seq_rm returns False): restore the newest snapshot taken at or before
        n_keep and re-decode the kept tokens after it (sequence 0 only).
        """
        tokens = self.seq_tokens[seq]
        if not 0 <= n_keep <= len(tokens):
            raise ValueError(f"cannot keep {n_keep} of {len(tokens)} cached tokens")
        if n_keep == len(tokens):
            return
        if not self.needs_state_rollback and _ll.llama_memory_seq_rm(self._memory, seq, n_keep, -1):
            del tokens[n_keep:]
            return
        if seq != _SEQ:
            raise LlamaSpecError(f"cannot roll back sequence {seq} of {self.path.name}: the cache refused")
        self._restore(n_keep)

    def kv_tokens(self, seq: int) -> int:
        """Positions llama.cpp's cache holds for a sequence (0 when empty), read from the
        cache itself: the check that bookkeeping and cache agree (no leaked sequences)."""
        return int(_ll.llama_memory_seq_pos_max(self._memory, seq)) + 1

    def reset(self) -> None:
        """Empty the cache (a new, unrelated conversation)."""
        _ll.llama_memory_clear(self._memory, True)
        for tokens in self.seq_tokens:
            tokens.clear()
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
    "q6_k": _ll.LLAMA_FTYPE_MOSTLY_Q6_K,
    "q4_k_m": _ll.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q4_k_s": _ll.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "q4_0": _ll.LLAMA_FTYPE_MOSTLY_Q4_0,
    "iq4_nl": _ll.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}
HEAD_TYPES = {"q8_0": 8, "q6_k": 14, "q4_k": 12, "q4_0": 2, "iq4_nl": 20}  # ggml_type ids (ggml.h)


def quantize(source: str | os.PathLike[str], destination: str | os.PathLike[str], quant_type: str,
             n_threads: int = 2, pure: bool = False, head: str | None = None) -> Path:
    """Re-quantize a GGUF (llama_model_quantize with allow_requantize): a cheaper draft
    (Q4_0) or a bandwidth-heavy "big target" profile (F16); `pure` gives every tensor the one
    type (no K-quant mixture: kernel tests); `head` sets the type of the output and
    token-embedding tables (a draft's head is a large part of its cost). Written to a temporary
    name and renamed, so an interrupted run leaves nothing that looks complete."""
    _init_backend()
    if quant_type not in QUANT_TYPES:
        raise LlamaSpecError(f"unknown quantization {quant_type!r}; choose from {', '.join(QUANT_TYPES)}")
    if head is not None and head not in HEAD_TYPES:
        raise LlamaSpecError(f"unknown head type {head!r}; choose from {', '.join(HEAD_TYPES)}")
    source, destination = Path(source), Path(destination)
    _check_gguf_file(source)
    partial = destination.with_name(destination.name + ".partial")
    params = _ll.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant_type]
    params.allow_requantize = True
    params.pure = pure
    params.nthread = n_threads
    if head is not None:
        params.output_tensor_type = params.token_embedding_type = HEAD_TYPES[head]
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


def cpu_kernels() -> str:
    """What the CPU backend does with verify-sized batches, in words (from the build's system info):
    stock kernels, batch-invariant per-row kernels, or batch-invariant multi-row kernels."""
    fields = dict(re.findall(r"(\w+) = ([^|\s]+)", system_info()))
    limit = int(fields.get("BATCH_INVARIANT", "0"))
    if limit < 2:
        return "stock kernels (batch size changes the reduction order; build without LLAMASPEC_STOCK for bit-exact)"
    multirow = fields.get("MULTIROW", "none")
    if multirow == "none":
        return f"batch-invariant up to {limit} tokens, per-row kernels (no multi-row kernels on this CPU)"
    return (f"batch-invariant up to {limit} tokens, multi-row kernels for {multirow.replace(',', ', ')} "
            "(other types per row)")


def set_cpu_kernels(batch_invariant: int, multirow: bool = True, control: bool = False) -> bool:
    """Switch the patched build's small-batch CPU kernels at run time, so stock and patched
    costs are measured side by side in one process: batch_invariant 0 = stock kernels, N = batches
    up to N computed row for row like a batch of one (multirow: with the multi-row kernels;
    control: a deliberately different rounding on rows 1.., for tests). False on a build
    without the switch (stock llama-cpp-python)."""
    _init_backend()
    lib = ctypes.CDLL(_ll.llama_cpp._lib._name)  # libllama's handle also finds ggml's symbols
    setter = getattr(lib, "ggml_cpu_batch_invariant_set", None)
    if setter is None:
        return False
    setter.argtypes, setter.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int], None
    setter(batch_invariant, int(multirow), int(control))
    return True


# The llama.cpp in llama-cpp-python 0.3.36 speaks RPC protocol 7.0 (ggml-rpc.h); HELLO is
# command 14 in every version. Objects llama.cpp keeps pointers to live here for good.
_RPC_PROTO, _RPC_HELLO, _RPC_CAPS = (7, 0), 14, 24
_rpc_keep: dict[str, object] = {"servers": {}}


def set_rpc_failure_handler(handler: Callable[[str], None] | None) -> None:
    """Call `handler(message)` when llama.cpp aborts on a lost RPC server, instead of exiting
    at once. It runs on the thread whose llama.cpp call failed, which never returns from
    that call: the handler can warn others and replace the process (exec); if it returns,
    the process exits with status 1 as without a handler."""
    _rpc_keep["on_failure"] = handler


def _place_on_rpc_servers(model_params: _ll.llama_model_params, servers: Sequence[str], timeout: float) -> None:
    """Put a model's layers on llama.cpp `rpc-server` processes (ggml's RPC backend).

    Only this model's params name the RPC devices, so other models (the draft) stay local.
    All layers go to the servers, split by their free memory (n_gpu_layers > 0 sends that
    many and keeps the rest local). llama.cpp's RPC client connects and receives without a
    time limit and aborts the process on any failed call (GGML_ABORT in ggml-rpc.cpp), so:
    each server is checked here first, with a 5 s timeout and an RPC HELLO (refused, silent,
    busy with another client or another protocol version: LlamaSpecError, process intact);
    after loading, the model's RPC sockets get TCP_USER_TIMEOUT and a receive timeout
    (`ModelOptions.rpc_timeout`, by default $LLAMASPEC_RPC_TIMEOUT or 120 s), so a vanished
    host or a hung server fails instead of hanging; and a ggml abort callback turns
    llama.cpp's abort on a lost server into one line on stderr and exit status 1 (or
    `set_rpc_failure_handler`'s handler).
    Nothing can keep the process alive after that: llama.cpp has no way back from a
    failed RPC call.
    """
    import socket
    import struct

    if not servers:
        return
    if not _ll.llama_supports_rpc():
        raise LlamaSpecError("this llama-cpp-python was built without RPC support; run scripts/build_rpc.sh "
                             "(it rebuilds it with -DGGML_RPC=ON and builds rpc-server)")
    known: dict[str, tuple[str, int]] = _rpc_keep["servers"]  # type: ignore[assignment]

    def address(server: str) -> tuple[str, int]:  # IPv4 only, like llama.cpp (gethostbyname)
        host, _, port = server.rpartition(":")
        try:
            return socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][:2]
        except OSError as exc:
            raise LlamaSpecError(f"RPC server {server}: cannot resolve {host!r} ({exc.strerror or exc})") from None

    for server in servers:
        addr = address(server)
        try:
            with socket.create_connection(addr, timeout=5.0) as sock:
                sock.sendall(struct.pack("<BQ", _RPC_HELLO, _RPC_CAPS) + bytes(_RPC_CAPS))
                reply = b""
                while len(reply) < 8 + 4 + _RPC_CAPS:
                    chunk = sock.recv(8 + 4 + _RPC_CAPS - len(reply))
                    if not chunk:
                        raise EOFError
                    reply += chunk
        except ConnectionRefusedError:
            raise LlamaSpecError(f"RPC server {server} refused the connection: is rpc-server running there?") from None
        except TimeoutError:
            raise LlamaSpecError(f"RPC server {server} did not answer within 5 s (rpc-server serves one client at "
                                 "a time: is another process using it? else check host, port and firewall)") from None
        except EOFError:
            raise LlamaSpecError(f"RPC server {server} closed the connection during the handshake: not an "
                                 "rpc-server of this llama.cpp version? (scripts/build_rpc.sh builds one)") from None
        except OSError as exc:
            raise LlamaSpecError(f"RPC server {server}: {exc.strerror or exc}") from None
        size, major, minor, patch = struct.unpack_from("<QBBB", reply)
        if size != 4 + _RPC_CAPS or major != _RPC_PROTO[0] or minor > _RPC_PROTO[1]:
            raise LlamaSpecError(f"RPC server {server} speaks RPC protocol {major}.{minor}.{patch}, this "
                                 f"llama-cpp-python {_RPC_PROTO[0]}.{_RPC_PROTO[1]}: build rpc-server from the "
                                 "same llama-cpp-python (scripts/build_rpc.sh)")
        known[server] = addr

    lib = ctypes.CDLL(_ll.llama_cpp._lib._name)  # libllama's handle also finds ggml's symbols
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    if "abort" not in _rpc_keep:
        abort_callback_t = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

        @abort_callback_t
        def on_abort(message: bytes | None) -> None:
            text = (message or b"").decode("utf-8", "replace").strip()
            if "ggml-rpc" not in text:  # not ours: llama.cpp's message, then its abort() as before
                os.write(2, text.encode() + b"\n")
                return
            down: list[str] = []
            for attempt in range(4):  # a dying server may still listen for a moment after its connection broke
                if attempt:
                    time.sleep(0.25)
                for name, addr in sorted(known.items()):
                    try:
                        socket.create_connection(addr, timeout=1.0).close()
                    except OSError as exc:
                        down.append(f"{name} ({'refused' if isinstance(exc, ConnectionRefusedError) else 'no answer'})")
                if down:
                    break
            what = (f"RPC server {', '.join(down)} is gone" if down else f"an RPC server ({', '.join(known)}) stopped "
                    f"answering or the connection broke (receive timeout {timeout:g} s)")
            what = f"{what}; llama.cpp: {text.split(': ', 1)[-1]}"
            handler = _rpc_keep.get("on_failure")
            if callable(handler):
                handler(what)  # normally does not return (the server restarts itself in place)
            os.write(2, f"error: {what}; it cannot continue after a failed RPC call, so this process exits\n".encode())
            os._exit(1)

        lib.ggml_set_abort_callback.restype = ctypes.c_void_p
        lib.ggml_set_abort_callback.argtypes = [abort_callback_t]
        lib.ggml_set_abort_callback(on_abort)
        _rpc_keep["abort"] = on_abort

    add_server_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
    rpc_reg = lib.ggml_backend_reg_by_name(b"RPC")
    add_server = add_server_t(lib.ggml_backend_reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server"))
    devices: list[int] = []
    for server in servers:
        reg = add_server(server.encode())  # connects (checked above) and lists the server's devices
        devices += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg) if reg else 0)]
    if not devices:
        raise LlamaSpecError(f"the RPC servers {','.join(servers)} offer no devices")
    array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)  # NULL-terminated
    _rpc_keep[",".join(servers)] = array
    model_params.devices = ctypes.addressof(array)
    if model_params.n_gpu_layers == 0:
        model_params.n_gpu_layers = -1

    def guard_sockets() -> None:
        """TCP_USER_TIMEOUT and SO_RCVTIMEO/SO_SNDTIMEO on this process's sockets to the servers
        (through libc on the raw descriptors: a Python socket object could change their blocking mode)."""
        libc, peers = ctypes.CDLL(None, use_errno=True), set(known.values())
        sockaddr, length = ctypes.create_string_buffer(128), ctypes.c_uint32()
        user_timeout = ctypes.c_uint(int(min(timeout, 30) * 1000))
        tv = ctypes.create_string_buffer(struct.pack("@ll", int(timeout), int(timeout % 1 * 1e6)))
        for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
            try:
                if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd, length.value = int(name), 128
            if libc.getpeername(fd, sockaddr, ctypes.byref(length)) != 0:
                continue
            family, port = struct.unpack_from("=H", sockaddr.raw)[0], struct.unpack_from("!H", sockaddr.raw, 2)[0]
            if family != socket.AF_INET or (socket.inet_ntoa(sockaddr.raw[4:8]), port) not in peers:
                continue
            libc.setsockopt(fd, socket.IPPROTO_TCP, 18, ctypes.byref(user_timeout), 4)  # TCP_USER_TIMEOUT
            if timeout > 0:
                libc.setsockopt(fd, socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv, len(tv.raw))
                libc.setsockopt(fd, socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv, len(tv.raw))

    @_ll.llama_progress_callback
    def on_progress(progress: float, _user_data: ctypes.c_void_p) -> bool:
        if progress >= 1.0:  # weights are on the servers: the connections exist now
            guard_sockets()
        return True

    _rpc_keep["progress:" + ",".join(servers)] = on_progress
    model_params.progress_callback = on_progress
