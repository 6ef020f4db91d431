"""Vectorised torch reference of one packed GDN decode step (gated delta rule).

Same packing, padding and state semantics as packed KDA decode (spec section 3); the
gate is one scalar per value head, ``g = -exp(A_log[hv]) * softplus(a[i, hv] +
dt_bias[hv])``, so the decay ``exp(g)`` scales the whole ``[V, K]`` state matrix.
"""

from __future__ import annotations

import torch

from kda_fuzz_kernels.gdn_decode.validate import validate_gdn_packed_decode_inputs
from kda_fuzz_kernels.kda_decode.reference import (
    SOFTPLUS_THRESHOLD,
    delta_rule,
    packed_rows,
    stored_state,
    write_back,
)


def gdn_decode_terms(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool,
    H: int,
    compute_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """The step's intermediates for the rows with a non-negative slot index, in
    ``compute_dtype``: ``rows``, ``slots``, ``q``/``k`` (expanded to HV heads, normalised
    if asked), ``v``, ``a`` ([R, HV]), ``dt_bias`` ([HV]), ``A`` (``exp(A_log)``), ``g``
    ([R, HV], one gate per value head), ``beta``, ``S0`` (the slots' state, maybe as
    stored), ``S_dec`` (decayed), ``S`` (updated) and ``o`` ([R, HV, V]).

    Inputs are not validated; nothing is written."""
    cd = compute_dtype
    rows, slots, q, k, v = packed_rows(mixed_qkv, ssm_state_indices, initial_state, H,
                                       use_qk_l2norm_in_kernel, cd)

    a_rows = a[rows].to(cd)  # [R, HV]
    dt = dt_bias.to(cd)  # [HV]
    x = a_rows + dt
    A = torch.exp(A_log.to(cd))  # [HV]
    softplus = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x)), x)
    g = -A * softplus  # [R, HV]
    beta = torch.sigmoid(b[rows].to(cd))  # [R, HV]

    S0 = stored_state(initial_state, slots, cd)  # [R, HV, V, K]
    S_dec, S, o = delta_rule(S0, torch.exp(g)[:, :, None, None], q, k, v, beta, scale)
    return {"rows": rows, "slots": slots, "q": q, "k": k, "v": v, "a": a_rows, "dt_bias": dt,
            "A": A, "g": g, "beta": beta, "S0": S0, "S_dec": S_dec, "S": S, "o": o}


def reference_gdn_packed_decode(
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
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the GDN decode step in torch (``compute_dtype`` math, float64 for the oracle).

    Validates with the triton variant (hardened), so any positive K and V is accepted.
    Writes ``out`` and the named state slots in place and returns the caller's objects.
    """
    _, H, _, _, _ = validate_gdn_packed_decode_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices, "triton"
    )
    t = gdn_decode_terms(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state,
                         ssm_state_indices, use_qk_l2norm_in_kernel, H, compute_dtype)
    return write_back(t, out, initial_state)
