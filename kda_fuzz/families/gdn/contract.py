"""The packed GDN (gated delta rule) decode contract (spec section 3, last paragraph).

``fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale,
initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel=False)``: KDA's packing,
padding and state semantics, with one gate per value head (``a``, ``b``: ``[B, HV]``;
``A_log``, ``dt_bias``: HV elements; ``g = -exp(A_log[hv]) * softplus(a[i, hv] +
dt_bias[hv])`` decays the whole ``[V, K]`` state of the head).

Checks, in order, numbered after KDA's: 1-13 as KDA; 14, helion variant only, power-of-two
K and V (the spec documents no such check for GDN, so it is not worded: any ValueError
passes, and a Helion kernel from another engine is not judged on this project's wording;
the documented contract is the ``triton`` variant, the default); 15 ``a``/``b`` width
(KDA's 15 and 16 in one); 16 ``A_log``/``dt_bias`` sizes (KDA's 17 and 18 in one);
19-22 as KDA, check 21's message ending after ``must be divisible by K={K}.``.
Holes as KDA's: the documented
checks let HV = 0 and V = 0 through (a target that returns there changing nothing shows
a validation gap; ``--strict`` demands ValueError), and K = 0 behind a q/k segment that
passes check 20 reaches ``q_dim % K`` (ValueError expected, any message).

The oracle is the packed decode families' shared one, KDA's too
(:func:`kda_fuzz.families.packed_judge.judge`: bit-exact padding rows,
untouched slots, guard cells and read-only inputs; the caller's objects returned) with
this family's float64 reference and forward-error bounds (:func:`reference64`), which
admit beta kept in float32 or rounded to ``b``'s dtype (both conformant).
"""

from __future__ import annotations

from typing import Any

import torch

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Check, Contract, Deferred, Hole, ModuleExecution
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families.gdn import layouts as gdn_layouts
from kda_fuzz.families.kda import contract as kda
from kda_fuzz.families.kda.layouts import KdaLayout
from kda_fuzz.families.packed import invariance as packed_invariance
from kda_fuzz.families.packed import judge as packed_judge
from kda_fuzz.families.packed import pins
from kda_fuzz.families.packed import summary as packed_summary
from kda_fuzz.families.packed import tolerance as tol
from kda_fuzz.families.packed.judge import pow2
from kda_fuzz.families.packed.knobs import KNOBS
from kda_fuzz.families.packed.shrink import PackedDecodeShrinker
from kda_fuzz.names import BUILTINS

SIGNATURE = (
    "mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
    "ssm_state_indices", "use_qk_l2norm_in_kernel",
)
HELION = frozenset({"helion"})

DERIVED = dict(kda.DERIVED)

_KDA = {c.number: c for c in kda.CHECKS}

CHECKS = (
    *(_KDA[i] for i in range(1, 14)),
    Check(14, lambda n: not (pow2(n.K) and pow2(n.V)), None, HELION),
    Check(15, lambda n: n.a.shape[1] != n.HV or n.b.shape[1] != n.HV,
          "`a`/`b` must have shape [B, HV] with HV={HV} "
          "(got a.shape={a_shape}, b.shape={b_shape})."),
    Check(16, lambda n: n.A_log_numel != n.HV or n.dt_bias_numel != n.HV,
          "`A_log` and `dt_bias` must have {HV} elements "
          "(got A_log.numel()={A_log_numel}, dt_bias.numel()={dt_bias_numel})."),
    _KDA[19],
    _KDA[20],
    Check(21, lambda n: n.q_dim % n.K != 0,
          "Invalid packed Q size {q_dim}: must be divisible by K={K}."),
    _KDA[22],
)

HOLES = (Hole("zero-sized K, V or HV", lambda n: min(n.K, n.V, n.HV) == 0, after=13),)


