"""Streaming token bytes as text without breaking multi-byte characters."""

from __future__ import annotations

import codecs
from typing import Callable


class TextStream:
    """Feed token bytes, get the text completed so far; a piece that ends inside a UTF-8
    character is held back until the bytes that complete it arrive."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._token_bytes(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
