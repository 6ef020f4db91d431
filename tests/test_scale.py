"""The GPU-scale stratum: sizes cross each limit (meta tensors), budgets hold, it is off on
cpu by default, and the sampled judge catches what it must on a small pretend-large case."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from kda_fuzz.campaign.plan import plan
from kda_fuzz.engine.oracle import expectation, run_case
from kda_fuzz.engine.targets import default_targets
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.scale import (
    GRID_YZ,
    INT32,
    KINDS,
    ScaleLayout,
    _layout,
    build_scale,
    case_cost,
    cheapest,
    fitting_kinds,
    judge_sampled,
    sample_rows,
    scale_layouts,
)

KDA = get_contract("kda")
GiB = 1 << 30


def _sizes(s: ScaleLayout) -> dict[str, int]:
    case = build_scale(s, "triton", "meta")
    state, qkv = case.tensors["initial_state"], case.tensors["mixed_qkv"]
    p = s.layout
    return {"B": p.B, "BHV": p.B * p.HV, "pool": state.footprint(),
            "qkv_reach": qkv.footprint()}


@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_each_substratum_crosses_its_limit_on_both_sides(variant: str) -> None:
    seen: dict[str, set[bool]] = {k: set() for k in KINDS}
    budget = 64 * GiB

    @settings(max_examples=400, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scale_layouts(variant, budget))
    def probe(s: ScaleLayout) -> None:
        assert case_cost(s) <= budget
        case = build_scale(s, variant, "meta")
        assert expectation(KDA, case).ok, case.describe()
        z, p = _sizes(s), s.layout
        if s.kind == "bhv":
            assert (z["BHV"] > GRID_YZ) or not s.above
            seen["bhv"].add(any(z["BHV"] > GRID_YZ * k and z["BHV"] - p.HV <= GRID_YZ * k
                                for k in (1, 2, 3)))
        elif s.kind == "wide-batch":
            seen["wide-batch"].add(p.B > GRID_YZ)
        elif s.kind == "big-pool":
            assert p.B <= 16  # few live rows: the bytes are in the pool
            seen["big-pool"].add(z["pool"] > INT32)
            if s.above:  # the whole top slot lies past 2^31 elements
                assert case.tensors["initial_state"].stride[0] * (p.num_slots - 1) >= INT32
        elif s.kind == "qkv-stride":
            seen["qkv-stride"].add(z["qkv_reach"] > INT32)
        else:
            seen["tails"].add(p.B % 2 == 1)
        if variant == "helion":
            assert p.K & (p.K - 1) == 0 and p.V & (p.V - 1) == 0

    probe()
    for kind in ("bhv", "wide-batch", "big-pool", "qkv-stride"):
        assert seen[kind] == {True, False}, (kind, seen)
    assert True in seen["tails"]


def test_budget_decides_which_substrata_are_drawn() -> None:
    assert fitting_kinds(1 << 10) == []
    small = fitting_kinds(256 << 20)
    assert "bhv" in small and "wide-batch" in small
    assert "big-pool" not in small and "qkv-stride" not in small
    assert set(fitting_kinds(64 * GiB)) == set(KINDS)
    # a 2^31-element bf16 pool is 4 GiB; run and judge hold three copies and scratch
    assert 13 * GiB <= case_cost(cheapest("big-pool")) <= 14 * GiB

    @settings(max_examples=60, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scale_layouts("triton", 2 * GiB))
    def probe(s: ScaleLayout) -> None:
        assert s.kind not in ("big-pool", "qkv-stride")
        assert case_cost(s) <= 2 * GiB

    probe()


def _args(device: str, **kw: object) -> argparse.Namespace:
    base = dict(device=device, target=None, families=None, no_bucket=False, max_b=None,
                budget=None, scale_share=None, scale_budget=None)
    return argparse.Namespace(**{**base, **kw})


def test_stratum_is_off_on_cpu_by_default_and_on_when_asked() -> None:
    from kda_fuzz.campaign.spec import shaping as _shaping

    assert _shaping(_args("cpu"))["scale_share"] == 0.0
    assert _shaping(_args("cuda"))["scale_share"] == 0.03
    names = [a.name for a in plan(KDA, "triton", 1000, device="cpu")]
    assert not any(n.startswith("scale") for n in names)
    # a share without a budget: cpu has no device memory to size from
    names = [a.name for a in plan(KDA, "triton", 1000, device="cpu", scale_share=0.03)]
    assert not any(n.startswith("scale") for n in names)
    arms = plan(KDA, "triton", 1000, device="cpu", scale_share=0.03, scale_budget=GiB)
    scale = [a for a in arms if a.name.startswith("scale")]
    assert [a.examples for a in scale] == [30]
    assert sum(a.examples for a in arms) == 1000
    arms = plan(KDA, "triton", 1000, device="cpu", scale_share=0.03, scale_budget=GiB, parts=3)
    assert sorted(a.examples for a in arms if a.name.startswith("scale")) == [10, 10, 10]


def test_cpu_build_names_the_top_slot_and_keeps_guards() -> None:
    s = ScaleLayout("bhv", _layout(B=40, HV=2, K=4, V=4, spare_slots=9, slot_pad=3, guard=2,
                                   seed=5), pad_rate=0.3)
    case = build_scale(s, "triton")
    p = s.layout
    assert expectation(KDA, case).ok
    idx = case.tensors["ssm_state_indices"].view().to(torch.long)
    assert int(idx.max()) == p.num_slots - 1
    assert int(idx[0]) >= 0 and int(idx[-1]) >= 0 and bool((idx < 0).any())
    live = idx[idx >= 0]
    assert live.unique().numel() == live.numel()
    state = case.tensors["initial_state"]
    assert torch.isnan(state.base[:2]).all() and torch.isnan(state.base[-2:]).all()
    assert torch.isnan(state.base[2 + 32 : 2 + 35]).all()  # slot padding stays NaN


# --------------------------------------------------------------- the sampled judge


def _run(case, mutate=None, **kw):
    """Run the reference kernel on ``case`` like ``run_case``, ``mutate`` the result, and
    judge it with the sampled judge (``kw``: thresholds)."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    kwargs, bases = case.materialize()
    before = {n: b.clone() for n, b in bases.items()}
    names = KDA.signature
    result = reference_kda_packed_decode(*[kwargs[n] for n in names])
    if mutate is not None:
        mutate(case, kwargs, bases)
    return judge_sampled(case, kwargs, before, bases, result, {}, **kw)


