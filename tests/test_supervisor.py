"""Supervised campaigns: the plan dealt to job processes, crashes survived and resumed."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

import pytest

from kda_fuzz.campaign.plan import deal, plan
from kda_fuzz.campaign.runner import campaign
from kda_fuzz.campaign.spec import CampaignOptions, CampaignSpec
from kda_fuzz.campaign.supervisor import Supervisor
from kda_fuzz.engine.oracle import same_bits
from kda_fuzz.engine.targets import Target, load_target
from kda_fuzz.families import get_contract

KDA = get_contract("kda")
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"


def test_deal_gives_every_arm_to_exactly_one_job() -> None:
    for jobs in (1, 2, 3, 7):
        arms = plan(KDA, "triton", 400, seed=3, parts=jobs)
        dealt = [deal(arms, j, jobs) for j in range(jobs)]
        indices = sorted(a.index for d in dealt for a in d)
        assert indices == list(range(len(arms)))
        # every job gets valid examples (the valid arm is split into one part per job)
        assert all(any(a.name.startswith("valid") for a in d) for d in dealt)
        assert sum(a.examples for a in arms) == 400
    # with compile families, each job gets its own
    arms = plan(KDA, "helion", 400, seed=3, families=3, max_b=64)
    dealt = [[a.name for a in deal(arms, j, 3) if a.name.startswith("valid")] for j in range(3)]
    assert sorted(map(len, dealt)) == [1, 1, 1] and len({d[0] for d in dealt}) == 3


def _counts(report) -> tuple:
    return (report.examples, report.valid_cases, report.broken_cases,
            dict(report.checks_hit))


def test_jobs_run_the_plan_of_one_campaign() -> None:
    """Two jobs run exactly the examples that one in-process campaign of the same plan and
    seed runs, valid and broken, and the merged report adds them up."""
    options = dict(max_examples=120, seed=5, budget=1 << 12, scale_share=0.1,
                   scale_budget=1 << 26)
    sup = Supervisor(CampaignSpec.of("kda", "triton", [REFERENCE], jobs=2, **options))
    report = sup.run()
    assert not report.failures
    assert len(sup.summaries()) == 2 and all(s["seconds"] > 0 for s in sup.summaries())
    assert report.examples == 120
    assert 0 < report.startup_seconds < report.seconds * 2  # both jobs' launches, summed
    assert report.to_json()["startup_seconds"] == round(report.startup_seconds, 3)
    alone = campaign(KDA, "triton", [load_target(REFERENCE)], job=(0, 1), **options)
    assert alone.startup_seconds == 0  # in-process: nothing was launched
    assert report.valid_cases == alone.valid_cases
    judged, alone_judged = (r.family_json()["scale_judged"] for r in (report, alone))
    assert sum(judged.values()) > 0 and judged == alone_judged  # scale cases
    assert report.broken_cases + sum(report.validation_gaps.values()) == \
        alone.broken_cases + sum(alone.validation_gaps.values())


def test_a_crash_costs_one_restart_and_the_campaign_covers_the_same_examples() -> None:
    """A target that aborts on some valid layouts: each abort is one restart; the job
    resumes where it stood, so the campaign runs as many examples of each stratum as with a
    correct target (draws like the crash's get less of them: other layouts instead), and
    the crash is one distinct failure with its repeats counted."""
    options = dict(max_examples=160, seed=2, budget=1 << 12, max_failures=5)
    crashing = Supervisor(CampaignSpec.of(
        "kda", "triton", ["tests.hostile_targets:aborts_past_16_rows"], **options)).run()
    clean = Supervisor(CampaignSpec.of("kda", "triton", [REFERENCE], **options)).run()
    assert crashing.examples == clean.examples == 160  # however often it aborts
    assert crashing.valid_cases == clean.valid_cases
    assert crashing.broken_cases + sum(crashing.validation_gaps.values()) == \
        clean.broken_cases + sum(clean.validation_gaps.values())
    assert [f.verdict.kind for f in crashing.failures] == ["crash"]
    crash = crashing.failures[0]
    assert "SIGABRT" in crash.verdict.detail
    # the recorded case is the one that was launched: past 16 rows
    assert crash.case.tensors["mixed_qkv"].shape[0] > 16
    # each further abort was one more restart, counted; further layouts like it were
    # mostly not run (shifted to others of their stratum)
    assert crash.count + sum(crashing.shifted.values()) >= 2 and crashing.shifted
    assert any("restart" in n for n in crashing.notes)


def test_distinct_failures_are_kept_until_max_failures() -> None:
    # small layouts (budget): what is counted here does not depend on their size
    rep = campaign(KDA, "triton", [load_target("tests.mutants:pad_wrap")], max_examples=300,
                   seed=1, max_failures=20, budget=1 << 12)
    whats = [f.verdict.what for f in rep.failures]
    # the wrapped write shows as its padding row, as the slot it wrote, and as the live
    # slot's value when the wrapped-to slot was live: distinct failures, each kept once
    assert {"padding-row-not-zero", "untouched-state-written"} <= set(whats)
    assert len(set(whats)) == len(whats) and rep.examples == 300
    assert sum(f.count for f in rep.failures) > len(whats)
    one = campaign(KDA, "triton", [load_target("tests.mutants:pad_wrap")], max_examples=300,
                   seed=1, max_failures=1, budget=1 << 12)
    assert len(one.failures) == 1 and one.examples < 300


@pytest.mark.parametrize("seed", [1, *(pytest.param(s, marks=pytest.mark.slow) for s in (2, 3))])
def test_a_failure_that_does_not_come_back_every_time_is_flaky(seed: int) -> None:
    from tests import hostile_targets

    # seeds 1 and 3 draw a case whose numbers the oracle cannot judge (float64 result past
    # half the dtype's range): its re-runs still judge the padding rows, and those hold
    hostile_targets._calls[0] = 0  # the every-third-call count from this campaign's start
    rep = campaign(KDA, "triton", [Target("flaky", hostile_targets.flaky_padding)],
                   max_examples=200, seed=seed, max_failures=20)
    kinds = {f.verdict.kind for f in rep.failures}
    assert kinds == {"flaky"}, [f.verdict.summary() for f in rep.failures]
    f = rep.failures[0]
    assert f.verdict.extra["reruns"] == 2 and f.verdict.extra["reproduced"] < 2
    assert f.verdict.extra["first_kind"] == "mismatch"


def test_a_failure_whose_re_runs_fail_differently_is_not_flaky() -> None:
    from tests import hostile_targets

    hostile_targets._calls[0] = 0
    rep = campaign(KDA, "triton", [Target("two_faced", hostile_targets.two_faced)],
                   max_examples=60, seed=1, max_failures=20)
    assert rep.failures and {f.verdict.kind for f in rep.failures} == {"mismatch"}, \
        [f.verdict.summary() for f in rep.failures]
    assert any(f.note.startswith("re-runs failed differently: mismatch/") for f in rep.failures), \
        [f.note for f in rep.failures]


def test_a_stop_from_outside_ends_the_jobs() -> None:
    ctx_event = mp.get_context("spawn").Event  # noqa: F841 - the supervisor's own kind
    # the stop comes 3 s after the first example (a loaded machine may take longer than a
    # fixed delay to start the jobs)
    started = threading.Event()
    sup = Supervisor(CampaignSpec.of("kda", "triton", [REFERENCE], jobs=2, max_examples=100000,
                                     seed=1, budget=1 << 12),
                     on_example=lambda report: started.set())
    threading.Thread(target=lambda: (started.wait(120), time.sleep(3.0), sup.stop.set()),
                     daemon=True).start()
    t = time.monotonic()
    report = sup.run()
    assert time.monotonic() - t < 150 and 0 < report.examples < 100000


def test_the_same_seed_draws_the_same_cases_whatever_the_process_imported(
        tmp_path, monkeypatch) -> None:
    """Hypothesis mines constants from the modules a process has loaded; a campaign must
    not depend on them (a restarted job has imported less than the job it replaces)."""
    def run() -> tuple:
        rep = campaign(KDA, "triton", [load_target(REFERENCE)], max_examples=200, seed=9,
                       budget=1 << 12)
        return rep.examples, rep.facts["rows"], rep.valid_cases, dict(rep.checks_hit)

    first = run()
    (tmp_path / "kda_many_constants.py").write_text(
        "VALUES = [" + ", ".join(str(n) for n in (3, 7, 33, 65, 127, 255, 4097, 65535,
                                                  65537, 2**31 - 1, -17, 0.25, 1e-7))
        + "]\nNAMES = ['mixed_qkv', 'HV', 'K']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("kda_many_constants")
    assert run() == first


CUDA_FAULT = "CUDA error: an illegal memory access was encountered"


def test_an_asynchronous_device_fault_is_the_targets_crash(monkeypatch) -> None:
    """On cuda a job does not sync after each target call: a fault the target launched
    surfaces in the judge's read, and the flight record still names the call and turns it
    into the target's crash (no 'outputs-unreadable' verdict, no fuzzer error)."""
    import dataclasses

    import pytest
    import torch

    from kda_fuzz.campaign.supervisor import (
        CALIBRATION,
        CALLING,
        FAULTED,
        STATE,
        _DeviceFault,
        _SharedRecorder,
    )
    from kda_fuzz.engine import oracle
    from kda_fuzz.families.kda.layouts import KdaLayout, build

    case = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, seed=0), "triton")
    target = load_target(REFERENCE).fn

    def faulting_judge(*args, **kwargs):
        raise RuntimeError(CUDA_FAULT)

    faulting = dataclasses.replace(KDA, judge=faulting_judge)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        oracle.run_case(faulting, case, target)  # not swallowed as an unreadable output

    record = mp.get_context("spawn").RawArray("d", CALIBRATION)  # the flight record's fields
    rec = _SharedRecorder(record, lambda pos: None, "cuda")
    synced: list[bool] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(True))
    with pytest.raises(_DeviceFault, match="illegal memory access"):
        with rec.settle():
            with rec.call((0, 0, 0), 0):
                assert record[STATE] == CALLING
            assert record[STATE] == CALLING and not synced  # no sync after the call
            raise RuntimeError(CUDA_FAULT)
    assert record[STATE] == FAULTED
    with rec.settle():  # a clean case: one sync when the judging is over
        with rec.call((0, 0, 1), 0):
            pass
    assert synced == [True] and record[STATE] != CALLING


