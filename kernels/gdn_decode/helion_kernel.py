"""Packed GDN decode step as a Helion kernel (contract variant ``helion``).

The host splits the operands into strided views (no copies), value heads grouped as
``[H, HV // H]`` so that GQA is plain indexing. The kernel tiles (row, key head, group
member, block of V) and takes K whole, hence the power-of-two requirement on K and V.
The gate is one scalar per (row, value head). Math in float32.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
from helion.runtime.ref_mode import RefMode

from kda_fuzz_kernels.gdn_decode.validate import validate_gdn_packed_decode_inputs
from kda_fuzz_kernels.kda_decode.staging import stage_bf16_outputs


def _gdn_packed_decode(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, G, V]
    a: torch.Tensor,  # [B, H, G]
    b: torch.Tensor,  # [B, H, G]
    A_log: torch.Tensor,  # [H, G]
    dt_bias: torch.Tensor,  # [H, G]
    state: torch.Tensor,  # [num_slots, H, G, V, K]
    out: torch.Tensor,  # [B, H, G, V]
    indices: torch.Tensor,  # [B]
    scale: float,
    use_l2norm: hl.constexpr,
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
            # a one-element tile, not the loaded 0-d scalar: Helion 1.4.0 would emit the
            # scalar as ``slot[:, None]``
            slot = indices[tile_b].to(torch.int64)
            # The K vectors as the KDA kernel loads them: never by the row tile (in a batch
            # of one Helion folds its loads into scalar loads, which an H100 computed
            # differently in the last bit there), and at K = 1 as scalars broadcast to
            # [1, K] (Helion 1.5.1 emits `q[i, h, :]` with a runtime `i` as a 0-d load there
            # and then indexes it `[None, None, :]`, which Triton rejects)
            if k_is_one:
                one = hl.zeros([tile_b, K], dtype=torch.float32)
                q_h = q[i, h, 0].to(torch.float32) + one  # [1, K]
                k_h = k[i, h, 0].to(torch.float32) + one
            else:
                q_h = q[i, h, :].to(torch.float32)[None, :]
                k_h = k[i, h, :].to(torch.float32)[None, :]
            if use_l2norm:
                q_h = q_h / torch.sqrt((q_h * q_h).sum(-1, keepdim=True) + 1e-6)
                k_h = k_h / torch.sqrt((k_h * k_h).sum(-1, keepdim=True) + 1e-6)
            x = a[i, h, g].to(torch.float32) + dt_bias[h, g].to(torch.float32)
            x_small = torch.where(x <= 20.0, x, 20.0)
            softplus = torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x_small)), x)
            decay = torch.exp(-torch.exp(A_log[h, g].to(torch.float32)) * softplus)
            beta = torch.sigmoid(b[i, h, g].to(torch.float32))

            s = state[slot, h, g, tile_v, :].to(torch.float32) * decay  # [1, BV, K]
            v_t = v[i, h, g, tile_v].to(torch.float32)  # [BV]
            delta = beta * (v_t[None, :] - (s * k_h[:, None, :]).sum(-1))
            s = s + delta[:, :, None] * k_h[:, None, :]
            o = (s * q_h[:, None, :]).sum(-1) * scale  # [1, BV]
            out[tile_b, h, g, tile_v] = o.to(out.dtype)
            state[slot, h, g, tile_v, :] = s.to(state.dtype)
        else:
            out[tile_b, h, g, tile_v] = hl.zeros([tile_b, tile_v], dtype=out.dtype)


# ref_mode explicit: HELION_INTERPRET / TRITON_INTERPRET in the environment never change
# this kernel; how it runs on CPU tensors is the harness's choice (as for the KDA kernel).
_SETTINGS = dict(static_shapes=True, config=helion.Config(num_warps=2, num_stages=1),
                 ref_mode=RefMode.OFF)
gdn_packed_decode_kernel = helion.kernel(**_SETTINGS)(_gdn_packed_decode)
# 64-bit index arithmetic for views reaching past 2^31 elements (a large state pool, a
# `mixed_qkv` row stride times B past it); the 32-bit kernel stays the default.
gdn_packed_decode_kernel_i64 = helion.kernel(index_dtype=torch.int64, **_SETTINGS)(
    _gdn_packed_decode)
INT32_REACH = 2**31


def _reach(t: torch.Tensor) -> int:
    """One past the largest element offset a view reaches in its storage."""
    if t.numel() == 0:
        return 0
    return t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def helion_fused_recurrent_gated_delta_rule_packed_decode(
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
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "helion"
    )
    if B == 0:
        return out, initial_state
    G = HV // H
    cpu = mixed_qkv.device.type == "cpu"
    # CPU: one V block per program. GPU: [block_v, K] tiles of about 2048 elements.
    block_v = V if cpu else min(V, max(1, 2048 // K))
    with stage_bf16_outputs(out, initial_state, ssm_state_indices, cpu) as (o, st):
        wide = max(_reach(t) for t in (mixed_qkv, a, b, st, o)) >= INT32_REACH
        kernel = gdn_packed_decode_kernel_i64 if wide else gdn_packed_decode_kernel
        kernel(
            mixed_qkv[:, : H * K].unflatten(1, (H, K)),
            mixed_qkv[:, H * K : 2 * H * K].unflatten(1, (H, K)),
            mixed_qkv[:, 2 * H * K : 2 * H * K + HV * V].unflatten(1, (H, G, V)),
            a.unflatten(1, (H, G)),
            b.unflatten(1, (H, G)),
            A_log.unflatten(0, (H, G)),
            dt_bias.unflatten(0, (H, G)),
            st.unflatten(1, (H, G)),
            o.view(B, H, G, V),
            ssm_state_indices,
            float(scale),
            bool(use_qk_l2norm_in_kernel),
            block_v,
            K == 1,
        )
    return out, initial_state
