"""llamaspec: speculative decoding for llama.cpp, driven from Python."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["SpeculativeDecoder", "ModelOptions", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so the numpy-only modules (verify, sampling) import without llama.cpp.
    if name == "SpeculativeDecoder":
        from .decoder import SpeculativeDecoder

        return SpeculativeDecoder
    if name == "ModelOptions":
        from .llama import ModelOptions

        return ModelOptions
    if name == "SamplingParams":
        from .sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)
