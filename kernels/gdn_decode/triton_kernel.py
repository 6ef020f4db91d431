"""Packed GDN decode step as a hand-written Triton kernel (contract variant ``triton``).

One program per (batch row, value head, block of V) holds a ``[BV, BK]`` tile of the
V-major state; K and V are masked up to the next power of two, so any positive K and V
are accepted. The gate is one scalar per (row, value head). Math in float32; every
operand is addressed through the caller's strides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kda_fuzz_kernels.gdn_decode.validate import validate_gdn_packed_decode_inputs
from kda_fuzz_kernels.kda_decode.staging import stage_bf16_outputs


@triton.jit
def _gdn_packed_decode_kernel(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    state,
    out,
    indices,
    num_slots,
    scale,
    stride_qkv,
    stride_a,
    stride_b,
    stride_idx,
    stride_s0,
    stride_s1,
    stride_s2,
    stride_s3,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_L2NORM: tl.constexpr,
):
    pid_row_head = tl.program_id(0)
    pid_v = tl.program_id(1)
    row_id = (pid_row_head // HV).to(tl.int64)
    hv = pid_row_head % HV
    h = hv // (HV // H)

    # A negative index is a padding row; an index past the pool (not covered by the
    # contract) is treated alike. Neither is ever dereferenced: state accesses are masked.
    slot = tl.load(indices + row_id * stride_idx).to(tl.int64)
    live = (slot >= 0) & (slot < num_slots)
    slot = tl.where(live, slot, 0)

    offs_k = tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_k = offs_k < K
    mask_v = offs_v < V

    base = mixed_qkv + row_id * stride_qkv
    q = tl.load(base + h * K + offs_k, mask=mask_k, other=0).to(tl.float32)
    k = tl.load(base + (H + h) * K + offs_k, mask=mask_k, other=0).to(tl.float32)
    v = tl.load(base + 2 * H * K + hv * V + offs_v, mask=mask_v, other=0).to(tl.float32)
    if USE_L2NORM:
        q = q / tl.sqrt(tl.sum(q * q) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)

    # scalar gate of this value head; softplus thresholded at 20, exp never overflows
    x = tl.load(a + row_id * stride_a + hv).to(tl.float32) + tl.load(dt_bias + hv).to(tl.float32)
    softplus = tl.where(x <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))), x)
    decay = tl.exp(-tl.exp(tl.load(A_log + hv).to(tl.float32)) * softplus)
    beta = tl.sigmoid(tl.load(b + row_id * stride_b + hv).to(tl.float32))

    p_state = (
        state
        + slot * stride_s0
        + hv * stride_s1
        + offs_v[:, None] * stride_s2
        + offs_k[None, :] * stride_s3
    )
    # a dead row's state mask is all false through the V bound: `mask & live` with a scalar
    # `live` turns into 0/1 integers under the interpreter, which triton 3.9 loads refuse
    mask_s = (offs_v[:, None] < tl.where(live, V, 0)) & mask_k[None, :]
    s = tl.load(p_state, mask=mask_s, other=0).to(tl.float32) * decay
    delta = beta * (v - tl.sum(s * k[None, :], axis=1))
    s += delta[:, None] * k[None, :]
    o = tl.sum(s * q[None, :], axis=1) * scale
    o = tl.where(live, o, 0.0)

    tl.store(out + (row_id * HV + hv) * V + offs_v, o.to(out.dtype.element_ty), mask=mask_v)
    tl.store(p_state, s.to(state.dtype.element_ty), mask=mask_s)


def fused_recurrent_gated_delta_rule_packed_decode(
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
    """One packed GDN decode step; updates ``initial_state`` and ``out`` in place.

    Returns the caller's own ``(out, initial_state)``.
    """
    B, H, HV, K, V = validate_gdn_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "triton"
    )
    if B == 0:
        return out, initial_state
    interpret = mixed_qkv.device.type == "cpu"  # (runs under the Triton interpreter)
    BK = triton.next_power_of_2(K)
    # CPU: the whole of V in one program. GPU: [BV, BK] tiles of about 2048 elements,
    # one warp each (the KDA kernel's measured sweet spot; the state traffic is the same).
    if interpret:
        BV, num_warps = triton.next_power_of_2(V), 4
    else:
        BV = min(triton.next_power_of_2(V), max(1, 2048 // BK))
        num_warps = 1 if BK * BV <= 2048 else 4
    grid = (B * HV, triton.cdiv(V, BV))
    with stage_bf16_outputs(out, initial_state, ssm_state_indices, interpret) as (out_k, state_k):
        _gdn_packed_decode_kernel[grid](
            mixed_qkv,
            a,
            b,
            A_log,
            dt_bias,
            state_k,
            out_k,
            ssm_state_indices,
            initial_state.shape[0],
            float(scale),
            mixed_qkv.stride(0),
            a.stride(0),
            b.stride(0),
            ssm_state_indices.stride(0),
            *state_k.stride(),
            H=H,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BV=BV,
            USE_L2NORM=bool(use_qk_l2norm_in_kernel),
            num_warps=num_warps,
        )
    return out, initial_state
