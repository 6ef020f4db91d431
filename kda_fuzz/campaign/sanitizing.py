"""--sanitize in a campaign: passing cases sampled by its jobs, replayed under
compute-sanitizer by one long-lived sanitized worker per campaign and GPU.

The worker is served by a dispatcher process (:func:`kda_fuzz.workers.sanitize.dispatch`)
that the first job of the GPU starts when its campaign starts, so that the worker's
start-up (seconds: imports and compiles under the tool) overlaps the campaign. The other
jobs, and a job restarted after a crash, find it by a socket named after the campaign
(:func:`rendezvous`); each job's :class:`SanitizerClient` streams its samples to it from a
background thread and takes the reports back between examples. The dispatcher ends at the
campaign's deadline (its worker killed), when the campaign's processes are gone, or when
no job has been connected for a few seconds.

Each sample ends one way, counted by the job: run (clean, or with errors: a ``sanitizer``
finding), failed (the sanitized run did not complete: its cause, never a verdict), or not
run (time ran out, or the campaign stopped, first).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, replace
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from kda_fuzz.campaign.minimize import Cut, minimize_failure
from kda_fuzz.engine.case import Case, signature
from kda_fuzz.workers import sanitize as sanitizer

MAX_CASE_BYTES = sanitizer.MAX_CASE_BYTES
SANITIZE_BACKLOG = 2  # a job's samples waiting for the tool at most (more would only wait)
SPAWN_WAIT = 60.0  # seconds a job waits for a dispatcher to listen before it gives up


@dataclass
class Sample:
    """One case sampled for the sanitizer: ``index`` is the target's in the campaign,
    ``key`` the job's name for the sample (its position and that index)."""

    case: Case
    target: str
    index: int
    key: Any = None
    report: sanitizer.SanitizerReport | None = None
    counted: bool = False  # its first report has been counted (a later one adds errors)
    found: bool = False  # its errors have been reported as a finding


@dataclass(frozen=True)
class Rendezvous:
    """Where the jobs of one campaign and GPU find their dispatcher."""

    address: str  # its socket
    lock: str  # held (with its pid) by the dispatcher, created by the job that starts it
    log: str  # its output
    key: bytes  # the sockets' authkey


def rendezvous(tool: str, device: str, seed: int | None, origin: float | None,
               anchor: int) -> Rendezvous:
    """The dispatcher's paths for the campaign that started at ``origin``
    (``time.monotonic()``) under process ``anchor`` (what its jobs share)."""
    name = hashlib.sha256(f"{anchor}:{origin!r}:{seed}:{device}:{tool}".encode()).hexdigest()
    folder = Path(tempfile.gettempdir(), f"kda-fuzz-sanitize-{os.getuid()}")
    folder.mkdir(mode=0o700, exist_ok=True)
    base = folder / name[:20]
    return Rendezvous(f"{base}.sock", f"{base}.lock", f"{base}.log",
                      hashlib.sha256(f"{name}:{os.getuid()}".encode()).digest()[:16])


def campaign_anchor() -> int:
    """The process whose end ends the campaign: a campaign job's parent (the fork server
    or the supervisor), else this process."""
    return os.getppid() if multiprocessing.parent_process() is not None else os.getpid()


