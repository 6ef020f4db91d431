"""Findings are saved small at any scale (issue 22, part 3): cells whose only role is
"unchanged after the call" become fills, the minimizer keeps what the failure needs (a
pool past a size) and shrinks the rest; a finding is never dropped for its size."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kda_fuzz.campaign.minimize import minimize_with_verdict
from kda_fuzz.campaign.results import Failure
from kda_fuzz.corpus import store as corpus
from kda_fuzz.corpus.store import load_case, save_failure
from kda_fuzz.engine.oracle import run_case
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode
from tests import planted

KDA = get_contract("kda")
MiB = 1 << 20


def _found(case, target, name: str, tmp_path: Path, seconds: float = 60.0) -> tuple[Path, object]:
    outcome = run_case(KDA, case, target)
    assert outcome.status == "fail", outcome
    small, verdict = minimize_with_verdict(KDA, case, target, outcome.verdict, seconds=seconds)
    failure = Failure(small, verdict, f"tests.planted:{name}")
    path = save_failure(failure, tmp_path, contract=KDA, seed=0)
    return path, verdict


def _replays(path: Path, target) -> tuple[str, str]:
    case, _, _ = load_case(path)
    return (run_case(KDA, case, target).status,
            run_case(KDA, case, reference_kda_packed_decode).status)


def test_a_write_into_an_unnamed_slot_saves_small(tmp_path: Path) -> None:
    """The issue's vLLM case at CPU scale: B=64, 71 slots, HV=8, V=48, K=100, fp32 pool
    (10.9 MB of random state) with a write into a slot no row names."""
    p = KdaLayout(B=64, H=2, HV=8, K=100, V=48, spare_slots=7, qkv_row_pad=3, slot_pad=5,
                  guard=2, seed=3)
    case = build(p, "triton")
    assert case.tensors["initial_state"].base.numel() * 4 > 10 * MiB
    path, verdict = _found(case, planted.writes_unnamed_slot, "writes_unnamed_slot", tmp_path)
    assert verdict.what == "untouched-state-written"
    assert path.stat().st_size < MiB // 16, path.stat().st_size
    assert _replays(path, planted.writes_unnamed_slot) == ("fail", "pass")


@pytest.mark.slow  # a long campaign: the slow tier
def test_a_failure_that_needs_a_big_pool_keeps_it_and_saves_small(tmp_path: Path) -> None:
    """An offset that wraps past 2^22 elements (the CPU stand-in for int32's 2^31): the
    pool must stay past it, the slots no row names become one fill."""
    HV, V, K = 2, 16, 16
    slots = planted.WRAP // (HV * V * K) + 40
    p = KdaLayout(B=8, H=1, HV=HV, K=K, V=V, spare_slots=slots - 8, seed=5)
    case = build(p, "triton")
    # the rows name the top slots, as the scale stratum draws them
    idx = case.tensors["ssm_state_indices"]
    idx.view().copy_(torch.arange(slots - 1, slots - 9, -1, dtype=idx.dtype))
    assert case.tensors["initial_state"].base.numel() * 4 > 16 * MiB
    path, _ = _found(case, planted.wraps_past_2_22, "wraps_past_2_22", tmp_path)
    kept, _, _ = load_case(path)
    pool = kept.tensors["initial_state"]
    assert pool.shape[0] * pool.stride[0] > planted.WRAP  # what the failure needs
    assert path.stat().st_size < MiB // 8, path.stat().st_size
    assert _replays(path, planted.wraps_past_2_22) == ("fail", "pass")


def test_a_finding_over_the_cap_is_saved_and_says_so(tmp_path: Path, monkeypatch) -> None:
    case = build(KdaLayout(B=4, H=1, HV=2, K=16, V=16, spare_slots=2, seed=1), "triton")
    outcome = run_case(KDA, case, planted.writes_unnamed_slot)
    assert outcome.status == "fail"
    monkeypatch.setattr(corpus, "MAX_SAVED_BYTES", 1024)
    failure = Failure(case, outcome.verdict, "tests.planted:writes_unnamed_slot")
    path = save_failure(failure, tmp_path, contract=KDA, seed=0)
    assert path.exists() and path.stat().st_size > 1024
    assert failure.note.startswith("saved at ") and "MiB cap: no smaller case reproduced it" \
        in failure.note, failure.note
    assert "over the size cap" in load_case(path)[2]["description"]


def test_runs_round_trip_bit_exact_and_bad_runs_are_rejected() -> None:
    """A base with long stretches of one value is stored as runs (fills and zlib
    stretches), bit for bit; a run list that does not add up, or a stretch that inflates
    to another size, is a bad file."""
    import json

    from kda_fuzz.corpus.store import _decode_tensor, _encode_tensor, encoded_base_size
    from kda_fuzz.engine.case import TensorArg

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.bool):
        base = torch.zeros(40_000, dtype=dtype)
        if dtype.is_floating_point:
            base[:3] = float("nan")
            base[1000:1600] = torch.randn(600).to(dtype)
            base[-1] = -0.0
        else:
            base[1000:1600] = 1
        entry = _encode_tensor(TensorArg(base, (40_000,), (1,), 0))
        assert entry["encoding"] == "runs" and len(entry["runs"]) >= 3
        assert abs(encoded_base_size(base) - sum(len(json.dumps(r)) for r in entry["runs"])) \
            < 200
        back = _decode_tensor("x", json.loads(json.dumps(entry)))
        assert torch.equal(back.base.view(torch.uint8), base.view(torch.uint8)), dtype

    entry = _encode_tensor(TensorArg(torch.zeros(40_000), (40_000,), (1,), 0))
    assert entry["encoding"] == "fill"  # one value throughout: still a plain fill
    base = torch.zeros(40_000)
    base[5] = 1.0
    good = _encode_tensor(TensorArg(base, (40_000,), (1,), 0))
    short = json.loads(json.dumps(good))
    short["runs"][-1]["count"] -= 1
    longer = json.loads(json.dumps(good))
    longer["runs"][0]["count"] += 1  # the stretch of bytes says one element more
    longer["runs"][-1]["count"] -= 1
    both = json.loads(json.dumps(good))
    both["runs"][0]["fill"] = "00000000"  # a stretch of bytes that is also a fill
    for bad, words in ((short, "the runs hold"), (longer, "bytes; count"),
                       (both, "exactly one of fill and base_bytes")):
        try:
            _decode_tensor("x", bad)
        except ValueError as e:
            assert words in str(e), e
        else:
            raise AssertionError(f"accepted: {words}")



def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
        t.element_size()])


def test_a_big_crash_not_minimized_in_time_is_saved_small_with_its_recipes(
        tmp_path: Path) -> None:
    """A crash on a big case that minimization could not shrink (cut by the deadline, or
    flaky: a device fault that depends on where a buffer lies) names no element: the
    saver regenerates its float values from recipes (its non-finite ones kept), says so,
    and the file is small; sent between processes pickled (as a job sends a finding), the
    recipes travel with the bases and the file stays small; it loads back bit for bit."""
    import pickle

    from kda_fuzz.campaign.channel import ExitReason, Stop
    from kda_fuzz.campaign.findings import FindingSaver
    from kda_fuzz.campaign.spec import CampaignSpec
    from kda_fuzz.engine.recipe import hint_of
    from kda_fuzz.engine.verdict import Verdict

    p = KdaLayout(B=64, H=2, HV=8, K=100, V=48, spare_slots=7, qkv_row_pad=3, slot_pad=5,
                  guard=2, seed=3)
    case = build(p, "triton")
    state = case.tensors["initial_state"]
    assert state.base.numel() * 4 > 10 * MiB
    state.base[state.offset + 5] = float("nan")  # a non-finite value is kept bit for bit
    crash = Verdict("crash", "device-fault", "the device faulted: an illegal memory access")
    mismatch = Verdict("mismatch", "out", "wrong values")
    saver = FindingSaver(CampaignSpec.of(KDA, "triton", [], corpus=str(tmp_path), seed=1))
    saver.request(Stop(ExitReason.DEADLINE))  # no time left to minimize
    f = Failure(case, crash, "m:k")
    saver.found_inline(f, None)
    assert "float values regenerated from recipes without a re-run" in f.note, f.note
    assert "initial_state" in f.note and f.original is case
    path = Path(f.saved)
    assert path.stat().st_size < MiB // 16, path.stat().st_size
    loaded, _, _ = load_case(path)
    for n, a in f.case.tensors.items():
        assert torch.equal(_bits(loaded.tensors[n].base), _bits(a.base)), n
    assert torch.isnan(loaded.tensors["initial_state"].base[state.offset + 5])
    assert torch.equal(loaded.tensors["ssm_state_indices"].base,
                       case.tensors["ssm_state_indices"].base)  # indices as found
    sent = pickle.loads(pickle.dumps(f))  # JobFound's way between processes
    assert hint_of(sent.case.tensors["initial_state"].base) == \
        hint_of(f.case.tensors["initial_state"].base) is not None
    sent.verdict, before = Verdict("crash", "process-died", "another"), sent.note
    other = FindingSaver(CampaignSpec.of(KDA, "triton", [], corpus=str(tmp_path / "b"),
                                         seed=1))
    other.request(Stop(ExitReason.DEADLINE))
    other.found_inline(sent, None)
    assert sent.note == before  # nothing left to regenerate: its recipes came along
    assert Path(sent.saved).stat().st_size < MiB // 16
    # a verdict that names elements keeps the values it was found with
    g = Failure(build(p, "triton"), mismatch, "m:k")
    saver.found_inline(g, None)
    assert "regenerated" not in g.note and Path(g.saved).stat().st_size > MiB


def test_a_cut_minimization_keeps_the_steps_it_made() -> None:
    """A minimization cut short (the deadline, an interrupt: the run raises ``Cut``) keeps
    the smallest failing case it reached, not the case as found."""
    from kda_fuzz.campaign.minimize import Cut, minimize_failure

    p = KdaLayout(B=64, H=2, HV=8, K=100, V=48, spare_slots=7, qkv_row_pad=3, slot_pad=5,
                  guard=2, seed=3)
    case = build(p, "triton")
    outcome = run_case(KDA, case, planted.writes_unnamed_slot)
    failure = Failure(case, outcome.verdict, "tests.planted:writes_unnamed_slot")
    kept: list[int] = []

    def run(cand):
        got = run_case(KDA, cand, planted.writes_unnamed_slot)
        if got.status == "fail" and got.verdict.what == outcome.verdict.what:
            kept.append(1)
            if len(kept) == 3:
                raise Cut  # cut while judging the step after the third kept one
        return got

    assert minimize_failure(KDA, failure, run, seconds=60.0)
    assert failure.original is case and failure.case is not case
    assert len(failure.case.notes["minimized"]) == 2
    assert corpus.encoded_size(failure.case) < corpus.encoded_size(case)
    assert run_case(KDA, failure.case, planted.writes_unnamed_slot).status == "fail"


def test_a_finding_minimization_could_not_shrink_is_saved_small_once_a_run_confirms_it(
        tmp_path: Path) -> None:
    """A finding whose verdict names elements, still over 1 MiB after its minimization
    (here given no time at all), is saved with its float values from recipes when one run
    of that case fails the same way; the file replays failing."""
    from dataclasses import replace

    from kda_fuzz.campaign.findings import FindingSaver
    from kda_fuzz.campaign.spec import CampaignSpec
    from kda_fuzz.engine.targets import Target

    p = KdaLayout(B=64, H=2, HV=8, K=100, V=48, spare_slots=7, qkv_row_pad=3, slot_pad=5,
                  guard=2, seed=3)
    case = build(p, "triton")
    assert corpus.encoded_size(case) > MiB
    outcome = run_case(KDA, case, planted.writes_unnamed_slot)
    failure = Failure(case, outcome.verdict, "tests.planted:writes_unnamed_slot")
    spec = CampaignSpec.of(KDA, "triton", [], corpus=str(tmp_path), seed=1)
    spec = replace(spec, budget=replace(spec.budget, shrink_seconds=0.0))
    FindingSaver(spec).found_inline(
        failure, Target("tests.planted:writes_unnamed_slot", planted.writes_unnamed_slot))
    path = Path(failure.saved)
    assert path.stat().st_size < MiB, path.stat().st_size
    assert "regenerated from recipes" in failure.note and "failed the same way" in failure.note
    assert failure.verdict.what == outcome.verdict.what
    assert _replays(path, planted.writes_unnamed_slot) == ("fail", "pass")


def test_a_job_saves_a_big_finding_small_before_its_minimization_has_any_time(
        tmp_path: Path) -> None:
    """The job that finds a failure naming elements on a case over 1 MiB (a GPU-scale
    layout) regenerates its float values from recipes and keeps that case when one run of
    it there fails the same way: a finding cut from its minimization by the deadline is
    saved under 1 MiB anyway, and replays failing."""
    from kda_fuzz.campaign.channel import ExitReason, Stop
    from kda_fuzz.campaign.findings import FindingSaver
    from kda_fuzz.campaign.runner import Campaign
    from kda_fuzz.campaign.spec import CampaignSpec
    from kda_fuzz.engine.targets import Target

    p = KdaLayout(B=64, H=2, HV=8, K=100, V=48, spare_slots=7, qkv_row_pad=3, slot_pad=5,
                  guard=2, seed=3)
    case = build(p, "triton")
    assert corpus.encoded_size(case) > MiB
    target = Target("tests.planted:wrong_gqa", planted.wrong_gqa)
    outcome = run_case(KDA, case, target.fn)
    assert outcome.status == "fail" and outcome.verdict.kind == "mismatch", outcome.verdict
    c = Campaign(KDA, "triton", [target])
    c._failed(case, outcome.verdict, target, pos=(0, 0, 0), index=0)
    [failure] = c.report.failures
    assert failure.case is not case and "one run of it failed the same way" in failure.note
    assert failure.verdict.signature() == outcome.verdict.signature()
    saver = FindingSaver(CampaignSpec.of(KDA, "triton", [], corpus=str(tmp_path), seed=1))
    saver.request(Stop(ExitReason.DEADLINE))  # no time left to minimize
    saver.found_inline(failure, None)
    path = Path(failure.saved)
    assert path.stat().st_size < MiB, path.stat().st_size
    assert _replays(path, planted.wrong_gqa) == ("fail", "pass")
    # near the jobs' deadline it is sent as found: a job killed in the middle of the run
    # would lose it
    late = Campaign(KDA, "triton", [target])
    late._deadline = time.monotonic() + 2.0
    late._failed(case, outcome.verdict, target, pos=(0, 0, 0), index=0)
    assert late.report.failures[0].case is case
    # a small case is kept as found (no run spent on it)
    small = build(KdaLayout(B=2, H=2, HV=8, K=4, V=4, seed=1), "triton")
    bad = run_case(KDA, small, target.fn)
    c2 = Campaign(KDA, "triton", [target])
    c2._failed(small, bad.verdict, target, pos=(0, 0, 0), index=0)
    assert c2.report.failures[0].case is small
