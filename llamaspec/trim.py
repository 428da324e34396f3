"""A draft whose output head holds only the N target tokens it is allowed to propose.

Why: the Qwen2.5-Coder-0.5B draft reads its 151936-row head for every token it drafts (a
third of its bytes at Q4_0), yet the drafts the target accepts come from a small part of the
vocabulary (FR-Spec, arXiv 2502.14856). A trimmed draft is two files made by `derive`:

- `<name>.gguf`: the draft with its tokenizer and embedding/output rows cut to the N kept
  tokens (ids renumbered 0..N-1 in target order), so llama.cpp computes N logits per token;
- `<name>.inputs.gguf`: the full input embedding table and the kept ids. The draft is fed
  embeddings from it (llama_batch.embd), so it reads every target token, kept or not.

The draft speaks target ids throughout: its logits are scattered back to the full
vocabulary (-inf where a token was cut), so it never proposes a cut token. Lossless by
construction: the target still verifies every draft over its full vocabulary.
"""

from __future__ import annotations

import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from .errors import LlamaSpecError, ModelLoadError

INPUTS_KEY = "llamaspec.trim.inputs"  # trimmed GGUF: the sidecar's file name
INPUTS_SHA_KEY = "llamaspec.trim.inputs_sha256"  # trimmed GGUF: the sidecar's sha256
IDS_KEY = "llamaspec.trim.ids"  # sidecar: kept target ids, ascending
EMBD = "token_embd.weight"
CORPUS_BYTES = 12_000_000  # enough text for stable ranks of the top 64K tokens


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

    def expand(self, logits: np.ndarray) -> np.ndarray:
        """(rows, N) draft logits as (rows, n_full) target-vocabulary logits, -inf where cut."""
        full = np.full((logits.shape[0], self.n_full), -np.inf, dtype=np.float32)
        full[:, self.ids] = logits
        return full


def load(model_path: Path, inputs_name: str, inputs_sha256: str) -> TrimmedVocab:
    """The sidecar named in a trimmed draft's metadata, checked against its recorded hash."""
    import gguf

    from .models import sha256_cached

    path = model_path.parent / inputs_name
    rederive = f"derive the draft again (llamaspec models derive, or delete {model_path.name} and fetch it)"
    if not path.is_file():
        raise ModelLoadError(f"{model_path.name} is a trimmed draft but its inputs file {path} is missing: {rederive}")
    if sha256_cached(path) != inputs_sha256:
        raise ModelLoadError(f"{path} does not match the trimmed draft {model_path.name}: {rederive}")
    try:
        reader = gguf.GGUFReader(str(path))
        table = next(t for t in reader.tensors if t.name == EMBD)
        ids = np.asarray(reader.fields[IDS_KEY].contents(), dtype=np.int64)
        texts = [text.encode() for text in reader.fields["tokenizer.ggml.tokens"].contents()]
    except (KeyError, StopIteration, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a trimmed draft's inputs file ({exc}): {rederive}") from None
    n_full = int(table.data.shape[0])
    local_of = np.full(n_full, -1, dtype=np.int64)
    local_of[ids] = np.arange(len(ids))
    return TrimmedVocab(ids, local_of, table.data, int(table.tensor_type), texts)


def corpus() -> Iterator[str]:
    """The text tokens are ranked on: this interpreter's standard library (Python source,
    docstrings and the pydoc topics; PSF License 2.0), up to CORPUS_BYTES, in a fixed order.
    Code-heavy like the target's work, with English prose in the docstrings."""
    root = Path(sysconfig.get_paths()["stdlib"])
    budget = CORPUS_BYTES
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in ("test", "site-packages", "idlelib") or "tests" in parts:
            continue
        text = path.read_text("utf-8", errors="replace")
        yield text[:budget]
        budget -= len(text)
        if budget <= 0:
            return
    if budget == CORPUS_BYTES:  # pragma: no cover - a Python without its sources
        raise LlamaSpecError(f"no Python sources under {root} to rank tokens on ({sys.executable})")


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


def derive(source: str | Path, destination: str | Path, n_keep: int, texts: Iterable[str] | None = None,
           n_threads: int = 2) -> Path:
    """Write a trimmed draft of `source` keeping `n_keep` tokens ranked on `texts` (default:
    `corpus()`). Each file goes to a temporary name first and the model file is renamed last,
    so an interrupted derive leaves no model that looks complete."""
    from .gguf_tools import always_kept, trim_vocab, write_token_table
    from .model import Model, ModelOptions
    from .models import sha256_file

    source, destination = Path(source), Path(destination)
    with Model(source, ModelOptions(n_ctx=8, n_threads=n_threads)) as model:
        if model.trimmed is not None:
            raise LlamaSpecError(f"{source} is already a trimmed draft; derive from the full model")
        always = always_kept(source)
        check_size(n_keep, model.n_vocab, len(always))  # before the corpus is read
        counts = np.zeros(model.n_vocab, dtype=np.int64)
        for text in corpus() if texts is None else texts:
            counts += np.bincount(model.tokenize(text, add_special=False, parse_special=False),
                                  minlength=model.n_vocab)[: model.n_vocab]
    keep = choose_tokens(counts, n_keep, always)
    inputs = inputs_path(destination)
    _write_atomically(inputs, lambda path: write_token_table(source, path, EMBD, keep, IDS_KEY))
    extra = {INPUTS_KEY: inputs.name, INPUTS_SHA_KEY: sha256_file(inputs)}
    _write_atomically(destination, lambda path: trim_vocab(source, path, keep, extra))
    return destination


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        write(partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
