"""The packed KDA decode contract (spec ``kda-packed-decode.md``) as data.

Checks 1-22 with their exact messages, the derived values they use, the holes that
must still raise, and the differential oracle with its tolerance policy:

* reference: the terms of ``reference_kda_packed_decode`` (``decode_terms``) in float64
  on the same (upcast) inputs, with the bounds computed from them in the same pass;
* per element, |got - ref| <= bound, where the bound is a forward error estimate of
  float32 arithmetic built from the magnitudes of the terms (gamma = 8 (K + 16) 2^-24
  per accumulated product, the gate's sensitivity for exp(g), the float32 rounding of
  ``scale``, subnormal included), plus one rounding of the stored dtype (its eps times
  |ref|) and the dtype's subnormal spacing. Float32 done
  right sits orders of magnitude inside it; one bf16/fp16 rounding of an intermediate
  (eps 2^-8 / 2^-11) lands outside it;
* padding rows exactly 0 (``out`` is pre-filled with NaN); every state element outside
  the named slots, guard cells included, bit-identical; read-only inputs bit-identical;
  the returned pair ``is`` the caller's ``(out, initial_state)``.

Layouts whose float64 result does not fit the stored dtype (more than half its max) are
not judged numerically (counted as ``skipped_unjudgeable``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..case import Case
from ..contract import Check, Contract, Hole, Unjudgeable, shape
from ..oracle import same_bits
from ..verdict import Verdict
from . import kda_layouts

SIGNATURE = (
    "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
    "ssm_state_indices", "use_qk_l2norm_in_kernel", "lower_bound",
)
READ_ONLY = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "ssm_state_indices")
DEVICE_PEERS = ("a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")
HELION = frozenset({"helion"})


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


DERIVED = {
    "B": lambda n: n.mixed_qkv.shape[0],
    "HV": lambda n: n.initial_state.shape[-3],
    "V": lambda n: n.initial_state.shape[-2],
    "K": lambda n: n.initial_state.shape[-1],
    "HVK": lambda n: n.HV * n.K,
    "a_shape": lambda n: shape(n.a),
    "b_shape": lambda n: shape(n.b),
    "out_shape": lambda n: shape(n.out),
    "out_expected": lambda n: (n.B, 1, n.HV, n.V),
    "idx_shape": lambda n: shape(n.ssm_state_indices),
    "A_log_numel": lambda n: n.A_log.numel(),
    "dt_bias_numel": lambda n: n.dt_bias.numel(),
    "qkv_dim": lambda n: n.mixed_qkv.shape[1],
    "qk_dim": lambda n: n.qkv_dim - n.HV * n.V,
    "q_dim": lambda n: n.qk_dim // 2,
    "H": lambda n: n.q_dim // n.K,
}

CHECKS = (
    Check(1, lambda n: n.mixed_qkv.ndim != 2,
          "`mixed_qkv` must be a 2D tensor (got ndim={mixed_qkv.ndim})."),
    Check(2, lambda n: n.mixed_qkv.stride(-1) != 1,
          "`mixed_qkv` must be contiguous in the last dim."),
    Check(3, lambda n: n.a.ndim != 2 or n.b.ndim != 2,
          "`a` and `b` must be 2D tensors (got a.ndim={a.ndim}, b.ndim={b.ndim})."),
    Check(4, lambda n: n.a.stride(-1) != 1 or n.b.stride(-1) != 1,
          "`a`/`b` must be contiguous in the last dim."),
    Check(5, lambda n: n.A_log.ndim != 1 or n.dt_bias.ndim != 1,
          "`A_log`/`dt_bias` must be 1D tensors."),
    Check(6, lambda n: n.A_log.stride(0) != 1 or n.dt_bias.stride(0) != 1,
          "`A_log`/`dt_bias` must be contiguous."),
    Check(7, lambda n: n.ssm_state_indices.ndim != 1,
          "`ssm_state_indices` must be 1D for packed decode "
          "(got ndim={ssm_state_indices.ndim})."),
    Check(8, lambda n: not n.out.is_contiguous(), "`out` must be contiguous."),
    Check(9, lambda n: any(n[p].device != n.mixed_qkv.device for p in DEVICE_PEERS),
          "All inputs must be on the same device."),
    Check(10, lambda n: n.a.shape[0] != n.B or n.b.shape[0] != n.B,
          "Mismatched batch sizes: mixed_qkv.shape[0]={B}, a.shape[0]={a.shape[0]}, "
          "b.shape[0]={b.shape[0]}."),
    Check(11, lambda n: n.ssm_state_indices.shape[0] != n.B,
          "`ssm_state_indices` must have shape [B] (got {idx_shape}; expected ({B},))."),
    Check(12, lambda n: n.initial_state.ndim != 4,
          "`initial_state` must be a 4D tensor (got ndim={initial_state.ndim})."),
    Check(13, lambda n: n.initial_state.stride(-1) != 1,
          "`initial_state` must be contiguous in the last dim."),
    Check(14, lambda n: not (_pow2(n.K) and _pow2(n.V)),
          "Helion KDA decode requires power-of-two key and value head dimensions "
          "(got K={K}, V={V}).", HELION),
    Check(15, lambda n: n.a.shape[1] != n.HVK,
          "`a` must have shape [B, HV*K] with HV={HV}, K={K} (got a.shape={a_shape})."),
    Check(16, lambda n: n.b.shape[1] != n.HV,
          "`b` must have shape [B, HV] with HV={HV} (got b.shape={b_shape})."),
    Check(17, lambda n: n.A_log_numel != n.HV,
          "`A_log` must have {HV} elements (got {A_log_numel})."),
    Check(18, lambda n: n.dt_bias_numel != n.HVK,
          "`dt_bias` must have {HVK} elements (got {dt_bias_numel})."),
    Check(19, lambda n: n.out_shape != n.out_expected,
          "`out` must have shape {out_expected} (got out.shape={out_shape})."),
    Check(20, lambda n: n.qk_dim <= 0 or n.qk_dim % 2 != 0,
          "Invalid packed `mixed_qkv` last dim={qkv_dim} for HV={HV}, V={V}."),
    Check(21, lambda n: n.q_dim % n.K != 0,
          "Invalid packed Q size {q_dim}: must be divisible by K={K}. KDA packed decode "
          "requires num_q_heads == num_k_heads and head_q_dim == head_k_dim."),
    Check(22, lambda n: n.H <= 0 or n.HV % n.H != 0,
          "Invalid head config inferred from mixed_qkv: H={H}, HV={HV}."),
)

# Upstream lets HV = 0 or V = 0 through and divides by K = 0 in check 21: a correct
# implementation must still raise ValueError there (which message is not pinned).
HOLES = (Hole("zero-sized K, V or HV", lambda n: min(n.K, n.V, n.HV) == 0, after=13),)


# --------------------------------------------------------------------------- oracle

_U32 = 2.0**-24


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _tiny(dtype: torch.dtype) -> float:
    fi = torch.finfo(dtype)
    return fi.smallest_normal * fi.eps


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers of the same width (NaN-safe equality)."""
    return t.view(_INT_OF_SIZE[t.element_size()])


