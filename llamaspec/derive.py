"""Deriving a vocabulary-trimmed draft (trim.py): rank the tokens on a corpus, write both files."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from .errors import LlamaSpecError
from .gguf_tools import always_kept, trim_vocab, write_token_table
from .llama import Model, ModelOptions
from .trim import EMBD, IDS_KEY, INPUTS_KEY, INPUTS_SHA_KEY, check_size, choose_tokens, file_sha256, inputs_path

CORPUS_BYTES = 12_000_000  # enough text for stable ranks of the top 64K tokens


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


def derive(source: str | Path, destination: str | Path, n_keep: int, texts: Iterable[str] | None = None,
           n_threads: int = 2) -> Path:
    """Write a trimmed draft of `source` keeping `n_keep` tokens ranked on `texts` (default:
    `corpus()`). Each file goes to a temporary name first and the model file is renamed last,
    so an interrupted derive leaves no model that looks complete."""
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
    extra = {INPUTS_KEY: inputs.name, INPUTS_SHA_KEY: file_sha256(inputs)}
    _write_atomically(destination, lambda path: trim_vocab(source, path, keep, extra))
    return destination


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        write(partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