def test_a_time_bounded_campaign_does_not_rerun_an_arms_simplest_case() -> None:
    """With a deadline the campaign cycles through its arms in rounds, each a new
    Hypothesis run, and every run starts with the arm's simplest case: later rounds skip
    it, so an arm of one or two examples per round draws new cases (it ran the same case
    round after round: 2,036 distinct of 5,905 examples in 20 s)."""
    from kda_fuzz.campaign.runner import Campaign

    drawn: dict[int, list[str]] = {}

    class Recording(Campaign):
        def _example(self, pos, case) -> None:
            super()._example(pos, case)  # (raises at the deadline: not counted then)
            drawn.setdefault(pos[1], []).append(f"{case.describe()} {case.notes.get('layout')}")

    c = Recording(KDA, "triton", [load_target(REFERENCE)], options=CampaignOptions.of(
        max_examples=300, seed=1, max_seconds=4.0, budget=1 << 12, max_b=16,
        max_failures=100))
    report = c.run()
    runs = [v for v in drawn.values() if len(v) >= 3]
    assert report.examples == sum(map(len, drawn.values())) and runs
    # over all arms (a loaded machine runs few examples: one repeat in an arm of three is
    # noise), and per arm where an arm ran enough to tell
    assert sum(len(set(v)) for v in runs) >= 0.75 * sum(map(len, runs)), \
        sorted((len(set(v)) / len(v), len(v)) for v in runs)[:5]
    assert all(len(set(v)) >= 0.75 * len(v) for v in runs if len(v) >= 12), \
        sorted((len(set(v)) / len(v), len(v)) for v in runs)[:5]


