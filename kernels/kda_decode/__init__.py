"""Packed KDA decode: validation, torch reference, Helion and Triton kernels.

A plain package (torch, triton and helion, nothing of the fuzzer): it can be copied as it
is. On CPU tensors the Triton kernel needs the Triton interpreter and the Helion kernel a
harness that runs Helion there; kda-fuzz installs its hooks before it calls a target
(``kda_fuzz.execution.cpu.configure_cpu()``, ``KDA_FUZZ_CPU_MODE`` choosing Helion's way).
"""

from importlib import import_module
from typing import Any

from kda_fuzz_kernels.kda_decode.reference import reference_kda_packed_decode
from kda_fuzz_kernels.kda_decode.validate import validate_packed_decode_inputs

# The kernels import triton and helion (seconds); they load on first use, so that the
# reference and the validator (what the fuzzer's oracle needs) stay cheap to import.
_LAZY = {
    "kda_packed_decode": ".dispatch",
    "helion_fused_recurrent_kda_packed_decode": ".helion_kernel",
    "fused_recurrent_kda_packed_decode": ".triton_kernel",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "fused_recurrent_kda_packed_decode",
    "helion_fused_recurrent_kda_packed_decode",
    "kda_packed_decode",
    "reference_kda_packed_decode",
    "validate_packed_decode_inputs",
]