class SanitizerClient:
    """A job's link to its campaign's dispatcher (see the module's docstring)."""

    def __init__(self, tool: str, device: str, targets: list[str], *, name: str,
                 seed: int | None, origin: float | None, deadline: float | None) -> None:
        self.tool, self.device, self.targets = tool, device, targets
        self.name, self.deadline = name, deadline
        self.exe = sanitizer.find_sanitizer()  # SanitizerMissing: before any example
        self.anchor = campaign_anchor()
        self.where = rendezvous(tool, device, seed,
                                origin if origin is not None else uuid.uuid4().int, self.anchor)
        self.unavailable: sanitizer.Unavailable | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._outbox: list[Sample] = []
        self._open: dict[Any, Sample] = {}  # submitted, no report yet
        self._reported: dict[Any, Sample] = {}
        self._done: queue.Queue[Sample] = queue.Queue()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="kda-fuzz-sanitize",
                                        daemon=True)

    def start(self) -> None:
        """Connect (starting the dispatcher if none listens yet) in the background."""
        self._thread.start()

    def backlog(self) -> int:
        """Samples sent and not reported on yet."""
        with self._lock:
            return len(self._open)

    def submit(self, sample: Sample) -> None:
        """Send ``sample`` to be sanitized."""
        with self._lock:
            self._open[sample.key] = sample
            self._outbox.append(sample)
        self._wake.set()

    def ready(self) -> list[Sample]:
        """The samples reported on since the last call (each with its report)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def finish(self, deadline: float | None, stopped: Any = None) -> tuple[list[Sample], int]:
        """Wait for the samples still out until ``deadline`` (``time.monotonic()``;
        ``None``: no limit) or ``stopped()``; the samples reported on, and how many were
        not run. Disconnects."""
        while True:
            with self._lock:
                left = len(self._open)
            if not left or self.unavailable is not None or not self._thread.is_alive():
                break
            if (deadline is not None and time.monotonic() >= deadline) or (
                    stopped is not None and stopped()):
                break
            time.sleep(0.02)
        done = self.ready()
        with self._lock:
            unrun = len(self._open)
            self._closing = True
        self._wake.set()
        self._thread.join(timeout=2.0)
        return done, unrun

    # ------------------------------------------------------------------ background

    def _over(self) -> bool:
        return self._closing or (self.deadline is not None
                                 and time.monotonic() > self.deadline)

    def _work(self) -> None:
        while not self._over():
            conn = self._connect()
            if conn is None:
                return
            try:
                self._talk(conn)
            except (EOFError, OSError, pickle.UnpicklingError):
                pass  # the dispatcher ended: another (or the same, restarted) is found
            finally:
                conn.close()

    def _talk(self, conn: Connection) -> None:
        sanitizer.send(conn, sanitizer.Hello(self.name))
        with self._lock:  # what an earlier dispatcher had not reported on is sent again
            self._outbox = list(self._open.values())
        while True:
            if self._closing:
                try:
                    sanitizer.send(conn, sanitizer.Bye())
                except OSError:
                    pass
                return
            with self._lock:
                out, self._outbox = self._outbox, []
            for s in out:
                sanitizer.send(conn, sanitizer.Submit(s.key, s.target, pickle.dumps(s.case),
                                                      signature(s.case)))
            while conn.poll(0.02):
                self._handle(sanitizer.recv(conn))
            if self.deadline is not None and time.monotonic() > self.deadline + 1.0:
                return

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, sanitizer.Unavailable):
            self.unavailable = msg
            return
        if not isinstance(msg, sanitizer.Result):
            return
        with self._lock:
            sample = self._open.pop(msg.key, None)
            if sample is None:
                sample = self._reported.get(msg.key)
                if sample is None:
                    return
                if msg.report.status == "errors" and sample.report is not None:
                    sample.report = replace(sample.report, status="errors",
                                            errors=[*sample.report.errors, *msg.report.errors])
            else:
                sample.report = msg.report
                self._reported[msg.key] = sample
        self._done.put(sample)

    def _connect(self) -> Connection | None:
        """A connection to the dispatcher, started here if none listens (None: closing or
        past the deadline, or none came up within ``SPAWN_WAIT``)."""
        w = self.where
        give_up = time.monotonic() + SPAWN_WAIT
        while not self._over() and time.monotonic() < give_up:
            try:
                return Client(w.address, family="AF_UNIX", authkey=w.key)
            except (OSError, EOFError):
                pass
            if _take_lock(w.lock):
                self._spawn()
            elif _stale(w.lock):
                for path in (w.lock, w.address):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
            self._wake.wait(0.1)
            self._wake.clear()
        return None

    def _spawn(self) -> None:
        w = self.where
        spec = sanitizer.DispatchSpec(w.address, self.exe, self.tool, self.device,
                                      tuple(self.targets), self.deadline, self.anchor, w.lock)
        env = {**os.environ, sanitizer.ENV_KEY: w.key.hex()}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH"))
                                            if p)
        with open(w.log, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "kda_fuzz.workers.sanitize",
                                     "dispatch", spec.to_json()], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        Path(w.lock).write_text(str(proc.pid))


def _take_lock(path: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _stale(path: str) -> bool:
    """Whether the lock's holder is gone (a dispatcher that died without its clean-up)."""
    try:
        pid = int(Path(path).read_text().strip() or 0)
        age = time.time() - os.stat(path).st_mtime
    except (OSError, ValueError):
        return False
    if not pid:
        return age > 10.0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sanitizer_note(report: Any, tool: str, every: int) -> str:
    """The summary's line on the sanitizer: what became of the samples, and its cost."""
    run, failed = report.sanitized, report.sanitize_failed
    unrun = max(0, report.sanitize_sampled - run - failed)
    per = f", {report.sanitize_seconds / run:.2f} s of the tool per case" if run else ""
    causes = "; ".join(f"{n} x {c}" for c, n in report.sanitize_causes.most_common(3))
    return (f"sanitizer ({tool}): {report.sanitize_sampled} sample(s) of "
            f"{report.valid_cases} valid case(s) (1 in {every} passing, up to "
            f"{MAX_CASE_BYTES >> 20} MiB of tensors, while fewer than {SANITIZE_BACKLOG} "
            f"of a job's wait for the tool): {run} run{per}, "
            f"{report.sanitize_found} with errors (findings), {unrun} not run (time ran out "
            f"or the campaign stopped first), {failed} failed (not verdicts)"
            + (f": {causes}" if causes else ""))


