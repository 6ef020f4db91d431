"""Triton KDA decode as a persistent grid: at most ``PROGRAMS`` programs, each looping over
the (row, value head) pairs ``for pid_bh in range(pid, n, step)`` with ``pid`` its
program id and ``n`` and ``step`` runtime ints. Under the Triton interpreter each of them
is a one-element array made an index with ``int()``, which numpy 2.4 refuses in triton 3.6
(``only 0-dimensional arrays can be converted to Python scalars``). Contract variant
``triton``; K and V are masked to powers of two."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kda_fuzz_kernels.kda_decode import validate_packed_decode_inputs

PROGRAMS = 4


@triton.jit
def _decode_kernel(
    qkv, a, b, A_log, dt_bias, state, out, indices,
    scale, lower_bound, n, step, s_qkv, s_a, s_b, s_slot, s_head, s_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, LOWER_BOUND: tl.constexpr,
):
    pid = tl.program_id(0)
    ok = tl.arange(0, BK)
    mk = ok < K
    ov = tl.arange(0, BV)
    mv = ov < V
    for pid_bh in range(pid, n, step):
        i = pid_bh // HV
        hv = pid_bh % HV
        h = hv // (HV // H)
        idx = tl.load(indices + i).to(tl.int64)
        p_out = out + (i * HV + hv) * V + ov
        if idx < 0:
            tl.store(p_out, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty), mask=mv)
        else:
            q = tl.load(qkv + i * s_qkv + h * K + ok, mask=mk, other=0.0).to(tl.float32)
            k = tl.load(qkv + i * s_qkv + (H + h) * K + ok, mask=mk, other=0.0).to(tl.float32)
            if L2NORM:
                q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
                k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
            x = tl.load(a + i * s_a + hv * K + ok, mask=mk, other=0.0).to(tl.float32)
            x = x + tl.load(dt_bias + hv * K + ok, mask=mk, other=0.0).to(tl.float32)
            A = tl.exp(tl.load(A_log + hv).to(tl.float32))
            if LOWER_BOUND:
                g = lower_bound * tl.sigmoid(A * x)
            else:
                soft = tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))
                g = -A * tl.where(x > 20.0, x, soft)
            beta = tl.sigmoid(tl.load(b + i * s_b + hv).to(tl.float32))
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
    """One packed KDA decode step (validates, then launches at most PROGRAMS programs)."""
    return _launch(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                   ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound)


def skipping_decode(
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
    """The same with a planted bug: the loop's step is one too many, so a program skips
    pairs whenever B * HV > PROGRAMS (their outputs and states are never written)."""
    return _launch(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                   ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound, extra_step=1)


def _launch(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
            dt_bias: torch.Tensor, scale: float, initial_state: torch.Tensor,
            out: torch.Tensor, ssm_state_indices: torch.Tensor,
            use_qk_l2norm_in_kernel: bool, lower_bound: float | None,
            extra_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "triton"
    )
    n = B * HV
    programs = max(1, min(n, PROGRAMS))
    _decode_kernel[(programs,)](
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices,
        float(scale), 0.0 if lower_bound is None else float(lower_bound), n,
        programs + extra_step,
        mixed_qkv.stride(0), a.stride(0), b.stride(0),
        initial_state.stride(0), initial_state.stride(1), initial_state.stride(2),
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V),
        L2NORM=bool(use_qk_l2norm_in_kernel), LOWER_BOUND=lower_bound is not None,
    )
    return out, initial_state
