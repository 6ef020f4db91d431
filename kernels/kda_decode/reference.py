"""Vectorised torch reference of one packed KDA decode step (spec section 3)."""

from __future__ import annotations

import torch

from .validate import validate_packed_decode_inputs

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6


def reference_kda_packed_decode(
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
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the decode step in torch (``compute_dtype`` math, float64 for the oracle).

    Validates with the triton variant, so any positive K and V is accepted. Writes
    ``out`` and the named state slots in place and returns the caller's objects.
    """
    _, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "triton"
    )
    cd = compute_dtype
    idx = ssm_state_indices.to(torch.long)
    rows = (idx >= 0).nonzero().squeeze(1)
    slots = idx[rows]
    R = rows.numel()

    qkv = mixed_qkv[rows].to(cd)
    q = qkv[:, : H * K].reshape(R, H, K).repeat_interleave(HV // H, dim=1)
    k = qkv[:, H * K : 2 * H * K].reshape(R, H, K).repeat_interleave(HV // H, dim=1)
    v = qkv[:, 2 * H * K : 2 * H * K + HV * V].reshape(R, HV, V)
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)

    x = a[rows].to(cd).reshape(R, HV, K) + dt_bias.to(cd).reshape(HV, K)
    A = torch.exp(A_log.to(cd)).reshape(HV, 1)
    if lower_bound is None:
        softplus = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
        g = -A * softplus
    else:
        g = lower_bound * torch.sigmoid(A * x)
    beta = torch.sigmoid(b[rows].to(cd))

    S = initial_state[slots].to(cd) * torch.exp(g).unsqueeze(2)  # [R, HV, V, K]
    r = beta.unsqueeze(-1) * (v - torch.einsum("rhvk,rhk->rhv", S, k))
    S = S + r.unsqueeze(-1) * k.unsqueeze(2)
    o = torch.einsum("rhvk,rhk->rhv", S, q) * scale

    out.zero_()
    out[rows, 0] = o.to(out.dtype)
    initial_state[slots] = S.to(initial_state.dtype)
    return out, initial_state
