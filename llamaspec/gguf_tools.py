"""GGUF surgery with the `gguf` package: layer-truncated, vocabulary-trimmed and random copies.

Keeping the first N transformer blocks of a model gives a draft with the target's exact
vocabulary that agrees with it often but not always: the fixture rollback tests need.
Keeping only some tokens gives a draft with a cheaper output head (see trim.py).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import LlamaSpecError

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _copy_metadata(reader, writer, value_of: Callable[[Any], object]) -> None:
    """Every key-value field of `reader` into `writer`, with the value `value_of(field)` gives
    (the architecture and GGUF.* fields are written by GGUFWriter itself)."""
    import gguf

    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value_of(field), value_type, sub_type=sub_type)


def truncate_layers(source: str | Path, destination: str | Path, n_layers: int) -> Path:
    """Write `destination`: `source` with only blocks 0..n_layers-1 and block_count fixed."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    block_count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    n_blocks = int(reader.fields[block_count_key].contents())
    if not 1 <= n_layers <= n_blocks:
        raise LlamaSpecError(f"{source} has {n_blocks} blocks; cannot keep {n_layers}")
    writer = gguf.GGUFWriter(str(destination), arch, endianess=reader.endianess)

    def value_of(field) -> object:
        value = n_layers if field.name == block_count_key else field.contents()
        if field.types[0] == gguf.GGUFValueType.ARRAY and isinstance(value, list) and len(value) == n_blocks:
            value = value[:n_layers]  # per-layer settings (head counts, window pattern)
        return value

    _copy_metadata(reader, writer, value_of)
    kept = [t for t in reader.tensors if not ((m := _BLOCK.match(t.name)) and int(m.group(1)) >= n_layers)]
    _write_tensors(writer, [(t.name, t.data, t.tensor_type) for t in kept], reader.endianess)
    return Path(destination)


def _write_tensors(writer, tensors: list[tuple[str, Any, Any]], endianess) -> None:
    """Finish `writer` with (name, data as the reader gives it, GGML type) tensors, raw bytes
    kept as they are (quantized rows are whole blocks, so slicing rows keeps them valid)."""
    for name, data, tensor_type in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data, tensor_endianess=endianess)
    writer.close()


_TOKENS = "tokenizer.ggml.tokens"
_VOCAB_TENSORS = ("token_embd.weight", "output.weight")  # one row per token


def always_kept(source: str | Path) -> np.ndarray:
    """Token ids a trimmed vocabulary must keep so the tokenizer still loads and works: every
    non-normal token (control, user-defined, byte), every single-character token (the byte
    alphabet of byte-level BPE), and every id a *_token_id key names."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    texts = reader.fields[_TOKENS].contents()
    keep = {i for i, text in enumerate(texts) if len(text) == 1}
    if "tokenizer.ggml.token_type" in reader.fields:
        types = reader.fields["tokenizer.ggml.token_type"].contents()
        keep |= {i for i, kind in enumerate(types) if kind != gguf.TokenType.NORMAL}
    keep |= {int(f.contents()) for name, f in reader.fields.items()
             if name.startswith("tokenizer.ggml.") and name.endswith("_token_id")}
    return np.array(sorted(t for t in keep if 0 <= t < len(texts)), dtype=np.int64)


def trim_vocab(source: str | Path, destination: str | Path, keep: np.ndarray, extra: dict[str, str]) -> None:
    """Write `destination`: `source` with only the `keep` tokens (ascending ids), renumbered
    0..len(keep)-1: tokenizer arrays, embedding/output rows and special-token ids; plus the
    `extra` string metadata."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    n_vocab = len(reader.fields[_TOKENS].data)
    local = np.full(n_vocab, -1, dtype=np.int64)
    local[keep] = np.arange(len(keep))

    def value_of(field) -> object:
        value = field.contents()
        if not field.name.startswith("tokenizer.ggml."):
            return value
        if field.types[0] == gguf.GGUFValueType.ARRAY and len(field.data) == n_vocab:
            return [value[i] for i in keep]
        if field.name.endswith("_token_id") and 0 <= value < n_vocab:  # else unset (-1 as uint32)
            if local[value] < 0:
                raise LlamaSpecError(f"{field.name} = {value} is not among the kept tokens")
            return int(local[value])
        return value

    writer = gguf.GGUFWriter(str(destination), arch, endianess=reader.endianess)
    _copy_metadata(reader, writer, value_of)
    for key, text in extra.items():
        writer.add_string(key, text)
    _write_tensors(writer, [(t.name, t.data[keep] if t.name in _VOCAB_TENSORS else t.data, t.tensor_type)
                            for t in reader.tensors], reader.endianess)