def test_the_scale_stratum_takes_at_most_its_time_share_of_a_time_bounded_campaign(
        ) -> None:
    """Scale cases cost tens of others' (a compile per shape): in a time-bounded campaign a
    round passes the scale arm by while its stratum has had more than SCALE_TIME_SHARE
    of the job's time; it still runs in the first round and keeps its share after."""
    from hypothesis import strategies as st

    from kda_fuzz.campaign.arms import Arm
    from kda_fuzz.campaign.plan import SCALE_TIME_SHARE
    from kda_fuzz.campaign.runner import Campaign, _Stopped

    arms = [Arm("valid:family0", st.none(), 1000), Arm("broken:mix", st.none(), 500),
            Arm("scale", st.none(), 40, time_share=SCALE_TIME_SHARE)]
    cost = {"valid": 0.02, "broken": 0.01, "scale": 1.0}  # seconds per example
    ran: list[tuple[int, str]] = []

    class Simulated(Campaign):
        def _run_arm(self, arm, n, rounds) -> None:
            if rounds == 100:
                raise _Stopped
            stratum = arm.name.split(":")[0]
            ran.append((rounds, stratum))
            self.report.stratum_seconds[stratum] += cost[stratum] * n

    c = Simulated(KDA, "triton", [load_target(REFERENCE)],
                  options=CampaignOptions(max_examples=10, max_seconds=3600.0))
    c._deadline = time.monotonic() + 3600
    c._run_rounds(arms, 1000, c._deadline)
    spent = c.report.stratum_seconds
    scale_rounds = [r for r, s in ran if s == "scale"]
    assert scale_rounds[0] == 0 and len(scale_rounds) >= 5
    assert spent["scale"] <= SCALE_TIME_SHARE * sum(spent.values()) + cost["scale"]
    assert spent["scale"] >= 0.5 * SCALE_TIME_SHARE * sum(spent.values())
    # a job dealt nothing but scale arms runs them every round (it would idle otherwise)
    ran.clear()
    alone = Simulated(KDA, "triton", [load_target(REFERENCE)],
                      options=CampaignOptions(max_examples=10, max_seconds=3600.0))
    alone._run_rounds(arms[2:], 40, c._deadline)
    assert [r for r, _ in ran] == list(range(100))
    # the cap is a tenth of the time, or the scale share asked for if larger
    from kda_fuzz.campaign.plan import _scale_arms

    def share_of(share: float) -> float | None:
        arms = _scale_arms(KDA, "triton", 1000, "cpu", share, 1 << 30, 1)
        return arms[0].time_share if arms else None

    assert share_of(0.03) == SCALE_TIME_SHARE and share_of(0.5) == 0.5


