"""The packed KDA decode contract (spec ``kda-packed-decode.md``) as data.

Checks 1-22 with their exact messages, the derived values they use and the holes that
must still raise. The differential oracle and its tolerance policy are the packed decode
families' shared ones (``packed_judge``, ``packed_tolerance``), with KDA's reference:

* reference: the terms of ``reference_kda_packed_decode`` (``decode_terms``) in float64
  on the same (upcast) inputs, with the bounds computed from them in the same pass;
* per element, |got - ref| <= bound, where the bound is a forward error estimate of
  float32 arithmetic built from the magnitudes of the terms (gamma = 8 (K + 16) 2^-24
  per accumulated product, the gate's sensitivity for exp(g), the float32 rounding of
  ``scale``, subnormal included; an absolute term of 2^-150 per product for underflow),
  plus one rounding of the stored dtype (its eps times
  |ref|) and the dtype's subnormal spacing. Float32 done
  right sits orders of magnitude inside it; one bf16/fp16 rounding of an intermediate
  (eps 2^-8 / 2^-11) lands outside it;
* padding rows exactly 0 (``out`` is pre-filled with NaN); every state element outside
  the named slots, guard cells included, bit-identical; read-only inputs bit-identical;
  the returned pair ``is`` the caller's ``(out, initial_state)``.

Layouts whose float64 result does not fit the stored dtype (more than half its max) are
not judged numerically (counted as ``skipped_unjudgeable``); the other rules (read-only
inputs, guard cells, padding rows, untouched slots) still hold for them.
"""

from __future__ import annotations

from typing import Any

import torch

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import (
    Check,
    Contract,
    Deferred,
    Hole,
    ModuleExecution,
    ScaleStratum,
    shape,
)
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families.kda import layouts as kda_layouts
from kda_fuzz.families.kda import scale as kda_scale
from kda_fuzz.families.packed import invariance as packed_invariance
from kda_fuzz.families.packed import judge as packed_judge
from kda_fuzz.families.packed import pins
from kda_fuzz.families.packed import summary as packed_summary
from kda_fuzz.families.packed.judge import Fused, Reference, pow2
from kda_fuzz.families.packed.knobs import KNOBS
from kda_fuzz.families.packed.shrink import PackedDecodeShrinker
from kda_fuzz.names import BUILTINS

SIGNATURE = (
    "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
    "ssm_state_indices", "use_qk_l2norm_in_kernel", "lower_bound",
)
READ_ONLY = ("mixed_qkv", "a", "b", "A_log", "dt_bias", "ssm_state_indices")
DEVICE_PEERS = ("a", "b", "A_log", "dt_bias", "initial_state", "out", "ssm_state_indices")
HELION = frozenset({"helion"})


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
    Check(14, lambda n: not (pow2(n.K) and pow2(n.V)),
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


def judge(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
          after: dict[str, torch.Tensor], result: Any,
          budget: dict[str, float] | None = None, *,
          reference: Reference | None = None, fused: Fused | None = None,
          facts: dict[str, Any] | None = None, defer: bool = False) -> Verdict | Deferred | None:
    """KDA's judge: the packed decode oracle (:func:`packed_judge.judge`, KDA's float64
    reference by default) with the GPU-scale cases judged by ``kda_scale.judge_sampled``
    (which tells ``facts`` how)."""
    return packed_judge.judge(case, kwargs, before, after, result, budget, reference=reference,
                              fused=fused, sampled=kda_scale.judge_sampled, facts=facts,
                              defer=defer)


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
    aims=lambda variant: {b.name: b.check for b in kda_layouts.breakages(variant)},
    restrict=lambda unsupported, variant: pins.restrictions(unsupported, variant),
    holes=HOLES,
    families=kda_layouts.families,
    cross_judge=packed_judge.cross_judge,
    upgrade_verdict=packed_judge.upgrade_verdict,  # older files' verdicts
    doc=__doc__ or "",
    scalars={"scale": "float", "use_qk_l2norm_in_kernel": "bool", "lower_bound": "float?"},
    default_targets=BUILTINS["kda"].targets,  # (declared light: chosen without torch)
    reference_target="kda_fuzz_kernels.kda_decode:reference_kda_packed_decode",
    execution=ModuleExecution("kda_fuzz.execution.cpu"),
    knobs=KNOBS,  # its options and sizes (interpreted kernels on CPU: 2^13 elements)
    shrinker=PackedDecodeShrinker(gate_per_key=True, pow2_variants=HELION),
    summarize=packed_judge.layout_summary,  # a case's sizes, dtypes and strides in one line
    sizes=packed_judge.packed_sizes,
    # calibrate.py: a valid case of `rows` batch rows and one head, K = V = `width`
    probe=lambda rows, width, variant: kda_layouts.build(
        kda_layouts.KdaLayout(B=rows, H=1, HV=1, K=width, V=width, seed=0), variant),
    # the GPU-scale stratum: (variant, device, budget_bytes) -> strategy or None
    scale=ScaleStratum(kda_scale.scale_cases, kda_scale.device_budget, focus=True),
    judge_budget=True,  # judge(..., budget={}) reports the error budget used
    judge_facts=True,  # judge(..., facts={}) says how a scale case was judged
    judge_defers=True,  # judge(..., defer=True): the fused GPU judge's read comes later
    status=packed_judge.fused_status,  # says so when the fused GPU judge turned itself off
    report_notes=kda_scale.report_notes,
    report_rows=packed_summary.report_rows,  # the rows its valid cases verified
    report_json=packed_summary.report_json,
    tally=packed_summary.tally,
    batch=packed_invariance.BATCH,
)
