"""Planted-bug implementations of the packed KDA decode contract (pure torch, CPU).

Each module-level callable in ``MUTANTS`` has the contract's signature and one bug of a
kind real kernels have had. The fuzzer's own tests require every one to be found; the
corpus tests use them to show that a saved case fails on its bug and passes on a correct
implementation. ``correct_triton`` and ``correct_helion`` are bug-free twins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kda_fuzz.families.kda.contract import CHECKS


def _validate(args: dict[str, Any], variant: str, bugs: frozenset[str]) -> tuple[int, ...]:
    """The contract's checks in order (with upstream's holes unless ``harden``)."""
    from kda_fuzz.engine.contract import Namespace
    from kda_fuzz.families.kda.contract import DERIVED

    ns = Namespace(args, DERIVED)
    checks = [c for c in CHECKS if c.applies(variant)]
    if "swap_14_15" in bugs:
        i = next(i for i, c in enumerate(checks) if c.number == 14)
        checks[i], checks[i + 1] = checks[i + 1], checks[i]
    if "swap_19_20" in bugs:
        i = next(i for i, c in enumerate(checks) if c.number == 19)
        checks[i], checks[i + 1] = checks[i + 1], checks[i]
    for c in checks:
        if f"skip_check_{c.number}" in bugs:
            continue
        if c.number == 2 and "qkv_requires_contiguous" in bugs:
            if not args["mixed_qkv"].is_contiguous():
                raise ValueError(c.render(ns))
            continue
        if c.number == 3 and "rank_check_and" in bugs:
            if args["a"].ndim != 2 and args["b"].ndim != 2:
                raise ValueError(c.render(ns))
            continue
        if "harden" in bugs and c.number == 20 and min(ns.HV, ns.V, ns.K) == 0:
            raise ValueError("zero-sized head dimension")
        if c.fails(ns):
            msg = c.render(ns)
            if f"typo_check_{c.number}" in bugs:
                msg = msg.replace("must", "should", 1) if "must" in msg else msg + " "
            raise ValueError(msg)
    return ns.B, ns.H, ns.HV, ns.K, ns.V


def make(bugs: frozenset[str] | set[str] = frozenset(), variant: str = "triton"
         ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A pure-torch implementation of the contract with the named bugs planted."""
    bugs = frozenset(bugs)

    def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
               use_qk_l2norm_in_kernel=False, lower_bound=None):
        args = dict(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                    initial_state=initial_state, out=out, ssm_state_indices=ssm_state_indices)
        if "zero_out_first" in bugs:
            out.zero_()
        hardened = bugs if "no_harden" in bugs else bugs | {"harden"}
        _, H, HV, K, V = _validate(args, variant, hardened)
        cd = initial_state.dtype if "low_precision_math" in bugs else torch.float32
        idx = ssm_state_indices.to(torch.long)
        n_slots = initial_state.shape[0]
        if "pad_wrap" in bugs:
            live = idx >= -1
            idx = torch.where(idx == -1, torch.full_like(idx, n_slots - 1), idx)
        elif "only_minus_one_pads" in bugs:
            live = idx != -1
            idx = idx % n_slots
        else:
            live = idx >= 0
        rows = live.nonzero().squeeze(1)
        slots = idx[rows]
        R = rows.numel()
        qkv = mixed_qkv
        if "ignore_row_stride" in bugs:
            qkv = torch.as_strided(mixed_qkv, mixed_qkv.shape, (mixed_qkv.shape[1], 1))
        qkv = qkv[rows].to(cd)
        heads = torch.arange(HV) % H if "gqa_modulo" in bugs else torch.arange(HV) // (HV // H)
        q = qkv[:, : H * K].reshape(R, H, K)[:, heads]
        k = qkv[:, H * K : 2 * H * K].reshape(R, H, K)[:, heads]
        v = qkv[:, 2 * H * K : 2 * H * K + HV * V].reshape(R, HV, V)
        if "scale_before_l2norm" in bugs:
            q = q * scale
        if use_qk_l2norm_in_kernel:
            if "l2_eps_outside" in bugs:
                q = q / (q.norm(dim=-1, keepdim=True) + 1e-6)
                k = k / (k.norm(dim=-1, keepdim=True) + 1e-6)
            else:
                q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
                k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            if "mutate_qkv" in bugs:
                mixed_qkv[rows, : H * K] = q[:, :: HV // H].reshape(R, H * K).to(mixed_qkv.dtype)
        a_rows = a[rows].to(cd)
        if "a_transposed" in bugs:
            a_rows = a_rows.reshape(R, K, HV).transpose(1, 2)
        else:
            a_rows = a_rows.reshape(R, HV, K)
        dt = dt_bias.to(cd).reshape(HV, K)
        if "dt_bias_first_head" in bugs:
            dt = dt[:1].expand(HV, K)
        x = a_rows + dt
        A = torch.exp(A_log.to(cd)).reshape(HV, 1)
        if lower_bound is None:
            sp = torch.log1p(torch.exp(x)) if "no_softplus_threshold" in bugs else \
                torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
            g = -A * sp
        else:
            g = lower_bound * torch.sigmoid(x if "lower_bound_without_A" in bugs else A * x)
        beta = b[rows].to(cd) if "beta_no_sigmoid" in bugs else torch.sigmoid(b[rows].to(cd))
        pool = initial_state
        if "ignore_slot_stride" in bugs:
            pool = torch.as_strided(initial_state, initial_state.shape,
                                    (HV * V * K, V * K, K, 1), initial_state.storage_offset())
        if "k_major_state" in bugs:
            S = pool[slots].reshape(R, HV, K, V).transpose(-1, -2).to(cd)
        else:
            S = pool[slots].to(cd)
        decay = torch.exp(g).unsqueeze(2)
        if "decay_after_update" not in bugs:
            S = S * decay
        o_pre = torch.einsum("rhvk,rhk->rhv", S, q)
        r = beta.unsqueeze(-1) * (v - torch.einsum("rhvk,rhk->rhv", S, k))
        S = S + r.unsqueeze(-1) * k.unsqueeze(2)
        if "decay_after_update" in bugs:
            S = S * decay
        o = o_pre if "out_before_update" in bugs else torch.einsum("rhvk,rhk->rhv", S, q)
        if "scale_before_l2norm" not in bugs:
            o = o * scale
        if "new_out" in bugs:
            out = torch.empty_like(out)
        if "padding_rows_untouched" not in bugs:
            out[(idx < 0).nonzero().squeeze(1)] = 0
        out[rows, 0] = o.to(out.dtype)
        if "k_major_state" in bugs:
            S = S.transpose(-1, -2).reshape(R, HV, V, K)
        # rows that wrap onto one slot: the last row's write wins, every time (an indexed
        # write with repeated indices lands in any order: the bug would look flaky)
        last = torch.full((n_slots,), -1, dtype=torch.long, device=slots.device).scatter_reduce(
            0, slots, torch.arange(R, device=slots.device), "amax")
        keep = last[last >= 0]
        pool[slots[keep]] = S[keep].to(initial_state.dtype)
        return out, initial_state

    decode.__name__ = "_".join(sorted(bugs)) or "correct"
    return decode


NUMERIC_BUGS = (
    "pad_wrap", "only_minus_one_pads", "ignore_row_stride", "gqa_modulo", "scale_before_l2norm",
    "l2_eps_outside", "mutate_qkv", "a_transposed", "dt_bias_first_head",
    "no_softplus_threshold", "lower_bound_without_A", "beta_no_sigmoid", "ignore_slot_stride",
    "k_major_state", "decay_after_update", "out_before_update", "new_out",
    "padding_rows_untouched", "low_precision_math",
)
CONTRACT_BUGS = (
    "swap_14_15", "swap_19_20", "qkv_requires_contiguous", "rank_check_and", "zero_out_first",
    "no_harden", *(f"skip_check_{n}" for n in (1, 2, 4, 8, 9, 11, 13, 14, 17, 19, 21, 22)),
    *(f"typo_check_{n}" for n in (3, 10, 12, 16, 18, 20)),
)
HELION_ONLY = {"swap_14_15", "skip_check_14"}

MUTANTS: dict[str, Callable[..., Any]] = {}
for _bug in NUMERIC_BUGS + CONTRACT_BUGS:
    _variant = "helion" if _bug in HELION_ONLY else "triton"
    MUTANTS[_bug] = globals()[_bug] = make({_bug}, _variant)

correct_triton = make(set(), "triton")
correct_helion = make(set(), "helion")
# Follows the documented checks only (no hardening): HV = 0 passes them and the call
# returns changing nothing, which the documented contract allows (a validation gap); the
# helion variant's check 14 rejects K = 0 and V = 0 first.
documented_helion = make({"no_harden"}, "helion")
# A numeric bug in the helion variant, visible on valid layouts only (a padding row of
# ``out`` keeps what it held); every check right, so the broken strata never show it.
padding_rows_untouched_helion = make({"padding_rows_untouched"}, "helion")