def test_a_job_ended_in_the_middle_of_an_arm_reports_its_time() -> None:
    """A time-bounded job is ended in the middle of an arm (by the deadline, or killed in
    an example): the seconds its strata took reach the summary all the same (counted after
    each example, so its last progress carries them); only a whole arm's end counted them
    before, and a job of one long arm reported a tenth of its time."""
    sup = Supervisor(CampaignSpec.of("kda", "triton", ["tests.hostile_targets:slow_but_correct"],
                                     max_examples=10**6, max_seconds=12.0, seed=2,
                                     valid_share=1.0))
    report = sup.run()
    assert not report.failures and report.examples >= 3
    spent = sum(report.stratum_seconds.values())
    assert spent >= 1.5 * report.examples  # every example's call took 1.5 s
    assert spent >= 0.5 * (report.seconds - report.startup_seconds), (spent, report.seconds)


class _StuckJob:
    """A job process as the supervisor sees it: alive until killed."""

    pid = 2**22 + 12345  # (no such process: it started nothing)
    exitcode = None

    def __init__(self) -> None:
        self.killed = False

    def is_alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_job_stuck_compiling_its_judges_kernel_runs_the_example_again_then_skips_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job judging an example, inside a compile for longer than --timeout (the judge's
    own kernels: a compiler's deadlock): killed and restarted on the same example, not a
    stalled-job error nor a finding; stuck there again, the example is counted as not
    executable (the restarted job is told to skip it)."""
    from kda_fuzz.campaign import supervisor as sv
    from kda_fuzz.campaign.timeouts import store_size

    sup = Supervisor(CampaignSpec.of("kda", "triton", [REFERENCE], timeout=5.0,
                                     max_examples=10, seed=1))
    record = [0.0] * (sv.CALIBRATION + store_size(1))
    started: list = []
    monkeypatch.setattr(sup, "_start", lambda spec, state=None: started.append(spec) or state)
    s = sv._JobState(sv.Job(0, sup.spec, None, sup.options), _StuckJob(), record, None)
    sup.states = [s]
    for _ in range(2):  # the example, then its re-run in the fresh process
        record[sv.STATE], record[sv.ROUND], record[sv.ARM], record[sv.EXAMPLE] = \
            sv.JUDGING, 0, 1, 5
        record[sv.COMPILING] = time.monotonic() - 6.0
        s.proc = _StuckJob()
        sup._watch(s)
        assert s.proc.killed
        s.spec = started[-1]
    first, second = started
    assert first.unexecutable == {} and first.hard == {}
    assert list(second.unexecutable) == [(0, 1, 5)] and second.hard == {}
    assert "a kernel compile did not return within 5 s, twice" in second.unexecutable[(0, 1, 5)]
    t = sup.timeouts()
    assert (t["compile_stalls"], t["compile_skipped"], t["hangs"]) == (1, 1, 0)
    assert not sup.report.failures


def test_a_job_judging_past_the_timeout_outside_any_compile_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Judging that takes long without a compile in progress (a large case's reference)
    is not a compiler's stall: the job is not touched."""
    from kda_fuzz.campaign import supervisor as sv
    from kda_fuzz.campaign.timeouts import store_size

    sup = Supervisor(CampaignSpec.of("kda", "triton", [REFERENCE], timeout=5.0,
                                     max_examples=10, seed=1))
    record = [0.0] * (sv.CALIBRATION + store_size(1))
    record[sv.STATE], record[sv.SINCE] = sv.JUDGING, time.monotonic() - 60.0
    monkeypatch.setattr(sup, "_start", lambda *a, **k: pytest.fail("restarted"))
    s = sv._JobState(sv.Job(0, sup.spec, None, sup.options), _StuckJob(), record, None)
    sup.states = [s]
    sup._watch(s)
    assert not s.proc.killed


def test_a_restarted_job_records_its_owed_crash_past_the_clock_and_runs_nothing_else(
) -> None:
    """A job restarted after a crash owes its record (``hard``: the supervisor knows the
    position, only the job can regenerate the case): past the clock, or after a stop, it
    still walks its plan to that position, running nothing else, and records the very
    case the crashed call had. Before, a crash late in a campaign was lost without a
    word when its restart took the time left."""
    import contextlib
    from dataclasses import replace

    from kda_fuzz.campaign.runner import Campaign, Recorder
    from kda_fuzz.engine.verdict import Verdict

    class Spy(Recorder):  # the case of every call, by position
        def __init__(self) -> None:
            self.case: Any = None
            self.calls: dict[Any, Any] = {}

        def expect(self, case: Any) -> None:
            self.case = case

        def call(self, position: Any, target: int) -> Any:
            self.calls[position] = self.case
            return contextlib.nullcontext()

    options = CampaignOptions.of(max_examples=40, seed=3, budget=512, max_b=4,
                                 valid_share=1.0)
    spy = Spy()
    Campaign(get_contract("kda"), "triton", [load_target(REFERENCE)], options=options,
             recorder=spy).run()
    pos = sorted(spy.calls)[len(spy.calls) // 2]
    died = Verdict("crash", "process-died", "the process running the target died (SIGABRT)")
    called: list[bool] = []

    def never(*args: Any) -> Any:
        called.append(True)
        raise AssertionError("a call past the clock")

    for late in ({"stop": lambda: True}, {"options": replace(
            options, deadline=time.monotonic() - 1.0)}):
        run = Campaign(get_contract("kda"), "triton", [Target("t", never)],
                       **{"options": options, **late}, hard={pos: (0, died)}).run()
        (f,) = run.failures
        assert f.verdict.kind == "crash" and not called and run.examples == 1
        drawn = spy.calls[pos]
        assert all(same_bits(f.case.tensors[n].base, t.base)
                   for n, t in drawn.tensors.items()), late