def reference64(args: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Float64 result and per-element error bounds for the rows with ``idx >= 0``."""
    from kernels.kda_decode.reference import decode_terms

    state, out = args["initial_state"], args["out"]
    f64 = torch.float64
    HV, V, K = state.shape[-3:]
    H = (args["mixed_qkv"].shape[1] - HV * V) // 2 // K
    lb = args["lower_bound"]
    t = decode_terms(args["mixed_qkv"], args["a"], args["b"], args["A_log"], args["dt_bias"],
                     args["scale"], state, args["ssm_state_indices"],
                     args["use_qk_l2norm_in_kernel"], lb, H, f64)
    g, A = t["g"], t["A"]
    gamma = 8.0 * (K + 16) * _U32
    A_log = args["A_log"].to(f64).reshape(HV, 1)
    gsens = (g.abs() * (A_log.abs() + 4)
             + A * (t["a"].abs() + t["dt_bias"].abs()) * max(1.0, abs(lb or 0.0)))
    S0 = t["S0"].abs()
    S_dec = t["S_dec"].abs()
    k_abs, q_abs = t["k"].abs(), t["q"].abs()
    # exp(g) and sigmoid(b) may underflow (or flush to zero) in float32: an absolute error
    # of one smallest normal each, multiplied by what they scale.
    tiny32 = torch.finfo(torch.float32).smallest_normal
    delta = t["v"].abs() + torch.einsum("rhvk,rhk->rhv", S_dec, k_abs)
    M_r = t["beta"].unsqueeze(-1) * delta
    e_state = (S_dec * (gamma + 4 * _U32 * gsens.unsqueeze(2))
               + (gamma * M_r + tiny32 * delta).unsqueeze(-1) * k_abs.unsqueeze(2)
               + tiny32 * (S0 + 1))
    new_state, o = t["S"], t["o"]
    sc = abs(float(args["scale"]))
    # scale itself is rounded to float32: by 2^-24 relative, or by up to the subnormal
    # spacing 2^-149 when it is tiny (a float64 scale of 1e-44 is subnormal in float32).
    sc_ulp = max(sc * _U32, 2.0**-149)
    Sq = torch.einsum("rhvk,rhk->rhv", new_state.abs(), q_abs)
    e_out = sc * (
        torch.einsum("rhvk,rhk->rhv", e_state, q_abs)
        + gamma * Sq
        + tiny32 * (1 + q_abs.sum(-1, keepdim=True))
    ) + sc_ulp * Sq
    return {
        "rows": t["rows"],
        "slots": t["slots"],
        "out": o,
        "state": new_state,
        "out_bound": e_out * (1 + _eps(out.dtype)) + _eps(out.dtype) * o.abs() + _tiny(out.dtype),
        "state_bound": e_state + _eps(state.dtype) * new_state.abs() + _tiny(state.dtype),
    }


def _compare(name: str, got: torch.Tensor, ref: torch.Tensor,
             bound: torch.Tensor) -> Verdict | None:
    err = (got.to(torch.float64) - ref).abs()
    bad = ~(err <= bound)  # NaN in got is bad
    if not bool(bad.any()):
        return None
    ratio = torch.where(bad, err / bound.clamp_min(1e-300), torch.zeros_like(err))
    ratio = torch.nan_to_num(ratio, nan=float("inf"))
    flat = int(ratio.flatten().argmax())
    where = list(torch.unravel_index(torch.tensor(flat), ratio.shape))
    where = [int(w) for w in where]
    g, r, bnd = got.flatten()[flat].item(), ref.flatten()[flat].item(), bound.flatten()[flat].item()
    return Verdict(
        "mismatch", f"{name}-value",
        f"{name} differs from the float64 reference at {where}: got {g!r}, expected {r!r} "
        f"(|err|={abs(g - r):.3g} > bound {bnd:.3g}); {int(bad.sum())} of {bad.numel()} "
        "elements out of tolerance",
        output=name, max_error=float(err[bad].max()) if bool(torch.isfinite(err[bad]).all())
        else float("inf"), where=where,
    )


def judge(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
          after: dict[str, torch.Tensor], result: Any) -> Verdict | None:
    """The differential and semantic oracle for a layout the contract accepts.

    ``before`` holds the bases as they were handed over, ``after`` the same bases after
    the call; ``kwargs`` the views the target received. Raises ``Unjudgeable``.
    """
    out, state = kwargs["out"], kwargs["initial_state"]
    if not (isinstance(result, tuple | list) and len(result) == 2
            and result[0] is out and result[1] is state):
        got = type(result).__name__
        return Verdict("mismatch", "returned-objects",
                       f"must return the caller's own (out, initial_state); got {got}")
    ref_args = {n: case.tensors[n].view(before[n]) for n in case.tensors}
    ref_args.update(case.scalars)
    ref = reference64(ref_args)
    masks = _masks(case, kwargs, after, ref)
    if _all_pass(kwargs, before, after, ref, masks):  # one device sync on the common path
        return None
    return _diagnose(kwargs, before, after, ref, masks)


def _masks(case: Case, kwargs: dict[str, Any], after: dict[str, torch.Tensor],
           ref: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Cells of the ``out`` base outside the view (guards), state base cells outside the
    named slots, and the padding rows."""
    guard = torch.ones_like(after["out"], dtype=torch.bool)
    case.tensors["out"].view(guard).fill_(False)
    untouched = torch.ones_like(after["initial_state"], dtype=torch.bool)
    case.tensors["initial_state"].view(untouched)[ref["slots"]] = False
    return {"guard": guard, "untouched": untouched, "pad": kwargs["ssm_state_indices"] < 0}


def _within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    return ((got.to(torch.float64) - ref).abs() <= bound).all()


def _fits(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Finite and within half the range of ``dtype`` (a device boolean)."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    return torch.isfinite(t).all() & (t.abs().amax() <= 0.5 * torch.finfo(dtype).max)


def _all_pass(kwargs: dict[str, Any], before: dict[str, torch.Tensor],
              after: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
              masks: dict[str, torch.Tensor]) -> bool:
    """Every rule of ``_diagnose`` at once, as device booleans read back together."""
    out, state = kwargs["out"], kwargs["initial_state"]
    flags = [(_bits(before[n]) == _bits(after[n])).all() for n in READ_ONLY]
    flags += [_fits(ref["out"], out.dtype), _fits(ref["state"], state.dtype)]
    flags.append(((_bits(after["out"]) == _bits(before["out"])) | ~masks["guard"]).all())
    flags.append(((out == 0).flatten(1).all(1) | ~masks["pad"]).all())
    flags.append(_within(out[ref["rows"], 0], ref["out"], ref["out_bound"]))
    changed = _bits(after["initial_state"]) != _bits(before["initial_state"])
    flags.append(~(changed & masks["untouched"]).any())
    flags.append(_within(state[ref["slots"]], ref["state"], ref["state_bound"]))
    return bool(torch.stack(flags).all())


def _diagnose(kwargs: dict[str, Any], before: dict[str, torch.Tensor],
              after: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
              masks: dict[str, torch.Tensor]) -> Verdict | None:
    """The first broken rule, in order, with its evidence."""
    out, state = kwargs["out"], kwargs["initial_state"]
    for name in READ_ONLY:
        if not same_bits(before[name], after[name]):
            return Verdict("mismatch", f"mutated-{name}", f"read-only input `{name}` was modified")
    if not bool(_fits(ref["out"], out.dtype) & _fits(ref["state"], state.dtype)):
        raise Unjudgeable("float64 result exceeds half the range of the stored dtype")

    # out: guard cells untouched, padding rows exactly zero, valid rows within bound.
    guard = masks["guard"]
    if not torch.equal(_bits(after["out"])[guard], _bits(before["out"])[guard]):
        return Verdict("mismatch", "out-guard-written", "wrote outside `out`'s elements")
    idx = kwargs["ssm_state_indices"].to(torch.long)
    pad = masks["pad"].nonzero().squeeze(1)
    if pad.numel():
        pad_vals = out[pad]
        if not bool((pad_vals == 0).all()):
            row = int(pad[(pad_vals != 0).flatten(1).any(1)][0])
            return Verdict("mismatch", "padding-row-not-zero",
                           f"padding row {row} (index {int(idx[row])}) of `out` is not all zeros: "
                           f"{out[row].flatten()[:8].tolist()}", output="out", where=[row])
    v = _compare("out", out[ref["rows"], 0], ref["out"], ref["out_bound"])
    if v is not None:
        return _with_row(v, ref["rows"])

    # state: named slots within bound; every other cell of the pool bit-identical.
    changed = (_bits(after["initial_state"]) != _bits(before["initial_state"])) & masks["untouched"]
    if bool(changed.any()):
        cell = int(changed.nonzero()[0, 0])
        return Verdict("mismatch", "untouched-state-written",
                       f"state pool element {cell} of the base buffer, outside every slot named by "
                       f"a non-negative index, changed", output="initial_state", where=[cell])
    v = _compare("initial_state", state[ref["slots"]], ref["state"], ref["state_bound"])
    if v is not None:
        return _with_row(v, ref["rows"])
    return None


def cross_judge(case: Case, before: dict[str, torch.Tensor],
                results: list[tuple[str, dict[str, Any]]]) -> Verdict | None:
    """Peer mode: two implementations' outputs on the same accepted layout agree within
    the sum of their tolerance bounds (each bound as in ``judge``)."""
    ref_args = {n: case.tensors[n].view(before[n]) for n in case.tensors}
    ref_args.update(case.scalars)
    ref = reference64(ref_args)
    (name_a, a), (name_b, b) = results[0], results[1]
    rows, slots = ref["rows"], ref["slots"]
    for output, got_a, got_b, bound in (
        ("out", a["out"][rows, 0], b["out"][rows, 0], ref["out_bound"]),
        ("initial_state", a["initial_state"][slots], b["initial_state"][slots],
         ref["state_bound"]),
    ):
        v = _compare(output, got_a, got_b.to(torch.float64), 2 * bound)
        if v is not None:
            detail = v.detail.replace("the float64 reference", name_b).replace(
                "got", f"{name_a} gave", 1)
            return _with_row(Verdict("mismatch", f"peers-disagree-{output}", detail,
                                     output=output, max_error=v.max_error, where=v.where),
                             rows)
    return None


def _with_row(v: Verdict, rows: torch.Tensor) -> Verdict:
    """Point ``where`` at the batch row rather than the position among valid rows."""
    if v.where:
        where = [int(rows[v.where[0]]), *v.where[1:]]
        return Verdict(v.kind, v.what, v.detail, v.check, v.message, v.output, v.max_error, where)
    return v


CONTRACT = Contract(
    name="kda",
    signature=SIGNATURE,
    variants=("helion", "triton"),
    checks=CHECKS,
    derived=DERIVED,
    judge=judge,
    valid_cases=kda_layouts.valid_cases,
    broken_cases=kda_layouts.broken_cases,
    broken_arms=kda_layouts.broken_arms,
    holes=HOLES,
    families=kda_layouts.families,
    cross_judge=cross_judge,
    doc=__doc__ or "",
    extras={
        "default_targets": {
            "helion": ("kernels.kda_decode:helion_fused_recurrent_kda_packed_decode",),
            "triton": ("kernels.kda_decode:fused_recurrent_kda_packed_decode",
                       "kernels.kda_decode:kda_packed_decode"),
        },
        "reference_target": "kernels.kda_decode:reference_kda_packed_decode",
    },
)
