"""Calibrated per-call timeouts and the budget steered away from crashes and hangs."""

from __future__ import annotations

import pytest

from kda_fuzz.campaign.steering import MIN_SHARE, Steering, describe_feature, features
from kda_fuzz.campaign.timeouts import (
    FLOOR,
    MAX_SCALE,
    Calibration,
    describe,
    merged,
    size_class,
    store_size,
)
from kda_fuzz.families.kda.layouts import KdaLayout, build


def _case(B: int = 2, K: int = 4, seed: int = 0):
    return build(KdaLayout(B=B, H=1, HV=1, K=K, V=4, seed=seed), "triton")


def test_the_ceiling_holds_until_a_call_returns_then_the_limit_follows_the_calls() -> None:
    store = [0.0] * store_size(1)
    cal = Calibration(store, 1, 60.0)
    small, other = _case(2), _case(3)
    assert cal.limit(0, small) == 60.0  # nothing returned yet: a compile may take that long
    cal.observe(0, small, 2.0)  # the process's first call (imports, compiles)
    assert cal.limit(0, other) == pytest.approx(20.0)  # a new shape: like a first call
    cal.observe(0, other, 0.3)
    cal.observe(0, small, 0.01)  # a shape run before, at its steady cost
    assert cal.limit(0, small) == FLOOR  # 10x 0.01 s, but never below the floor
    cal.observe(0, small, 1.5)
    assert cal.limit(0, small) == pytest.approx(15.0)  # 10x the slowest of its size class
    assert cal.limit(0, _case(4)) >= 15.0  # a new shape: at least what its class needs
    cal.observe(0, small, 30.0)
    assert cal.limit(0, small) == 60.0  # --timeout is the ceiling


def test_what_was_learned_survives_a_restart_and_larger_classes_scale_up() -> None:
    store = [0.0] * store_size(2)
    first = Calibration(store, 2, 60.0)
    small, big = _case(2), _case(64, K=16)
    assert size_class(big) > size_class(small)
    first.observe(1, small, 0.2)
    first.observe(1, small, 0.15)
    again = Calibration(store, 2, 60.0)  # a restarted job: same store, a new process
    assert again.limit(0, small) == 60.0  # the other target has never returned
    # the first call of a process: like the slowest first call of a process seen
    scaled = 10 * 0.15 * min(MAX_SCALE, 2 ** (size_class(big) - size_class(small)))
    assert again.limit(1, big) == pytest.approx(min(60.0, max(FLOOR, scaled)))
    again.observe(1, small, 0.1)
    assert again.limit(1, small) == FLOOR  # a shape seen: 10x 0.15 s, raised to the floor
    summary = describe(merged([store], 2), ["a", "b"], 60.0)
    assert summary["targets"]["a"]["in_force_seconds"] == 60.0
    assert summary["targets"]["b"]["slowest_first_call_of_a_process_seconds"] == 0.2
    with pytest.raises(ValueError):
        Calibration([0.0], 1, 60.0)


def test_a_class_far_larger_than_any_seen_costs_a_bounded_multiple_not_the_ceiling() -> None:
    store = [0.0] * store_size(1)
    cal = Calibration(store, 1, 600.0)
    small, big = _case(2), _case(512, K=64)
    assert size_class(big) - size_class(small) > 3  # a size ratio past MAX_SCALE
    cal.observe(0, small, 1.0)  # the first call of the process
    cal.observe(0, small, 0.5)  # a shape run before
    cal.observe(0, big, 1.0)  # a new shape (compile cell)
    # the big shape run before: its class never measured, the small one's 0.5 s scaled
    # up at most MAX_SCALE times (not 2 ** ratio: 10x that would be far past a minute)
    assert cal.limit(0, big) == pytest.approx(10 * 0.5 * MAX_SCALE)
    # a smaller class than any seen: the slowest call of any class, not the ceiling
    fresh = Calibration([0.0] * store_size(1), 1, 600.0)
    fresh.observe(0, big, 1.0)
    fresh.observe(0, big, 3.0)
    fresh.observe(0, small, 0.1)  # a new shape: the compile cell
    assert fresh.limit(0, small) == pytest.approx(30.0)


