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

Variant = Literal["helion", "triton"]


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


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
    if mixed_qkv.ndim != 2:
        raise ValueError(f"`mixed_qkv` must be a 2D tensor (got ndim={mixed_qkv.ndim}).")
    if mixed_qkv.stride(-1) != 1:
        raise ValueError("`mixed_qkv` must be contiguous in the last dim.")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(
            f"`a` and `b` must be 2D tensors (got a.ndim={a.ndim}, b.ndim={b.ndim})."
        )
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("`a`/`b` must be contiguous in the last dim.")
    if A_log.ndim != 1 or dt_bias.ndim != 1:
        raise ValueError("`A_log`/`dt_bias` must be 1D tensors.")
    if A_log.stride(0) != 1 or dt_bias.stride(0) != 1:
        raise ValueError("`A_log`/`dt_bias` must be contiguous.")
    if ssm_state_indices.ndim != 1:
        raise ValueError(
            "`ssm_state_indices` must be 1D for packed decode "
            f"(got ndim={ssm_state_indices.ndim})."
        )
    if not out.is_contiguous():
        raise ValueError("`out` must be contiguous.")
    device = mixed_qkv.device
    if any(
        t.device != device for t in (a, b, A_log, dt_bias, initial_state, out, ssm_state_indices)
    ):
        raise ValueError("All inputs must be on the same device.")
    B = mixed_qkv.shape[0]
    if a.shape[0] != B or b.shape[0] != B:
        raise ValueError(
            f"Mismatched batch sizes: mixed_qkv.shape[0]={B}, a.shape[0]={a.shape[0]}, "
            f"b.shape[0]={b.shape[0]}."
        )
    if ssm_state_indices.shape[0] != B:
        raise ValueError(
            "`ssm_state_indices` must have shape [B] "
            f"(got {tuple(ssm_state_indices.shape)}; expected ({B},))."
        )
    if initial_state.ndim != 4:
        raise ValueError(f"`initial_state` must be a 4D tensor (got ndim={initial_state.ndim}).")
    if initial_state.stride(-1) != 1:
        raise ValueError("`initial_state` must be contiguous in the last dim.")
    HV, V, K = initial_state.shape[-3:]
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
