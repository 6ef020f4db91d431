"""Vectorised torch reference of one packed KDA decode step (spec section 3)."""

from __future__ import annotations

import torch

from kda_fuzz_kernels.kda_decode.validate import validate_packed_decode_inputs

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6


def decode_terms(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool,
    lower_bound: float | None,
    H: int,
    compute_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """The step's intermediates for the rows with a non-negative slot index, in
    ``compute_dtype``: ``rows``, ``slots``, ``q``/``k`` (expanded to HV heads, normalised
    if asked), ``v``, ``a``, ``dt_bias``, ``A`` (``exp(A_log)``), ``g``, ``beta``, ``S0``
    (the slots' state, possibly as stored: see ``stored_state``), ``S_dec`` (decayed), ``S``
    (updated) and ``o`` ([R, HV, V]).

    Inputs are not validated; nothing is written."""
    cd = compute_dtype
    HV, K = initial_state.shape[-3], initial_state.shape[-1]
    rows, slots, q, k, v = packed_rows(mixed_qkv, ssm_state_indices, initial_state, H,
                                       use_qk_l2norm_in_kernel, cd)
    R = rows.numel()

    a_rows = a[rows].to(cd).reshape(R, HV, K)
    dt = dt_bias.to(cd).reshape(HV, K)
    x = a_rows + dt
    A = torch.exp(A_log.to(cd)).reshape(HV, 1)
    if lower_bound is None:
        softplus = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
        g = -A * softplus
    else:
        g = lower_bound * torch.sigmoid(A * x)
    beta = torch.sigmoid(b[rows].to(cd))

    S0 = stored_state(initial_state, slots, cd)  # [R, HV, V, K]
    S_dec, S, o = delta_rule(S0, torch.exp(g).unsqueeze(2), q, k, v, beta, scale)
    return {"rows": rows, "slots": slots, "q": q, "k": k, "v": v, "a": a_rows, "dt_bias": dt,
            "A": A, "g": g, "beta": beta, "S0": S0, "S_dec": S_dec, "S": S, "o": o}


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
    _, H, _, _, _ = validate_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "triton"
    )
    t = decode_terms(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, ssm_state_indices,
                     use_qk_l2norm_in_kernel, lower_bound, H, compute_dtype)
    return write_back(t, out, initial_state)


def packed_rows(mixed_qkv: torch.Tensor, ssm_state_indices: torch.Tensor,
                initial_state: torch.Tensor, H: int, use_qk_l2norm_in_kernel: bool,
                cd: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``rows`` (those with a slot index >= 0), their ``slots``, and ``q``/``k`` (expanded
    to HV heads, normalised if asked) and ``v`` of those rows in ``cd``; shared by the
    packed decode families."""
    HV, V, K = initial_state.shape[-3:]
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
    return rows, slots, q, k, v


def stored_state(initial_state: torch.Tensor, slots: torch.Tensor,
                 cd: torch.dtype) -> torch.Tensor:
    """The slots' states as stored when ``cd`` arithmetic promotes them exactly (the
    decay's product does the conversion: one pass over [R, HV, V, K] less), else in
    ``cd``."""
    S0 = initial_state[slots]
    return S0 if torch.promote_types(S0.dtype, cd) == cd else S0.to(cd)


def delta_rule(S0: torch.Tensor, decay: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, beta: torch.Tensor, scale: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decayed state ``S0 * decay``, the state after the delta-rule update, and the
    output ``[R, HV, V]``."""
    S_dec = S0 * decay
    r = beta.unsqueeze(-1) * (v - torch.einsum("rhvk,rhk->rhv", S_dec, k))
    S = torch.addcmul(S_dec, r.unsqueeze(-1), k.unsqueeze(2))  # one [R, HV, V, K] pass
    return S_dec, S, torch.einsum("rhvk,rhk->rhv", S, q) * scale


def write_back(t: dict[str, torch.Tensor], out: torch.Tensor, initial_state: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the terms ``t`` into the caller's ``out`` (padding rows zero) and state slots;
    return the caller's objects."""
    out.zero_()
    out[t["rows"], 0] = t["o"].to(out.dtype)
    initial_state[t["slots"]] = t["S"].to(initial_state.dtype)
    return out, initial_state