def reference64(args: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Float64 result and per-element error bounds for the rows with ``idx >= 0`` (the
    bound as KDA's, with the gate's sensitivity taken per value head, and admitting beta
    rounded to ``b``'s dtype as upstream GDN kernels do: spec section 3)."""
    from kda_fuzz_kernels.gdn_decode.reference import gdn_decode_terms

    state = args["initial_state"]
    f64 = torch.float64
    HV, V, K = state.shape[-3:]
    H = (args["mixed_qkv"].shape[1] - HV * V) // 2 // K
    t = gdn_decode_terms(args["mixed_qkv"], args["a"], args["b"], args["A_log"],
                         args["dt_bias"], args["scale"], state, args["ssm_state_indices"],
                         args["use_qk_l2norm_in_kernel"], H, f64)
    g, A = t["g"], t["A"]
    A_log = args["A_log"].to(f64).reshape(HV)
    gsens = g.abs() * (A_log.abs() + 4) + A * (t["a"].abs() + t["dt_bias"].abs())  # [R, HV]
    return packed_judge.packed_bounds(args, t, gsens[:, :, None, None],
                                      beta_rel=tol.beta_rounding(args["b"].dtype))


FUSED = packed_judge.Fused(gate_per_key=False)  # the same reference as one kernel (packed_fused)


def judge(case: Case, kwargs: dict[str, Any], before: dict[str, torch.Tensor],
          after: dict[str, torch.Tensor], result: Any,
          budget: dict[str, float] | None = None, *, defer: bool = False
          ) -> Verdict | Deferred | None:
    """The packed decode oracle and tolerance policy with the GDN float64 reference."""
    return packed_judge.judge(case, kwargs, before, after, result, budget,
                              reference=reference64, fused=FUSED, defer=defer)


def cross_judge(case: Case, before: dict[str, torch.Tensor],
                results: list[tuple[str, dict[str, Any]]]) -> Verdict | None:
    """Peer mode: two implementations agree within the sum of their bounds."""
    return packed_judge.cross_judge(case, before, results, reference=reference64)


def _probe(rows: int, width: int, variant: str) -> Case:
    return gdn_layouts.build(KdaLayout(B=rows, H=1, HV=1, K=width, V=width, seed=0), variant)


CONTRACT = Contract(
    name="gdn",
    signature=SIGNATURE,
    variants=("triton", "helion"),  # the first is the default: the documented checks
    checks=CHECKS,
    derived=DERIVED,
    judge=judge,
    valid_cases=gdn_layouts.valid_cases,
    broken_cases=gdn_layouts.broken_cases,
    broken_arms=gdn_layouts.broken_arms,
    aims=lambda variant: {b.name: b.check for b in gdn_layouts.breakages(variant)},
    restrict=lambda unsupported, variant: pins.restrictions(unsupported, variant,
                                                            gdn_layouts.NOT_GDN),
    holes=HOLES,
    families=gdn_layouts.families,
    cross_judge=cross_judge,
    upgrade_verdict=packed_judge.upgrade_verdict,  # older files' verdicts
    doc=__doc__ or "",
    scalars={"scale": "float", "use_qk_l2norm_in_kernel": "bool"},
    default_targets=BUILTINS["gdn"].targets,  # (declared light: chosen without torch)
    reference_target="kda_fuzz_kernels.gdn_decode:reference_gdn_packed_decode",
    execution=ModuleExecution("kda_fuzz.execution.cpu"),
    knobs=KNOBS,  # the packed decode families' options and sizes
    shrinker=PackedDecodeShrinker(gate_per_key=False, pow2_variants=HELION),
    summarize=packed_judge.layout_summary,
    sizes=packed_judge.packed_sizes,
    probe=_probe,
    judge_budget=True,
    judge_defers=True,  # the shared fused GPU judge's read comes later in a campaign
    status=packed_judge.fused_status,  # the shared fused GPU judge (one gate per value head)
    batch=packed_invariance.BATCH,
    report_rows=packed_summary.report_rows,  # the rows its valid cases verified
    report_json=packed_summary.report_json,
    tally=packed_summary.tally,
)