def test_draws_like_faulting_layouts_get_less_of_the_budget_and_replay_alike() -> None:
    steer = Steering(seed=1)
    small = [_case(2, seed=s) for s in range(40)]
    large = [_case(96, seed=s) for s in range(40)]
    assert all(steer.admits((0, 0, i), "valid", c)[0] for i, c in enumerate(small + large))
    for c in small[:10]:
        steer.observe("valid", c, fault=False)
    for c in large[:4]:
        steer.observe("valid", c, fault=True)
    draws = [large[i % len(large)] for i in range(400)]
    decided = [steer.admits((0, 1, i), "valid", c) for i, c in enumerate(draws)]
    run = sum(ok for ok, _ in decided)
    assert run < len(draws) / 8 and run >= 1  # far less, never nothing
    why = {describe_feature(w) for ok, w in decided if not ok}
    assert why and all(">=" in w for w in why), why
    assert all(steer.admits((0, 2, i), "valid", c)[0] for i, c in enumerate(small))
    assert all(steer.admits((0, 3, i), "broken", c)[0] for i, c in enumerate(large))  # others
    # a restarted job resuming at (0, 1, 30): the draws before it are decided as they were
    state = steer.state((0, 1, 30))
    again = Steering(seed=1, state=state)
    assert [again.admits((0, 1, i), "valid", c, replay=True)[0] for i, c in
            enumerate(draws[:30])] == [ok for ok, _ in decided[:30]]
    assert [again.admits((0, 1, i), "valid", c)[0] for i, c in enumerate(draws[30:], 30)] \
        == [ok for ok, _ in decided[30:]]
    assert MIN_SHARE > 0 and len(features("valid", small[0])) > 10


def test_a_minimized_hang_is_kept_only_if_it_does_not_return_within_the_ceiling() -> None:
    """Its candidates were judged under the shorter calibrated limit: the saver runs the
    minimized case again under ``--timeout`` and keeps it only if it hangs there too."""
    from types import SimpleNamespace

    from kda_fuzz.campaign.findings import FindingSaver
    from kda_fuzz.campaign.spec import CampaignSpec
    from kda_fuzz.families import get_contract

    saver = FindingSaver(CampaignSpec.of(get_contract("kda"), "triton", [], seed=1,
                                         timeout=30.0))
    limits: list[float] = []

    class Iso:
        timeout = 2.0

        def __init__(self, hangs: bool) -> None:
            self.hangs = hangs

        def run(self, case):
            limits.append(self.timeout)
            kind = "timeout" if self.hangs else None
            return SimpleNamespace(verdict=None if kind is None else SimpleNamespace(kind=kind))

    for hangs in (True, False):
        iso = Iso(hangs)
        assert saver._proven_hang(iso, object()) is hangs  # type: ignore[arg-type]
        assert iso.timeout == 2.0  # its calibrated limit back for the next candidate
    assert limits == [30.0, 30.0]


def test_steering_counts_per_feature_once_a_stratum_faults_as_if_counted_all_along() -> None:
    """Layouts are counted compactly until their stratum faults; its per-feature counts are
    then exactly those of counting every feature of every layout (and survive a restart)."""
    from collections import Counter

    steer = Steering(seed=1)
    cases = [_case(B, K=K, seed=s) for s, (B, K) in
             enumerate([(2, 4), (9, 4), (96, 8), (2, 8), (33, 4)] * 3)]
    runs, faults = Counter(), Counter()
    for i, c in enumerate(cases):
        fault = i in (6, 11)
        steer.observe("valid", c, fault=fault)
        steer.observe("broken", c, fault=False)
        for f in features("valid", c):
            runs[f] += 1
            faults[f] += fault
    assert steer.runs == runs and +steer.faults == +faults
    assert not any(f[0] == "broken" for f in steer.runs)  # never faulted: never expanded
    again = Steering(seed=1, state=steer.state((0, 0, 0)))
    assert again.runs == runs and +again.faults == +faults


def test_the_timeout_line_says_what_the_re_runs_of_calls_past_the_ceiling_gave() -> None:
    """Re-runs that returned are stalls, those cut by the campaign's end are not proven:
    neither is a finding, and the line says which is which."""
    from kda_fuzz.campaign.timeouts import note

    base = {"policy": "p", "targets": {"t": {"in_force_seconds": 60.0}}}
    assert "ran again" not in note(base)
    line = note({**base, "rerun": 3, "rerun_hung": 1, "rerun_returned": 1})
    assert "3 call(s) past --timeout ran again in a fresh process: 1 did not return again " \
        "(hangs), 1 returned (stalled, not hung: no finding), 1 cut by the campaign's end" \
        in line, line
    assert "cut by" not in note({**base, "rerun": 1, "rerun_hung": 0, "rerun_returned": 1})