@pytest.fixture(scope="module")
def small() -> object:
    s = ScaleLayout("bhv", _layout(B=300, HV=2, K=4, V=4, spare_slots=50, slot_pad=3,
                                   guard=2, seed=11, out_dtype=torch.float32), pad_rate=0.1)
    return build_scale(s, "triton")


def test_sampled_judge_passes_a_correct_kernel_and_says_how_it_judged(small) -> None:
    facts: dict = {}
    assert _run(small, full_limit=512, limit=16, facts=facts) is None
    assert facts["judged_mode"] == "sampled"
    assert facts["judged"].startswith("sampled: 16 of ")
    assert _run(small, facts=facts) is None
    assert facts["judged_mode"] == "full"
    assert "judged_mode" not in small.notes  # what the judge learned is not the case's
    # and through the contract's own judge, with the target's call: in the outcome
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    got = run_case(KDA, small, reference_kda_packed_decode)
    assert got.status == "pass" and got.facts["judged_mode"] == "full"


def _live_rows(case) -> torch.Tensor:
    idx = case.tensors["ssm_state_indices"].view().to(torch.long)
    return (idx >= 0).nonzero().squeeze(1)


def test_sampled_judge_catches_a_wrong_value_in_a_sampled_row(small) -> None:
    last = int(_live_rows(small)[-1])  # the last live row is always sampled

    def wrong(case, kwargs, bases):
        kwargs["out"][last, 0, 1, 2] += 1.0

    v = _run(small, wrong, full_limit=512, limit=16)
    assert v is not None and v.what == "out-value" and v.where[0] == last
    assert "sampled" in v.detail

    def wrong_state(case, kwargs, bases):
        slot = int(kwargs["ssm_state_indices"][last])
        kwargs["initial_state"][slot, 0, 0, 0] += 1.0

    v = _run(small, wrong_state, full_limit=512, limit=16)
    assert v is not None and v.what == "initial_state-value"