def minimize_finding(contract: Any, failure: Any, *, device: str, seconds: float,
                     abort: Any = None) -> bool:
    """Minimize a ``sanitizer`` finding with the project's minimizer, each candidate (a
    valid layout) run under the finding's tool by one sanitized worker and kept when the
    tool reports the same error; the minimized case's report replaces the verdict's.
    Whether it got smaller. ``abort()``: stop now (the smallest case so far is kept)."""
    from kda_fuzz.engine.oracle import Outcome, expectation

    tool = failure.verdict.tool or "memcheck"
    end = time.monotonic() + seconds

    def run(case: Case) -> Any:
        report = worker.run(failure.target, case, max(0.1, end - time.monotonic()), abort)
        if report is None:
            raise _Aborted
        verdict = report.verdict()
        return Outcome("fail" if verdict is not None else "pass", expectation(contract, case),
                       verdict)

    with sanitizer.SanitizedWorker(sanitizer.find_sanitizer(), tool, device,
                                   [failure.target]) as worker:
        found = failure.case
        minimize_failure(contract, failure, run, seconds=seconds,
                         keep=lambda c: expectation(contract, c).ok)
    return failure.case is not found


class _Aborted(Cut):
    """Ends a minimization under the sanitizer at once (what it reached is kept)."""


def attach_report(failure: Any, tool: str, device: str, timeout: float = 600.0) -> None:
    """Replay a finding's case under ``tool`` and attach the report to its verdict
    (``notes["sanitizer"]``); a run that fails is noted, never a verdict."""
    if failure.verdict.kind == "sanitizer" or " vs " in failure.target:
        return
    try:
        report = sanitizer.sanitize(tool, failure.target, [failure.case], device=device,
                                    timeout=timeout)[0]
    except Exception as e:  # the machinery's own
        failure.add_note(
            f"no sanitizer report: {type(e).__name__}: {e}")
        return
    failure.verdict = replace(failure.verdict, notes={**failure.verdict.notes,
                                                      "sanitizer": report.to_json()})


__all__ = ["MAX_CASE_BYTES", "Rendezvous", "Sample", "SanitizerClient", "attach_report",
           "campaign_anchor", "minimize_finding", "rendezvous", "sanitizer_note"]
