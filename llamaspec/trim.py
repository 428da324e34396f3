"""A draft whose output head holds only the N target tokens it is allowed to propose.

Why: the Qwen2.5-Coder-0.5B draft reads its 151936-row head for every token it drafts (a
third of its bytes at Q4_0), yet the drafts the target accepts come from a small part of the
vocabulary (FR-Spec, arXiv 2502.14856). A trimmed draft is two files made by
`derive.derive`:

- `<name>.gguf`: the draft with its tokenizer and embedding/output rows cut to the N kept
  tokens (ids renumbered 0..N-1 in target order), so llama.cpp computes N logits per token;
- `<name>.inputs.gguf`: the full input embedding table and the kept ids. The draft is fed
  embeddings from it (llama_batch.embd), so it reads every target token, kept or not.

The draft speaks target ids throughout: its logits are scattered back to the full
vocabulary (-inf where a token was cut), so it never proposes a cut token. Lossless by
construction: the target still verifies every draft over its full vocabulary.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from .errors import LlamaSpecError, ModelLoadError
from .gguf_tools import read_token_table

INPUTS_KEY = "llamaspec.trim.inputs"  # trimmed GGUF: the sidecar's file name
INPUTS_SHA_KEY = "llamaspec.trim.inputs_sha256"  # trimmed GGUF: the sidecar's sha256
IDS_KEY = "llamaspec.trim.ids"  # sidecar: kept target ids, ascending
EMBD = "token_embd.weight"


@dataclass(frozen=True)
class TrimmedVocab:
    """The kept ids, the full input embedding table, and the map between the two numberings."""

    ids: np.ndarray  # local id -> target id, ascending (int64)
    local_of: np.ndarray  # target id -> local id, -1 where cut
    embd: np.ndarray  # raw rows of the full table, quantized (uint8, one row per target id)
    embd_type: int  # GGMLQuantizationType of those rows
    texts: list[bytes]  # every target token's text: the vocabulary check compares all of them

    @property
    def n_full(self) -> int:
        return len(self.local_of)

    def local(self, token: int) -> int:
        """The draft's id for a target token; -1 for a cut token or an id out of range."""
        return int(self.local_of[token]) if 0 <= token < self.n_full else -1

    def inputs(self, tokens: Iterable[int]) -> np.ndarray:
        """float32 (len, n_embd) input embeddings, dequantized as llama.cpp's get_rows does."""
        from gguf.quants import dequantize

        return dequantize(self.embd[np.fromiter(tokens, dtype=np.int64)], self.embd_type)

    def expand(self, logits: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(rows, N) draft logits as (rows, n_full) target-vocabulary logits, written into
        `out`, whose cut columns hold -inf: only the kept ones are written, so one buffer
        serves every eval (a fresh 600 KB array a row cost 0.7 ms a draft token in the loop)."""
        out[:, self.ids] = logits
        return out


def load(model_path: Path, inputs_name: str, inputs_sha256: str) -> TrimmedVocab:
    """The sidecar named in a trimmed draft's metadata, checked against its recorded hash."""
    path = model_path.parent / inputs_name
    rederive = f"derive the draft again (llamaspec models derive, or delete {model_path.name} and fetch it)"
    if not path.is_file():
        raise ModelLoadError(f"{model_path.name} is a trimmed draft but its inputs file {path} is missing: {rederive}")
    if file_sha256(path) != inputs_sha256:
        raise ModelLoadError(f"{path} does not match the trimmed draft {model_path.name}: {rederive}")
    try:
        fields, table, table_type = read_token_table(path, EMBD)
        ids = np.asarray(fields[IDS_KEY], dtype=np.int64)
        texts = fields["tokenizer.ggml.tokens"]
        if not isinstance(texts, list) or len(texts) != len(table):
            raise ValueError("its token texts do not match its table")
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a trimmed draft's inputs file ({exc}): {rederive}") from None
    local_of = np.full(len(table), -1, dtype=np.int64)
    local_of[ids] = np.arange(len(ids))
    return TrimmedVocab(ids, local_of, table, table_type, texts)


def check_size(n_keep: int, n_vocab: int, n_always: int) -> None:
    if not n_always < n_keep <= n_vocab:
        raise LlamaSpecError(
            f"a trimmed vocabulary needs between {n_always + 1} and {n_vocab} tokens "
            f"(the {n_always} control and single-character tokens are always kept), got {n_keep}"
        )


def choose_tokens(counts: np.ndarray, n_keep: int, always: np.ndarray) -> np.ndarray:
    """The `always` ids plus the most frequent others up to n_keep, ascending. Ties (tokens
    the corpus never used, mostly) go to lower ids: BPE ids follow merge order, itself a
    frequency rank on the tokenizer's much larger training corpus."""
    n_vocab = len(counts)
    always = np.unique(always)
    check_size(n_keep, n_vocab, len(always))
    order = np.lexsort((np.arange(n_vocab), -counts))  # by count descending, then id
    chosen = np.zeros(n_vocab, dtype=bool)
    chosen[always] = True
    rest = order[~chosen[order]][: n_keep - len(always)]
    chosen[rest] = True
    return np.flatnonzero(chosen)


def inputs_path(destination: Path) -> Path:
    return destination.with_name(destination.name.removesuffix(".gguf") + ".inputs.gguf")


def file_sha256(path: Path) -> str:
    """Checked at every load (an inputs file is ~80 MB: a tenth of a second)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
