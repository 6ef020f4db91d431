"""Packed KDA decode: validation, torch reference, Helion and Triton kernels.

CPU execution (no GPU) is selected by ``KDA_FUZZ_CPU_MODE``; see ``_execution``.
``configure_cpu()`` runs here, before any kernel module is imported, so that
``TRITON_INTERPRET=1`` is exported on machines without CUDA (our own kernels do not need
it, third-party Triton kernels imported later do).
"""

from ._execution import CPU_MODES, configure_cpu, cpu_mode

configure_cpu()

from .dispatch import kda_packed_decode  # noqa: E402
from .helion_kernel import helion_fused_recurrent_kda_packed_decode  # noqa: E402
from .reference import reference_kda_packed_decode  # noqa: E402
from .triton_kernel import fused_recurrent_kda_packed_decode  # noqa: E402
from .validate import validate_packed_decode_inputs  # noqa: E402

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
