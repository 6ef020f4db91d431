"""Helion KDA decode over pre-split views with a scalar slot index and whole-K slices:
``s = initial_state[idx, i_hv, tile_v, :]`` with ``idx = ssm_state_indices[i]``,
softplus written with ``torch.where``. Contract variant ``helion``."""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from kda_fuzz_kernels.kda_decode import validate_packed_decode_inputs


@helion.kernel(static_shapes=True, config=helion.Config(block_sizes=[4], num_warps=4))
def _decode(
    q_all: torch.Tensor,  # [B, H, K]
    k_all: torch.Tensor,  # [B, H, K]
    v_all: torch.Tensor,  # [B, HV, V]
    a: torch.Tensor,  # [B, HV, K]
    b: torch.Tensor,  # [B, HV]
    A_log: torch.Tensor,  # [HV]
    dt_bias: torch.Tensor,  # [HV, K]
    initial_state: torch.Tensor,  # [slots, HV, V, K]
    out: torch.Tensor,  # [B, HV, V]
    ssm_state_indices: torch.Tensor,  # [B]
    scale: float,
    lower_bound: float,
    use_l2norm: hl.constexpr,
    use_lower_bound: hl.constexpr,
) -> None:
    B, HV, V = out.shape
    H = q_all.size(1)
    for i, i_hv in hl.grid([B, HV]):
        i_h = i_hv // (HV // H)
        idx = ssm_state_indices[i]
        q = q_all[i, i_h, :].to(torch.float32)
        k = k_all[i, i_h, :].to(torch.float32)
        if use_l2norm:
            q = q / torch.sqrt(torch.sum(q * q, dim=-1) + 1e-6)
            k = k / torch.sqrt(torch.sum(k * k, dim=-1) + 1e-6)
        x = a[i, i_hv, :].to(torch.float32) + dt_bias[i_hv, :].to(torch.float32)
        A = torch.exp(A_log[i_hv].to(torch.float32))
        if use_lower_bound:
            g = lower_bound * torch.sigmoid(A * x)
        else:
            x_small = torch.where(x > 20.0, 20.0, x)
            softplus = torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x_small)))
            g = -A * softplus
        decay = torch.exp(g)
        beta = torch.sigmoid(b[i, i_hv].to(torch.float32))
        for tile_v in hl.tile(V):
            if idx < 0:
                out[i, i_hv, tile_v] = hl.zeros([tile_v], dtype=out.dtype)
            else:
                s = initial_state[idx, i_hv, tile_v, :].to(torch.float32) * decay[None, :]
                v = v_all[i, i_hv, tile_v].to(torch.float32)
                r = beta * (v - torch.sum(s * k[None, :], dim=-1))
                s = s + r[:, None] * k[None, :]
                out[i, i_hv, tile_v] = (torch.sum(s * q[None, :], dim=-1) * scale).to(out.dtype)
                initial_state[idx, i_hv, tile_v, :] = s.to(initial_state.dtype)


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
    B, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "helion"
    )
    q, k, v = mixed_qkv.split([H * K, H * K, HV * V], dim=1)
    _decode(q.unflatten(1, (H, K)), k.unflatten(1, (H, K)), v.unflatten(1, (HV, V)),
            a.unflatten(1, (HV, K)), b, A_log, dt_bias.view(HV, K), initial_state,
            out.view(B, HV, V), ssm_state_indices, float(scale),
            0.0 if lower_bound is None else float(lower_bound),
            bool(use_qk_l2norm_in_kernel), lower_bound is not None)
    return out, initial_state
