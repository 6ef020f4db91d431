"""Helion KDA decode over a (row, value head) grid with a scalar slot index, whole-K slices
and the output stored straight into the caller's ``[B, 1, HV, V]`` tensor. Correct on any
layout the contract accepts; at B = H = HV = K = V = 1 the Triton Helion generates for
CPU is refused by Triton's frontend under the interpreter (a size-1 dimension emitted
with one rank too few): the class of failure that is the CPU path's, never a verdict.
Contract variant ``helion``."""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from kda_fuzz_kernels.kda_decode import validate_packed_decode_inputs


@helion.kernel(static_shapes=True, autotune_effort="none")
def _decode(
    q_all: torch.Tensor,  # [B, H, K]
    k_all: torch.Tensor,  # [B, H, K]
    v_all: torch.Tensor,  # [B, HV, V]
    a: torch.Tensor,  # [B, HV, K]
    b: torch.Tensor,  # [B, HV]
    A_log: torch.Tensor,  # [HV]
    dt_bias: torch.Tensor,  # [HV, K]
    initial_state: torch.Tensor,  # [slots, HV, V, K]
    out: torch.Tensor,  # [B, 1, HV, V]
    ssm_state_indices: torch.Tensor,  # [B]
    scale: float,
    lower_bound: float,
    use_l2norm: hl.constexpr,
    use_lower_bound: hl.constexpr,
) -> None:
    B = q_all.size(0)
    H = hl.specialize(q_all.size(1))
    HV = hl.specialize(initial_state.size(1))
    V = hl.specialize(initial_state.size(2))
    for i, i_hv in hl.grid([B, HV]):
        slot = ssm_state_indices[i]
        i_h = i_hv // (HV // H)
        q = q_all[i, i_h, :].to(torch.float32)
        k = k_all[i, i_h, :].to(torch.float32)
        if use_l2norm:
            q = q * torch.rsqrt(torch.sum(q * q) + 1e-6)
            k = k * torch.rsqrt(torch.sum(k * k) + 1e-6)
        x = a[i, i_hv, :].to(torch.float32) + dt_bias[i_hv, :].to(torch.float32)
        A = torch.exp(A_log[i_hv].to(torch.float32))
        if use_lower_bound:
            gate = lower_bound * torch.sigmoid(A * x)
        else:
            gate = -A * torch.nn.functional.softplus(x)
        beta = torch.sigmoid(b[i, i_hv].to(torch.float32))
        live = slot >= 0
        row = torch.where(live, slot, 0)  # padding rows compute on slot 0, store nothing
        for tile_v in hl.tile(V):
            s = initial_state[row, i_hv, tile_v, :].to(torch.float32)
            s = s * torch.exp(gate)[None, :]
            v = v_all[i, i_hv, tile_v].to(torch.float32)
            r = beta * (v - torch.sum(s * k[None, :], dim=1))
            s = s + r[:, None] * k[None, :]
            o = torch.sum(s * q[None, :], dim=1) * scale
            out[i, 0, i_hv, tile_v] = torch.where(live, o, 0.0).to(out.dtype)
            if live:
                initial_state[row, i_hv, tile_v, :] = s.to(initial_state.dtype)

def decode(
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
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed KDA decode step (validates, splits the packed input, launches)."""
    _, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "helion"
    )
    q, k, v = mixed_qkv.split([H * K, H * K, HV * V], dim=1)
    _decode(q.unflatten(1, (H, K)), k.unflatten(1, (H, K)), v.unflatten(1, (HV, V)),
            a.unflatten(1, (HV, K)), b, A_log, dt_bias.view(HV, K), initial_state, out,
            ssm_state_indices, float(scale), 0.0 if lower_bound is None else float(lower_bound),
            bool(use_qk_l2norm_in_kernel), lower_bound is not None)
    return out, initial_state
