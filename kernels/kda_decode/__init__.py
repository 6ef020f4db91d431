"""Packed KDA decode: validation, torch reference, Helion and Triton kernels.

CPU execution (no GPU) is selected by ``KDA_FUZZ_CPU_MODE``; see ``_execution``.
``configure_cpu()`` runs here, before any kernel module is imported, so that
``TRITON_INTERPRET=1`` is exported on machines without CUDA (our own kernels do not need
it, third-party Triton kernels imported later do).
"""

from importlib import import_module
from typing import Any

from kda_fuzz.execution.cpu import CPU_MODES, configure_cpu, cpu_mode

configure_cpu()

from kda_fuzz_kernels.kda_decode.reference import reference_kda_packed_decode  # noqa: E402
from kda_fuzz_kernels.kda_decode.validate import validate_packed_decode_inputs  # noqa: E402

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
    "CPU_MODES",
    "configure_cpu",
    "cpu_mode",
    "fused_recurrent_kda_packed_decode",
    "helion_fused_recurrent_kda_packed_decode",
    "kda_packed_decode",
    "reference_kda_packed_decode",
    "validate_packed_decode_inputs",
]