@pytest.mark.parametrize("where", ["untouched-slot", "slot-pad", "guard", "qkv", "out-guard"])
def test_sampled_judge_catches_writes_anywhere(small, where: str) -> None:
    p_slot = small.tensors["initial_state"].stride[0]

    def write(case, kwargs, bases):
        if where == "untouched-slot":  # slot 0 is never named: live slots are at the top
            kwargs["initial_state"][0, 1, 2, 3] = 7.0
        elif where == "slot-pad":
            bases["initial_state"][2 + 5 * p_slot + 32] = 7.0
        elif where == "guard":
            bases["initial_state"][-1] = 7.0
        elif where == "qkv":
            kwargs["mixed_qkv"][123, 0] = 7.0
        else:
            bases["out"][0] = 7.0

    v = _run(small, write, full_limit=512, limit=16)
    expected = {"qkv": "mutated-mixed_qkv", "out-guard": "out-guard-written"}.get(
        where, "untouched-state-written")
    assert v is not None and v.what == expected, v
    if where == "untouched-slot":
        assert v.where == [2 + 1 * 16 + 2 * 4 + 3]


def test_sampled_judge_catches_a_nonzero_padding_row(small) -> None:
    idx = small.tensors["ssm_state_indices"].view()
    row = int((idx < 0).nonzero()[0, 0])

    def write(case, kwargs, bases):
        kwargs["out"][row].fill_(1.0)

    v = _run(small, write, full_limit=512, limit=16)
    assert v is not None and v.what == "padding-row-not-zero" and v.where == [row]


