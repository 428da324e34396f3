"""llama.cpp's process-wide state: the library, its log, its backend initialisation.

llama.cpp logs through one process-wide callback; we keep its recent errors so a failed load
can say why in one line instead of dumping pages of loader output on stderr, and echo the
log only when asked (`ModelOptions.log`).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import sys
from pathlib import Path

from ..errors import ModelLoadError

try:
    import llama_cpp as ll
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "llama-cpp-python is not installed; run scripts/install.sh (it builds it for this CPU)"
    ) from exc

_GGML_LOG_LEVEL_ERROR = 4
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_echo = [False]  # print llama.cpp's log on stderr (the latest loaded model's `ModelOptions.log`)


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace") if text else ""
    if level == _GGML_LOG_LEVEL_ERROR and message.strip():
        _recent_errors.append(message.strip())
    if _echo[0]:
        print(message, end="", flush=True, file=sys.stderr)


@functools.cache
def init() -> None:
    """Install our log callback and initialise llama.cpp's backends (once per process)."""
    ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
    ll.llama_backend_init()


def echo_log(echo: bool) -> None:
    _echo[0] = echo


def clear_errors() -> None:
    """Forget earlier errors: the next `last_error` is about the call that follows."""
    _recent_errors.clear()


def last_error() -> str:
    """The first error logged since `clear_errors`: it names the cause; later ones only say that it failed."""
    return _recent_errors[0] if _recent_errors else "no reason given (set LLAMASPEC_LOG=1 to see its log)"


@functools.cache
def ggml() -> ctypes.CDLL:
    """ggml's C API, for what llama-cpp-python does not bind (libllama's handle also finds ggml's symbols)."""
    return ctypes.CDLL(ll.llama_cpp._lib._name)


_PR_SET_THP_DISABLE = 41


def use_huge_pages(on: bool) -> None:
    """Let this process's memory fault in as transparent huge pages, or keep it on 4 KiB pages
    (PR_SET_THP_DISABLE, which overrides the patched ggml's MADV_HUGEPAGE). Process-wide, and
    it applies to pages touched from now on: set it before a model is loaded. Linux only."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_THP_DISABLE, int(not on), 0, 0, 0)


def check_gguf_file(path: Path) -> None:
    """Reject missing and non-GGUF files before llama.cpp sees them (it would only log)."""
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")
