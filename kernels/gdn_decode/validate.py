"""Input validation of the packed GDN (gated delta rule) decode contract.

The sibling of the packed KDA contract (spec section 3, last paragraph): checks 1-13 as
for KDA, then two GDN checks in place of KDA checks 15-18 (``a``/``b`` are ``[B, HV]``,
``A_log``/``dt_bias`` have HV elements), then checks 19-22, check 21's message without
KDA's sentence about head configs. Variant ``helion`` adds a power-of-two check on K and
V where KDA has check 14 (right after check 13); variant ``triton`` has none.
"""

from __future__ import annotations

from typing import Literal

import torch

from kda_fuzz_kernels.kda_decode.validate import _is_pow2, validate_packed_layout

Variant = Literal["helion", "triton"]


def validate_gdn_packed_decode_inputs(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    variant: Variant = "triton",
    *,
    hardened: bool = True,
) -> tuple[int, int, int, int, int]:
    """Raise the contract's ValueError for the first failing check; return (B, H, HV, K, V).

    ``hardened`` (the default, what the project's kernels use) also rejects degenerate
    sizes, as the KDA validator does: HV or V of 0 fail check 20 (no value segment), K of
    0 fails check 21 (nothing is divisible by 0). ``hardened=False`` is the documented
    contract to the letter, upstream's holes included: HV = 0 or V = 0 may pass, and
    K = 0 reaches ``q_dim % K`` (ZeroDivisionError).
    """
    if variant not in ("helion", "triton"):
        raise ValueError(f"unknown contract variant {variant!r}; expected 'helion' or 'triton'.")
    B, HV, V, K = validate_packed_layout(mixed_qkv, a, b, A_log, dt_bias, initial_state, out,
                                         ssm_state_indices)
    if variant == "helion" and not (_is_pow2(K) and _is_pow2(V)):
        raise ValueError(
            "Helion GDN decode requires power-of-two key and value head dimensions "
            f"(got K={K}, V={V})."
        )
    if a.shape[1] != HV or b.shape[1] != HV:
        raise ValueError(
            f"`a`/`b` must have shape [B, HV] with HV={HV} "
            f"(got a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)})."
        )
    if A_log.numel() != HV or dt_bias.numel() != HV:
        raise ValueError(
            f"`A_log` and `dt_bias` must have {HV} elements "
            f"(got A_log.numel()={A_log.numel()}, dt_bias.numel()={dt_bias.numel()})."
        )
    if tuple(out.shape) != (B, 1, HV, V):
        raise ValueError(
            f"`out` must have shape {(B, 1, HV, V)} (got out.shape={tuple(out.shape)})."
        )
    qkv_dim = mixed_qkv.shape[1]
    qk_dim = qkv_dim - HV * V
    degenerate_hv = hardened and (HV <= 0 or V <= 0)
    if degenerate_hv or qk_dim <= 0 or qk_dim % 2 != 0:
        raise ValueError(f"Invalid packed `mixed_qkv` last dim={qkv_dim} for HV={HV}, V={V}.")
    q_dim = qk_dim // 2
    if (hardened and K <= 0) or q_dim % K != 0:
        raise ValueError(f"Invalid packed Q size {q_dim}: must be divisible by K={K}.")
    H = q_dim // K
    if H <= 0 or HV % H != 0:
        raise ValueError(f"Invalid head config inferred from mixed_qkv: H={H}, HV={HV}.")
    return B, H, HV, K, V
