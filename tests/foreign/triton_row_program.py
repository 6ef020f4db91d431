"""Triton KDA decode with one program per (row, value head) looping over BV tiles of V:
the slot index is a scalar ``tl.load``, the softplus uses ``libdevice.log1p`` and the
norms ``tl.math.rsqrt``. K and V are masked to powers of two. Contract variant ``triton``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kda_fuzz_kernels.kda_decode import validate_packed_decode_inputs


@triton.jit
def _decode_kernel(
    qkv, a, b, A_log, dt_bias, state, out, indices,
    scale, lower_bound, s_qkv, s_a, s_b, s_slot, s_head, s_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, LOWER_BOUND: tl.constexpr,
):
    pid = tl.program_id(0)
    i = pid // HV
    hv = pid % HV
    h = hv // (HV // H)
    idx = tl.load(indices + i).to(tl.int64)
    ok = tl.arange(0, BK)
    mk = ok < K
    q = tl.load(qkv + i * s_qkv + h * K + ok, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(qkv + i * s_qkv + (H + h) * K + ok, mask=mk, other=0.0).to(tl.float32)
    if L2NORM:
        q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    x = tl.load(a + i * s_a + hv * K + ok, mask=mk, other=0.0).to(tl.float32)
    x = x + tl.load(dt_bias + hv * K + ok, mask=mk, other=0.0).to(tl.float32)
    A = tl.exp(tl.load(A_log + hv).to(tl.float32))
    if LOWER_BOUND:
        g = lower_bound * tl.sigmoid(A * x)
    else:
        g = -A * tl.where(x > 20.0, x, libdevice.log1p(tl.exp(tl.minimum(x, 20.0))))
    beta = tl.sigmoid(tl.load(b + i * s_b + hv).to(tl.float32))
    for v0 in tl.range(0, V, BV):
        ov = v0 + tl.arange(0, BV)
        mv = ov < V
        p_out = out + (i * HV + hv) * V + ov
        if idx < 0:
            tl.store(p_out, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty), mask=mv)
        else:
            p_s = state + idx * s_slot + hv * s_head + ov[:, None] * s_v + ok[None, :]
            m = mv[:, None] & mk[None, :]
            s = tl.load(p_s, mask=m, other=0.0).to(tl.float32) * tl.exp(g)[None, :]
            v = tl.load(qkv + i * s_qkv + 2 * H * K + hv * V + ov, mask=mv, other=0.0)
            r = beta * (v.to(tl.float32) - tl.sum(s * k[None, :], axis=1))
            s = s + r[:, None] * k[None, :]
            o = tl.sum(s * q[None, :], axis=1) * scale
            tl.store(p_out, o.to(out.dtype.element_ty), mask=mv)
            tl.store(p_s, s.to(state.dtype.element_ty), mask=m)


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
    """One packed KDA decode step (validates, then launches over B * HV programs)."""
    B, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "triton"
    )
    BV = min(triton.next_power_of_2(V), 32)
    _decode_kernel[(B * HV,)](
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices,
        float(scale), 0.0 if lower_bound is None else float(lower_bound),
        mixed_qkv.stride(0), a.stride(0), b.stride(0),
        initial_state.stride(0), initial_state.stride(1), initial_state.stride(2),
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV,
        L2NORM=bool(use_qk_l2norm_in_kernel), LOWER_BOUND=lower_bound is not None,
    )
    return out, initial_state
