"""GGUF surgery with the `gguf` package: a layer-truncated copy of a model.

Keeping the first N transformer blocks of a model gives a draft with the target's exact
vocabulary that agrees with it often but not always: the fixture rollback tests need.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import LlamaSpecError

_BLOCK = re.compile(r"^blk\.(\d+)\.")


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
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        value = n_layers if field.name == block_count_key else field.contents()
        if value_type == gguf.GGUFValueType.ARRAY and isinstance(value, list) and len(value) == n_blocks:
            value = value[:n_layers]  # per-layer settings (head counts, window pattern)
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
    kept = [t for t in reader.tensors if not ((m := _BLOCK.match(t.name)) and int(m.group(1)) >= n_layers)]
    for tensor in kept:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                               tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return Path(destination)
