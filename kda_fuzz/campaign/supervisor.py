"""Supervised campaigns: the default way ``kda-fuzz fuzz`` runs targets.

A supervisor (this process) starts N job processes (``--jobs``; one by default). Each job
runs the hot loop itself (draw, build on the device, launch, judge: a
:class:`~kda_fuzz.campaign.runner.Campaign` over its share of the plan's arms) and keeps a flight
record in shared memory: the position of the example in flight and whether a target is
executing. Nothing is shipped per example. The supervisor reads progress and failures
from its own pipe (a job killed mid-message can only break its own pipe, which its
restart replaces; a queue shared by all jobs would stay locked) and watches the records:

* a job that dies while a target runs is a ``crash`` of that target at that position,
  one that stays in a target call past ``timeout`` is killed, a ``timeout``; once a
  target has hung, its later calls are cut at the limit the job set for them, calibrated
  from the target's measured call times (:mod:`kda_fuzz.campaign.timeouts`);
* the job is restarted from its last progress message with the same plan and seed; it
  fast-forwards to where it stood (the same seeds draw the same cases), regenerates the
  case that crashed, exactly as launched, records it as a failure without running it,
  and goes on: a campaign with a crash runs its whole example budget, however many
  crashes it meets, with less of it spent on layouts like those that crashed
  (:mod:`kda_fuzz.campaign.steering`);
* a job that dies or stalls outside a target call is the fuzzer's own failure
  (``JobError``), never a verdict against the target.

Jobs are forks of a fork server that has imported torch and the engine and run nothing
(``process.worker_context``; never forks of a process with a running torch thread pool
or CUDA context, which deadlock or fail). On ``cuda``, job j uses GPU ``j mod n`` with
its share of that GPU's memory. Each new distinct failure is handed on as it arrives
(``on_found``: the command minimizes and saves it while the campaign goes on, see
:mod:`kda_fuzz.campaign.findings`). Jobs ignore SIGINT and SIGTERM: the supervisor stops them
(``interrupt``, a deadline). Messages on the pipes are the dataclasses of
:mod:`kda_fuzz.campaign.channel`.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing import connection
from typing import Any, NoReturn

from kda_fuzz.campaign.channel import (
    Changes,
    ExitReason,
    JobDone,
    JobEnvironment,
    JobFailed,
    JobFault,
    JobFound,
    JobMessage,
    JobProgress,
    JobRepeat,
    Snapshot,
    Stop,
    received,
)
from kda_fuzz.campaign.results import Failure, Report, wants_minimizing
from kda_fuzz.campaign.runner import Campaign, Position, Recorder
from kda_fuzz.campaign.spec import CampaignOptions, CampaignSpec
from kda_fuzz.campaign.steering import note as shifted_note
from kda_fuzz.campaign.timeouts import Calibration, describe, merged, store_size
from kda_fuzz.campaign.timeouts import note as timeout_note
from kda_fuzz.engine.oracle import EnvironmentFailure, device_error
from kda_fuzz.engine.targets import Target, load_target
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.execution import compiles
from kda_fuzz.workers.process import (
    NVML_CHECK,
    exit_with_parent,
    forget,
    how_it_ended,
    kill_tree,
    message_pipe,
    worker_context,
    worker_process,
)

JOBS_PER_GPU = 4  # xdist workers sharing one GPU
PROGRESS_EVERY = 0.25  # seconds between a job's progress messages
STALL_SECONDS = 600.0  # a job silent this long outside a target call is stuck (ours)
STOP_GRACE = 3.0  # seconds a job may take to end its example after an interrupt

# Flight record fields (one shared array of doubles per job): LIMIT, the seconds the call
# in flight may take (0: the supervisor's timeout); COMPILING, when the compile in progress
# began (0: none; kda_fuzz.execution.compiles); UNREAD (1: some results are unread) and
# the position of the oldest example whose result is unread (--read-every); from
# CALIBRATION on, the job's kda_fuzz.campaign.timeouts store (kept across its restarts).
STATE, ROUND, ARM, EXAMPLE, TARGET, SINCE, LIMIT, CONFIGS, COMPILING = range(9)
UNREAD, UNREAD_ROUND, UNREAD_ARM, UNREAD_EXAMPLE = range(9, 13)
CALIBRATION = 13
OWED_MARGIN = 0.5  # seconds before the clock's end a job on its way to a crash is killed
IDLE, CALLING, FAULTED, JUDGING = 0.0, 1.0, 2.0, 3.0  # JUDGING: after a call, before the next


def device_for(device: str, worker: int) -> str:
    """The device of worker ``worker``: for ``cuda`` GPU ``worker mod n``; ``cuda:i`` and
    ``cpu`` as given."""
    if device != "cuda":
        return device
    import torch

    return f"cuda:{worker % max(1, torch.cuda.device_count())}"


def claim_device(device: str, worker: int, per_gpu: int = JOBS_PER_GPU) -> str:
    """``device_for(device, worker)``; a GPU is made current and capped to ``0.9 / per_gpu``
    of its memory so that ``per_gpu`` workers cannot exhaust it."""
    device = device_for(device, worker)
    if not device.startswith("cuda"):
        return device
    import torch

    torch.cuda.set_device(device)
    torch.cuda.set_per_process_memory_fraction(0.9 / per_gpu)
    return device




class JobError(RuntimeError):
    """A job of a campaign failed outside the targets (the fuzzer's own failure)."""


@dataclass(frozen=True)
class Job:
    """What one job process runs: its index, the campaign's spec (pickled with its family
    by name, targets as ``MODULE:CALLABLE``) and this job's options (its share of the plan,
    the clock the supervisor started), where it resumes and what it must not run again."""

    index: int
    spec: CampaignSpec
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None
    options: CampaignOptions
    resume: tuple[Position, dict[str, Any]] | None = None
    hard: dict[Position, tuple[int, Verdict]] = field(default_factory=dict)
    seen: frozenset[tuple[Any, ...]] = frozenset()  # signatures of failures already kept
    launched: float = 0.0  # time.monotonic() when the supervisor started the process
    # positions whose example is counted as not executable, not run: a compiler that did
    # not return there, twice (cause)
    unexecutable: dict[Position, str] = field(default_factory=dict)


class _SharedRecorder(Recorder):
    """A job's flight record in shared memory, and its progress messages."""

    def __init__(self, record: Any, send: Callable[[Position], None], device: str,
                 flight: bool = True, calibration: Calibration | None = None,
                 ) -> None:
        self.record, self.send, self.device, self.flight = record, send, device, flight
        self.calibration = calibration  # None: the supervisor's fixed timeout
        self.last = 0.0
        if flight:
            compiles.on_compiling(self._compiling)
        self._case: Any = None
        self._timing: tuple[int, float] | None = None  # (target, start) of a call to time

    def expect(self, case: Any) -> None:
        self._case = case

    def _compiling(self, since: float) -> None:
        self.record[COMPILING] = since

    def _timed(self) -> None:
        """The call being timed has ended (cpu: it returned; cuda: its launches finished)."""
        if self._timing is not None and self.calibration is not None and self._case is not None:
            target, start = self._timing
            self.calibration.observe(target, self._case, time.monotonic() - start)
        self._timing = None

    @contextmanager
    def call(self, position: Position, target: int) -> Any:
        if not self.flight:
            yield
            return
        r = self.record
        r[ROUND], r[ARM], r[EXAMPLE], r[TARGET] = (*position, target)
        r[CONFIGS] = self.alternative  # (other kernel configs: runner._other_configs)
        cal, case = self.calibration, self._case
        if cal is not None and case is not None:
            r[LIMIT] = cal.limit(target, case, compiling=compiles.totals().count > 0
                                 or compiles.interpreted() > 0)
        r[COMPILING] = 0.0
        r[SINCE] = time.monotonic()
        self._timing = (target, r[SINCE])
        r[STATE] = CALLING
        yield
        if not self.device.startswith("cuda"):
            r[STATE] = JUDGING
            self._timed()
        # on cuda the call stays the target's until ``settle`` has seen the device finish
        # its launches: no sync here (each costs a time slice on a GPU shared by jobs)

    @contextmanager
    def settle(self) -> Any:
        if not (self.flight and self.device.startswith("cuda")):
            yield
            return
        import torch

        try:
            yield
        except Exception as e:
            if device_error(e):
                self._fault(e)
            raise
        try:
            torch.cuda.synchronize()  # the judge's read usually left nothing to wait for
        except Exception as e:
            self._fault(e)
        self.record[STATE] = JUDGING
        self._timed()  # (the judge's read is in it: what the supervisor's clock sees too)

    def _fault(self, error: BaseException) -> NoReturn:
        self.record[STATE] = FAULTED  # the CUDA context is gone: report, then die here
        raise _DeviceFault(str(error).splitlines()[0]) from error

    def unread(self, position: Position | None) -> None:
        if not self.flight:
            return
        r = self.record
        if position is not None:
            r[UNREAD_ROUND], r[UNREAD_ARM], r[UNREAD_EXAMPLE] = position
        r[UNREAD] = 0.0 if position is None else 1.0

    def progress(self, position: Position) -> None:
        self.record[STATE] = IDLE
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.send(position)


class _DeviceFault(Exception):
    """The device faulted during (or right after) a target call."""


def _run_job(job: Job, conn: Any, stop: Any, record: Any) -> None:
    """Job process body: one campaign, its progress, failures and end sent on ``conn``
    (from this thread only, so a target's crash never interrupts a message)."""
    exit_with_parent()
    # Ctrl-C and SIGTERM reach the whole process group: the supervisor alone decides (it
    # stops the jobs through ``stop``), so that a signal is never a job's death
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    put = conn.send
    try:
        import torch

        spec = job.spec  # (its contract looked up once, as it was unpickled)
        gpus = torch.cuda.device_count() if spec.device == "cuda" else 1
        try:
            device = claim_device(spec.device, job.index, -(-spec.jobs // max(1, gpus)))
        except RuntimeError as e:
            if "forked subprocess" not in str(e):
                raise
            raise EnvironmentFailure(
                f"this job cannot use CUDA: a module the fork server imported initialised it "
                f"({e}); set {NVML_CHECK}=1, or report the kernel library's version") from e
        contract = spec.contract
        if not device.startswith("cuda") and contract.execution is not None:
            contract.execution.configure_cpu()
        # the jobs share the host's cores: no job's torch ops may spread over all of them
        # (nor past the threads the process was started with: an OMP_NUM_THREADS holds)
        torch.set_num_threads(max(1, min(torch.get_num_threads(),
                                         (os.cpu_count() or 1) // spec.jobs)))
        targets = [load_target(t) for t in spec.targets]
        peers = [load_target(p) for p in spec.peers]
        if job.wrap is not None:
            targets = [Target(t.name, job.wrap(t.fn)) for t in targets]
        options = replace(job.options, device=device)
        holder: list[Campaign] = []
        n_targets = len(targets) + len(peers)
        calibration = Calibration(record, n_targets, spec.budget.timeout, offset=CALIBRATION) \
            if spec.isolate and len(record) >= CALIBRATION + store_size(n_targets) else None

        sent = [0]  # history records already sent
        changes = Changes()  # what the last messages sent of the growing counts

        def snapshot(position: Position) -> tuple[Position, dict[str, Any]]:
            rep = holder[0].report
            counters = rep.counters()
            counters["history"], sent[0] = rep.history[sent[0]:], len(rep.history)
            counters["steering"] = holder[0].steering.state(position)  # (resumes with it)
            return position, changes.sent(counters)

        def on_failure(f: Failure, new: bool) -> None:
            c = holder[0]
            rec.last = 0.0  # the next progress message goes out at once
            where = (c._pos[0], c._pos[1], c._pos[2] - 1)  # this example, not yet counted
            # Plain pickle: torch's reductions would share tensors through handles that
            # die with this process.
            put(JobFound(job.index, pickle.dumps(f), snapshot(where)) if new
                else JobRepeat(job.index, f.signature, snapshot(where)))

        rec = _SharedRecorder(record, lambda pos: put(JobProgress(job.index, snapshot(pos))),
                              device, flight=spec.isolate, calibration=calibration)
        c = Campaign(contract, spec.variant, targets, peers=peers, options=options,
                     on_failure=on_failure, stop=stop.is_set, recorder=rec,
                     resume=job.resume, hard=job.hard, seen=job.seen,
                     unexecutable=job.unexecutable)
        holder.append(c)
        compiles.freeze_heap()  # (the imports done; the compilers' own: after each compile)
        try:
            c.report.startup_seconds += max(0.0, time.monotonic() - job.launched)
            rep = c.run()
        except _DeviceFault as e:
            put(JobFault(job.index, str(e)))
            conn.close()
            os._exit(70)
        summaries = {"seconds": rep.seconds, "stopped": c.stopped, "notes": rep.notes,
                     "targets": {t.name: t.fn.summary() for t in targets
                                 if hasattr(t.fn, "summary")}}
        put(JobDone(job.index, snapshot((1 << 62, 0, 0)), summaries))
    except EnvironmentFailure as e:
        put(JobEnvironment(job.index, str(e)))
    except BaseException:  # reported by the supervisor as the fuzzer's own failure
        put(JobFailed(job.index, traceback.format_exc()))


@dataclass
class _JobState:
    spec: Job
    proc: Any
    record: Any
    conn: Any
    snapshot: Snapshot | None = None
    fault: str = ""
    restarts: int = 0
    done: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    last_message: float = field(default_factory=time.monotonic)


class Supervisor:
    """Runs a campaign as supervised job processes and merges what they find."""

    def __init__(self, spec: CampaignSpec, *,
                 wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
                 on_example: Callable[[Report], None] | None = None,
                 on_found: Callable[[Failure], None] | None = None) -> None:
        if spec.options.seed is None:  # (a spec built by hand: resolve chose one)
            spec = spec.with_options(seed=random.randrange(2**31))
        self.spec = spec
        self.contract, self.variant = spec.contract, spec.variant
        self.targets, self.peers = list(spec.targets), list(spec.peers)
        self.jobs, self.timeout, self.isolate = spec.jobs, spec.budget.timeout, spec.isolate
        self.wrap, self.on_example = wrap, on_example
        self.on_found = on_found  # told of each new distinct failure as it arrives
        self.hard_deadline = spec.budget.kill  # time.monotonic() by which every job has ended
        # once a failure is found the jobs stop drawing by then: its minimization's time
        self.minimize_at = spec.budget.minimize
        self.reserved: Stop | None = None  # the jobs were stopped for a minimization
        self._kept: dict[tuple[Any, ...], Failure] = {}  # signature as found -> failure
        self.interrupted: Stop | None = None  # set by ``interrupt`` (a signal handler)
        self.stopped: Stop | None = None  # why the campaign ended early, if it did
        self.options = spec.options
        self.ctx = worker_context()  # never a fork of a process with CUDA or a thread pool
        self.stop = self.ctx.Event()
        self.report = Report(spec.family, spec.variant, [*self.targets, *self.peers],
                             seed=spec.options.seed, family=spec.contract)
        self.states: list[_JobState] = []
        self.restarts = 0
        self.hang_limits: list[float] = []  # the limit in force at each hang
        self._hung_targets: set[int] = set()  # targets with a proven hang
        # (job, position) of first calls past the ceiling run again in a fresh process, and
        # those of them that did not return again either
        self._reran: set[tuple[int, Position]] = set()
        self._rerun_hung: set[tuple[int, Position]] = set()
        # (job, position) of calls past their limit inside a compile, and those of them
        # whose re-run stalled in a compile again (counted as not executable)
        self._compile_stalls: set[tuple[int, Position]] = set()
        self._compile_skipped: set[tuple[int, Position]] = set()
        # (job, position) -> the crash or hang there that its restarted job has not
        # recorded yet (it regenerates the case): such a job is killed at the clock's end,
        # not at ``hard_deadline``, and what it never records is said in the notes
        self._owed: dict[tuple[int, Position], Verdict] = {}
        # (job, position of the call in flight) -> (the oldest unread example's position,
        # what was seen): a crash or hang seen with several results unread, their examples
        # run again one at a time to find whose it is (_retrace); those passed again with
        # none found, and those never got back to, are said in the notes
        self._retraced: dict[tuple[int, Position], tuple[Position, Verdict]] = {}
        self._untraced: list[tuple[int, Position, Position, Verdict]] = []
        self._t0 = 0.0
        self._shown = 0.0  # when on_example may next be called

    # ------------------------------------------------------------------ lifecycle

    def _start(self, spec: Job, state: _JobState | None = None) -> _JobState:
        record = state.record if state is not None else self.ctx.RawArray(
            "d", CALIBRATION + store_size(len(self.targets) + len(self.peers)))
        record[STATE], record[LIMIT] = IDLE, 0.0
        reader, writer = message_pipe(self.ctx)
        spec = replace(spec, launched=time.monotonic())  # (one clock for all processes)
        proc = worker_process(self.ctx, _run_job, (spec, writer, self.stop, record))
        proc.start()
        writer.close()
        if state is None:
            return _JobState(spec, proc, record, reader)
        if state.conn is not None:
            state.conn.close()
        state.spec, state.proc, state.conn, state.fault = spec, proc, reader, ""
        state.last_message = time.monotonic()
        return state

    def start(self) -> None:
        """Start the job processes (they import the targets and begin); ``run`` waits for
        them. Starting early lets the jobs' imports overlap the caller's own checks. Past
        the clock's ``draw`` instant none is started (the report then has no example)."""
        if self.states:
            return
        self._t0 = time.monotonic()
        draw = self.spec.budget.draw
        if draw is not None and self._t0 >= draw:  # no job is started past the clock
            self.stopped = self.stopped or Stop(ExitReason.DEADLINE,
                                                "no job was started: the clock ran out first")
            return
        o = self.options = replace(self.options, origin=self._t0)  # history times count from here
        n = self.jobs
        for j in range(n):  # (one by one: ``abort`` from another thread sees those started)
            self.states.append(self._start(Job(j, self.spec, self.wrap,
                                               replace(o, job=(j, n)))))

    def abort(self) -> None:
        """Stop jobs started by ``start`` without running the campaign."""
        self.stop.set()
        _kill_all([s.proc for s in self.states])

    def interrupt(self, reason: Stop) -> None:
        """Ask the campaign to stop drawing (safe in a signal handler: only a flag is set;
        the run loop stops the jobs)."""
        self.interrupted = self.interrupted or reason

    def run(self) -> Report:
        """Run every job to its end; raises ``JobError`` or ``EnvironmentFailure``.

        After ``interrupt``, or past ``options.deadline``, the jobs stop drawing; a job
        still in an example ``STOP_GRACE`` seconds later (after an interrupt) or at
        ``hard_deadline`` is killed, its last progress kept."""
        self.start()
        t0 = self._t0
        cut: float | None = None  # when to kill jobs that have not ended
        try:
            while not all(s.done for s in self.states):
                self._drain(0.05)
                if self.interrupted is not None and cut is None:
                    self.stopped = self.interrupted
                    self.stop.set()
                    cut = time.monotonic() + STOP_GRACE
                self._reserve()
                hard = self._kill_at()
                if (cut is not None and time.monotonic() > cut) or (
                        hard is not None and time.monotonic() > hard):
                    self._cut()
                    break
                for s in self.states:
                    if not s.done:
                        self._watch(s)
            self._drain(0.0)
        finally:
            self.stop.set()
            # the jobs end their example (10 s at most, never past the hard deadline); those
            # still there then are killed all at once (a GPU job's exit takes a while: one
            # after another they would add up)
            until = time.monotonic() + 10.0
            kill_at = self._kill_at()
            if kill_at is not None:
                until = min(until, max(kill_at, time.monotonic() + 0.5))
            for s in self.states:
                s.proc.join(timeout=max(0.0, until - time.monotonic()))
            _kill_all([s.proc for s in self.states if s.proc.is_alive()],
                      by=self.spec.budget.end)
        said: dict[str, list[int]] = {}  # a job's note -> the jobs that made it
        for s in self.states:
            stopped = s.summary.get("stopped")
            if stopped is not None and stopped.noteworthy:
                self.report.notes.append(f"job {s.spec.index}: {stopped}")
            for note in s.summary.get("notes", []):
                said.setdefault(note, []).append(s.spec.index)
        self.report.notes += [f"job{'s' * (len(j) > 1)} {', '.join(map(str, j))}: {note}"
                              for note, j in said.items()]
        report = self._progress()
        report.seed, report.notes, report.history = (self.report.seed, self.report.notes,
                                                     self.report.history)
        self.report = report
        self.report.stopped = self._why_stopped()
        if self.reserved is not None:
            self.report.notes.append(str(self.reserved))
        if self.restarts:
            self.report.notes.append(f"{self.restarts} job restart(s) after a crash or hang")
        self._unrecorded()
        if self.report.shifted:
            self.report.notes.append(shifted_note(self.report.shifted))
        if self.isolate and self.states:
            self.report.extra["timeout"] = self.timeouts()
            self.report.notes.append(timeout_note(self.report.extra["timeout"]))
        self.report.seconds = time.monotonic() - t0
        return self.report

    def _kill_at(self) -> float | None:
        """When the jobs still running are killed: ``hard_deadline``, or while a restarted
        job owes a crash or hang (``_owed``) the clock's end less ``OWED_MARGIN``."""
        end = self.spec.budget.end
        if self.hard_deadline is None or not self._owed or end is None:
            return self.hard_deadline
        return max(self.hard_deadline, end - OWED_MARGIN)

    def _settle_owed(self, job: int, snapshot: Snapshot | None, found: bool) -> None:
        """A job's message: the owed positions it has passed are recorded (a failure's
        message carries its own position: ``found``)."""
        if not self._owed or snapshot is None:
            return
        here = snapshot[0]
        for key in [k for k in self._owed if k[0] == job
                    and (k[1] < here or (found and k[1] == here))]:
            del self._owed[key]

    def _unrecorded(self) -> None:
        """Crashes and hangs whose restarted job did not get back to them before the end:
        no case to save, but never silent (a note, and ``unrecorded_faults`` in the JSON
        summary)."""
        untraced = self._untraced + [(job, first, pos, v) for (job, pos), (first, v)
                                     in sorted(self._retraced.items())]
        if not self._owed and not untraced:
            return
        lost = [{"job": job, "position": list(pos), "kind": v.kind, "what": v.what,
                 "detail": v.detail} for (job, pos), v in sorted(self._owed.items())]
        traced = [{"job": job, "position": list(pos), "from": list(first), "kind": v.kind,
                   "what": v.what, "detail": v.detail} for job, first, pos, v in untraced]
        self.report.extra["unrecorded_faults"] = lost + traced
        for f in traced:
            self.report.notes.append(
                f"job {f['job']}: a {f['kind']}/{f['what']} ({f['detail']}) came while the "
                f"results of its examples {tuple(f['from'])} to {tuple(f['position'])} were "
                "unread (--read-every); run again one at a time, none of them showed it "
                "(or the campaign ended first), so no file holds it")
        for f in lost:
            self.report.notes.append(
                f"job {f['job']}: a {f['kind']}/{f['what']} at its example "
                f"{tuple(f['position'])} was not recorded ({f['detail']}): its restarted "
                "process did not get back to the case before the campaign ended, so no "
                "file holds it; run again with the same --seed and more --max-seconds")

    def _reserve(self) -> None:
        """Past ``minimize_at`` with a failure to minimize: stop the jobs drawing, so that
        its minimization has its time before the clock's end."""
        if self.reserved is not None or self.minimize_at is None or self.stop.is_set() \
                or time.monotonic() < self.minimize_at \
                or not any(wants_minimizing(f) for f in self.report.failures):
            return
        left = max(0.0, (self.spec.budget.end or 0.0) - time.monotonic())
        self.reserved = Stop(ExitReason.DEADLINE, f"stopped drawing {left:.0f} s before "
                             "the --max-seconds deadline: the rest is the findings' "
                             "minimization's")
        self.stop.set()

    def _why_stopped(self) -> Stop | None:
        """Why the campaign stopped early: an interrupt, the clock (a job stopped drawing
        at it, or was killed, or the jobs were stopped to leave a finding its
        minimization), --max-failures; ``None``: every job ran its plan."""
        if self.stopped is not None:
            return self.stopped
        if self.reserved is not None and len(self.report.failures) < self.options.max_failures:
            return self.reserved
        stops = [s.summary.get("stopped") for s in self.states]
        clock = [x for x in stops if x is not None and x.reason is ExitReason.DEADLINE]
        if clock:
            return max(clock, key=lambda x: bool(x.detail))  # a killed job's says more
        if len(self.report.failures) >= self.options.max_failures:
            return Stop(ExitReason.MAX_FAILURES)
        return None

    def _cut(self) -> None:
        """Kill the jobs that have not ended (stopping or past the deadline), keeping their
        last progress: never a verdict on a target."""
        self.stop.set()
        now = time.monotonic()
        where = {s.spec.index: _where(s.record, now) for s in self.states if not s.done}
        _kill_all([s.proc for s in self.states if not s.done])
        for s in self.states:
            if s.done:
                continue
            s.done = True
            s.summary = {**s.summary, "stopped": Stop(
                self.stopped.reason if self.stopped else ExitReason.DEADLINE,
                "stopped in the middle of an example (killed: "
                + ("interrupted" if self.stopped else "the --max-seconds deadline") + ")"
                + where[s.spec.index])}
        self._drain(0.0)

    def timeouts(self) -> dict[str, Any]:
        """The calibrated per-call timeout (``kda_fuzz.campaign.timeouts.describe``, what all jobs
        measured) and the limits in force at the hangs."""
        names = [*self.targets, *self.peers]
        store = merged([s.record for s in self.states], len(names), CALIBRATION)
        out = describe(store, names, self.timeout)
        out["hangs"] = len(self.hang_limits)
        out["hang_limits_seconds"] = sorted({round(x, 3) for x in self.hang_limits})
        out["restarts"] = self.restarts  # of jobs, after a crash or hang
        out["rerun"] = len(self._reran)  # first calls past the ceiling run again
        out["rerun_hung"] = len(self._rerun_hung)  # of those, not returned again: hangs
        # ... returned (the job went past them): stalls; the rest were cut by the end
        out["rerun_returned"] = sum(1 for j, pos in self._reran - self._rerun_hung
                                    if self._passed(j, pos))
        # calls stopped past their limit inside a compile: run again, or (twice) skipped
        out["compile_stalls"] = len(self._compile_stalls)
        out["compile_skipped"] = len(self._compile_skipped)
        return out

    def _passed(self, job: int, pos: Position) -> bool:
        """Whether job ``job`` has gone past ``pos`` (its last progress, or its end)."""
        snap = self.states[job].snapshot if job < len(self.states) else None
        return snap is not None and snap[0] > pos

    def summaries(self) -> list[dict[str, Any]]:
        """Per job: its campaign's seconds, why it stopped, its wrapped targets' summaries."""
        return [s.summary for s in self.states]

    # ------------------------------------------------------------------ messages

    def _drain(self, wait: float) -> None:
        conns = [s.conn for s in self.states if s.conn is not None]
        ready = connection.wait(conns, timeout=wait) if conns else []
        if not conns:
            time.sleep(wait)
        for conn in ready:
            s = next(s for s in self.states if s.conn is conn)
            try:
                while s.conn is not None and s.conn.poll():
                    self._handle(s.conn.recv())
            except (EOFError, OSError):  # the job ended (or died mid-message)
                s.conn.close()
                s.conn = None
        if ready and self.on_example is not None and time.monotonic() >= self._shown:
            # (merging every job's counts costs the parent milliseconds: not per message)
            self._shown = time.monotonic() + PROGRESS_EVERY
            self.on_example(self._progress())

    def _progress(self) -> Report:
        """Every job's latest counts added up, with the failures kept so far."""
        merged = Report(self.spec.family, self.variant, self.report.targets,
                        family=self.contract)
        for s in self.states:
            if s.snapshot is not None:
                merged.add_counters(s.snapshot[1])
        merged.failures = self.report.failures
        return merged

    def _handle(self, msg: JobMessage) -> None:
        s = self.states[msg.job]
        s.last_message = time.monotonic()
        match msg:
            case JobProgress(snapshot=snap):
                s.snapshot = self._history(msg.job, snap)
            case JobFound(failure=payload, snapshot=snap):
                s.snapshot = self._history(msg.job, snap)
                self._add(pickle.loads(payload), msg.job)
            case JobRepeat(signature=sig, snapshot=snap):
                s.snapshot = self._history(msg.job, snap)
                kept = self._kept.get(sig)
                if kept is not None:
                    kept.count += 1
            case JobFault(detail=detail):
                s.fault = detail
            case JobDone(snapshot=snap, summary=summary):
                s.snapshot, s.summary, s.done = self._history(msg.job, snap), summary, True
            case JobEnvironment(detail=detail):
                raise EnvironmentFailure(detail)
            case JobFailed(traceback=tb):
                raise JobError(f"campaign job {msg.job} failed:\n{tb}")
            case _:
                raise JobError(f"campaign job {msg.job} sent an unknown message: {msg!r}")
        if isinstance(msg, JobProgress | JobFound | JobRepeat | JobDone):
            self._settle_owed(msg.job, s.snapshot, found=isinstance(msg, JobFound | JobRepeat))
            self._untrace_passed(msg.job, s.snapshot)

    def _history(self, job: int, snap: Snapshot) -> Snapshot:
        """``snap`` made whole (its changed entries onto what the job sent before), its
        history records moved into the report's (tagged with the job)."""
        self.report.history.extend({**rec, "job": job} for rec in snap[1].pop("history", ()))
        s = self.states[job]
        return snap[0], received(s.snapshot[1] if s.snapshot is not None else None, snap[1])

    def _add(self, failure: Failure, job: int | None = None) -> None:
        if job is not None and failure.found_example is not None:
            # the job numbered its own examples: add those the other jobs had run by then
            failure.found_example += sum(s.snapshot[1]["examples"] for s in self.states
                                         if s.spec.index != job and s.snapshot is not None)
        sig = failure.signature  # as found: minimizing it later must not change its key
        kept = self._kept.get(sig)
        if kept is not None:
            kept.count += failure.count
            if failure.found_seconds is not None and (
                    kept.found_seconds is None or failure.found_seconds < kept.found_seconds):
                kept.found_seconds, kept.found_example = (failure.found_seconds,
                                                          failure.found_example)
            return
        self._kept[sig] = failure
        self.report.failures.append(failure)
        if self.on_found is not None:
            self.on_found(failure)
        if len(self.report.failures) >= self.options.max_failures:
            self.stop.set()

    # ------------------------------------------------------------------ watching

    def _watch(self, s: _JobState) -> None:
        r = s.record
        now = time.monotonic()
        calling = r[STATE] in (CALLING, FAULTED, JUDGING)
        calibrated = min(self.timeout, r[LIMIT]) if r[LIMIT] > 0 else self.timeout
        # a call is a hang only past the ceiling until its target has hung once: a cut at
        # a calibrated limit would cost a restart (imports, every compile again) for each
        # slow call of a correct kernel on a loaded machine or a shared GPU
        limit = calibrated if int(r[TARGET]) in self._hung_targets else self.timeout
        past = r[STATE] == CALLING and now - r[SINCE] > limit
        # a compile of the judge's own kernels past the ceiling: no verdict either way
        judging = r[STATE] == JUDGING and r[COMPILING] > 0 and now - r[COMPILING] > self.timeout
        if (past or judging) and s.proc.is_alive():
            in_compile = r[COMPILING] > 0  # (read before the kill)
            kill_tree(s.proc)
            s.proc.join(timeout=10)
            self._drain(0.0)
            if in_compile:
                self._compile_stalled(s, limit if past else self.timeout)
            elif not self._retrace(s, Verdict("timeout", "no-return",
                                              f"did not return within {limit:.3g} s")):
                self._hung(s, limit, calibrated)
            return
        if s.proc.is_alive():
            if not calling and now - s.last_message > STALL_SECONDS:
                s.proc.kill()
                raise JobError(f"campaign job {s.spec.index} stalled for {STALL_SECONDS:g} s "
                               "outside any target call (the fuzzer's own failure)")
            return
        s.proc.join(timeout=5)
        self._drain(0.0)  # its last messages ("done", "fault") may still be queued
        if s.done:
            return
        ended = how_it_ended(s.proc.exitcode)
        if not self.isolate:
            raise JobError(f"campaign job {s.spec.index} died ({ended}); without isolation a "
                           "crash ends the campaign")
        if not calling:
            raise JobError(f"campaign job {s.spec.index} died outside a target call "
                           f"({ended}): the fuzzer's own failure")
        if self._retrace(s, Verdict("crash", "device-fault" if r[STATE] == FAULTED or s.fault
                                    else "process-died", f"{s.fault or ended}")):
            return
        if r[STATE] == FAULTED or s.fault:
            self._restart(s, Verdict("crash", "device-fault", f"the device faulted: {s.fault}"))
        elif r[STATE] == JUDGING:
            self._restart(s, Verdict(
                "crash", "process-died", f"the process died after the target returned, while "
                f"its results were judged ({ended}); memory corrupted?"))
        else:
            self._restart(s, Verdict("crash", "process-died",
                                     f"the process running the target died ({ended})"))

    def _compile_stalled(self, s: _JobState, limit: float) -> None:
        """The job's example did not go on within ``limit`` and was inside a kernel
        compile (``kda_fuzz.execution.compiles``) when it was stopped, in the target's call
        or in the judge's: the compiler's stall (a compiler, or a library it runs,
        deadlocked or slow in that process), never the kernel's verdict. The example runs
        again in a fresh process; if a compile does not return there either, it is counted
        as not executable and the job goes on past it."""
        here = (s.spec.index, _position(s.record))
        if here not in self._compile_stalls:
            self._compile_stalls.add(here)
            self._restart(s)
            return
        self._compile_skipped.add(here)
        self._restart(s, unexecutable=f"a kernel compile did not return within "
                                      f"{limit:.3g} s, twice (the second time in a fresh "
                                      "process): not a verdict")

    def _hung(self, s: _JobState, limit: float, calibrated: float) -> None:
        """The job's call did not return within ``limit`` (the ceiling, or once its target
        has a proven hang, the call's ``calibrated`` limit). Until the target has one, such
        a call is run again in a fresh process under the ceiling (the job restarts from its
        last progress and draws the same case): one that returns there is slow, or was
        stalled by the machine (a GPU shared with other processes, a loaded host, a library
        that deadlocked in the process), never a finding. A call that does not return again
        either, or a later one cut at its calibrated limit, is a ``timeout`` finding, whose
        smaller variants get the ``calibrated`` limit while it is minimized (the minimized
        case is proven past the ceiling before it replaces the one found)."""
        target, here = int(s.record[TARGET]), (s.spec.index, _position(s.record))
        if target not in self._hung_targets and here not in self._reran \
                and not self._traced(here):
            self._reran.add(here)
            self._restart(s)
            return
        again = here in self._reran
        if again:
            self._rerun_hung.add(here)
        self._hung_targets.add(target)
        self.hang_limits.append(limit)
        how = " twice (the second time in a fresh process)" if again else ""
        if limit < self.timeout:
            how = (" (its calibrated per-call timeout: the target has a proven hang past "
                   f"--timeout {self.timeout:g} s)")
        self._restart(s, Verdict("timeout", "no-return",
                                 f"did not return within {limit:.3g} s{how}",
                                 limit_seconds=round(calibrated, 3)))

    def _retrace(self, s: _JobState, seen: Verdict) -> bool:
        """A crash or hang seen while results of earlier examples were unread
        (``--read-every``): it may be any of theirs. The job runs them again from its last
        progress with each result read at once, so that the one it is shows at its own
        example (True); False where the call in flight was the only one unread."""
        r = s.record
        pos = _position(r)
        if not r[UNREAD]:
            return False
        first = int(r[UNREAD_ROUND]), int(r[UNREAD_ARM]), int(r[UNREAD_EXAMPLE])
        if first >= pos:
            return False
        self._retraced[(s.spec.index, pos)] = (first, seen)
        options = replace(s.spec.options, read_each_through=max(
            pos, s.spec.options.read_each_through or pos))
        self._restart(s, options=options)
        return True

    def _traced(self, here: tuple[int, Position], found: bool = False) -> bool:
        """Whether ``here`` (job, position) lies in a batch being run again one at a time
        (``_retrace``); ``found``: what was seen there is traced to it (it is recorded)."""
        job, pos = here
        keys = [k for k, (first, _) in self._retraced.items()
                if k[0] == job and first <= pos <= k[1]]
        if found:
            for k in keys:
                del self._retraced[k]
        return bool(keys)

    def _untrace_passed(self, job: int, snapshot: Snapshot | None) -> None:
        """Batches run again one at a time whose last example the job has passed with
        nothing found in them: what was seen there is said in the notes (``_unrecorded``)."""
        if not self._retraced or snapshot is None:
            return
        for key in [k for k in self._retraced if k[0] == job and k[1] < snapshot[0]]:
            first, seen = self._retraced.pop(key)
            self._untraced.append((job, first, key[1], seen))

    def _restart(self, s: _JobState, fault: Verdict | None = None,
                 unexecutable: str | None = None, options: CampaignOptions | None = None
                 ) -> None:
        """Start the job again from its last progress message, ``fault`` (a crash or hang)
        recorded at its flight position, or that position's example counted as not
        executable (``unexecutable``: why); neither: that position's call runs again."""
        r = s.record
        pos = _position(r)
        target = int(r[TARGET])
        resume = s.snapshot if s.snapshot is not None and s.snapshot[0] <= pos else None
        start = resume[0] if resume is not None else (-1, 0, 0)
        hard = {p: h for p, h in s.spec.hard.items() if p >= start}
        if fault is not None:
            # (config_alternative: the call ran under other kernel configs,
            # Recorder.alternative)
            hard[pos] = (target, replace(fault, config_alternative=(
                int(r[CONFIGS]) - 1 if r[CONFIGS] > 0 else None)))
            self._owed[(s.spec.index, pos)] = fault
            self._traced((s.spec.index, pos), found=True)
        r[UNREAD] = 0.0  # (the record outlives the process: its batch went with it)
        s.restarts += 1
        self.restarts += 1
        skip = {p: why for p, why in s.spec.unexecutable.items() if p >= start}
        if unexecutable is not None:
            skip[pos] = unexecutable
        seen = frozenset(self._kept)
        spec = Job(**{**s.spec.__dict__, "resume": resume, "hard": hard, "seen": seen,
                      "unexecutable": skip, "options": options or s.spec.options})
        self._start(spec, s)


def _where(record: Any, now: float) -> str:
    """Where a job killed in the middle of an example was, in words ('' if nowhere known):
    a job long inside a kernel compile was stalled by its compiler, not by the target."""
    if record[COMPILING] > 0:
        return f"; it had been inside a kernel compile for {now - record[COMPILING]:.0f} s"
    if record[STATE] == CALLING:
        return f"; it had been in a call of the target for {now - record[SINCE]:.0f} s"
    return ""


def _position(record: Any) -> Position:
    """The flight record's position: where its job stands."""
    return int(record[ROUND]), int(record[ARM]), int(record[EXAMPLE])


def _kill_all(procs: list[Any], wait: float = 5.0, by: float | None = None) -> None:
    """Kill every process of ``procs`` first, then wait for them together (``wait``
    seconds in all, not each, and never past ``by``, less the wrap-up's half second: a
    killed GPU job can take seconds to give its memory back). One still there then is
    left to end on its own, not waited for again at this process's exit."""
    for p in procs:
        kill_tree(p)
    now = time.monotonic()
    until = now + wait if by is None else min(now + wait, max(now + 0.2, by - 0.5))
    for p in procs:
        p.join(timeout=max(0.0, until - now))
        now = time.monotonic()
        if p.is_alive():
            forget(p)




__all__ = ["JobError", "Supervisor", "claim_device", "device_for"]