def test_sample_rows_keep_the_edges() -> None:
    rows = torch.arange(0, 140000)
    slots = 200000 - 1 - rows.flip(0)
    pick = sample_rows(rows, slots, 200000, HV=1, limit=64, seed=1)
    assert pick.numel() == 64
    got = set(pick.tolist())
    assert {0, 139999, 65534, 65535, 65536, 131070, 131071}.issubset(got)
    assert int(rows[int((slots == 199999).nonzero()[0, 0])]) in got
    pick = sample_rows(rows[:9000], slots[:9000], 200000, HV=8, limit=64)
    assert {65535 // 8, 65536 // 8}.issubset(set(pick.tolist()))


# ------------------------------------------------------------------------ on a GPU

GPU_CASES = {
    "B=70000,HV=1": ScaleLayout("wide-batch", _layout(B=70000, HV=1, K=16, V=16, seed=1)),
    "B*HV=65544,HV=8": ScaleLayout("bhv", _layout(B=8193, H=2, HV=8, K=16, V=16, seed=2),
                                   pad_rate=0.1),
    "pool>2^31 bf16": ScaleLayout("big-pool", replace(cheapest("big-pool").layout, B=4,
                                                      spare_slots=INT32 // 256 + 2 - 4,
                                                      seed=3)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case_name", list(GPU_CASES))
@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_project_kernels_pass_scale_cases(variant: str, case_name: str,
                                          kda_device_name: str) -> None:
    s = GPU_CASES[case_name]
    torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    case = build_scale(s, variant, kda_device_name)
    built = time.monotonic() - t0
    for target in default_targets(KDA, variant):
        t1 = time.monotonic()
        out = run_case(KDA, case, target.fn)
        torch.cuda.synchronize()
        print(f"{variant} {case_name} {target.name}: {out.status} "
              f"({case.notes.get('judged')}), build {built:.2f}s, run+judge "
              f"{time.monotonic() - t1:.2f}s, peak {torch.cuda.max_memory_allocated() / 2**30:.2f}"
              f" GiB (estimated {case_cost(s) / 2**30:.2f} GiB)")
        assert out.status == "pass", out.verdict


def _run_scale_draws(build, n: int = 3) -> list[object]:
    """Draw ``n`` scale cases with ``build_scale`` replaced by ``build``."""
    import kda_fuzz.families.kda.scale as scale

    seen: list[object] = []
    real = scale.build_scale

    def on_cpu(s: ScaleLayout, variant: str, device: str):  # meta builds only measure
        return real(s, variant, device) if device == "meta" else build(s, variant, device)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scale, "build_scale", on_cpu)

        @settings(max_examples=n, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(scale.scale_cases("triton", "cpu", 64 * GiB))
        def draw(case: object) -> None:
            seen.append(case)

        draw()
    return seen


def test_out_of_memory_falls_back_to_the_cheapest_case_of_all() -> None:
    """A job whose share of memory is taken builds the cheapest case instead."""
    fallback = cheapest("wide-batch")
    tried: list[ScaleLayout] = []

    def build(s: ScaleLayout, variant: str, device: str):
        tried.append(s)
        if s != fallback:
            raise torch.OutOfMemoryError("pretend the share is taken")
        return build_scale(replace(s, layout=_layout(B=3, HV=1, K=2, V=2)), variant, "meta")

    cases = _run_scale_draws(build)
    assert cases and all(c.notes["bytes"] > 0 for c in cases)
    assert tried.count(fallback) == len(cases)  # every case ended at the fallback
    assert any(s != fallback for s in tried)  # after the drawn case ran out of memory


@pytest.mark.filterwarnings("ignore:Using `reject` outside")
def test_out_of_memory_everywhere_draws_no_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """When not even the cheapest case fits, the draw is rejected (Hypothesis draws again)."""
    from hypothesis.errors import UnsatisfiedAssumption

    import kda_fuzz.families.kda.scale as scale

    def build(s: ScaleLayout, variant: str, device: str):
        raise torch.OutOfMemoryError("pretend nothing fits")

    monkeypatch.setattr(scale, "build_scale", build)
    with pytest.raises(UnsatisfiedAssumption):
        scale.build_within_memory(cheapest("bhv"), "triton", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_scale_cases_stay_within_a_jobs_share_of_the_device(variant: str,
                                                           kda_device_name: str) -> None:
    """Drawn at the default budget of one of 8 jobs, building, running and judging a scale
    case never takes more device memory than that budget: 8 jobs never exhaust the GPU."""
    from kda_fuzz.families.kda.scale import device_budget, scale_cases

    budget = device_budget(kda_device_name, jobs=8)
    strategy = scale_cases(variant, kda_device_name, budget)
    assert strategy is not None, f"no scale case fits {budget / GiB:.1f} GiB"
    target = default_targets(KDA, variant)[0]
    peaks: list[float] = []

    @settings(max_examples=6, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case: object) -> None:
        out = run_case(KDA, case, target.fn)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        peaks.append(peak / GiB)
        assert out.status == "pass", out.verdict
        assert peak <= budget, (f"{case.describe()}: peak {peak / GiB:.2f} GiB over the "
                                f"budget of {budget / GiB:.2f} GiB")

    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    print(f"{variant}: budget {budget / GiB:.1f} GiB, peaks {[round(p, 2) for p in peaks]}")
    assert peaks


def test_a_campaign_reports_the_largest_scale_sizes_and_the_strata_time() -> None:
    """The summary's figures: the largest B, B*HV, pool and mixed_qkv reach the stratum
    ran, and the time each stratum took (so its share of the campaign can be read)."""
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.engine.targets import load_target
    target = load_target(KDA.reference_target)  # vectorised: the interpreter would crawl
    r = campaign(KDA, "triton", [target], device="cpu", max_examples=30, seed=1,
                 valid_share=1.0, budget=1 << 12, scale_share=0.2, scale_budget=1 << 28)
    assert sum(r.to_json()["scale_judged"].values()) == 6
    big = r.peaks
    assert big["B*HV"] >= big["B"] > 0 and big["state pool elements"] > 0
    assert r.stratum_seconds["scale"] > 0 and r.stratum_seconds["valid"] > 0
    [note] = KDA.report_notes(r)  # the family's own line in the summary
    assert note.startswith("scale stratum: ") and f"B*HV {big['B*HV']:,}" in note
    assert r.to_json()["scale_largest"] == big


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(scale_layouts("triton", 1 << 40))
def test_scale_cases_leave_out_what_the_targets_do_not_support(s) -> None:
    """A target that declares int64 indices, fp16 state, padded strides and padding rows
    unsupported never gets them in the scale stratum either (its limits stay)."""
    from kda_fuzz.families.kda.scale import honour
    from kda_fuzz.families.packed.pins import restrictions

    pins = restrictions(["indices=int64", "state=float16", "strides", "padding"], "triton")
    got = honour(s, pins)
    p = got.layout
    assert p.idx_dtype == torch.int32 and p.state_dtype != torch.float16
    assert (p.qkv_row_pad, p.slot_pad, p.guard) == (0, 0, 0) and got.pad_rate == 0
    assert (p.B, p.HV, p.K, p.V, got.kind) == (s.layout.B, s.layout.HV, s.layout.K,
                                               s.layout.V, s.kind)
    assert honour(s, None) is s


def test_the_plan_hands_the_restrictions_to_the_scale_stratum() -> None:
    from kda_fuzz.engine.contract import ScaleStratum

    seen = []

    def cases(variant, device, budget, pins=None):
        seen.append(pins)
        return KDA.scale.cases(variant, device, budget, pins=pins)

    contract = replace(KDA, scale=ScaleStratum(cases, KDA.scale.device_budget))
    restrict = KDA.restrict(["indices=int64"], "triton")
    arms = plan(contract, "triton", 200, scale_share=0.1, scale_budget=1 << 40,
                restrict=restrict)
    assert any(a.stratum == "scale" for a in arms) and seen == [restrict]


QWEN = {"H": 4, "HV": 8, "K": 64, "V": 64, "state": "bfloat16"}


@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_a_pinned_layouts_scale_cases_keep_its_heads_and_cross_the_limits(variant: str
                                                                          ) -> None:
    budget = 64 * GiB
    kinds = set()

    @settings(max_examples=150, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(scale_layouts(variant, budget, QWEN))
    def probe(s: ScaleLayout) -> None:
        p = s.layout
        assert (p.H, p.HV, p.K, p.V, p.state_dtype) == (4, 8, 64, 64, torch.bfloat16)
        assert case_cost(s) <= budget
        assert expectation(KDA, build_scale(s, variant, "meta")).ok
        z = _sizes(s)
        if s.kind == "bhv" and s.above:
            assert z["BHV"] > GRID_YZ
        if s.kind == "big-pool" and s.above:
            assert z["pool"] > INT32
        if s.kind == "qkv-stride" and s.above:
            assert z["qkv_reach"] > INT32
        kinds.add(s.kind)

    probe()
    assert kinds == set(fitting_kinds(budget, variant, QWEN)) and "bhv" in kinds
    # at these heads a batch past 65,535 rows does not fit a few GiB: that limit is left out
    assert "wide-batch" not in fitting_kinds(4 * GiB, variant, QWEN)


def test_the_plan_gives_pinned_layouts_their_share_of_the_scale_stratum() -> None:
    arms = plan(KDA, "triton", 400, scale_share=0.2, scale_budget=64 * GiB,
                layouts=[("qwen", QWEN)], layout_share=0.75)
    scale = {a.name: a.examples for a in arms if a.stratum == "scale"}
    assert scale == {"scale:pin:qwen": 60, "scale": 20}


def test_the_summary_counts_the_pinned_layouts_examples() -> None:
    from kda_fuzz.cli import pinned_note

    assert pinned_note({"valid:qwen": 120, "scale:qwen": 6, "valid:big": 3}) == (
        "examples at the pinned layouts: big: 3 valid; qwen: 6 scale (the GPU limits at its "
        "heads), 120 valid")
