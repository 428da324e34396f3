"""How a model is loaded and its context sized: one frozen value shared by target and draft.

Settings that used to be read from the environment deep inside the binding are fields here,
with the environment variable as their default, so a caller can see and set all of them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Literal

from ..errors import LlamaSpecError
from .backend import ll

FlashAttn = Literal["auto", "on", "off"]
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequences one context holds

FLASH_ATTN = {
    "auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def _env_timeout() -> float:
    return float(os.environ.get("LLAMASPEC_RPC_TIMEOUT") or 120)


def _env_flag(name: str) -> Callable[[], bool]:
    """A field default: whether the environment variable is set (non-empty)."""
    return lambda: bool(os.environ.get(name))


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
    rpc_timeout: float = field(default_factory=_env_timeout)
    log: bool = field(default_factory=_env_flag("LLAMASPEC_LOG"))  # echo llama.cpp's own log on stderr
    # Map the GGUF as llama.cpp does (shared page cache; a model larger than free memory can
    # still run) instead of reading it onto huge pages ($LLAMASPEC_MMAP).
    mmap: bool = field(default_factory=_env_flag("LLAMASPEC_MMAP"))
    # Put the weights and buffers on transparent huge pages (cpp_patches/0004; Linux). A
    # decode, which streams every weight, runs about 7 % faster on them, but a VM that hands
    # free memory back to its host faults them in slowly: on the Firecracker VM of RESULTS.md
    # the Qwen 1.5B Q4_K_M target loads in 8.4 s on huge pages against 1.5 s on 4 KiB pages.
    # Worth it for long runs (serve, bench); not for one answer. Process-wide: the last
    # model loaded sets it (Model.__init__).
    huge_pages: bool = False
    # Compute every graph node alone and time it (`Model.op_timer`; profile.py): slower, for
    # the per-operation breakdown of `scripts/kernel_bench.py --by-type` only.
    profile_ops: bool = False

    @property
    def on_this_cpu(self) -> bool:
        """Every layer on this process's CPU backend: where the patched CPU kernels run."""
        return self.n_gpu_layers == 0 and not self.rpc_servers

    @property
    def reads_weights(self) -> bool:
        """Read the GGUF into memory instead of mapping it (Linux, CPU, huge pages). Why: the
        patched ggml puts large buffers on transparent huge pages, while the pages of a mapped
        file stay 4 KiB."""
        return self.on_this_cpu and sys.platform.startswith("linux") and self.huge_pages and not self.mmap

    def __post_init__(self) -> None:
        if self.n_ctx < 8:
            raise LlamaSpecError(f"context size must be at least 8, got {self.n_ctx}")
        if self.n_threads < 1:
            raise LlamaSpecError(f"threads must be at least 1, got {self.n_threads}")
        if self.n_batch < 1:
            raise LlamaSpecError(f"batch size must be at least 1, got {self.n_batch}")
        if not 1 <= self.n_seq <= MAX_SEQUENCES:
            raise LlamaSpecError(f"parallel sequences must be between 1 and {MAX_SEQUENCES}, got {self.n_seq}")
        if self.flash_attn not in FLASH_ATTN:
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
