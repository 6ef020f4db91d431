"""Planted-bug implementations of the packed GDN decode contract (pure torch, CPU).

Each callable in ``MUTANTS`` has the GDN entry point's signature and one bug of a kind
real kernels have had; ``correct_triton`` and ``correct_helion`` are the bug-free twins
(same code, no bug), ``documented_triton`` follows the documented checks only (no
hardening: HV = 0 or V = 0 pass validation, K = 0 divides by zero, as upstream). They
are for showing that the fuzzer finds GDN bugs once the engine has a GDN contract.

Numeric bugs (wrong numbers or wrong writes on valid layouts):

``gate_per_key_channel``
    The KDA kernel's gate load kept in a GDN port: key channel ``k`` of every value
    head decays with the gate of head ``k`` (``a[i, k]``, ``dt_bias[k]``, ``A_log[k]``,
    masked to ``k < HV``; channels past HV do not decay at all) instead of the head's
    own scalar gate over the whole ``[V, K]`` matrix.
``gqa_modulo``
    Value head ``hv`` reads query/key head ``hv % H`` instead of ``hv // (HV // H)``
    (silent when H == HV or H == 1).
``padding_rows_untouched``
    Padding rows (``idx < 0``) keep whatever ``out`` held instead of zeros.
``l2_eps_outside``
    ``q / (||q|| + 1e-6)`` instead of ``q / sqrt(sum(q*q) + 1e-6)`` (visible on small
    norms only).

Conformant variations (not bugs; the fuzzer must pass them):

``beta_in_b_dtype``
    beta rounded to ``b``'s dtype before the float32 math, as sglang's and vLLM's GDN
    packed decode do (spec section 3, last paragraph).
``scale_in_products``
    ``out`` as the sum of the K float32 products ``S[v, k] * (q[k] * scale)``: with a
    tiny ``scale`` each product underflows on its own.

Contract bugs (wrong error on broken layouts):

``swap_ab_alog_checks``
    The ``A_log``/``dt_bias`` element-count check runs before the ``a``/``b`` shape
    check.
``kda_check_21_message``
    Check 21 raises the KDA message (with its trailing sentence about
    ``num_q_heads == num_k_heads``) instead of GDN's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kda_fuzz_kernels.gdn_decode.validate import validate_gdn_packed_decode_inputs

KDA_21_TAIL = (" KDA packed decode requires num_q_heads == num_k_heads and "
               "head_q_dim == head_k_dim.")
AB_PREFIX = "`a`/`b` must have shape [B, HV]"


def _validate(args: tuple, variant: str, bugs: frozenset[str]) -> tuple[int, ...]:
    A_log, dt_bias, state = args[3], args[4], args[5]
    try:
        return validate_gdn_packed_decode_inputs(*args, variant, hardened="no_harden" not in bugs)
    except ValueError as e:
        msg = str(e)
        HV = state.shape[-3] if state.ndim >= 3 else -1  # a/b checks: state is 4D by then
        if ("swap_ab_alog_checks" in bugs and msg.startswith(AB_PREFIX)
                and (A_log.numel() != HV or dt_bias.numel() != HV)):
            # every check before the a/b one passed: the swapped order raises this first
            msg = (f"`A_log` and `dt_bias` must have {HV} elements "
                   f"(got A_log.numel()={A_log.numel()}, dt_bias.numel()={dt_bias.numel()}).")
        if "kda_check_21_message" in bugs and msg.startswith("Invalid packed Q size"):
            msg += KDA_21_TAIL
        raise ValueError(msg) from None


def make(bugs: frozenset[str] | set[str] = frozenset(), variant: str = "triton"
         ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A pure-torch GDN decode (float32 math) with the named bugs planted."""
    bugs = frozenset(bugs)

    def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
               use_qk_l2norm_in_kernel=False):
        _, H, HV, K, V = _validate(
            (mixed_qkv, a, b, A_log, dt_bias, initial_state, out, ssm_state_indices),
            variant, bugs)
        f32 = torch.float32
        idx = ssm_state_indices.to(torch.long)
        rows = (idx >= 0).nonzero().squeeze(1)
        slots = idx[rows]
        R = rows.numel()
        qkv = mixed_qkv[rows].to(f32)
        heads = torch.arange(HV) % H if "gqa_modulo" in bugs else torch.arange(HV) // (HV // H)
        q = qkv[:, : H * K].reshape(R, H, K)[:, heads]
        k = qkv[:, H * K : 2 * H * K].reshape(R, H, K)[:, heads]
        v = qkv[:, 2 * H * K : 2 * H * K + HV * V].reshape(R, HV, V)
        if use_qk_l2norm_in_kernel:
            if "l2_eps_outside" in bugs:
                q = q / (q.norm(dim=-1, keepdim=True) + 1e-6)
                k = k / (k.norm(dim=-1, keepdim=True) + 1e-6)
            else:
                q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
                k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        x = a[rows].to(f32) + dt_bias.to(f32)  # [R, HV]
        g = -torch.exp(A_log.to(f32)) * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
        if "gate_per_key_channel" in bugs:
            n = min(K, HV)
            decay = torch.ones(R, 1, 1, K)
            decay[:, 0, 0, :n] = torch.exp(g[:, :n])
        else:
            decay = torch.exp(g)[:, :, None, None]
        beta = torch.sigmoid(b[rows].to(f32))
        if "beta_in_b_dtype" in bugs:  # conformant (spec section 3): sglang's and vLLM's
            beta = beta.to(b.dtype).to(f32)
        S = initial_state[slots].to(f32) * decay
        r = beta.unsqueeze(-1) * (v - torch.einsum("rhvk,rhk->rhv", S, k))
        S = S + r.unsqueeze(-1) * k.unsqueeze(2)
        if "scale_in_products" in bugs:  # conformant: K float32 products, each maybe subnormal
            o = (S * (q * scale).unsqueeze(2)).sum(-1)
        else:
            o = torch.einsum("rhvk,rhk->rhv", S, q) * scale
        if "padding_rows_untouched" not in bugs:
            out[(idx < 0).nonzero().squeeze(1)] = 0
        out[rows, 0] = o.to(out.dtype)
        initial_state[slots] = S.to(initial_state.dtype)
        return out, initial_state

    decode.__name__ = "_".join(sorted(bugs)) or "correct"
    return decode


NUMERIC_BUGS = ("gate_per_key_channel", "gqa_modulo", "padding_rows_untouched", "l2_eps_outside")
CONTRACT_BUGS = ("swap_ab_alog_checks", "kda_check_21_message")

MUTANTS: dict[str, Callable[..., Any]] = {}
for _bug in NUMERIC_BUGS + CONTRACT_BUGS:
    MUTANTS[_bug] = globals()[_bug] = make({_bug}, "triton")

correct_triton = make(set(), "triton")
correct_helion = make(set(), "helion")
CONFORMANT = ("beta_in_b_dtype", "scale_in_products")
beta_in_b_dtype = make({"beta_in_b_dtype"}, "triton")
scale_in_products = make({"scale_in_products"}, "triton")
# Documented checks only: a gap (HV = 0 returns changing nothing), not a bug.
documented_triton = make({"no_harden"}, "triton")
