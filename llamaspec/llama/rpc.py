"""A model's layers on llama.cpp `rpc-server` processes (ggml's RPC backend), made safe to use.

llama.cpp's RPC client connects and receives without a time limit and aborts the process on
any failed call (GGML_ABORT in ggml-rpc.cpp). So each server is checked here first, with a
5 s timeout and an RPC HELLO (refused, silent, busy with another client or another protocol
version: LlamaSpecError, process intact); after loading, the model's RPC sockets get
TCP_USER_TIMEOUT and a receive timeout (`ModelOptions.rpc_timeout`), so a vanished host or a
hung server fails instead of hanging; and a ggml abort callback turns llama.cpp's abort on a
lost server into one line on stderr and exit status 1 (or `set_rpc_failure_handler`'s
handler). Nothing can keep the process alive after that: llama.cpp has no way back from a
failed RPC call.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import LlamaSpecError
from .backend import ggml, ll

# The llama.cpp in llama-cpp-python 0.3.36 speaks RPC protocol 7.0 (ggml-rpc.h); HELLO is
# command 14 in every version.
_RPC_PROTO, _RPC_HELLO, _RPC_CAPS = (7, 0), 14, 24
_TCP_USER_TIMEOUT = 18  # linux/tcp.h
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)


@dataclass
class _RpcState:
    """What the process knows about its RPC servers, and the objects llama.cpp keeps pointers to."""

    addresses: dict[str, tuple[str, int]] = field(default_factory=dict)  # every server checked, by name
    timeout: float = 120.0  # the latest placement's receive timeout, for the abort message
    on_failure: Callable[[str], None] | None = None
    abort_callback: object | None = None  # installed once per process
    # The device array and progress callback of the latest load per server list (used while loading).
    loading: dict[str, tuple[object, object]] = field(default_factory=dict)


_state = _RpcState()


def set_rpc_failure_handler(handler: Callable[[str], None] | None) -> None:
    """Call `handler(message)` when llama.cpp aborts on a lost RPC server, instead of exiting
    at once. It runs on the thread whose llama.cpp call failed, which never returns from
    that call: the handler can warn others and replace the process (exec); if it returns,
    the process exits with status 1 as without a handler."""
    _state.on_failure = handler


def place_on_rpc_servers(model_params: ll.llama_model_params, servers: Sequence[str], timeout: float) -> None:
    """Put a model's layers on the servers (a no-op for none).

    Only this model's params name the RPC devices, so other models (the draft) stay local.
    All layers go to the servers, split by their free memory (n_gpu_layers > 0 sends that
    many and keeps the rest local)."""
    if not servers:
        return
    if not ll.llama_supports_rpc():
        raise LlamaSpecError("this llama-cpp-python was built without RPC support; run scripts/build_rpc.sh "
                             "(it rebuilds it with -DGGML_RPC=ON and builds rpc-server)")
    for server in servers:
        _state.addresses[server] = _hello(server)
    _state.timeout = timeout
    _install_abort_callback()
    devices = _rpc_devices(servers)
    array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)  # NULL-terminated
    model_params.devices = ctypes.addressof(array)
    if model_params.n_gpu_layers == 0:
        model_params.n_gpu_layers = -1
    peers = {_state.addresses[s] for s in servers}

    @ll.llama_progress_callback
    def on_progress(progress: float, _user_data: ctypes.c_void_p) -> bool:
        if progress >= 1.0:  # weights are on the servers: the connections exist now
            _guard_sockets(peers, timeout)
        return True

    _state.loading[",".join(servers)] = (array, on_progress)
    model_params.progress_callback = on_progress


def _address(server: str) -> tuple[str, int]:
    """IPv4 only, like llama.cpp (gethostbyname)."""
    host, _, port = server.rpartition(":")
    try:
        return socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][:2]
    except OSError as exc:
        raise LlamaSpecError(f"RPC server {server}: cannot resolve {host!r} ({exc.strerror or exc})") from None


def _hello(server: str) -> tuple[str, int]:
    """The RPC HELLO handshake with a 5 s timeout: the server's address, or one clear error."""
    addr = _address(server)
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
    return addr


def _rpc_devices(servers: Sequence[str]) -> list[int]:
    """Register each server with ggml's RPC backend (it connects) and list its devices."""
    lib = ggml()
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    rpc_reg = lib.ggml_backend_reg_by_name(b"RPC")
    add_server = _ADD_SERVER(lib.ggml_backend_reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server"))
    devices: list[int] = []
    for server in servers:
        reg = add_server(server.encode())
        devices += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg) if reg else 0)]
    if not devices:
        raise LlamaSpecError(f"the RPC servers {','.join(servers)} offer no devices")
    return devices


def _install_abort_callback() -> None:
    if _state.abort_callback is not None:
        return
    lib = ggml()
    lib.ggml_set_abort_callback.restype = ctypes.c_void_p
    lib.ggml_set_abort_callback.argtypes = [_ABORT_CALLBACK]
    _state.abort_callback = _ABORT_CALLBACK(_on_abort)
    lib.ggml_set_abort_callback(_state.abort_callback)


def _on_abort(message: bytes | None) -> None:
    """ggml is about to abort: if a lost RPC server is why, say which, then hand over or exit."""
    text = (message or b"").decode("utf-8", "replace").strip()
    if "ggml-rpc" not in text:  # not ours: llama.cpp's message, then its abort() as before
        os.write(2, text.encode() + b"\n")
        return
    known = sorted(_state.addresses.items())
    down: list[str] = []
    for attempt in range(4):  # a dying server may still listen for a moment after its connection broke
        if attempt:
            time.sleep(0.25)
        for name, addr in known:
            try:
                socket.create_connection(addr, timeout=1.0).close()
            except OSError as exc:
                down.append(f"{name} ({'refused' if isinstance(exc, ConnectionRefusedError) else 'no answer'})")
        if down:
            break
    what = (f"RPC server {', '.join(down)} is gone" if down else
            f"an RPC server ({', '.join(name for name, _ in known)}) stopped answering or the connection broke "
            f"(receive timeout {_state.timeout:g} s)")
    what = f"{what}; llama.cpp: {text.split(': ', 1)[-1]}"
    if _state.on_failure is not None:
        _state.on_failure(what)  # normally does not return (the server restarts itself in place)
    os.write(2, f"error: {what}; it cannot continue after a failed RPC call, so this process exits\n".encode())
    os._exit(1)


def _guard_sockets(peers: set[tuple[str, int]], timeout: float) -> None:
    """TCP_USER_TIMEOUT and SO_RCVTIMEO/SO_SNDTIMEO on this process's sockets to the servers
    (through libc on the raw descriptors: a Python socket object could change their blocking mode)."""
    libc = ctypes.CDLL(None, use_errno=True)
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
        libc.setsockopt(fd, socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, ctypes.byref(user_timeout), 4)
        libc.setsockopt(fd, socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv, len(tv.raw))
        libc.setsockopt(fd, socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv, len(tv.raw))
