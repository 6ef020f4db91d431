"""The contract and differential oracles judge right and wrong implementations correctly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.oracle import expectation, run_case
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, Values, breakages, build
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode
from tests import mutants

KDA = get_contract("kda")


def _with(case: Case, name: str, shape: tuple[int, ...]) -> Case:
    """``case`` with tensor ``name`` replaced by zeros of another shape (same dtype)."""
    n = 1
    for d in shape:
        n *= d
    old = case.tensors[name]
    arg = TensorArg(torch.zeros(n, dtype=old.dtype), shape, torch.empty(shape).stride(), 0)
    return Case(case.contract, case.variant, {**case.tensors, name: arg}, case.scalars,
                (f"{name}-reshaped",), dict(case.notes))


def _layout(**kw) -> KdaLayout:
    base = dict(B=4, H=2, HV=4, K=8, V=4, spare_slots=3, padding="some", qkv_row_pad=5,
                slot_pad=3, guard=2, values=Values(), seed=7)
    base.update(kw)
    return KdaLayout(**base)


def _first_checks(variant: str, breakage: str) -> set[int | None]:
    """The first failing check of a few cases with only ``breakage`` applied."""
    found: set[int | None] = set()

    @settings(max_examples=6)
    @given(KDA.broken_cases(variant, only=breakage))
    def probe(case: Case) -> None:
        found.add(expectation(KDA, case).check)

    probe()
    return found


@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_every_check_is_reached_by_its_breakage(variant: str) -> None:
    """Each breakage aimed at check n, applied alone to a valid layout (the smallest one
    included), makes n the first failing check; together they reach every check."""
    seen: set[int] = set()
    for brk in breakages(variant):
        if brk.check is not None:
            assert _first_checks(variant, brk.name) == {brk.check}, brk.name
            seen.add(brk.check)
    assert seen == {c.number for c in KDA.checks_for(variant)}


def test_reference_passes_valid_and_broken_triton_cases() -> None:
    @settings(max_examples=30)
    @given(st.one_of(KDA.valid_cases("triton", budget=4096), KDA.broken_cases("triton")))
    def probe(case: Case) -> None:
        out = run_case(KDA, case, reference_kda_packed_decode)
        assert out.status in ("pass", "gap", "skip"), out.verdict

    probe()


def test_wrong_message_and_order_are_told_apart() -> None:
    case = _with(build(_layout(), "helion"), "a", (4, 33))
    v = run_case(KDA, case, mutants.make({"typo_check_15"}, "helion")).verdict
    assert v is not None and v.what == "wrong-message" and v.check == 15
    # K = 3 breaks check 14 (helion) and, with a too-wide `a`, check 15 as well.
    c = _with(build(_layout(K=3), "helion"), "a", (4, 13))
    out = run_case(KDA, c, mutants.make({"swap_14_15"}, "helion"))
    assert out.status == "fail" and out.verdict.what == "wrong-check-order"
    assert out.verdict.check == 14 and out.verdict.extra["got_check"] == 15


def test_zero_k_must_be_value_error_not_zero_division() -> None:
    # HV*V = 16 value columns plus 4 more: checks 1-20 pass, check 21 would divide by 0.
    case = _with(build(_layout(K=0), "triton"), "mixed_qkv", (4, 20))
    exp = expectation(KDA, case)
    assert not exp.ok and exp.message is None  # any ValueError message
    v = run_case(KDA, case, mutants.make({"no_harden"}, "triton")).verdict
    assert v is not None and v.what == "wrong-exception-type" and "ZeroDivisionError" in v.detail
    assert run_case(KDA, case, reference_kda_packed_decode).status == "pass"


def test_zero_v_accepted_is_a_gap_and_a_failure_only_when_strict() -> None:
    case = build(_layout(V=0), "triton")
    documented = mutants.make({"no_harden"}, "triton")
    assert run_case(KDA, case, documented).status == "gap"
    v = run_case(KDA, case, documented, strict=True).verdict
    assert v is not None and v.what == "accepted-broken-layout"


def test_mutation_before_raising_is_caught() -> None:
    case = _with(build(_layout(), "triton"), "b", (4, 5))
    v = run_case(KDA, case, mutants.make({"zero_out_first"})).verdict
    assert v is not None and v.what == "mutated-on-error"


def test_rejecting_a_valid_row_strided_layout_is_caught() -> None:
    case = build(_layout(qkv_row_pad=8), "triton")
    v = run_case(KDA, case, mutants.make({"qkv_requires_contiguous"})).verdict
    assert v is not None and v.what == "rejected-valid-layout"


def test_missing_k_segment_that_divides_out_is_a_validation_gap() -> None:
    # H=2, K=8: q and v only gives qk_dim = 16 -> H' = 1 divides HV: the checks pass.
    p = _layout(H=2, HV=4, K=8, V=4)
    good = build(p, "triton")
    wide = good.tensors["mixed_qkv"]
    narrow = type(wide)(torch.zeros(4 * (16 + 16)), (4, 32), (32, 1), 0)
    case = Case("kda", "triton", {**good.tensors, "mixed_qkv": narrow}, good.scalars,
                ("missing-k-segment",), {"semantic": True, "breakages": ["missing-k-segment"]})
    out = run_case(KDA, case, reference_kda_packed_decode)
    assert out.status == "gap"


@pytest.mark.parametrize("bug,what", [
    ("pad_wrap", "padding-row-not-zero"),
    ("padding_rows_untouched", "padding-row-not-zero"),
    ("new_out", "returned-objects"),
    ("gqa_modulo", None),
    ("k_major_state", None),
    ("ignore_slot_stride", None),
])
def test_semantic_bugs_are_caught_on_one_layout(bug: str, what: str | None) -> None:
    p = _layout(K=8, V=4, padding="first", seed=3)
    case = build(p, "triton")
    assert run_case(KDA, case, reference_kda_packed_decode).status == "pass"
    out = run_case(KDA, case, mutants.make({bug}))
    assert out.status == "fail" and out.verdict.kind == "mismatch"
    if what:
        assert out.verdict.what == what


def test_untouched_slot_written_is_caught() -> None:
    def writes_spare_slot(*args):
        res = reference_kda_packed_decode(*args)
        used = set(args[8].tolist())
        spare = next(i for i in range(args[6].shape[0]) if i not in used)
        args[6][spare].add_(1.0)
        return res

    case = build(_layout(), "triton")
    v = run_case(KDA, case, writes_spare_slot).verdict
    assert v is not None and v.what == "untouched-state-written"


def test_bf16_intermediate_rounding_is_outside_tolerance() -> None:
    p = _layout(state_dtype=torch.bfloat16, K=64, V=16, padding="none", seed=11)
    case = build(p, "triton")
    assert run_case(KDA, case, reference_kda_packed_decode).status == "pass"
    v = run_case(KDA, case, mutants.make({"low_precision_math"})).verdict
    assert v is not None and v.kind == "mismatch"


def test_peer_mode_compares_two_implementations() -> None:
    from kda_fuzz.engine.oracle import run_peers

    case = build(_layout(K=8, V=4, padding="first", seed=5), "triton")
    same = run_peers(KDA, case, [("ref", reference_kda_packed_decode),
                                 ("twin", mutants.correct_triton)])
    assert same.status == "pass"
    differ = run_peers(KDA, case, [("ref", reference_kda_packed_decode),
                                   ("kmajor", mutants.make({"k_major_state"}))])
    assert differ.status == "fail" and differ.verdict.what.startswith("peers-disagree")
    assert "kmajor" in differ.verdict.detail


def test_target_that_resizes_out_is_a_failure_not_a_crash() -> None:
    def shrinks_out(*args):
        res = reference_kda_packed_decode(*args)
        args[7].resize_(0)
        return res

    case = build(_layout(), "triton")
    v = run_case(KDA, case, shrinks_out).verdict
    assert v is not None and v.kind == "mismatch"


def test_the_fused_judge_never_reads_outputs_a_target_resized(monkeypatch) -> None:
    """On a GPU the fused kernel reads ``out`` and the state through the views handed
    over: a target that resized or moved them sends the case to the torch oracle before
    any launch (a read past them would fault the device: a crash that is not one)."""
    from kda_fuzz.families.packed import fused as packed_fused
    from kda_fuzz.families.packed import judge as packed_judge

    launched: list[bool] = []
    real = packed_fused.summary
    monkeypatch.setattr(packed_fused, "summary",
                        lambda *a, **k: launched.append(True) or real(*a, **k))
    for change in ("none", "resize", "retype", "move"):
        case = build(_layout(), "triton")
        kwargs, before, bases, ref_args = _corrupt(case, "none", 0,
                                                   reference_kda_packed_decode)
        if change == "resize":
            kwargs["out"].resize_(0)
        elif change == "retype":
            kwargs["initial_state"].data = kwargs["initial_state"].data.double()
        elif change == "move":
            kwargs["out"].set_(kwargs["out"].clone())
        launched.clear()
        verdict = packed_judge._fused_pass(case, ref_args, kwargs, before, bases,
                                           packed_judge.KDA_FUSED, None)
        assert verdict is (change == "none") and launched == [True] * (change == "none"), change


# One corruption of a correct result per rule of the KDA judge (or none).
_CORRUPTIONS = ("none", "read-only", "out-guard", "padding-row", "out-value", "untouched-state",
                "state-value", "overflow")


def _corrupt(case: Case, corruption: str, where: int, reference: Any) -> tuple[Any, ...]:
    """Run the correct ``reference`` on a copy of ``case``, then break one rule of the
    judge (``_CORRUPTIONS``; some need a feature the layout may lack and do nothing)."""
    from kda_fuzz.families.packed import judge as packed_judge

    kwargs, bases = case.materialize()
    before = {n: b.clone() for n, b in bases.items()}
    reference(*(kwargs[n] for n in get_contract(case.contract).signature))
    out, state = kwargs["out"], kwargs["initial_state"]
    if corruption == "read-only":
        name = packed_judge.READ_ONLY[where % len(packed_judge.READ_ONLY)]
        base = bases[name]
        if base.numel():
            base[where % base.numel()] = base[where % base.numel()] + 1
    elif corruption == "out-guard" and case.tensors["out"].offset:
        bases["out"][-(where % 2)] = 1.0  # the first guard cell or the last
    elif corruption == "padding-row":
        pad = (kwargs["ssm_state_indices"] < 0).nonzero().flatten()
        if pad.numel():
            out[int(pad[where % pad.numel()])] = 0.5
    elif corruption == "out-value" and out.numel():
        out.view(-1)[where % out.numel()] += 1.0
    elif corruption == "untouched-state":
        base = bases["initial_state"]
        base[where % base.numel()] = 3.0
    elif corruption == "state-value":
        slot = state[where % state.shape[0]]  # inner dims are contiguous, slots maybe not
        slot.view(-1)[where % slot.numel()] += 1.0
    ref_args = {n: case.tensors[n].view(before[n]) for n in case.tensors}
    ref_args.update(case.scalars)
    return kwargs, before, bases, ref_args


@settings(max_examples=60, deadline=None)
@given(layout=KDA.valid_cases("triton", budget=1 << 12, max_b=12),
       corruption=st.sampled_from(_CORRUPTIONS), where=st.integers(0, 2**16))
def test_fast_path_agrees_with_the_ordered_diagnosis(layout: Case, corruption: str,
                                                     where: int) -> None:
    """The judge's one-sync pass decision holds exactly when the ordered, per-rule
    diagnosis finds nothing (and does not call the case unjudgeable)."""
    from kda_fuzz.families.packed import judge as packed_judge

    case = layout
    kwargs, before, bases, ref_args = _corrupt(case, corruption, where,
                                               reference_kda_packed_decode)
    ref = packed_judge.reference64(ref_args)
    if corruption == "overflow" and ref["out"].numel():
        ref["out"].view(-1)[0] = float("inf")
    masks = packed_judge._masks(case, kwargs, before, bases)
    fast = packed_judge._all_pass(kwargs, before, bases, ref, masks)
    try:
        slow = packed_judge._diagnose(kwargs, before, bases, ref, masks) is None
    except packed_judge.Unjudgeable:
        slow = False
    event(f"{corruption}: {'pass' if fast else 'fail'}")
    assert fast == slow


@pytest.mark.parametrize("corruption,what", [("none", None),
                                               ("padding-row", "padding-row-not-zero"),
                                               ("untouched-state", "untouched-state-written")])
def test_a_result_too_large_for_its_dtype_is_still_judged_on_every_other_rule(
        corruption: str, what: str | None) -> None:
    """Unjudgeable means "not judged numerically": a nonzero padding row or a write to an
    unnamed slot is still a failure when the float64 result overflows the stored dtype."""
    from kda_fuzz.families.packed import judge as packed_judge

    case = build(_layout(spare_slots=3, padding="first", seed=3), "triton")
    kwargs, before, bases, ref_args = _corrupt(case, "none", 0, reference_kda_packed_decode)
    if corruption == "padding-row":
        pad = (kwargs["ssm_state_indices"] < 0).nonzero().flatten()
        assert pad.numel()
        kwargs["out"][int(pad[0])] = 0.5
    elif corruption == "untouched-state":
        named = set(kwargs["ssm_state_indices"].tolist())
        free = next(i for i in range(case.tensors["initial_state"].shape[0]) if i not in named)
        kwargs["initial_state"][free].view(-1)[0] += 1.0
    ref = packed_judge.reference64(ref_args)
    ref["out"].view(-1)[0] = float("inf")  # the float64 result overflows
    masks = packed_judge._masks(case, kwargs, before, bases)
    assert not packed_judge._all_pass(kwargs, before, bases, ref, masks)
    if what is None:
        with pytest.raises(packed_judge.Unjudgeable):
            packed_judge._diagnose(kwargs, before, bases, ref, masks)
    else:
        assert packed_judge._diagnose(kwargs, before, bases, ref, masks).what == what


def _fused_vs_torch(case: Case, corruption: str, where: int, reference: Any, family: Any,
                    fused: Any) -> None:
    """``packed_fused`` (the GPU's fast path, here in the Triton interpreter) passes a
    case exactly when the torch oracle does, calls it unjudgeable exactly where the torch
    oracle does, and reports the same error budget when it passes."""
    from kda_fuzz.families.packed import fused as packed_fused
    from kda_fuzz.families.packed import judge as packed_judge

    kwargs, before, bases, ref_args = _corrupt(case, corruption, where, reference)
    masks = packed_judge._masks(case, kwargs, before, bases)
    assert packed_fused.broken is None, packed_fused.broken
    outcome: dict[str, Any] = {}
    for name, judge in (("fused", lambda b: packed_judge._fused_pass(case, ref_args, kwargs, before,
                                                            bases, fused, b)),
                        ("torch", lambda b: packed_judge._all_pass(kwargs, before, bases,
                                                          family(ref_args), masks, b)
                         or packed_judge._diagnose(kwargs, before, bases, family(ref_args), masks)
                         is None)):
        budget: dict[str, float] = {}
        try:
            outcome[name] = (judge(budget), budget)
        except packed_judge.Unjudgeable:
            outcome[name] = ("unjudgeable", {})
    (fused_says, fused_budget), (torch_says, torch_budget) = outcome["fused"], outcome["torch"]
    event(f"{corruption}: {torch_says}")
    assert fused_says == torch_says
    if torch_says is not True:  # a budget is reported for passing cases
        return
    assert fused_budget.keys() == torch_budget.keys()
    for k, v in fused_budget.items():
        assert v == pytest.approx(torch_budget[k], rel=1e-6, abs=1e-12), k


def test_a_failing_fast_path_falls_back_to_the_torch_oracle(monkeypatch, capsys) -> None:
    """The fused judge's own failure is never a verdict: the fast path says "not decided",
    turns itself off for the process (saying why on stderr), and the torch oracle judges."""
    from kda_fuzz.families.packed import fused as packed_fused
    from kda_fuzz.families.packed import judge as packed_judge

    def broken(*args: Any, **kw: Any) -> None:
        raise TypeError("failed to specialize argument of type: dict")

    monkeypatch.setattr(packed_fused, "summary", broken)
    monkeypatch.setattr(packed_fused, "broken", None)
    case = build(_layout(), "triton")
    kwargs, before, bases, ref_args = _corrupt(case, "none", 0, reference_kda_packed_decode)
    assert packed_judge._fused_pass(case, ref_args, kwargs, before, bases,
                                    packed_judge.KDA_FUSED, None) is False
    assert "TypeError: failed to specialize" in (packed_fused.broken or "")
    assert "judging with the torch oracle" in capsys.readouterr().err
    assert packed_judge.judge(case, kwargs, before, bases,
                              (kwargs["out"], kwargs["initial_state"])) is None
    # ... and the campaign's summary says so
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.engine.targets import load_target

    report = campaign(KDA, "triton", [load_target(
        "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode")], max_examples=4, seed=1,
        budget=1 << 10)
    assert any("fused GPU judge failed (TypeError: failed to specialize" in n
               for n in report.notes), report.notes


@settings(max_examples=24, deadline=None)
@given(layout=KDA.valid_cases("triton", budget=1 << 11, max_b=6),
       corruption=st.sampled_from(_CORRUPTIONS[:-1]), where=st.integers(0, 2**16))
def test_fused_judge_agrees_with_the_torch_oracle(layout: Case, corruption: str,
                                                  where: int) -> None:
    """KDA (one gate per key, lower_bound or softplus)."""
    from kda_fuzz.families.packed import judge as packed_judge

    _fused_vs_torch(layout, corruption, where, reference_kda_packed_decode,
                    packed_judge.reference64, packed_judge.KDA_FUSED)


@settings(max_examples=12, deadline=None)
@given(layout=get_contract("gdn").valid_cases("triton", budget=1 << 11, max_b=6),
       corruption=st.sampled_from(_CORRUPTIONS[:-1]), where=st.integers(0, 2**16))
def test_fused_judge_agrees_with_the_torch_oracle_on_gdn(layout: Case, corruption: str,
                                                         where: int) -> None:
    """GDN (one gate per value head)."""
    from kda_fuzz.families.gdn import contract as gdn
    from kda_fuzz_kernels.gdn_decode import reference_gdn_packed_decode

    _fused_vs_torch(layout, corruption, where, reference_gdn_packed_decode, gdn.reference64,
                    gdn.FUSED)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_fused_judge_agrees_with_the_torch_oracle_gpu(family: str, kda_device_name: str
                                                      ) -> None:
    """The same on the GPU, compiled, with GPU-sized layouts (B up to 4096)."""
    from kda_fuzz.families.gdn import contract as gdn
    from kda_fuzz.families.packed import judge as packed_judge
    from kda_fuzz_kernels.gdn_decode import reference_gdn_packed_decode

    contract = get_contract(family)
    reference, ref64, fused = ((reference_kda_packed_decode, packed_judge.reference64,
                                packed_judge.KDA_FUSED)
                               if family == "kda" else
                               (reference_gdn_packed_decode, gdn.reference64, gdn.FUSED))

    @settings(max_examples=50, deadline=None)  # most examples compile a dtype mix anew
    @given(layout=contract.valid_cases("triton", device=kda_device_name, budget=1 << 20,
                                       max_b=4096, bucket=True),
           corruption=st.sampled_from(_CORRUPTIONS[:-1]), where=st.integers(0, 2**16))
    def agree(layout: Case, corruption: str, where: int) -> None:
        _fused_vs_torch(layout, corruption, where, reference, ref64, fused)

    agree()


def test_a_scale_subnormal_in_float32_is_within_tolerance() -> None:
    """A float64 scale of 5.6e-44 is a float32 subnormal (40 times 2^-149): a float32
    kernel's result differs from the float64 reference by that rounding, not by a bug.
    Found by the CI fuzz test of the Triton kernel."""
    from kda_fuzz_kernels.kda_decode import fused_recurrent_kda_packed_decode

    p = KdaLayout(B=1, H=1, HV=1, K=1, V=1, scale=5.578987510632595e-44,
                  values=Values(state_scale=10.0), seed=0)
    case = build(p, "triton")
    outcome = run_case(KDA, case, fused_recurrent_kda_packed_decode)
    assert outcome.status == "pass", outcome.verdict

    def doubled_scale(*args):  # the bound stays tight: a wrong scale is still caught
        return fused_recurrent_kda_packed_decode(*args[:5], 2 * args[5], *args[6:])

    assert run_case(KDA, case, doubled_scale).status == "fail"


def test_documented_contract_gaps_are_not_failures_unless_strict() -> None:
    """A target that follows the documented checks only returns on HV = 0 and changes
    nothing: a validation gap of the contract by default, a failure under --strict; one
    that writes on such a layout, or raises another type, fails either way."""
    from kda_fuzz.families.kda.layouts import KdaLayout, build
    from tests import mutants

    hv0 = build(KdaLayout(B=2, H=1, HV=0, K=4, V=4, seed=1), "helion")
    gap = run_case(KDA, hv0, mutants.documented_helion)
    assert gap.status == "gap" and gap.expectation.hole, gap
    assert run_case(KDA, hv0, mutants.documented_helion, strict=True).verdict.what == \
        "accepted-broken-layout"
    assert run_case(KDA, hv0, mutants.correct_helion, strict=True).status == "pass"

    def writes(*args):  # returns normally on the degenerate layout but writes `mixed_qkv`
        args[0].fill_(0)
        return args[7], args[6]

    assert run_case(KDA, hv0, writes).verdict.what == "wrote-on-degenerate-layout"


@pytest.mark.slow  # three campaigns
def test_campaigns_against_the_documented_checks_see_gaps_not_failures_unless_strict() -> None:
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.engine.targets import Target
    from tests import mutants

    twin = [Target("documented", mutants.documented_helion)]
    rep = campaign(KDA, "helion", twin, max_examples=600, seed=4, max_failures=20)
    assert not rep.failures, [f.verdict.summary() for f in rep.failures]
    assert rep.checks_hit["hole:zero-sized K, V or HV"] > 0
    strict = campaign(KDA, "helion", twin, max_examples=1500, seed=4, strict=True,
                      valid_share=0.0)
    assert [f.verdict.what for f in strict.failures] == ["accepted-broken-layout"]
    assert strict.failures[0].case.notes.get("strict") is True  # replayed as it was found
    # K = 0 on the triton variant divides by zero in the documented checks: a failure
    zero_k = campaign(KDA, "triton", [Target("no_harden", mutants.no_harden)],
                      max_examples=600, seed=4, max_failures=20)
    assert "wrong-exception-type" in {f.verdict.what for f in zero_k.failures}


@pytest.mark.slow  # three campaigns
def test_message_class_policy_counts_wording_and_judges_the_rest() -> None:
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.engine.targets import Target
    from tests import mutants

    typo = [Target("typo", mutants.typo_check_20)]
    exact = campaign(KDA, "triton", typo, max_examples=400, seed=2)
    assert [f.verdict.what for f in exact.failures] == ["wrong-message"]
    lenient = campaign(KDA, "triton", typo, max_examples=400, seed=2, messages="class")
    assert not lenient.failures
    assert lenient.wording[20] > 0
    check, expected, got = lenient.wording_samples[0]
    assert check == 20 and got == expected + " "  # the typo: a trailing space
    # a wrong exception type still fails under the class policy
    zero_k = campaign(KDA, "triton", [Target("no_harden", mutants.no_harden)],
                      max_examples=600, seed=4, messages="class", max_failures=20)
    assert "wrong-exception-type" in {f.verdict.what for f in zero_k.failures}


@pytest.mark.parametrize("cat_bytes", [1 << 26, 0])
def test_mutated_names_every_base_changed_and_none_else(monkeypatch, cat_bytes: int) -> None:
    """``_mutated`` names each base with a changed byte (one bit of one cell is enough),
    in the bases' order, whether the bases are first compared as one buffer or not; where
    none changed, the one-buffer comparison decides without a comparison per base."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from kda_fuzz.engine import oracle

    monkeypatch.setattr(oracle, "MUTATED_CAT_BYTES", cat_bytes)
    g = torch.Generator().manual_seed(4)
    before = {"x": torch.randn(9, generator=g), "y": torch.randn(5, generator=g).half(),
              "i": torch.arange(4, dtype=torch.int32), "e": torch.empty(0)}
    after = {n: t.clone() for n, t in before.items()}
    assert oracle._mutated(before, after) == []
    after["i"][3] = 3 | (1 << 30)
    after["y"].view(torch.int16)[0] ^= 1
    assert oracle._mutated(before, after) == ["y", "i"]

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        oracle._mutated(before, {n: t.clone() for n, t in before.items()})
    assert ("stack" in ops.names) == (cat_bytes == 0)


def test_the_fused_judges_batch_reads_each_cases_own_values_in_one_transfer() -> None:
    """Cases judged with their reads left for later (``--read-every``): each one's values
    go to a row of one buffer, read with one transfer, and each case is decided as its
    own read at once decides it; the buffer's rows are free again once all are read."""
    from kda_fuzz.families.packed import judge as packed_judge

    batch = packed_judge.BATCH
    assert batch.used == 0
    cases, reads = [], []
    for i, corruption in enumerate(_CORRUPTIONS[:-1] * 2):
        case = build(_layout(seed=i, B=2 + i % 3), "triton")
        kwargs, before, bases, ref_args = _corrupt(case, corruption, i * 7919,
                                                   reference_kda_packed_decode)
        cases.append((case, kwargs, before, bases, ref_args))
        reads.append(packed_judge._fused_launch(case, ref_args, kwargs, before, bases,
                                                packed_judge.KDA_FUSED, batched=True))
    assert batch.used == len(cases) and batch.host is None
    transfers = []
    rows = batch.rows
    assert rows is not None
    batch.rows = _Counted(rows, transfers)
    try:
        decided = []
        for (case, kwargs, before, bases, ref_args), read in zip(cases, reads):
            assert read is not None
            try:
                late = packed_judge._fused_read(read, kwargs["out"], kwargs["initial_state"],
                                                None)
            except Exception as e:  # Unjudgeable: as at once
                late = type(e).__name__
            try:
                now = packed_judge._fused_pass(case, ref_args, kwargs, before, bases,
                                               packed_judge.KDA_FUSED, None)
            except Exception as e:
                now = type(e).__name__
            decided.append((late, now))
    finally:
        batch.rows = rows
    assert all(late == now for late, now in decided), decided
    assert {now for _, now in decided} >= {True, False}  # (passes and failures both)
    assert len(transfers) == 1 and batch.used == 0 and batch.host is None


class _Counted:
    """A tensor whose slices' ``tolist`` are counted (the batch's transfers)."""

    def __init__(self, rows: Any, log: list[int]) -> None:
        self.rows, self.log = rows, log
        self.device, self.shape = rows.device, rows.shape

    def __getitem__(self, key: Any) -> Any:
        part = self.rows[key]
        log = self.log

        class _Part:
            def tolist(self) -> Any:
                log.append(1)
                return part.tolist()
        return _Part()
