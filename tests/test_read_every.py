"""``--read-every N``: a campaign reads a deferring judge's results once per N valid
examples (``Campaign._read``). What it counts, finds and records is the same as reading
each at once; a device fault or hang seen with results unread is traced to its example
by running them again one at a time (``Supervisor._retrace``), never guessed."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import pytest

from kda_fuzz.campaign.runner import Campaign, Recorder
from kda_fuzz.campaign.spec import CampaignOptions
from kda_fuzz.engine.contract import Contract, Deferred
from kda_fuzz.engine.targets import Target
from kda_fuzz.families import get_contract
from tests import mutants

FAULT = "CUDA error: an illegal memory access was encountered"


def _deferring(log: list[str], fault_at: int | None = None) -> Contract:
    """KDA's contract whose judge, asked to defer, returns its verdict in a ``Deferred``;
    ``log`` says when cases are drawn, called and judged, and when verdicts are read.
    ``fault_at``: the read of that launch (from 0) raises a device error, and every
    draw after that launch raises it too (a sticky CUDA error surfacing in the next
    case's build)."""
    kda = get_contract("kda")
    launches: list[int] = []

    def drawn(case: Any) -> Any:
        if fault_at is not None and len(launches) > fault_at:
            raise RuntimeError(FAULT)
        log.append("draw")
        return case

    def judge(case: Any, kwargs: Any, before: Any, after: Any, result: Any,
              budget: Any = None, *, facts: Any = None, defer: bool = False) -> Any:
        v = kda.judge(case, kwargs, before, after, result, budget, facts=facts)
        if not defer:
            log.append("judge")
            return v
        n = len(launches)
        launches.append(n)
        log.append("launch")

        def finish() -> Any:
            log.append("read")
            if n == fault_at:
                raise RuntimeError(FAULT)
            return v
        return Deferred(finish)

    return replace(kda, judge=judge, judge_defers=True,
                   valid_cases=lambda *a, **k: kda.valid_cases(*a, **k).map(drawn))


def _options(**kw: Any) -> CampaignOptions:
    # extra_share 1: every batch invariance turn due runs, whatever the job's time so far
    # (a turn held by the clock differs between two runs: on a GPU the first run of a real
    # kernel pays its compiles and the second finds them made)
    return CampaignOptions.of(**{"max_examples": 60, "seed": 5, "budget": 512, "max_b": 4,
                                 "valid_share": 1.0, "max_failures": 50, "read_every": 8,
                                 "extra_share": 1.0, **kw})


def _calls(target: Any) -> tuple[list[Any], Target]:
    seen: list[Any] = []

    def call(*args: Any) -> Any:
        seen.append(tuple(args[7].shape))  # out
        return target(*args)
    return seen, Target("t", call)


def _facts(report: Any) -> tuple[Any, ...]:
    return (report.examples, report.valid_cases, report.broken_cases, report.skipped,
            report.batch_checks, dict(report.checks_hit),
            [(f.verdict.signature(), f.found_example, f.count) for f in report.failures])


@pytest.mark.parametrize("bugs,share", [(set(), 1.0), ({"padding_rows_untouched"}, 1.0),
                                         ({"padding_rows_untouched", "rank_check_and"}, 0.5)])
def test_results_read_in_batches_count_and_find_as_read_at_once(bugs: set[str],
                                                                share: float) -> None:
    """The same examples, passes, failures (each at its own example number, with its
    repeats) and calls, whether each result is read at once or eight at a time; and
    they are read eight at a time."""
    reports, logs, calls = [], [], []
    for every in (1, 8):
        log: list[str] = []
        seen, target = _calls(mutants.make(bugs, "triton"))
        reports.append(Campaign(_deferring(log), "triton", [target], options=_options(
            read_every=every, valid_share=share, max_examples=120)).run())
        logs.append(log)
        calls.append(seen)
    at_once, batched = reports
    # (the same calls; a failure's confirming re-runs come after its batch's)
    assert _facts(at_once) == _facts(batched) and sorted(calls[0]) == sorted(calls[1])
    assert at_once.examples > 40 and (batched.failures or not bugs)
    assert "launch" not in logs[0] and "launch" in logs[1]
    runs = " ".join(x for x in logs[1] if x in ("launch", "read"))
    assert " ".join(["launch"] * 8 + ["read"] * 8) in runs
    assert "launch " * 9 not in runs + " "  # never more than eight unread


class _Spy(Recorder):
    """Which call each ``settle`` wrapped, what it saw raised, the oldest unread."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.faults: list[tuple[Any, str]] = []
        self.first: Any = None

    def call(self, position: Any, target: int) -> Any:
        self.calls.append(position)
        return contextlib.nullcontext()

    def unread(self, position: Any) -> None:
        self.first = position

    @contextlib.contextmanager
    def settle(self) -> Any:
        try:
            yield
        except Exception as e:
            self.faults.append((self.calls[-1] if self.calls else None, str(e)))
            raise


@pytest.mark.parametrize("fault_at", [0, 7, 12])
def test_a_device_fault_read_in_a_batch_ends_the_campaign_as_that_batchs(fault_at: int
                                                                          ) -> None:
    """A device error raised by a read, and by every draw after it (a sticky CUDA error),
    ends the campaign with that error, seen in a ``settle`` of the batch's calls, with the
    batch's oldest example named as unread, and nothing called after the batch."""
    spy = _Spy()
    log: list[str] = []
    contract = _deferring(log, fault_at=fault_at)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        Campaign(contract, "triton", [Target("t", mutants.make(set(), "triton"))],
                 options=_options(invariance="off"), recorder=spy).run()
    launched = log.count("launch")
    assert fault_at < launched <= (fault_at // 8 + 1) * 8  # (its batch, not beyond)
    assert spy.faults and all(FAULT in text for _, text in spy.faults)
    assert spy.first is not None and spy.first <= spy.calls[-1]


def test_a_fault_read_in_a_batch_leaves_the_flight_record_naming_the_batch(monkeypatch
                                                                           ) -> None:
    """Through a job's flight record (as on cuda, where a call stays the target's until
    its result is read): a device error read in a batch leaves the record FAULTED at the
    last call made, with the batch's oldest example as the oldest unread (what the
    supervisor runs again one at a time)."""
    import multiprocessing as mp

    import torch

    from kda_fuzz.campaign.supervisor import (
        ARM,
        CALIBRATION,
        EXAMPLE,
        FAULTED,
        ROUND,
        STATE,
        UNREAD,
        UNREAD_ARM,
        UNREAD_EXAMPLE,
        UNREAD_ROUND,
        _DeviceFault,
        _SharedRecorder,
    )

    record = mp.get_context("spawn").RawArray("d", CALIBRATION)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls: list[tuple[float, float, float]] = []
    correct = mutants.make(set(), "triton")

    def target(*args: Any) -> Any:
        calls.append((record[ROUND], record[ARM], record[EXAMPLE]))
        return correct(*args)

    log: list[str] = []
    with pytest.raises(_DeviceFault, match="illegal memory access"):
        Campaign(_deferring(log, fault_at=7), "triton", [Target("t", target)],
                 options=_options(invariance="off"),
                 recorder=_SharedRecorder(record, lambda pos: None, "cuda")).run()
    assert record[STATE] == FAULTED and log.count("launch") == 8 and record[UNREAD] == 1
    last = (record[ROUND], record[ARM], record[EXAMPLE])
    first = (record[UNREAD_ROUND], record[UNREAD_ARM], record[UNREAD_EXAMPLE])
    assert last == calls[-1] and first == calls[-8] < last


@pytest.mark.gpu
@pytest.mark.parametrize("bugs", [None, set(), {"padding_rows_untouched"},
                                  {"low_precision_math"}, {"ignore_slot_stride"}])
def test_the_fused_judge_read_in_batches_finds_as_read_at_once_gpu(bugs: set[str] | None,
                                                                   kda_device_name: str
                                                                   ) -> None:
    """On a GPU the fused judge defers its read: a campaign reading eight at a time finds,
    counts and records the same as one reading each at once (``bugs`` None: the
    project's Triton kernel)."""
    from kda_fuzz.engine.targets import default_targets

    kda = get_contract("kda")
    deferred: list[bool] = []

    def counting(*args: Any, **kw: Any) -> Any:
        v = kda.judge(*args, **kw)
        deferred.append(isinstance(v, Deferred))
        return v

    facts = []
    for every in (1, 8):
        target = (default_targets(kda, "triton")[0] if bugs is None
                  else Target("t", mutants.make(bugs, "triton")))
        facts.append(_facts(Campaign(replace(kda, judge=counting), "triton", [target],
                                     options=_options(device=kda_device_name,
                                                      max_examples=120,
                                                      read_every=every)).run()))
    assert facts[0] == facts[1] and sum(deferred) > 40
    assert (not facts[0][-1]) == (not bugs)


FAULTING_JOB = """
import json, multiprocessing as mp
from kda_fuzz.campaign.runner import Campaign
from kda_fuzz.campaign.spec import CampaignOptions
from kda_fuzz.campaign import supervisor as sv
from kda_fuzz.engine.targets import Target, load_target
from kda_fuzz.families import get_contract
from tests.gpu_targets import writes_out_of_bounds

ref = load_target("kda_fuzz_kernels.kda_decode:reference_kda_packed_decode").fn
record = mp.get_context("spawn").RawArray("d", sv.CALIBRATION)
calls = []

def target(*args):
    calls.append([record[sv.ROUND], record[sv.ARM], record[sv.EXAMPLE]])
    return (writes_out_of_bounds if len(calls) == 12 else ref)(*args)

options = CampaignOptions.of(max_examples=60, seed=5, budget=512, max_b=4, valid_share=1.0,
                             invariance="off", device="cuda", read_every=8)
try:
    Campaign(get_contract("kda"), "triton", [Target("t", target)], options=options,
             recorder=sv._SharedRecorder(record, lambda pos: None, "cuda")).run()
except sv._DeviceFault as e:
    print(json.dumps({"fault": str(e), "state": record[sv.STATE], "calls": calls,
                      "unread": record[sv.UNREAD],
                      "first": [record[sv.UNREAD_ROUND], record[sv.UNREAD_ARM],
                                record[sv.UNREAD_EXAMPLE]],
                      "at": [record[sv.ROUND], record[sv.ARM], record[sv.EXAMPLE]]}))
"""


@pytest.mark.gpu
def test_a_real_device_fault_in_a_batch_names_the_batch_gpu(kda_device_name: str) -> None:
    """A target's illegal memory access among results read eight at a time: the flight
    record ends FAULTED, naming a batch (the oldest unread, the last call) that holds the
    faulting call, nothing called past that batch. (In a process of its own: the fault
    ends its CUDA context.)"""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from kda_fuzz.campaign.supervisor import FAULTED

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if kda_device_name.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = kda_device_name.split(":")[1]
    run = subprocess.run([sys.executable, "-c", FAULTING_JOB], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    lines = [x for x in run.stdout.splitlines() if x.startswith("{")]
    assert lines, run.stdout[-2000:] + run.stderr[-2000:]
    got = json.loads(lines[-1])
    assert "illegal memory access" in got["fault"] and got["state"] == FAULTED
    faulted = got["calls"][11]
    assert got["at"] == got["calls"][-1] and len(got["calls"]) - 12 < 8
    assert got["unread"] == 1 and got["first"] <= faulted <= got["at"]


@pytest.mark.gpu
def test_a_campaign_reading_in_batches_saves_the_faulting_case_gpu(tmp_path: Any) -> None:
    """The command with --read-every 8 against a target that faults only on layouts of
    an odd number of value heads (3 or more): every crash it saves is such a layout (a
    fault seen in a batch is run again one at a time and saved at its own example),
    and none is said unrecorded unless the clock ended its re-run."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run(
        [sys.executable, "-m", "kda_fuzz", "fuzz", "--device", "cuda", "--target",
         "tests.gpu_targets:faults_on_odd_heads", "--contract", "triton", "--jobs", "2",
         "--read-every", "8", "--valid-share", "1", "--max-seconds", "90", "--seed", "3",
         "--shrink-seconds", "20", "--json", "--corpus", str(tmp_path)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    files = sorted(Path(tmp_path).rglob("*.json"))
    assert files, summary
    from kda_fuzz.corpus.store import load_case

    for f in files:
        case, verdict, _ = load_case(f)
        hv = case.tensors["initial_state"].shape[1]
        assert verdict is not None and verdict.kind == "crash" and hv % 2 == 1 and hv >= 3, \
            (f, hv)


class _Job:
    """A job process as the supervisor sees it: dead (``alive`` False) or stuck."""

    pid = 2**22 + 12346  # (no such process: it started nothing)

    def __init__(self, alive: bool) -> None:
        self.alive, self.exitcode = alive, None if alive else -11

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.alive = False

    def join(self, timeout: float | None = None) -> None:
        pass


def _supervised(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, list[Any], Any]:
    """A supervisor of one job whose restarts are only recorded, and that job's state."""
    from kda_fuzz.campaign import supervisor as sv
    from kda_fuzz.campaign.spec import CampaignSpec
    from kda_fuzz.campaign.timeouts import store_size

    sup = sv.Supervisor(CampaignSpec.of(
        "kda", "triton", ["kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"],
        timeout=5.0, max_examples=10, seed=1, read_every=8))
    record = [0.0] * (sv.CALIBRATION + store_size(1))
    started: list[Any] = []
    monkeypatch.setattr(sup, "_start", lambda spec, state=None: started.append(spec) or state)
    s = sv._JobState(sv.Job(0, sup.spec, None, sup.options), _Job(False), record, None)
    sup.states = [s]
    return sup, s, started, sv


def _seen(sup: Any, s: Any, started: list[Any], sv: Any, at: tuple[int, int, int],
          first: tuple[int, int, int] | None = None, hang: bool = False) -> None:
    """The job seen faulting (``hang``: stuck in a call) at ``at`` with results unread
    from ``first`` on; the supervisor acts, and the job is its restart from then on."""
    import time

    r = s.record
    r[sv.STATE] = sv.CALLING if hang else sv.FAULTED
    r[sv.SINCE] = time.monotonic() - 60.0
    r[sv.ROUND], r[sv.ARM], r[sv.EXAMPLE] = at
    r[sv.UNREAD] = 0.0 if first is None else 1.0
    if first is not None:
        r[sv.UNREAD_ROUND], r[sv.UNREAD_ARM], r[sv.UNREAD_EXAMPLE] = first
    s.fault = "" if hang else FAULT
    s.proc = _Job(alive=hang)
    sup._watch(s)
    s.spec, s.fault = started[-1], ""
    assert r[sv.UNREAD] == 0  # (the record outlives the process; its batch does not)


def test_a_fault_seen_with_results_unread_is_run_again_one_at_a_time_and_saved_at_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A device fault seen while results of earlier examples were unread is nobody's yet:
    the job runs them again with each result read at once (no position recorded), and
    the fault is recorded where it comes back."""
    sup, s, started, sv = _supervised(monkeypatch)
    _seen(sup, s, started, sv, (0, 1, 12), first=(0, 1, 5))
    assert started[-1].hard == {} and started[-1].options.read_each_through == (0, 1, 12)
    _seen(sup, s, started, sv, (0, 1, 8))  # one at a time: at its own example
    (pos, (_, verdict)), = started[-1].hard.items()
    assert pos == (0, 1, 8) and verdict.what == "device-fault"
    assert not sup._retraced and not sup._untraced


def test_a_hang_seen_with_results_unread_is_proven_where_it_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A hang seen with results unread is run again one at a time; where the re-run hangs
    again (a fresh process: the ceiling's second look) it is a finding at once."""
    sup, s, started, sv = _supervised(monkeypatch)
    _seen(sup, s, started, sv, (0, 1, 12), first=(0, 1, 5), hang=True)
    assert started[-1].hard == {} and started[-1].options.read_each_through == (0, 1, 12)
    _seen(sup, s, started, sv, (0, 1, 9), hang=True)
    (pos, (_, verdict)), = started[-1].hard.items()
    assert pos == (0, 1, 9) and verdict.kind == "timeout"


def test_a_fault_of_a_batch_that_does_not_come_back_is_said_never_saved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Run again one at a time past the batch with nothing seen: no example is blamed (no
    file), and the campaign says what it saw and where (``unrecorded_faults``: the CLI
    exits 1)."""
    sup, s, started, sv = _supervised(monkeypatch)
    _seen(sup, s, started, sv, (0, 1, 12), first=(0, 1, 5))
    sup._untrace_passed(0, ((0, 1, 11), {}))
    assert sup._retraced  # not passed yet
    sup._untrace_passed(0, ((0, 1, 13), {}))
    sup._unrecorded()
    (f,), notes = sup.report.extra["unrecorded_faults"], sup.report.notes
    assert (f["from"], f["position"], f["what"]) == ([0, 1, 5], [0, 1, 12], "device-fault")
    assert not sup.report.failures and any("--read-every" in n for n in notes)


def test_a_batch_counts_each_examples_compiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiles and their seconds a campaign reports are the same read in batches as
    read at once: each example's own, not those of the examples launched after it (they
    were counted once per unread example: 2x the compile seconds in an H100 campaign)."""
    from kda_fuzz.execution import compiles

    made = [compiles.Compiles()]
    monkeypatch.setattr(compiles, "totals", lambda: made[0])
    seen: set[tuple[int, ...]] = set()
    correct = mutants.make(set(), "triton")

    def compiling(*args: Any) -> Any:
        shape = tuple(args[7].shape)
        if shape not in seen:  # a first call of a shape compiles: one, of 1.5 s
            seen.add(shape)
            made[0] = replace(made[0], helion=made[0].helion + 1,
                              seconds=made[0].seconds + 1.5)
        return correct(*args)

    reports = []
    for every in (1, 8):
        seen.clear()
        made[0] = compiles.Compiles()
        reports.append(Campaign(_deferring([]), "triton", [Target("t", compiling)],
                                options=_options(read_every=every, max_examples=120,
                                                 invariance="off")).run())
    at_once, batched = reports
    assert at_once.compiles == batched.compiles == made[0].count > 1
    assert at_once.compiling_seconds == batched.compiling_seconds == made[0].seconds
