"""Packed KDA decode step as a Helion kernel (contract variant ``helion``).

The host splits ``mixed_qkv`` and the other operands into strided views (no copies),
with value heads grouped as ``[H, HV // H]`` so that GQA is plain indexing. The kernel
tiles (row, key head, group member, block of V); K is taken whole, hence the contract's
power-of-two requirement on K and V. All math is float32.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import RefMode

from kda_fuzz_kernels.kda_decode.staging import stage_bf16_outputs
from kda_fuzz_kernels.kda_decode.validate import validate_packed_decode_inputs


def _kda_packed_decode(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, G, V]
    a: torch.Tensor,  # [B, H, G, K]
    b: torch.Tensor,  # [B, H, G]
    A_log: torch.Tensor,  # [H, G]
    dt_bias: torch.Tensor,  # [B, H, G, K] (stride 0 along B)
    state: torch.Tensor,  # [num_slots, H, G, V, K]
    out: torch.Tensor,  # [B, H, G, V]
    indices: torch.Tensor,  # [B]
    scale: float,
    lower_bound: float,
    use_l2norm: hl.constexpr,
    use_lower_bound: hl.constexpr,
    block_v: hl.constexpr,
    k_is_one: hl.constexpr,
) -> None:
    B, H, G, V = out.shape
    K = q.size(2)
    for tile_b, tile_h, tile_g, tile_v in hl.tile([B, H, G, V], block_size=[1, 1, 1, block_v]):
        i, h, g = tile_b.begin, tile_h.begin, tile_g.begin
        idx = indices[i]
        # padding rows (idx < 0) and, defensively, indices past the pool never touch it
        if (idx >= 0) & (idx < state.size(0)):
            # The slot is indexed as a one-element tile: a loaded 0-d scalar would be
            # emitted as ``slot[:, None]`` by Helion 1.4.0's codegen.
            slot = indices[tile_b].to(torch.int64)
            if k_is_one:
                # At K = 1 each K vector is one scalar, loaded as a scalar and broadcast
                # to [1, K]. Not `q[i, h, :]`: Helion 1.5.1 emits it with a runtime `i` as a
                # 0-d load and then indexes it `[None, None, :]`, which Triton rejects (GPU
                # and interpreter). Not `q[tile_b, h, :]` either: in a batch of one Helion
                # folds the row tile into a scalar load there, and on an H100 that batch's
                # `out` differed from a larger batch's in the last bit (--invariance
                # bitwise); loaded as scalars, every batch size computes alike.
                one = hl.zeros([tile_b, K], dtype=torch.float32)
                q_h = q[i, h, 0].to(torch.float32) + one  # [1, K]
                k_h = k[i, h, 0].to(torch.float32) + one
                x = a[i, h, g, 0].to(torch.float32) + dt_bias[i, h, g, 0].to(torch.float32) \
                    + one
            else:
                # (row-scalar indexing: about a fifth less of Helion's time per new shape)
                q_h = q[i, h, :].to(torch.float32)[None, :]
                k_h = k[i, h, :].to(torch.float32)[None, :]
                x = (a[i, h, g, :].to(torch.float32) + dt_bias[i, h, g, :].to(torch.float32)
                     )[None, :]
            if use_l2norm:
                q_h = q_h / torch.sqrt((q_h * q_h).sum(-1, keepdim=True) + 1e-6)
                k_h = k_h / torch.sqrt((k_h * k_h).sum(-1, keepdim=True) + 1e-6)
            A = torch.exp(A_log[h, g].to(torch.float32))
            if use_lower_bound:
                gate = lower_bound * torch.sigmoid(A * x)
            else:
                x_small = torch.where(x <= 20.0, x, 20.0)
                gate = -A * torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x_small)), x)
            beta = torch.sigmoid(b[i, h, g].to(torch.float32))

            s = state[slot, h, g, tile_v, :].to(torch.float32)  # [1, BV, K]
            s = s * torch.exp(gate)[:, None, :]
            v_t = v[i, h, g, tile_v].to(torch.float32)  # [BV]
            r = beta * (v_t[None, :] - (s * k_h[:, None, :]).sum(-1))
            s = s + r[:, :, None] * k_h[:, None, :]
            o = (s * q_h[:, None, :]).sum(-1) * scale  # [1, BV]
            out[tile_b, h, g, tile_v] = o.to(out.dtype)
            state[slot, h, g, tile_v, :] = s.to(state.dtype)
        else:
            out[tile_b, h, g, tile_v] = hl.zeros([tile_b, tile_v], dtype=out.dtype)


# ref_mode is explicit so that HELION_INTERPRET / TRITON_INTERPRET in the environment never
# change (or, set together, break) this kernel; how it runs on CPU tensors is the
# harness's choice (kda-fuzz hooks Helion's calls: the interpreter or Helion's eager mode).
_SETTINGS = dict(static_shapes=True, config=helion.Config(num_warps=2, num_stages=1),
                 ref_mode=RefMode.OFF)
kda_packed_decode_kernel = helion.kernel(**_SETTINGS)(_kda_packed_decode)
# Offsets past 2^31 elements (a state pool of over 2^31 elements, a `mixed_qkv` row stride
# times B past it) need 64-bit index arithmetic; the 32-bit kernel stays the fast default.
kda_packed_decode_kernel_i64 = helion.kernel(index_dtype=torch.int64, **_SETTINGS)(
    _kda_packed_decode)
INT32_REACH = 2**31


def _reach(t: torch.Tensor) -> int:
    """One past the largest element offset a view reaches in its storage."""
    if t.numel() == 0:
        return 0
    return t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def helion_fused_recurrent_kda_packed_decode(
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
    """One packed KDA decode step; updates ``initial_state`` and ``out`` in place.

    Returns the caller's own ``(out, initial_state)``.
    """
    B, H, HV, K, V = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "helion"
    )
    if B == 0:
        return out, initial_state
    G = HV // H
    cpu = mixed_qkv.device.type == "cpu"
    # CPU: one V block per program. GPU: [block_v, K] tiles of about 2048 elements on two
    # warps, the fastest of a small sweep on an H200 (B=128, H=HV=16, K=V=128).
    block_v = V if cpu else min(V, max(1, 2048 // K))
    with stage_bf16_outputs(out, initial_state, ssm_state_indices, cpu) as (o, st):
        wide = max(_reach(t) for t in (mixed_qkv, a, b, st, o)) >= INT32_REACH
        kernel = kda_packed_decode_kernel_i64 if wide else kda_packed_decode_kernel
        kernel(
            mixed_qkv[:, : H * K].unflatten(1, (H, K)),
            mixed_qkv[:, H * K : 2 * H * K].unflatten(1, (H, K)),
            mixed_qkv[:, 2 * H * K : 2 * H * K + HV * V].unflatten(1, (H, G, V)),
            a.unflatten(1, (H, G, K)),
            b.unflatten(1, (H, G)),
            A_log.unflatten(0, (H, G)),
            dt_bias.unflatten(0, (H, G, K)).expand(B, H, G, K),
            st.unflatten(1, (H, G)),
            o.view(B, H, G, V),
            ssm_state_indices,
            float(scale),
            0.0 if lower_bound is None else float(lower_bound),
            bool(use_qk_l2norm_in_kernel),
            lower_bound is not None,
            block_v,
            K == 1,
        )
    return out, initial_state
