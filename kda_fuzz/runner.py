"""Fuzz campaigns: Hypothesis drives valid and broken cases through the oracles."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from .case import Case
from .contract import Contract
from .oracle import Outcome, run_case, run_peers
from .verdict import Verdict


class TargetError(Exception):
    """A ``--target`` that cannot be imported or called."""


@dataclass(frozen=True)
class Target:
    """A callable under test and the name it was given by."""

    name: str
    fn: Callable[..., Any]


def load_target(spec: str) -> Target:
    """Import ``MODULE:CALLABLE`` with the current directory on ``sys.path``."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise TargetError(f"target {spec!r} is not of the form MODULE:CALLABLE")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise TargetError(f"cannot import {module!r}: {type(e).__name__}: {e}") from e
    fn: Any = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise TargetError(f"module {module!r} has no attribute {attr!r}")
    if not callable(fn):
        raise TargetError(f"{spec!r} is not callable")
    return Target(spec, fn)


def default_targets(contract: Contract, variant: str) -> list[Target]:
    """The project's own kernels for a contract variant."""
    return [load_target(s) for s in contract.extras.get("default_targets", {}).get(variant, ())]


def fingerprint(case: Case) -> str:
    """A content hash of a case: layouts, bytes and scalars."""
    h = hashlib.sha256()
    for name in sorted(case.tensors):
        t = case.tensors[name]
        h.update(f"{name}|{t.dtype}|{t.device.type}|{t.shape}|{t.stride}|{t.offset}|".encode())
        if t.device.type != "meta":
            h.update(t.base.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(repr(sorted(case.scalars.items())).encode())
    h.update(case.variant.encode())
    return h.hexdigest()


@dataclass
class Failure:
    """A failing case, as small as Hypothesis (and the domain minimizer) could make it."""

    case: Case
    verdict: Verdict
    target: str
    saved: str | None = None
    original: Case | None = None


@dataclass
class Report:
    """Counts and findings of one campaign."""

    contract: str
    variant: str
    targets: list[str]
    examples: int = 0
    rows: int = 0
    tail_rows: int = 0
    valid_cases: int = 0
    broken_cases: int = 0
    skipped: int = 0
    seconds: float = 0.0
    checks_hit: Counter = field(default_factory=Counter)
    validation_gaps: Counter = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)

    def record(self, outcome: Outcome, case: Case) -> None:
        exp = outcome.expectation
        if outcome.status == "gap":
            label = "+".join(case.notes.get("breakages", ["?"]))
            self.validation_gaps[label] += 1
        elif exp.ok:
            self.valid_cases += 1
            self.rows += int(case.notes.get("rows", 1))
            self.tail_rows += int(case.notes.get("tail_rows", 0))
        else:
            self.broken_cases += 1
            self.checks_hit[exp.check if exp.check is not None else f"hole:{exp.hole}"] += 1
        if outcome.status == "skip":
            self.skipped += 1

    def absorb(self, other: Report) -> None:
        """Add another campaign's counts and findings (a parallel job's) to this one."""
        for name in ("examples", "rows", "tail_rows", "valid_cases", "broken_cases", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.checks_hit.update(other.checks_hit)
        self.validation_gaps.update(other.validation_gaps)
        self.failures.extend(other.failures)
        self.saved.extend(other.saved)

    def to_json(self) -> dict[str, Any]:
        return {
            "contract": self.contract,
            "variant": self.variant,
            "targets": self.targets,
            "examples": self.examples,
            "valid_rows": self.rows,
            "bucket_padding_rows": self.tail_rows,
            "valid_cases": self.valid_cases,
            "broken_cases": self.broken_cases,
            "skipped_unjudgeable": self.skipped,
            "failures": len(self.failures),
            "failure_details": [
                {"target": f.target, **f.verdict.to_json(), "saved": f.saved}
                for f in self.failures
            ],
            "seconds": round(self.seconds, 3),
            "checks_hit": {str(k): v for k, v in sorted(self.checks_hit.items(), key=str)},
            "validation_gaps": dict(self.validation_gaps),
            "saved": self.saved,
        }


# (case, target, verdict, run) -> (smaller case, its verdict); ``run`` judges a candidate.
Minimizer = Callable[[Case, Target, Verdict, Callable[[Case], Outcome]], tuple[Case, Verdict]]


HARD_KINDS = ("crash", "timeout")  # never re-run, shrunk or minimized: each try may kill


class _Found(Exception):
    """Raised inside the Hypothesis test to report a failing case."""


class _Stopped(Exception):
    """Raised inside the Hypothesis test when the campaign is told to stop."""


@dataclass(frozen=True)
class Arm:
    """One stratum of a campaign: a strategy and the examples it gets."""

    name: str
    strategy: st.SearchStrategy[Case]
    examples: int
    index: int = 0  # position in the whole campaign's plan (seeds the arm's Hypothesis run)


def deal(arms: list[Arm], job: int, jobs: int) -> list[Arm]:
    """The arms that job ``job`` of ``jobs`` runs: broken and valid arms are each dealt out
    round-robin, so every job gets its share of both (see ``plan``'s ``parts``)."""
    arms = [replace(a, index=i) for i, a in enumerate(arms)]
    broken = [a for a in arms if a.name.startswith("broken:")]
    valid = [a for a in arms if not a.name.startswith("broken:")]
    return broken[job::jobs] + valid[job::jobs]


def plan(contract: Contract, variant: str, max_examples: int, *, device: str = "cpu",
         budget: int | None = None, valid_share: float = 0.5, families: int = 0,
         bucket: bool = False, max_b: int | None = None, seed: int | None = None,
         max_bhv: int | None = None, parts: int = 1) -> list[Arm]:
    """Split a campaign's examples: every broken stratum (each breakage, each adjacent pair
    of checks) gets its share, then a random mix of breakages, then valid layouts.

    With ``families`` (and a contract that defines them) the valid examples are spent
    family by family, so a shape-specialising kernel compiles a few times per family.
    Without families the valid examples are split into ``parts`` arms (one per job)."""
    strata = contract.broken_arms(variant)
    n_broken = round(max_examples * (1 - valid_share))
    per = (n_broken * 4 // 5) // max(1, len(strata))  # 0: too few examples, mix only
    arms = [Arm(f"broken:{name}", contract.broken_cases(variant, device=device, only=only), per)
            for name, only in strata] if per else []
    used = per * len(arms)
    mix = max(0, n_broken - used)
    if mix:
        arms.append(Arm("broken:mix", contract.broken_cases(variant, device=device), mix))
    used += mix
    n_valid = max_examples - used
    if n_valid <= 0:
        return arms
    kw: dict[str, Any] = {"device": device}
    if budget:
        kw["budget"] = budget
    if max_b:
        kw["max_b"] = max_b
    if bucket:
        kw["bucket"] = True
    if max_bhv:
        kw["max_bhv"] = max_bhv
    fams = (contract.families(variant, families, seed or 0, **({"budget": budget} if budget
                                                               else {}))
            if families and contract.families else [])
    if not fams:
        strategy = contract.valid_cases(variant, **kw)
        if parts <= 1:
            return [*arms, Arm("valid", strategy, n_valid)]
        return [*arms, *(Arm(f"valid:part{j}", strategy, n) for j, n in
                         enumerate(_split(n_valid, parts)) if n)]
    return [*arms, *(Arm(f"valid:family{i}", contract.valid_cases(variant, family=f, **kw), n)
                     for i, (f, n) in enumerate(zip(fams, _split(n_valid, len(fams)))) if n)]


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (i < n % parts) for i in range(parts)]


def campaign(
    contract: Contract,
    variant: str,
    targets: list[Target],
    *,
    device: str = "cpu",
    max_examples: int = 200,
    seed: int | None = None,
    budget: int | None = None,
    valid_share: float = 0.5,
    shrink_seconds: float = 60.0,
    on_example: Callable[[Report], None] | None = None,
    minimize: Minimizer | None = None,
    isolate: bool = False,
    timeout: float = 60.0,
    inflight_dir: str | None = None,
    families: int = 0,
    bucket: bool = False,
    max_b: int | None = None,
    max_seconds: float | None = None,
    peers: list[Target] | None = None,
    max_bhv: int | None = None,
    stop: Callable[[], bool] | None = None,
    job: tuple[int, int] = (0, 1),
) -> Report:
    """Run one fuzz campaign; stops at the first failing case, minimized.

    With ``isolate``, each target runs in a worker process with a per-case ``timeout``;
    the case in flight is written to ``inflight_dir`` first, so an abort, a hard fault or
    a hang is reported as a ``crash``/``timeout`` failure and the campaign carries on.
    ``families``/``bucket``/``max_b`` shape the valid layouts (see ``plan``); with
    ``max_seconds`` the arms are run in chunks, cycling, until the time is up.
    ``peers`` are judged like targets and, on accepted layouts, compared with the first
    target (in this process). ``stop`` is asked before each example; once it says yes
    the campaign ends (another job of a parallel campaign found a failure). ``job``
    ``(j, n)`` runs only job j's arms of the whole plan (see ``deal``).
    """
    peers = list(peers or [])
    targets = [*targets, *peers]
    report = Report(contract.name, variant, [t.name for t in targets])
    contract.checks_for(variant)  # rejects unknown variants early
    state: dict[str, Any] = {"first": None, "t_first": None, "last": None, "fps": set(),
                             "hard": {}}
    t0 = time.monotonic()
    workers: dict[str, Any] = {}
    if isolate:
        from .isolate import IsolatedTarget

        workers = {t.name: IsolatedTarget(contract, t.name, timeout=timeout, device=device)
                   for t in targets}

    def judge(case: Case, target: Target) -> Outcome:
        if not isolate:
            return run_case(contract, case, target.fn)
        fp = fingerprint(case)
        if (target.name, fp) in state["hard"]:  # never re-run a crash or a hang
            return state["hard"][(target.name, fp)]
        inflight = None
        if inflight_dir is not None:
            from .corpus import CaseTooLarge, save_case

            try:
                inflight = save_case(case, None, inflight_dir,
                                     description=f"in flight on {target.name}")
            except CaseTooLarge:  # over the corpus cap: run it without a crash record
                inflight = None
        outcome = workers[target.name].run(case)
        if outcome.verdict is not None and outcome.verdict.kind in HARD_KINDS:
            state["hard"][(target.name, fp)] = outcome
            if inflight is not None:
                outcome.verdict.extra["inflight"] = str(inflight)
        elif inflight is not None:
            inflight.unlink(missing_ok=True)
        return outcome

    def count(outcome: Outcome, case: Case) -> None:
        report.examples += 1
        report.record(outcome, case)
        if on_example is not None:
            on_example(report)

    def found(case: Case, outcome: Outcome, verdict: Verdict, target: Target) -> None:
        """Report a failure to Hypothesis (raises), unless shrinking turned it into
        another failure (returns: that smaller case does not count as failing)."""
        first = state["first"]
        if first is not None and not verdict.same_failure(first[1]):
            return
        state["fps"].add(fingerprint(case))
        state["last"] = (case, verdict, target)
        if first is None:
            state["first"], state["t_first"] = state["last"], time.monotonic()
            if verdict.kind in HARD_KINDS:
                state["t_first"] -= shrink_seconds  # each try may cost a timeout
            count(outcome, case)
        raise _Found(verdict.summary())

    def body(case: Case) -> None:
        shrinking = state["first"] is not None
        if not shrinking and stop is not None and stop():
            raise _Stopped
        if shrinking:
            over = time.monotonic() - state["t_first"] > shrink_seconds
            if over and fingerprint(case) not in state["fps"]:
                return
        outcome = None
        for target in targets:
            outcome = judge(case, target)
            if outcome.status == "fail":
                assert outcome.verdict is not None
                found(case, outcome, outcome.verdict, target)
                return  # shrinking must keep the same failure
            if outcome.status in ("gap", "skip"):
                break
        for peer in peers if outcome is not None and outcome.status == "pass" else ():
            pair = run_peers(contract, case, [(targets[0].name, targets[0].fn),
                                             (peer.name, peer.fn)])
            if pair.status == "fail" and pair.verdict is not None:
                who = Target(f"{targets[0].name} vs {peer.name}", targets[0].fn)
                found(case, outcome, pair.verdict, who)
                return
        if not shrinking and outcome is not None:
            count(outcome, case)

    arms = plan(contract, variant, max_examples, device="cpu" if isolate else device,
                budget=budget,
                valid_share=valid_share, families=families, bucket=bucket, max_b=max_b,
                seed=seed, max_bhv=max_bhv, parts=job[1])
    arms = deal(arms, *job)
    deadline = None if max_seconds is None else t0 + max_seconds
    try:
        _run_arms(arms, seed, body, state, report, minimize, deadline, judge)
    finally:
        for w in workers.values():
            w.close()
    report.seconds = time.monotonic() - t0
    return report


CHUNK = 25


def _run_arms(arms: list[Arm], seed: int | None, body: Callable[[Case], None],
              state: dict[str, Any], report: Report,
              minimize: Minimizer | None, deadline: float | None,
              judge: Callable[[Case, Target], Outcome]) -> None:
    """Run each arm as its own Hypothesis test; with a deadline, in chunks until it passes."""
    rounds = 0
    while True:
        for arm in arms:
            if deadline is not None and time.monotonic() > deadline:
                return
            n = arm.examples if deadline is None else min(arm.examples, CHUNK)
            test = settings(
                max_examples=n,
                database=None,
                deadline=None,
                phases=(Phase.generate, Phase.shrink),
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
                print_blob=False,
            )(given(arm.strategy)(body))
            if seed is not None or rounds:
                test = hypothesis_seed(((seed or 0) * 1009 + arm.index) * 7919 + rounds)(test)
            try:
                test()
            except _Stopped:
                return
            except _Found:
                case, verdict, target = state["last"]
                failure = Failure(case, verdict, target.name)
                hard = verdict.kind in HARD_KINDS or verdict.what.startswith("peers-")
                if minimize is not None and not hard:
                    failure.original = case
                    failure.case, failure.verdict = minimize(
                        case, target, verdict, lambda c, t=target: judge(c, t))
                report.failures.append(failure)
                return
        if deadline is None:
            return
        rounds += 1
