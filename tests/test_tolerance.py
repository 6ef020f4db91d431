"""No false alarms on conformant float32 arithmetic, and the bound stays tight (issue 22,
part 7): underflow in the subnormal range, and GDN's beta rounded to ``b``'s dtype."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.oracle import run_case
from kda_fuzz.families import get_contract
from kda_fuzz.families.gdn import layouts as gdn_layouts
from kda_fuzz.families.kda.layouts import KdaLayout, Values
from tests import gdn_mutants

GDN = get_contract("gdn")
TINY_SCALE = -1.175494351e-38  # the issue's scale: out lands in float32's subnormal range


def _tiny_scale_case(seed: int) -> Case:
    """GDN, float32, l2norm on, K = 18 and small values: ``out`` about 1e-42."""
    return gdn_layouts.build(KdaLayout(
        B=3, H=1, HV=2, K=18, V=8, seed=seed, use_qk_l2norm_in_kernel=True, scale=TINY_SCALE,
        values=Values(state_scale=1e-3, qkv_scale=1e-3)), "triton")


def _bf16_b_case(seed: int, state_dtype: torch.dtype = torch.float32) -> Case:
    return gdn_layouts.build(KdaLayout(B=3, H=1, HV=2, K=16, V=8, seed=seed,
                                       ab_dtype=torch.bfloat16, state_dtype=state_dtype),
                             "triton")


@pytest.mark.parametrize("seed", range(4))
def test_underflow_of_a_correct_float32_gdn_is_within_tolerance(seed: int) -> None:
    """The issue's case (a): out-value 2.3374e-42 against 2.3406e-42 was 1.65x the bound.
    Every product of ``S[v, k] * (q[k] * scale)`` may underflow by up to 2^-150."""
    case = _tiny_scale_case(seed)
    for target in (gdn_mutants.scale_in_products, gdn_mutants.correct_triton):
        outcome = run_case(GDN, case, target)
        assert outcome.status == "pass", outcome.verdict


def test_the_underflow_term_leaves_a_wrong_tiny_result_caught() -> None:
    def doubled_scale(*args: Any) -> Any:
        return gdn_mutants.scale_in_products(*args[:5], 2 * args[5], *args[6:])

    outcome = run_case(GDN, _tiny_scale_case(0), doubled_scale)
    assert outcome.status == "fail" and outcome.verdict.what == "out-value", outcome.verdict


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(3))
def test_gdn_beta_rounded_to_b_dtype_is_conformant(seed: int, state_dtype: torch.dtype) -> None:
    """The issue's case (b): sglang's and vLLM's GDN kernels round beta to bf16 ``b``'s
    dtype; the state was off by 469x the float32 bound."""
    outcome = run_case(GDN, _bf16_b_case(seed, state_dtype), gdn_mutants.beta_in_b_dtype)
    assert outcome.status == "pass", outcome.verdict


def test_beta_rounded_past_b_dtype_is_still_a_failure() -> None:
    """Only ``b``'s own dtype is admitted: float32 ``b`` with beta rounded to bf16 fails."""
    def beta_in_bf16(mixed_qkv, a, b, *rest):
        return gdn_mutants.beta_in_b_dtype(mixed_qkv, a, b.to(torch.bfloat16), *rest)

    case = gdn_layouts.build(KdaLayout(B=3, H=1, HV=2, K=16, V=8, seed=0), "triton")
    outcome = run_case(GDN, case, beta_in_bf16)
    assert outcome.status == "fail" and outcome.verdict.kind == "mismatch", outcome.verdict


@pytest.mark.parametrize("case_of", [_tiny_scale_case, _bf16_b_case])
def test_the_fused_judge_admits_the_same(case_of: Any) -> None:
    """``packed_fused`` (the GPU judge, here in the Triton interpreter) keeps the policy of
    the torch bounds: no element out of bound on either case, and the same ratio."""
    from kda_fuzz.families.gdn import contract as gdn
    from kda_fuzz.families.packed import fused as pf

    case = case_of(0)
    target = (gdn_mutants.scale_in_products if case_of is _tiny_scale_case
              else gdn_mutants.beta_in_b_dtype)
    kwargs, _ = case.materialize()
    views = {n: case.tensors[n].view(case.tensors[n].base) for n in case.tensors}
    views.update(case.scalars)
    target(*(kwargs[n] for n in GDN.signature))
    state = kwargs["initial_state"]
    named = torch.zeros(state.shape[0], dtype=torch.int8)
    s = pf.summary(views, state, kwargs["out"], gate_per_key=False, named=named).tolist()
    assert s[pf.OUT_OF_BOUND] == 0, s
    ref = gdn.reference64(views)
    rows, slots = ref["rows"], ref["slots"]
    out_ratio = float(((kwargs["out"][rows, 0] - ref["out"]).abs() / ref["out_bound"]).max())
    st_ratio = float(((state[slots] - ref["state"]).abs() / ref["state_bound"]).max())
    assert s[pf.OUT_RATIO] == pytest.approx(out_ratio, rel=1e-6, abs=1e-9)
    assert s[pf.STATE_RATIO] == pytest.approx(st_ratio, rel=1e-6, abs=1e-9)
