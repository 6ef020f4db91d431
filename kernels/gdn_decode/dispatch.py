"""Pick the packed GDN decode kernel for a call: Helion when it can, Triton otherwise."""

from __future__ import annotations

import torch

from kda_fuzz_kernels.gdn_decode.helion_kernel import (
    helion_fused_recurrent_gated_delta_rule_packed_decode,
)
from kda_fuzz_kernels.gdn_decode.triton_kernel import fused_recurrent_gated_delta_rule_packed_decode
from kda_fuzz_kernels.gdn_decode.validate import _is_pow2


def gdn_packed_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed GDN decode step through the Helion kernel or the Triton kernel.

    Helion serves states with power-of-two K and V (``initial_state.shape[-2:]`` is
    ``(V, K)``); everything else, malformed layouts included, goes to Triton. With
    power-of-two K and V the Helion-only check passes, so both routes raise the same
    contract error, and this entry point never raises the power-of-two error.
    """
    shape = initial_state.shape
    use_helion = initial_state.ndim >= 2 and _is_pow2(shape[-1]) and _is_pow2(shape[-2])
    kernel = (
        helion_fused_recurrent_gated_delta_rule_packed_decode
        if use_helion
        else fused_recurrent_gated_delta_rule_packed_decode
    )
    return kernel(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                  ssm_state_indices, use_qk_l2norm_in_kernel)
