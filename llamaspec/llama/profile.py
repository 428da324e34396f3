"""Time every node of a model's compute graph, by operation and weight type.

llama.cpp's scheduler takes an eval callback (`cb_eval`): asked about each node before it
runs, a callback that says yes gets the node computed on its own and is called again once it
is done. Saying yes to every node therefore times each one alone. Why: a verify batch's cost
is a sum over the model's matrix types (Q4_K, Q6_K, ...) and attention, and which one keeps a
batch slow is what a kernel change has to know (`scripts/kernel_bench.py --by-type`).

Each node computed alone pays its own graph launch and thread synchronisation and starts
cold, so a profiled evaluation runs slower than a plain one, the more so the larger the batch
(Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, one run: batch 1 30 ms profiled against 32 plain,
batch 8 81 against 68): read the parts as shares of the plain time.
"""

from __future__ import annotations

import ctypes
import time
from collections import defaultdict

from ..errors import LlamaSpecError
from .backend import ggml, ll


class _Tensor(ctypes.Structure):
    """The head of ggml.h's `struct ggml_tensor` (llama-cpp-python 0.3.36), up to its name;
    checked against ggml's own accessors on the first node."""

    _fields_ = [
        ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
    ]


_WEIGHTED = {"MUL_MAT", "MUL_MAT_ID"}


class OpTimer:
    """The callback and what it measured since the last `take()`: milliseconds per node,
    keyed by operation (`MUL_MAT q4_K` for a matrix product with Q4_K weights, in ggml's
    spelling of type names)."""

    def __init__(self) -> None:
        lib = ggml()
        self._op_desc = lib.ggml_op_desc
        self._op_desc.argtypes, self._op_desc.restype = [ctypes.c_void_p], ctypes.c_char_p
        self._type_name = lib.ggml_type_name
        self._type_name.argtypes, self._type_name.restype = [ctypes.c_int], ctypes.c_char_p
        self._get_name = lib.ggml_get_name
        self._get_name.argtypes, self._get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
        self._checked = False
        self._layout_error = ""  # raised by take(): an exception cannot cross the C callback
        self._start = 0.0
        self.nodes: list[tuple[str, float]] = []
        self.callback = ll.ggml_backend_sched_eval_callback(self._on_node)

    def _label(self, pointer: int) -> str:
        tensor = _Tensor.from_address(pointer)
        if not self._checked:
            self._checked = True
            if tensor.name != self._get_name(pointer) or not 0 <= tensor.type < 64:
                self._layout_error = "this ggml's struct ggml_tensor is not the layout llamaspec.llama.profile reads"
        op = self._op_desc(pointer).decode()
        if self._layout_error:
            return op
        if op in _WEIGHTED and tensor.src[0]:
            return f"{op} {self._type_name(_Tensor.from_address(tensor.src[0]).type).decode()}"
        return op

    def _on_node(self, pointer: int, ask: bool, _user_data: int) -> bool:
        now = time.perf_counter()
        if ask:
            self._start = now
        else:
            self.nodes.append((self._label(pointer), 1000.0 * (now - self._start)))
        return True  # every node alone, then go on

    def take(self) -> list[tuple[str, float]]:
        """The nodes timed since the previous call, in graph order."""
        if self._layout_error:
            raise LlamaSpecError(self._layout_error)
        nodes, self.nodes = self.nodes, []
        return nodes


def by_operation(nodes: list[tuple[str, float]]) -> dict[str, float]:
    """Milliseconds summed by what a verify batch's cost is made of: each matrix product by
    its weight type (`q4_K`, `q6_K`, `f16`, ...), attention, and everything else (`other`:
    norms, RoPE, residual adds, activations, cache writes)."""
    totals: dict[str, float] = defaultdict(float)
    for op, ms in nodes:
        kind, _, weights = op.partition(" ")
        totals[weights if kind in _WEIGHTED else "attention" if kind == "FLASH_ATTN_EXT" else "other"] += ms
    return dict(totals)
