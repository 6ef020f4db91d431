"""A campaign reads a deferring judge's verdict one example late (``Campaign._settle``:
after Hypothesis drew and built the next case, so that the device's work overlaps it).
What it counts, finds and records is the same as reading each verdict at once, and a
device fault that surfaces late, even in the next draw, is the late example's."""

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


def _deferring(log: list[str], defers: bool = True, fault_at: int | None = None) -> Contract:
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

    return replace(kda, judge=judge, judge_defers=defers,
                   valid_cases=lambda *a, **k: kda.valid_cases(*a, **k).map(drawn))


def _options(**kw: Any) -> CampaignOptions:
    return CampaignOptions.of(**{"max_examples": 60, "seed": 5, "budget": 512, "max_b": 4,
                                 "valid_share": 1.0, "max_failures": 50, **kw})


def _calls(target: Any) -> tuple[list[Any], Target]:
    seen: list[Any] = []

    def call(*args: Any) -> Any:
        seen.append(args[7].shape)  # out
        return target(*args)
    return seen, Target("t", call)


def _facts(report: Any) -> tuple[Any, ...]:
    return (report.examples, report.valid_cases, report.broken_cases, report.skipped,
            report.batch_checks, dict(report.checks_hit),
            [(f.verdict.signature(), f.found_example, f.count) for f in report.failures])


@pytest.mark.parametrize("bugs", [set(), {"padding_rows_untouched"}])
def test_verdicts_read_late_count_and_find_as_read_at_once(bugs: set[str]) -> None:
    """The same examples, passes, failures (each at its own example number, with its
    repeats) and calls, whether each verdict is read at once or after the next draw;
    and it is read after that draw, never later than the next call."""
    reports, logs, calls = [], [], []
    for defers in (False, True):
        log: list[str] = []
        seen, target = _calls(mutants.make(bugs, "triton"))
        reports.append(Campaign(_deferring(log, defers), "triton", [target],
                                options=_options()).run())
        logs.append(log)
        calls.append(seen)
    at_once, late = reports
    assert _facts(at_once) == _facts(late) and calls[0] == calls[1]
    assert at_once.examples > 40 and (late.failures or not bugs)
    assert "launch" not in logs[0] and "launch" in logs[1]
    # read late: after the next case is drawn, and each before the next launch
    assert "launch draw read" in " ".join(logs[1])
    reads = [x for x in logs[1] if x in ("launch", "read")]
    assert reads == ["launch", "read"] * (len(reads) // 2)


class _Spy(Recorder):
    """Which call each ``settle`` wrapped, and what it saw raised."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.faults: list[tuple[Any, str]] = []

    def call(self, position: Any, target: int) -> Any:
        self.calls.append(position)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def settle(self) -> Any:
        try:
            yield
        except Exception as e:
            self.faults.append((self.calls[-1] if self.calls else None, str(e)))
            raise


@pytest.mark.parametrize("fault_at", [0, 7])
def test_a_device_fault_read_late_is_the_late_examples_own(fault_at: int) -> None:
    """A device error raised by a late read, and by every draw after it (a sticky CUDA
    error), reaches the recorder's ``settle`` of the call that caused it, with nothing
    called after that call, and ends the campaign with that error."""
    spy = _Spy()
    log: list[str] = []
    contract = _deferring(log, fault_at=fault_at)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        Campaign(contract, "triton", [Target("t", mutants.make(set(), "triton"))],
                 options=_options(invariance="off"), recorder=spy).run()
    assert log.count("launch") == fault_at + 1
    (where, text), = spy.faults
    assert where == spy.calls[-1] and FAULT in text


def test_a_late_fault_is_the_flight_records_call(monkeypatch) -> None:
    """Through a job's flight record (as on cuda, where the call stays the target's until
    its verdict is read): a device error read late leaves the record FAULTED at the
    position of the call that caused it, the last call made."""
    import multiprocessing as mp

    import torch

    from kda_fuzz.campaign.supervisor import (
        ARM,
        CALIBRATION,
        EXAMPLE,
        FAULTED,
        ROUND,
        STATE,
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
    assert record[STATE] == FAULTED and log.count("launch") == 8
    assert (record[ROUND], record[ARM], record[EXAMPLE]) == calls[-1]


@pytest.mark.gpu
@pytest.mark.parametrize("bugs", [None, set(), {"padding_rows_untouched"},
                                  {"low_precision_math"}, {"ignore_slot_stride"}])
def test_the_fused_judge_read_late_finds_as_read_at_once_gpu(bugs: set[str] | None,
                                                             kda_device_name: str) -> None:
    """On a GPU the fused judge defers its read: a campaign finds, counts and records the
    same as one whose judge reads each verdict at once (``bugs`` None: the project's
    Triton kernel)."""
    from kda_fuzz.engine.targets import default_targets

    kda = get_contract("kda")
    deferred: list[bool] = []

    def counting(*args: Any, **kw: Any) -> Any:
        v = kda.judge(*args, **kw)
        deferred.append(isinstance(v, Deferred))
        return v

    facts = []
    for contract in (replace(kda, judge_defers=False), replace(kda, judge=counting)):
        target = (default_targets(kda, "triton")[0] if bugs is None
                  else Target("t", mutants.make(bugs, "triton")))
        facts.append(_facts(Campaign(contract, "triton", [target], options=_options(
            device=kda_device_name, max_examples=120)).run()))
    assert facts[0] == facts[1] and sum(deferred) > 40
    assert (not facts[0][-1]) == (not bugs)


FAULTING_JOB = """
import json, multiprocessing as mp
from kda_fuzz.campaign.runner import Campaign
from kda_fuzz.campaign.spec import CampaignOptions
from kda_fuzz.campaign.supervisor import (ARM, CALIBRATION, EXAMPLE, ROUND, STATE,
                                          _DeviceFault, _SharedRecorder)
from kda_fuzz.engine.targets import Target, load_target
from kda_fuzz.families import get_contract
from tests.gpu_targets import writes_out_of_bounds

ref = load_target("kda_fuzz_kernels.kda_decode:reference_kda_packed_decode").fn
record = mp.get_context("spawn").RawArray("d", CALIBRATION)
calls = []

def target(*args):
    calls.append([record[ROUND], record[ARM], record[EXAMPLE]])
    return (writes_out_of_bounds if len(calls) == 8 else ref)(*args)

options = CampaignOptions.of(max_examples=60, seed=5, budget=512, max_b=4, valid_share=1.0,
                             invariance="off", device="cuda")
try:
    Campaign(get_contract("kda"), "triton", [Target("t", target)], options=options,
             recorder=_SharedRecorder(record, lambda pos: None, "cuda")).run()
except _DeviceFault as e:
    print(json.dumps({"fault": str(e), "state": record[STATE], "calls": calls,
                      "at": [record[ROUND], record[ARM], record[EXAMPLE]]}))
"""


@pytest.mark.gpu
def test_a_real_device_fault_read_late_is_the_faulting_calls_gpu(kda_device_name: str) -> None:
    """A target's illegal memory access, launched and left to surface later (in the next
    case's build or the late read), is the faulting call's: the flight record names it,
    FAULTED, and nothing was called after it. (In a process of its own: the fault ends
    its CUDA context.)"""
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
    assert len(got["calls"]) == 8 and got["at"] == got["calls"][-1]
