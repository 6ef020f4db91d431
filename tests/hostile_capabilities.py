"""Targets for pinned and capability-restricted campaigns (pure torch, CPU)."""

from __future__ import annotations

from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def no_lower_bound(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                   ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None):
    """Correct, but without lower_bound support: it raises when one is given."""
    if lower_bound is not None:
        raise NotImplementedError("lower_bound is not supported")
    return reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale,
                                       initial_state, out, ssm_state_indices,
                                       use_qk_l2norm_in_kernel, lower_bound)


def declared_no_lower_bound(*args, **kwargs):
    """The same target, saying so."""
    return no_lower_bound(*args, **kwargs)


declared_no_lower_bound.kda_fuzz_unsupported = ("lower_bound",)


def wrong_at_served_shape(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                          ssm_state_indices, use_qk_l2norm_in_kernel=False, lower_bound=None):
    """Correct except at the served configuration HV=12, K=V=8: the last head's output is
    doubled (a tiling bug of one specialisation)."""
    reference_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                ssm_state_indices, use_qk_l2norm_in_kernel, lower_bound)
    if tuple(initial_state.shape[-3:]) == (12, 8, 8):
        live = ssm_state_indices >= 0
        out[live, :, -1] *= 2
    return out, initial_state
