"""The binding to llama.cpp: the only package that uses ctypes and frees C memory.

`model.Model` owns the C objects of one loaded model; `options.ModelOptions` says how to load
it; `rpc` places a model's layers on rpc-servers; `tools` re-quantizes and reports the build;
`backend` holds what llama.cpp keeps per process (its log, its initialisation).
"""

from .model import Model
from .options import ModelOptions
from .rpc import set_rpc_failure_handler
from .tools import (HEAD_TYPES, QUANT_TYPES, Multirow, batch1_kernel_choice, build_id, cpu_kernel_settings,
                    cpu_kernels, other_batch1_kernels, quantize, set_cpu_kernels, system_info)

__all__ = ["HEAD_TYPES", "QUANT_TYPES", "Model", "ModelOptions", "Multirow", "batch1_kernel_choice", "build_id",
           "cpu_kernel_settings", "cpu_kernels", "other_batch1_kernels", "quantize", "set_cpu_kernels",
           "set_rpc_failure_handler", "system_info"]
