"""Planted targets for the findings tests (pure torch, CPU, seconds per campaign).

``raises_first``
    Raises ``NotImplementedError`` before validating anything, its message naming the
    input size: one root cause, whatever check a layout was meant to trip.
``writes_unnamed_slot``
    The reference step, then one cell of a slot no row names is overwritten (as an
    out-of-bounds write past a tile would): ``untouched-state-written``.
``wrong_gqa``
    The reference step with value head ``hv`` reading key head ``hv % H`` instead of
    ``hv // (HV // H)``: shows from HV = 4 with H = 2, silent with one key head.
"""

from __future__ import annotations

import torch

from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def raises_first(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                 ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None):
    raise NotImplementedError(f"packed decode of {mixed_qkv.numel()} elements is not implemented")


def writes_unnamed_slot(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                        ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None):
    result = reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state,
                                         out, ssm_state_indices, use_qk_l2norm_in_kernel,
                                         lower_bound)
    named = set(ssm_state_indices.tolist())
    free = [s for s in range(initial_state.shape[0]) if s not in named]
    if free:  # the write lands in the first slot past the named ones that nobody names
        top = max((i for i in named if i >= 0), default=-1)
        slot = next((s for s in free if s > top), free[-1])
        initial_state[slot, 0, 0, 0] = initial_state[slot, 0, 0, 0] + 1
    return result


def wrong_gqa(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
              ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None):
    HV, V, K = initial_state.shape[-3:]
    H = (mixed_qkv.shape[1] - HV * V) // 2 // K
    if H > 1 and HV // H > 1:  # permute value heads' key heads: hv -> hv % H
        per_q = HV // H
        order = torch.arange(HV) % H  # the key head each value head reads (buggy)
        q = mixed_qkv[:, : H * K].reshape(-1, H, K)
        k = mixed_qkv[:, H * K: 2 * H * K].reshape(-1, H, K)
        # run head by head: value head hv reads key head order[hv]
        for hv in range(HV):
            if order[hv] != hv // per_q:
                break
        else:
            order = None
        if order is not None:
            qx = q[:, order].reshape(mixed_qkv.shape[0], -1)
            kx = k[:, order].reshape(mixed_qkv.shape[0], -1)
            wide = torch.cat([qx, kx, mixed_qkv[:, 2 * H * K:]], 1)  # H' = HV key heads
            return reference_kda_packed_decode(wide, a, b, A_log, dt_bias, scale,
                                               initial_state, out, ssm_state_indices,
                                               use_qk_l2norm_in_kernel, lower_bound)
    return reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state,
                                       out, ssm_state_indices, use_qk_l2norm_in_kernel,
                                       lower_bound)


WRAP = 1 << 22  # elements: the CPU-sized stand-in for int32's 2^31


def wraps_past_2_22(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                    ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None):
    """The reference step, plus each live row's new state also stored at its slot
    offset taken modulo ``WRAP`` elements (an offset that wraps): visible only with a
    live slot past ``WRAP`` elements of the pool, as an int32 offset past 2^31."""
    result = reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state,
                                         out, ssm_state_indices, use_qk_l2norm_in_kernel,
                                         lower_bound)
    S0 = initial_state.stride(0)
    for i in ssm_state_indices.tolist():
        if i >= 0 and i * S0 >= WRAP:
            wrapped = (i * S0 % WRAP) // S0
            initial_state[wrapped] = initial_state[i]
    return result
