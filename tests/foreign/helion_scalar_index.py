"""Helion KDA decode in the scalar-index style: ``idx = ssm_state_indices[i]`` loaded as a
scalar, K offsets from ``hl.arange(K)`` and the pool indexed as
``initial_state[idx, i_hv, tile_v.index, k_offsets]``. Contract variant ``helion``."""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from kda_fuzz_kernels.kda_decode import validate_packed_decode_inputs


@helion.kernel(static_shapes=True, autotune_effort="none")
def _decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    scale: float,
    lower_bound: float,
    H: hl.constexpr,
    use_l2norm: hl.constexpr,
    use_lower_bound: hl.constexpr,
) -> None:
    B = mixed_qkv.size(0)
    HV = hl.specialize(initial_state.size(1))
    V = hl.specialize(initial_state.size(2))
    K = hl.specialize(initial_state.size(3))
    for i, i_hv in hl.grid([B, HV]):
        i_h = i_hv // (HV // H)
        k_offsets = hl.arange(K)
        idx = ssm_state_indices[i]
        q = mixed_qkv[i, i_h * K + k_offsets].to(torch.float32)
        k = mixed_qkv[i, H * K + i_h * K + k_offsets].to(torch.float32)
        if use_l2norm:
            q = q * torch.rsqrt(torch.sum(q * q) + 1e-6)
            k = k * torch.rsqrt(torch.sum(k * k) + 1e-6)
        x = a[i, i_hv * K + k_offsets].to(torch.float32) + dt_bias[i_hv * K + k_offsets]
        A = torch.exp(A_log[i_hv].to(torch.float32))
        if use_lower_bound:
            g = lower_bound * torch.sigmoid(A * x)
        else:
            g = -A * torch.nn.functional.softplus(x)
        beta = torch.sigmoid(b[i, i_hv].to(torch.float32))
        for tile_v in hl.tile(V):
            v = mixed_qkv[i, 2 * H * K + i_hv * V + tile_v.index].to(torch.float32)
            if idx >= 0:
                s = initial_state[idx, i_hv, tile_v.index, k_offsets].to(torch.float32)
                s = s * torch.exp(g)[None, :]
                r = beta * (v - torch.sum(s * k[None, :], dim=1))
                s = s + r[:, None] * k[None, :]
                o = torch.sum(s * q[None, :], dim=1) * scale
                out[i, 0, i_hv, tile_v] = o.to(out.dtype)
                initial_state[idx, i_hv, tile_v.index, k_offsets] = s.to(initial_state.dtype)
            else:
                out[i, 0, i_hv, tile_v] = hl.zeros([tile_v], dtype=out.dtype)


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
    """One packed KDA decode step (validates, then launches the Helion kernel)."""
    _, H, _, _, _ = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "helion"
    )
    _decode(mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices,
            float(scale), 0.0 if lower_bound is None else float(lower_bound),
            H, bool(use_qk_l2norm_in_kernel), lower_bound is not None)
    return out, initial_state
