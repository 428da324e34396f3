"""A loaded GGUF model: the one class that owns llama.cpp's C objects.

A `Model` owns one llama_model, one llama_context and one reusable llama_batch, and frees
all three on `close()` / context-manager exit. It tracks the tokens held in its KV cache
(sequence 0), so callers can evaluate new tokens, read logits as numpy views, and roll the
cache back to any prefix. A context made with `n_seq > 1` also holds that many sequences
side by side, decoded together by `decode_many` (the server's shared batch).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import trim
from ..errors import ContextFullError, LlamaSpecError, ModelLoadError
from . import backend
from .backend import ll
from .options import FLASH_ATTN, ModelOptions
from .profile import OpTimer
from .rpc import place_on_rpc_servers
from .state import StateSnapshots
from .tools import cpu_kernel_settings, set_cpu_kernels

_SEQ = 0  # the sequence of the single-sequence API (eval, rollback, tokens)


class Model:
    """A loaded GGUF model with one context; evaluate tokens, read logits, roll back."""

    def __init__(self, path: str | os.PathLike[str], options: ModelOptions = ModelOptions()):
        backend.init()
        backend.echo_log(options.log)
        self.path = Path(path)
        self.options = options
        self._model = self._ctx = None
        self._batch: ll.llama_batch | None = None
        self.trimmed: trim.TrimmedVocab | None = None
        backend.check_gguf_file(self.path)
        backend.clear_errors()
        backend.use_huge_pages(options.huge_pages)
        model_params = ll.llama_model_default_params()
        model_params.n_gpu_layers = options.n_gpu_layers
        model_params.use_extra_bufts = options.repack
        if options.reads_weights:
            model_params.load_mode = ll.LLAMA_LOAD_MODE_NONE
        place_on_rpc_servers(model_params, options.rpc_servers, options.rpc_timeout)
        self._model = ll.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {backend.last_error()}")
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
        self.n_evaluated = 0  # tokens decoded over this Model's life (KV reuse is visible here)
        # The patched build's kernel settings (set_cpu_kernels) this model decodes one token
        # with, applied before each such decode; None: whatever the process is set to. Why per
        # model: which batch-1 kernel is faster differs by model (calibrate.choose_batch1_kernels),
        # while the build's switch is one for the whole process.
        self.batch1_kernels: tuple[int, int, int] | None = None

    def _init_context(self) -> None:
        options = self.options
        ctx_params = ll.llama_context_default_params()
        ctx_params.n_ctx = options.n_ctx * options.n_seq
        ctx_params.n_batch = options.n_batch
        ctx_params.n_ubatch = options.n_batch
        ctx_params.n_seq_max = options.n_seq
        # One KV buffer for all sequences: a batch mixing sequences of different lengths
        # stays one ubatch (per-sequence buffers would split it into equal-length pieces).
        ctx_params.kv_unified = True
        ctx_params.n_threads = options.n_threads
        ctx_params.n_threads_batch = options.n_threads
        ctx_params.flash_attn_type = FLASH_ATTN[options.flash_attn]
        ctx_params.no_perf = True
        self.op_timer = OpTimer() if options.profile_ops else None
        if self.op_timer is not None:
            ctx_params.cb_eval = self.op_timer.callback
        if self.n_swa > 0:
            # Rolling back after the window slid needs the full-size SWA cache.
            ctx_params.swa_full = True
        self._ctx = ll.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            raise ModelLoadError(f"llama.cpp could not create a context for {self.path}: {backend.last_error()}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._memory = ll.llama_get_memory(self._ctx)
        # Recurrent state can't be cut at an arbitrary position: keep saved states instead.
        self._snapshots = StateSnapshots(self._ctx, self._memory, _SEQ, self.path.name)
        n_embd = ll.llama_model_n_embd(self._model) if self.trimmed is not None else 0
        self._batch = ll.llama_batch_init(options.n_batch, n_embd, 1)
        self._embd = None if not n_embd else np.ctypeslib.as_array(self._batch.embd, shape=(options.n_batch, n_embd))
        self.n_vocab_local: int = ll.llama_vocab_n_tokens(self._vocab)  # rows of the logits llama.cpp computes
        self.n_vocab: int = self.trimmed.n_full if self.trimmed is not None else self.n_vocab_local
        self._expanded = np.empty((0, self.n_vocab), dtype=np.float32)  # a trimmed draft's logits, by target id
        self.n_ctx: int = ll.llama_n_ctx(self._ctx)
        self.n_batch: int = ll.llama_n_batch(self._ctx)  # llama.cpp caps it at n_ctx
        # decode_many's rows per decode for prompts; the server may lower it (calibrate.choose_prompt_rows)
        self.prompt_rows: int = self.n_batch
        self.needs_state_rollback = bool(
            ll.llama_model_is_recurrent(self._model) or ll.llama_model_is_hybrid(self._model)
        )

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Free the batch, context and model (idempotent)."""
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            ll.llama_model_free(self._model)
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
        return int(ll.llama_model_n_swa(self._model))

    @property
    def n_layer(self) -> int:
        return int(ll.llama_model_n_layer(self._model))

    @property
    def vocab_type(self) -> int:
        return int(ll.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return self._full(ll.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return self._full(ll.llama_vocab_eos(self._vocab))

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
        return bool(ll.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(ll.llama_vocab_get_add_eos(self._vocab))

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and any other token the vocab marks as a stop."""
        if self.trimmed is not None and self.trimmed.local(token) < 0:
            return False  # every stop token is kept, so a cut one is none
        return bool(ll.llama_vocab_is_eog(self._vocab, self._local(token)))

    def token_text(self, token: int) -> bytes:
        """The vocabulary's raw text for a token id (used to compare vocabularies)."""
        if self.trimmed is not None:
            return self.trimmed.texts[token] if 0 <= token < self.n_vocab else b""
        return ll.llama_vocab_get_text(self._vocab, token) or b""

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def chat_template(self) -> str | None:
        template = ll.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", "replace") if template else None

    # -- text <-> tokens ------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; `add_special` adds BOS where the vocab wants it,
        `parse_special` turns written control tokens (e.g. <|im_start|>) into their ids."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buf = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
            if n >= 0:
                return [self._full(t) for t in buf[:n]]
            capacity = -n

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """One token's bytes; may be part of a multi-byte UTF-8 character. An id outside the
        vocabulary (a vocabulary without BOS or EOS says -1) is empty: llama.cpp would throw
        through its C API and abort the process."""
        if not 0 <= token < self.n_vocab:
            return b""
        buf = ctypes.create_string_buffer(64)
        token = self._local(token)
        n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
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
            self._snapshots.save(self.n_past)
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

        Rows of all items share llama_decode calls, so N sequences cost one batched pass
        instead of N. Items of up to `exact_rows` tokens (generation steps) share decodes of at
        most that many rows, so every row is computed as in a batch of one (bit-identical to
        plain decoding) and costs what a verify row costs: 17 rows or more take the stock
        kernels, dearer on CPU (Zen 4 VM, Qwen 1.5B Q4_K_M: 16 rows 115 ms, 17 rows 201, 32
        rows 345). Longer items (prompts) share decodes of up to `prompt_rows` rows: n_batch,
        as llama.cpp evaluates a prompt, unless the server found pieces of `exact_rows` faster.
        Returns, per item, a copy of its logits rows: every row with all_logits, else the last one.
        """
        seqs = [seq for seq, _, _ in items]
        if len(set(seqs)) != len(seqs) or not all(0 <= seq < len(self.seq_tokens) for seq in seqs):
            raise ValueError(f"decode_many needs distinct sequences below {len(self.seq_tokens)}, got {seqs}")
        if self.needs_state_rollback:  # rollback restores snapshots, which only `eval` saves
            raise LlamaSpecError(f"{self.path.name} keeps recurrent state, which shared batches do not support")
        if not all(tokens for _, tokens, _ in items):
            raise ValueError("decode_many needs at least one token per sequence")
        self._check_room(sum(len(tokens) for _, tokens, _ in items))
        results: list[list[np.ndarray]] = [[] for _ in items]
        exact = self.exact_rows()
        short = [owner for owner, (_, tokens, _) in enumerate(items) if len(tokens) <= exact]
        long = [owner for owner, (_, tokens, _) in enumerate(items) if len(tokens) > exact]
        for owners, rows_per_decode in ((short, exact), (long, self.prompt_rows)):
            self._decode_in_pieces(items, owners, rows_per_decode, results)
        return [rows[0] if len(rows) == 1 else np.concatenate(rows) for rows in results]

    def exact_rows(self) -> int:
        """The most rows one decode may hold and keep every row's result that of a batch of
        one: the build's batch-invariant size for a model on this CPU, else 0."""
        settings = cpu_kernel_settings()
        if not self.options.on_this_cpu or settings is None or settings[0] < 2:
            return 0
        return min(settings[0], self.n_batch)

    def _decode_in_pieces(self, items: Sequence[tuple[int, Sequence[int], bool]], owners: Sequence[int],
                          rows_per_decode: int, results: list[list[np.ndarray]]) -> None:
        """The items at `owners`, their tokens in order, cut into decodes of rows_per_decode
        rows (an item may span two); each item's logits rows appended to results[owner]."""
        parts: list[tuple[int, Sequence[int], bool, bool]] = []
        part_owners: list[int] = []

        def flush() -> None:
            view, row = self._logits_view(self._decode(parts)), 0
            for owner, (_, tokens, all_rows, last_row) in zip(part_owners, parts):
                n_rows = len(tokens) if all_rows else int(last_row)
                if n_rows:
                    results[owner].append(view[row : row + n_rows].copy())
                    row += n_rows
            parts.clear()
            part_owners.clear()

        size = 0
        for owner in owners:
            seq, tokens, all_logits = items[owner]
            start = 0
            while start < len(tokens):
                end = min(len(tokens), start + rows_per_decode - size)
                parts.append((seq, tokens[start:end], all_logits, end == len(tokens)))
                part_owners.append(owner)
                size, start = size + end - start, end
                if size == rows_per_decode:
                    flush()
                    size = 0
        if parts:
            flush()

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
        if n == 1 and self.batch1_kernels is not None:
            set_cpu_kernels(*self.batch1_kernels)
        rc = ll.llama_decode(self._ctx, batch)
        if rc != 0:
            # A failed decode may leave part of the batch in the cache: drop it.
            for seq, _, _, _ in parts:
                ll.llama_memory_seq_rm(self._memory, seq, len(self.seq_tokens[seq]), -1)
            raise LlamaSpecError(f"llama_decode failed with code {rc}: {backend.last_error()}")
        for seq, tokens, _, _ in parts:
            self.seq_tokens[seq].extend(tokens)
        self.n_evaluated += n
        return n_out

    def _logits_view(self, n_rows: int) -> np.ndarray:
        pointer = ll.llama_get_logits(self._ctx)
        view = np.ctypeslib.as_array(pointer, shape=(n_rows, self.n_vocab_local))
        if self.trimmed is None:
            return view
        if len(self._expanded) < n_rows:
            self._expanded = np.full((n_rows, self.n_vocab), -np.inf, dtype=np.float32)
        return self.trimmed.expand(view, self._expanded[:n_rows])

    def rollback(self, n_keep: int, seq: int = _SEQ) -> None:
        """Keep the first `n_keep` cached tokens of a sequence and forget the rest.

        Attention caches cut the tail directly. Recurrent/hybrid caches can't
        (llama_memory_seq_rm returns False): restore the newest snapshot taken at or before
        n_keep and re-decode the kept tokens after it, or all of them when no snapshot is that
        old (sequence 0 only).
        """
        tokens = self.seq_tokens[seq]
        if not 0 <= n_keep <= len(tokens):
            raise ValueError(f"cannot keep {n_keep} of {len(tokens)} cached tokens")
        if n_keep == len(tokens):
            return
        if self._ctx is None:  # closed: no cache left to cut (a generation finalized after close)
            del tokens[n_keep:]
            return
        if not self.needs_state_rollback and ll.llama_memory_seq_rm(self._memory, seq, n_keep, -1):
            del tokens[n_keep:]
            return
        if seq != _SEQ:
            raise LlamaSpecError(f"cannot roll back sequence {seq} of {self.path.name}: the cache refused")
        self._restore(n_keep)

    def kv_tokens(self, seq: int) -> int:
        """Positions llama.cpp's cache holds for a sequence (0 when empty), read from the
        cache itself: the check that bookkeeping and cache agree (no leaked sequences)."""
        if self._ctx is None:
            return 0
        return int(ll.llama_memory_seq_pos_max(self._memory, seq)) + 1

    def reset(self) -> None:
        """Empty the cache (a new, unrelated conversation)."""
        if self._ctx is not None:  # closed: no cache left to clear
            ll.llama_memory_clear(self._memory, True)
        for tokens in self.seq_tokens:
            tokens.clear()
        self._snapshots.clear()

    def _restore(self, n_keep: int) -> None:
        n_saved = self._snapshots.restore(n_keep)
        replay = self.tokens[n_saved:n_keep]
        del self.tokens[n_saved:]
        if replay:
            self.eval(replay)
