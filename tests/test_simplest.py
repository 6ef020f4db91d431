"""Minimization ends on canonical cases where the failure allows (issue 22, part 8): the
fewest heads the GQA ratio needs, ``scale`` 1.0, values 0/+-1/small integers, the
shortest batch."""

from __future__ import annotations

import math

from kda_fuzz.campaign.minimize import minimize_with_verdict
from kda_fuzz.engine.oracle import run_case
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, Values, build
from tests import planted

KDA = get_contract("kda")


def _minimized(case, target, seconds: float = 60.0):
    outcome = run_case(KDA, case, target)
    assert outcome.status == "fail", outcome
    small, verdict = minimize_with_verdict(KDA, case, target, outcome.verdict, seconds=seconds)
    assert run_case(KDA, small, target).status == "fail"
    return small, verdict


def _integers(case, name: str) -> bool:
    v = case.tensors[name].view().double()
    return bool(((v == v.round()) & (v.abs() <= 4)).all())


def test_a_gqa_bug_ends_on_two_key_heads_of_two_value_heads() -> None:
    """HV=10 over H=5 (two value heads per key head): HV=4, H=2 is the fewest that show
    a wrong key head per value head; scale 1.0, small integer values, one row."""
    case = build(KdaLayout(B=5, H=5, HV=10, K=8, V=4, spare_slots=2, seed=11), "triton")
    small, _ = _minimized(case, planted.wrong_gqa)
    HV, V, K = small.tensors["initial_state"].shape[1:]
    B, width = small.tensors["mixed_qkv"].shape
    assert (HV, (width - HV * V) // (2 * K)) == (4, 2), small.describe()
    assert B == 1
    assert small.scalars["scale"] == 1.0
    assert _integers(small, "mixed_qkv") and _integers(small, "initial_state")


def test_a_tiny_scale_failure_keeps_a_power_of_two_not_the_drawn_value() -> None:
    """A bug visible only with a tiny ``scale`` (a target that writes zeros below
    ``|scale| < 1e-20``) keeps the magnitude as a power of two, not the drawn 1.37e-25,
    and its values become small integers."""
    def zero_below_1e_20(*args):
        out, state = planted.reference_kda_packed_decode(*args)
        if abs(args[5]) < 1e-20:
            out.zero_()
        return out, state

    case = build(KdaLayout(B=3, H=1, HV=2, K=4, V=2, scale=1.37e-25,
                           values=Values(qkv_scale=1e-3)), "triton")
    small, _ = _minimized(case, zero_below_1e_20)
    scale = small.scalars["scale"]
    assert abs(scale) < 1e-20 and math.frexp(abs(scale))[0] == 0.5, scale
    assert _integers(small, "mixed_qkv") and _integers(small, "initial_state")
    assert small.tensors["mixed_qkv"].shape[0] == 1
