"""Packed GDN (gated delta rule) decode: validation, torch reference, Helion and Triton
kernels. The sibling of ``kda_fuzz_kernels.kda_decode`` (spec section 3, last paragraph),
a plain package like it (it runs on CPU tensors the same way).
"""

from importlib import import_module
from typing import Any

from kda_fuzz_kernels.gdn_decode.reference import gdn_decode_terms, reference_gdn_packed_decode
from kda_fuzz_kernels.gdn_decode.validate import validate_gdn_packed_decode_inputs

# The kernels import triton and helion (seconds); they load on first use, so that the
# reference and the validator stay cheap to import. The short names are aliases.
_LAZY = {
    "gdn_packed_decode": (".dispatch", "gdn_packed_decode"),
    "helion_fused_recurrent_gated_delta_rule_packed_decode": (
        ".helion_kernel", "helion_fused_recurrent_gated_delta_rule_packed_decode"),
    "fused_recurrent_gated_delta_rule_packed_decode": (
        ".triton_kernel", "fused_recurrent_gated_delta_rule_packed_decode"),
    "helion_gdn_packed_decode": (
        ".helion_kernel", "helion_fused_recurrent_gated_delta_rule_packed_decode"),
    "triton_gdn_packed_decode": (
        ".triton_kernel", "fused_recurrent_gated_delta_rule_packed_decode"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(import_module(module, __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "fused_recurrent_gated_delta_rule_packed_decode",
    "gdn_decode_terms",
    "gdn_packed_decode",
    "helion_fused_recurrent_gated_delta_rule_packed_decode",
    "helion_gdn_packed_decode",
    "reference_gdn_packed_decode",
    "triton_gdn_packed_decode",
    "validate_gdn_packed_decode_inputs",
]
