"""Findings saved as they are confirmed: each new distinct failure is minimized and written
into the corpus while the campaign goes on, and announced with its file.

Minimization runs in background threads (each failure's candidates judged in an isolated
worker) or, for an in-process campaign, right where the failure is found. ``cut`` (an
interrupt, the ``--max-seconds`` deadline) ends every minimization in progress at once
(its worker killed) and the rest are not started: those failures are saved as found,
marked so in the file and in the summary.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kda_fuzz.campaign.channel import ExitReason, Stop
from kda_fuzz.campaign.minimize import (
    NO_ELEMENT_KINDS,
    Cut,
    candidate_timeout,
    compacted,
    minimize_failure,
    minimized_detail,
    values_from_recipes,
)
from kda_fuzz.campaign.results import Failure, minimizable, wants_minimizing
from kda_fuzz.campaign.sanitizing import attach_report, minimize_finding
from kda_fuzz.campaign.spec import CampaignSpec
from kda_fuzz.corpus.store import CaseTooLarge, save_failure
from kda_fuzz.engine.oracle import Outcome, run_case
from kda_fuzz.engine.targets import Target
from kda_fuzz.workers.deadline import PastDeadline
from kda_fuzz.workers.isolate import IsolatedTarget

SAVE_MARGIN = 1.0  # seconds before the deadline at which minimization stops
# the most of a minimization's time, when the deadline shortens it, kept for one run of
# the case with its values from recipes (``_compact_checked``)
COMPACT_MARGIN = 2.0


class _Cut(Cut):
    """Ends a minimization at once, keeping what it reached (see ``minimize.Cut``)."""


def _why(stop: Stop) -> str:
    if stop.reason is ExitReason.DEADLINE:
        return "minimization cut short by the --max-seconds deadline"
    if stop.reason in (ExitReason.INTERRUPTED, ExitReason.TERMINATED):
        return f"minimization cut short: {stop}"
    return f"minimization cut short ({stop})"


class FindingSaver:
    """Minimizes and saves each new distinct failure it is given (``found``), as it comes.

    The campaign's ``spec`` says how (its contract, corpus (``None``: minimized, not
    saved), judging, sanitizer tool) and until when: no minimization runs past its
    budget's ``settle`` instant, no worker is waited for past its ``end`` (what is not
    minimized by then is saved as found). ``workers``: minimizations at once (default:
    the jobs', at most 4). ``skip``: signatures of failures
    handled elsewhere (replayed from an example database): neither minimized nor saved
    here. ``on_found(f)`` and ``on_saved(f)`` are told of each failure when it arrives
    and when it is settled (its ``saved`` path, or its ``note`` saying why it has
    none)."""

    def __init__(self, spec: CampaignSpec, *,
                 skip: frozenset[tuple[Any, ...]] = frozenset(),
                 on_found: Callable[[Failure], None] | None = None,
                 on_saved: Callable[[Failure], None] | None = None,
                 reproduce: Callable[[Failure], str] | None = None,
                 workers: int | None = None) -> None:
        o, budget = spec.options, spec.budget
        self.spec = spec
        self.contract, self.corpus, self.seed = spec.contract, spec.corpus, o.seed
        self.device, self.timeout = spec.device, budget.timeout
        self.shrink_seconds = budget.shrink_seconds
        self.judging = {"messages": o.messages, "strict": o.strict}
        # no minimization past the budget's settle instant, no worker waited for past its end
        self.deadline: float | None = budget.end
        self._settle_at: float | None = budget.settle
        # minimizations still judging a candidate are killed then
        self._cut_at = None if self.deadline is None or self._settle_at is None else (
            self._settle_at + self.deadline) / 2
        workers = min(spec.jobs, 4) if workers is None else workers
        self.skip = skip
        self.sanitize = o.sanitize  # each finding also replayed under this compute-sanitizer tool
        self.on_found, self.on_saved, self.reproduce = on_found, on_saved, reproduce
        self.stopped: Stop | None = None  # set by ``cut``
        self.settled: list[Failure] = []  # in the order they were settled
        self.too_large: list[Failure] = []
        self._lock = threading.Lock()
        self._live: set[IsolatedTarget] = set()
        self._todo: queue.Queue[Failure | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._timer: threading.Timer | None = None
        self._threads = [threading.Thread(target=self._work, name=f"kda-fuzz-minimize-{i}",
                                          daemon=True) for i in range(max(1, workers))]
        self._started = False

    # ------------------------------------------------------------------ feeding

    def found(self, failure: Failure) -> None:
        """A new distinct failure (from a supervisor): minimized and saved in the background."""
        if self._skipped(failure):
            return
        if self.on_found is not None:
            self.on_found(failure)
        self._start()
        with self._lock:
            self._pending += 1
        self._todo.put(failure)

    def found_inline(self, failure: Failure, target: Target | None) -> None:
        """A new distinct failure of an in-process campaign: minimized here, in this
        thread, with ``target`` called directly (``None``: not minimized), then saved."""
        if self._skipped(failure):
            return
        if self.on_found is not None:
            self.on_found(failure)
        if target is not None and minimizable(failure.verdict):
            def run(case: Any) -> Outcome:
                self._check()
                return run_case(self.contract, case, target.fn, **self.judging)  # type: ignore[arg-type]

            self._minimize(failure, run)
        self._sanitized(failure)
        self._settle(failure)

    def _skipped(self, failure: Failure) -> bool:
        return failure.signature in self.skip

    # ------------------------------------------------------------------ stopping

    def request(self, stop: Stop) -> None:
        """Ask every minimization to end (safe in a signal handler: only a flag is set;
        ``finish`` kills the workers still judging a candidate)."""
        self.stopped = self.stopped or stop

    def cut(self, stop: Stop) -> None:
        """End every minimization now (from any thread, not a signal handler): failures
        not yet minimized are saved as found."""
        self.request(stop)
        with self._lock:
            live = list(self._live)
        for iso in live:
            _kill(iso)

    def finish(self) -> None:
        """Wait until every failure given is settled (minimizations end by the deadline;
        past its end no thread is waited for: a failure still unsettled then is the
        caller's to save, as found, see ``settled``)."""
        if self._cut_at is not None and self._timer is None and self._started:
            wait = max(0.0, self._cut_at - time.monotonic())
            self._timer = threading.Timer(wait, self.cut, (Stop(ExitReason.DEADLINE),))
            self._timer.daemon = True
            self._timer.start()
        with self._idle:
            while self._pending:
                if self.stopped is not None and self._live:
                    for iso in list(self._live):
                        _kill(iso)
                if self.deadline is not None and time.monotonic() > self.deadline:
                    break
                self._idle.wait(0.1)
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if self._started:
            for _ in self._threads:
                self._todo.put(None)
            # joined, not left as daemons: a daemon thread inside a torch op when the
            # interpreter exits aborts the process (see ``workers.process.exit_now``, which
            # skips that teardown: a thread still busy past the deadline is left to it)
            for t in self._threads:
                t.join(None if self.deadline is None
                       else max(0.0, self.deadline - time.monotonic()))

    # ------------------------------------------------------------------ work

    def _start(self) -> None:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def _work(self) -> None:
        while True:
            f = self._todo.get()
            if f is None:
                return
            try:
                self._isolated(f)
                self._sanitized(f)
                self._settle(f)
            except BaseException as e:  # never lose the failure to our own error
                f.add_note(f"not minimized: {e!r}")
                self._settle(f)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _isolated(self, f: Failure) -> None:
        if not _wants_minimizing(f) or self._out_of_time():
            return
        # the worker's start-up and every candidate end by the cut, as a ``PastDeadline``
        with IsolatedTarget(self.contract, f.target, device=self.device,
                            timeout=candidate_timeout(f.verdict, self.timeout),
                            deadline=self._cut_at, **self.judging) as iso:  # type: ignore[arg-type]
            with self._lock:
                if self.stopped is not None:
                    return
                self._live.add(iso)
            try:
                def run(case: Any) -> Outcome:
                    return self._run_cut(iso, case)

                def proven(case: Any) -> bool:
                    return self._proven_hang(iso, case)

                self._minimize(f, run, proven)
            finally:
                with self._lock:
                    self._live.discard(iso)

    def _proven_hang(self, iso: IsolatedTarget, case: Any) -> bool:
        """Whether ``case`` does not return within the ceiling (``--timeout``) either: a
        minimized hang is kept only then (its candidates were judged under the shorter
        calibrated limit, which a slow but returning call may pass)."""
        if self._settle_at is not None and time.monotonic() + self.timeout > self._settle_at:
            return False  # no time to prove it: the proven case as found is kept
        limit, iso.timeout = iso.timeout, self.timeout
        try:
            outcome = self._run_cut(iso, case)
        finally:
            iso.timeout = limit
        return outcome.verdict is not None and outcome.verdict.kind == "timeout"

    def _run_cut(self, iso: IsolatedTarget, case: Any) -> Outcome:
        """``iso.run(case)``, ended by ``_Cut`` when the saver is cut or the deadline
        passes (a worker killed by the cut is no crash of the target)."""
        self._check()
        try:
            outcome = iso.run(case)
        except PastDeadline:
            self.request(Stop(ExitReason.DEADLINE))
            raise _Cut from None
        self._check()
        return outcome

    def _minimize(self, f: Failure, run: Callable[[Any], Outcome],
                  proven: Callable[[Any], bool] | None = None) -> None:
        if self._out_of_time():
            return
        seconds = self.shrink_seconds
        if self._settle_at is not None:
            left = self._settle_at - time.monotonic()
            if left < seconds + COMPACT_MARGIN:  # the deadline decides: keep a margin
                seconds = max(0.0, left - min(COMPACT_MARGIN, 0.2 * left))
        end = time.monotonic() + seconds
        # a hang minimized under its calibrated limit is kept only when proven past the ceiling
        shorter = candidate_timeout(f.verdict, self.timeout) < self.timeout
        try:
            if not minimize_failure(self.contract, f, run, seconds=seconds,
                                    proven=proven if shorter else None,
                                    detail=lambda v, found=f.verdict: minimized_detail(
                                        found, v, self.timeout)):
                return
        except _Cut:
            return
        if self.stopped is not None:
            if f.original is not None and f.case is f.original:  # cut before any step
                f.original = None  # (saved as found, marked so)
                return
            f.add_note(f"partly minimized: {_why(self.stopped)}")
        elif seconds < self.shrink_seconds and time.monotonic() >= end:
            f.add_note(
                "partly minimized: minimization cut short by the --max-seconds deadline")
        self._compact_checked(f, run)

    def _compact_checked(self, f: Failure, run: Callable[[Any], Outcome]) -> None:
        """A finding whose verdict names elements, still over the file goal after its
        minimization: its float values regenerated from recipes when one run of that
        case fails the same way (else it is saved as it stands)."""
        if f.verdict.kind in NO_ELEMENT_KINDS or self.stopped is not None:
            return
        try:
            got = compacted(f.case, f.verdict, run)
        except _Cut:
            return
        except Exception as e:  # the machinery's own: the finding is saved as it is
            f.add_note(f"values not regenerated: {type(e).__name__}: {e}")
            return
        if got is None:
            return
        _regenerated(f, got[0], "", "the case was still over 1 MiB, and one run of it "
                     "failed the same way")
        f.verdict = got[1]

    def _sanitized(self, f: Failure) -> None:
        """When there is time left: a ``sanitizer`` finding minimized under its tool (its
        report is the minimized case's); with ``sanitize``, any other finding's (minimized)
        case replayed under the tool, its report attached."""
        if self.stopped is not None or (f.verdict.kind != "sanitizer" and self.sanitize is None):
            return
        left = None if self.deadline is None else self.deadline - SAVE_MARGIN - time.monotonic()
        if left is not None and left < 5.0:
            return
        if f.verdict.kind == "sanitizer":
            try:
                minimize_finding(self.contract, f, device=self.device,
                                 seconds=min(self.shrink_seconds, left or self.shrink_seconds),
                                 abort=lambda: self._out_of_time())
            except Exception as e:  # the machinery's own: the finding is saved as found
                f.add_note(
                    f"not minimized under the sanitizer: {type(e).__name__}: {e}")
            return
        assert self.sanitize is not None
        attach_report(f, self.sanitize, self.device, timeout=min(600.0, left or 600.0))

    def _out_of_time(self) -> bool:
        if self.stopped is None and self._settle_at is not None \
                and time.monotonic() > self._settle_at:
            with self._lock:
                self.stopped = self.stopped or Stop(ExitReason.DEADLINE)
        return self.stopped is not None

    def _check(self) -> None:
        if self.stopped is not None:
            raise _Cut

    def _settle(self, f: Failure) -> None:
        """Save ``f`` (marked when it was to be minimized but was not) and announce it."""
        cut = f.original is None and self.stopped is not None and _wants_minimizing(f)
        if cut:
            assert self.stopped is not None
            f.add_note(f"not minimized: {_why(self.stopped)}")
        if self.corpus is not None:
            self._compact(f)
            try:
                f.saved = str(save_failure(f, self.corpus, contract=self.contract,
                                           seed=self.seed,
                                           unminimized=_why(self.stopped) if cut and
                                           self.stopped else ""))
                if self.reproduce is not None:
                    f.reproduce = self.reproduce(f)
            except CaseTooLarge as e:
                f.add_note(str(e))
                self.too_large.append(f)
        with self._lock:
            self.settled.append(f)
        if self.on_saved is not None:
            self.on_saved(f)

    def _compact(self, f: Failure) -> None:
        """A finding whose verdict names no element, still big after minimization (cut by
        the deadline, or no smaller candidate reproduced it), is saved with its float
        values regenerated from recipes (not re-run), so that its file stays small."""
        if f.verdict.kind not in NO_ELEMENT_KINDS:
            return
        try:
            small = values_from_recipes(f.case)
        except Exception as e:  # the machinery's own: the finding is saved as it is
            f.add_note(f"values not regenerated: {type(e).__name__}: {e}")
            return
        if small is None:
            return
        _regenerated(f, small, " without a re-run", "the verdict names no element and "
                     "minimization did not shrink the case")


def _regenerated(f: Failure, small: Any, how: str, why: str) -> None:
    """``f``'s case replaced by ``small`` (its float values from recipes), noted."""
    if f.original is None:
        f.original = f.case
    f.case = small
    f.add_note(f"float values regenerated from recipes{how} ("
               f"{', '.join(small.notes['values_regenerated'])}): {why}")


def _wants_minimizing(f: Failure) -> bool:
    """Minimized in an isolated worker (a sanitizer finding is minimized under its tool)."""
    return wants_minimizing(f) and f.verdict.kind != "sanitizer"


def _kill(iso: IsolatedTarget) -> None:
    """Kill ``iso``'s worker now: its ``run`` in another thread returns at once."""
    proc = getattr(iso, "_proc", None)
    if proc is not None and proc.is_alive():
        proc.kill()


__all__ = ["SAVE_MARGIN", "FindingSaver"]
