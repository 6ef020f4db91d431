"""A Helion KDA decode (contract variant ``helion``) that is right under its default config
and wrong under some others: a V tile narrower than 4 lanes (and than V) skips the state
write-back, as a store path written for 4-wide tiles would. Helion's default config tiles V
by min(V, 32), so only another config (block_sizes [1] or [2], ``--helion-configs``) shows
it. No config is given: on CPU the kernel runs Helion's default config."""

from __future__ import annotations

import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import RefMode

from kda_fuzz_kernels.kda_decode import validate_packed_decode_inputs


@helion.kernel(static_shapes=True, ref_mode=RefMode.OFF)
def _decode(q_all: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, a: torch.Tensor,
            b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
            initial_state: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor,
            scale: float, lower_bound: float, use_l2norm: hl.constexpr,
            use_lower_bound: hl.constexpr) -> None:
    B, HV, V = out.shape
    H = q_all.size(1)
    for i, i_hv in hl.grid([B, HV]):
        idx = ssm_state_indices[i]
        q = q_all[i, i_hv // (HV // H), :].to(torch.float32)
        k = k_all[i, i_hv // (HV // H), :].to(torch.float32)
        if use_l2norm:
            q = q / torch.sqrt(torch.sum(q * q, dim=-1) + 1e-6)
            k = k / torch.sqrt(torch.sum(k * k, dim=-1) + 1e-6)
        x = a[i, i_hv, :].to(torch.float32) + dt_bias[i_hv, :].to(torch.float32)
        A = torch.exp(A_log[i_hv].to(torch.float32))
        if use_lower_bound:
            g = lower_bound * torch.sigmoid(A * x)
        else:
            x_small = torch.where(x > 20.0, 20.0, x)
            g = -A * torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x_small)))
        beta = torch.sigmoid(b[i, i_hv].to(torch.float32))
        for tile_v in hl.tile(V):
            if idx < 0:
                out[i, i_hv, tile_v] = hl.zeros([tile_v], dtype=out.dtype)
            else:
                s = initial_state[idx, i_hv, tile_v, :].to(torch.float32) * torch.exp(g)[None, :]
                v = v_all[i, i_hv, tile_v].to(torch.float32)
                r = beta * (v - torch.sum(s * k[None, :], dim=-1))
                s = s + r[:, None] * k[None, :]
                out[i, i_hv, tile_v] = (torch.sum(s * q[None, :], dim=-1) * scale).to(out.dtype)
                if tile_v.block_size >= 4 or tile_v.block_size >= V:  # the planted bug
                    initial_state[idx, i_hv, tile_v, :] = s.to(initial_state.dtype)


def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
           use_qk_l2norm_in_kernel=False, lower_bound=None):
    """One packed KDA decode step (validates, splits the packed input, launches)."""
    B, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "helion")
    q, k, v = mixed_qkv.split([H * K, H * K, HV * V], dim=1)
    _decode(q.unflatten(1, (H, K)), k.unflatten(1, (H, K)), v.unflatten(1, (HV, V)),
            a.unflatten(1, (HV, K)), b, A_log, dt_bias.view(HV, K), initial_state,
            out.view(B, HV, V), ssm_state_indices, float(scale),
            0.0 if lower_bound is None else float(lower_bound),
            bool(use_qk_l2norm_in_kernel), lower_bound is not None)
    return out, initial_state