def write_token_table(source: str | Path, destination: str | Path, tensor: str, ids: np.ndarray,
                      ids_key: str) -> None:
    """Write `destination`: `source`'s full `tensor` (one row per token) and token texts, plus
    `ids` under `ids_key`: what a trimmed draft needs to read, and to be checked by, every token."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    table = next((t for t in reader.tensors if t.name == tensor), None)
    if table is None:
        raise LlamaSpecError(f"{source} has no {tensor} tensor")
    writer = gguf.GGUFWriter(str(destination), "llamaspec-token-table", endianess=reader.endianess)
    writer.add_array(ids_key, [int(i) for i in ids])
    writer.add_key_value(_TOKENS, reader.fields[_TOKENS].contents(), gguf.GGUFValueType.ARRAY,
                         sub_type=gguf.GGUFValueType.STRING)
    _write_tensors(writer, [(table.name, table.data, table.tensor_type)], reader.endianess)


# GGUF value types (gguf.GGUFValueType) of a fixed size: their struct format (numpy reads the same)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# tensor types numpy reads as numbers (as gguf.GGUFReader gives them); other types: raw bytes
_NUMERIC = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


def read_token_table(path: str | Path, tensor: str) -> tuple[dict[str, Any], np.ndarray, int]:
    """A token table written by `write_token_table`: its metadata (arrays as numpy arrays,
    strings as bytes, string arrays as lists of bytes), `tensor`'s rows (a read-only map of the
    file: one row per token, raw bytes for quantized types) and its GGML type.

    Why not gguf.GGUFReader: it makes a numpy view per string, and a vocabulary's 152K token
    texts took it 3-6 s, at every start of a trimmed draft. Here: a tenth of a second."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except ValueError as exc:  # an empty file
        raise ValueError(f"{Path(path).name}: {exc}") from None
    buf = memoryview(data)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return value

    def text() -> bytes:
        nonlocal pos
        n = take("<Q")
        pos += n
        return bytes(buf[pos - n: pos])

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == _STRING:
            return text()
        if kind == _ARRAY:
            item, n = take("<I"), take("<Q")
            if item == _STRING:
                return [text() for _ in range(n)]
            array = np.frombuffer(buf, np.dtype(_SCALARS[item]), n, pos).copy()
            pos += array.nbytes
            return array
        return take(_SCALARS[kind])

    try:
        if bytes(buf[:4]) != b"GGUF" or take("<4xI") not in (2, 3):
            raise ValueError("not a little-endian GGUF file of version 2 or 3")
        n_tensors, n_kv = take("<Q"), take("<Q")
        fields = {text().decode(): value(take("<I")) for _ in range(n_kv)}
        infos = {}
        for _ in range(n_tensors):
            name = text().decode()
            dims = [take("<Q") for _ in range(take("<I"))]
            infos[name] = dims, take("<I"), take("<Q")
        alignment = int(fields.get("general.alignment", 32))
        start = -(-pos // alignment) * alignment
        dims, kind, offset = infos[tensor]
        rows, width = int(np.prod(dims[1:])), dims[0]
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        raw = data[start + offset: start + offset + rows * (width // block) * size]
        table = raw.view(_NUMERIC[kind]).reshape(rows, width) if kind in _NUMERIC else raw.reshape(rows, -1)
    except (struct.error, KeyError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"{Path(path).name}: {exc}") from None
    return fields, table, kind


def random_llama(source: str | Path, destination: str | Path, n_embd: int = 256, n_ff: int = 512,
                 n_layers: int = 2, seed: int = 0) -> Path:
    """Write `destination`: a llama model with `source`'s tokenizer and random F32 weights of
    the given widths. Why: the tiny shipped models are 64 wide, too narrow for the 256-wide
    K-quant blocks; quantized, this exercises every kernel type on every matmul."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    if arch != "llama":
        raise LlamaSpecError(f"{source} is {arch}; random_llama needs a llama-architecture source")
    n_head = int(reader.fields[f"{arch}.attention.head_count"].contents())
    n_head_kv = int(reader.fields[f"{arch}.attention.head_count_kv"].contents())
    n_vocab = next(t for t in reader.tensors if t.name == "token_embd.weight").data.shape[0]
    head_dim = n_embd // n_head
    sizes = {f"{arch}.embedding_length": n_embd, f"{arch}.feed_forward_length": n_ff,
             f"{arch}.block_count": n_layers, f"{arch}.rope.dimension_count": head_dim}
    writer = gguf.GGUFWriter(str(destination), arch, endianess=reader.endianess)
    _copy_metadata(reader, writer, lambda field: sizes.get(field.name, field.contents()))
    rng = np.random.default_rng(seed)
    # numpy shapes are (rows, row length): GGUF's (ne1, ne0)
    shapes = {"token_embd.weight": (n_vocab, n_embd), "output_norm.weight": (n_embd,),
              "output.weight": (n_vocab, n_embd)}
    for layer in range(n_layers):
        shapes |= {f"blk.{layer}.attn_norm.weight": (n_embd,), f"blk.{layer}.ffn_norm.weight": (n_embd,),
                   f"blk.{layer}.attn_q.weight": (n_embd, n_embd),
                   f"blk.{layer}.attn_k.weight": (n_head_kv * head_dim, n_embd),
                   f"blk.{layer}.attn_v.weight": (n_head_kv * head_dim, n_embd),
                   f"blk.{layer}.attn_output.weight": (n_embd, n_embd),
                   f"blk.{layer}.ffn_gate.weight": (n_ff, n_embd), f"blk.{layer}.ffn_up.weight": (n_ff, n_embd),
                   f"blk.{layer}.ffn_down.weight": (n_embd, n_ff)}
    for name, shape in shapes.items():
        if len(shape) == 1:
            data = np.ones(shape, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(destination)
