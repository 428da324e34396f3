"""llama.cpp's tools beside inference: re-quantizing a GGUF, the build's system info, and the
patched build's run-time kernel switch."""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Callable, Iterator

from ..errors import LlamaSpecError, ModelLoadError
from . import backend
from .backend import ll

QUANT_TYPES = {
    "f16": ll.LLAMA_FTYPE_MOSTLY_F16,
    "q8_0": ll.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q6_k": ll.LLAMA_FTYPE_MOSTLY_Q6_K,
    "q5_k_m": ll.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "q5_k_s": ll.LLAMA_FTYPE_MOSTLY_Q5_K_S,
    "q4_k_m": ll.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q4_k_s": ll.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "q4_0": ll.LLAMA_FTYPE_MOSTLY_Q4_0,
    "iq4_nl": ll.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}
HEAD_TYPES = {"q8_0": 8, "q6_k": 14, "q4_k": 12, "q4_0": 2, "iq4_nl": 20}  # ggml_type ids (ggml.h)


def quantize(source: str | os.PathLike[str], destination: str | os.PathLike[str], quant_type: str,
             n_threads: int = 2, pure: bool = False, head: str | None = None) -> Path:
    """Re-quantize a GGUF (llama_model_quantize with allow_requantize): a cheaper draft
    (Q4_0) or a bandwidth-heavy "big target" profile (F16); `pure` gives every tensor the one
    type (no K-quant mixture: kernel tests); `head` sets the type of the output and
    token-embedding tables (a draft's head is a large part of its cost). Written to a temporary
    name and renamed, so an interrupted run leaves nothing that looks complete."""
    backend.init()
    if quant_type not in QUANT_TYPES:
        raise LlamaSpecError(f"unknown quantization {quant_type!r}; choose from {', '.join(QUANT_TYPES)}")
    if head is not None and head not in HEAD_TYPES:
        raise LlamaSpecError(f"unknown head type {head!r}; choose from {', '.join(HEAD_TYPES)}")
    source, destination = Path(source), Path(destination)
    backend.check_gguf_file(source)
    partial = destination.with_name(destination.name + ".partial")
    params = ll.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant_type]
    params.allow_requantize = True
    params.pure = pure
    params.nthread = n_threads
    if head is not None:
        params.output_tensor_type = params.token_embedding_type = HEAD_TYPES[head]
    backend.clear_errors()
    try:
        if ll.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
            raise ModelLoadError(f"quantizing {source} failed: {backend.last_error()}")
        partial.replace(destination)
    finally:
        partial.unlink(missing_ok=True)
    return destination


def system_info() -> str:
    """The CPU features llama.cpp was compiled with (AVX2 = 1, ...): the build, in one line."""
    backend.init()
    return (ll.llama_print_system_info() or b"").decode("utf-8", "replace").strip()


@functools.cache
def build_id() -> str:
    """A digest of the llama.cpp libraries this process runs: a rebuilt kernel (another
    cpp_patches/ revision) changes costs and rounding without changing `system_info`."""
    digest = hashlib.sha256()
    for path in sorted({p.resolve() for p in Path(ll.llama_cpp._base_path).glob("*") if p.is_file()}):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


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


def _kernel_switch(name: str, argtypes: list, restype: type | None) -> Callable | None:
    """The patched build's ggml_cpu_<name>, typed; None on a build without it (stock)."""
    backend.init()
    function = getattr(backend.ggml(), f"ggml_cpu_{name}", None)
    if function is not None:
        function.argtypes, function.restype = argtypes, restype
    return function


class Multirow(enum.IntEnum):
    """Which batches the patched build's multi-row kernels take (GGML_CPU_MULTIROW). At batch 1
    both kernels are bit-identical; which is faster depends on the CPU and on each kernel's
    prefetching, so llamaspec measures it (calibrate.py)."""

    OFF = 0  # every row its own single-row kernel (cpp_patches/0001 alone)
    ALL = 1  # batches of 1..16
    BATCHES = 2  # batches of 2..16; a batch of 1 keeps the single-row kernels (the build's default)


def set_cpu_kernels(batch_invariant: int, multirow: int = Multirow.BATCHES, control: int = 0) -> bool:
    """Switch the patched build's small-batch CPU kernels at run time, so stock and patched
    costs are measured side by side in one process: batch_invariant 0 = stock kernels, N = batches
    up to N computed row for row like a batch of one (multirow: which of them take the multi-row
    kernels, a Multirow; control, for tests: a deliberately different rounding on rows 1.. (1)
    or on every row (2)). False on a build without the switch (stock llama-cpp-python)."""
    setter = _kernel_switch("batch_invariant_set", [ctypes.c_int] * 3, None)
    if setter is None:
        return False
    setter(batch_invariant, int(multirow), int(control))
    return True


def cpu_kernel_settings() -> tuple[int, Multirow, int] | None:
    """The patched build's kernel settings now (batch_invariant, multirow, control) as
    set_cpu_kernels takes them; None on a build without the switch."""
    getters = [_kernel_switch(name, [], ctypes.c_int)
               for name in ("batch_invariant_max", "multirow_enabled", "multirow_control")]
    if None in getters:
        return None
    batch_invariant, multirow, control = (getter() for getter in getters)
    return batch_invariant, Multirow(multirow), control


def batch1_kernel_choice() -> tuple[int, Multirow, int] | None:
    """The kernel settings now when a batch of one token may run either of two kernels (the
    multi-row or the single-row one); None where there is only one: a build without the switch,
    stock or per-row kernels, or no multi-row kernels on this CPU."""
    settings = cpu_kernel_settings()
    if settings is None or settings[0] < 1 or settings[1] == Multirow.OFF or "MULTIROW = none" in system_info():
        return None
    return settings


@contextlib.contextmanager
def other_batch1_kernels() -> Iterator[bool]:
    """For the block, decode a batch of one token with the kernel this process does not use for
    it now: the multi-row kernels where batch 1 runs the single-row ones (stock llama.cpp's
    path), and the other way round; then the settings as they were. Yields False when there is
    no other (batch1_kernel_choice)."""
    settings = batch1_kernel_choice()
    if settings is None:
        yield False
        return
    set_cpu_kernels(settings[0], Multirow.BATCHES if settings[1] == Multirow.ALL else Multirow.ALL, settings[2])
    try:
        yield True
    finally:
        set_cpu_kernels(*settings)
