"""Judge single cases in a worker process, so an abort, a hard fault or a hang ends one
case only: the path of corpus replay (``crash-``/``timeout-``/``flaky-`` files) and of
minimizing a failure found by a supervised campaign (campaigns themselves run their whole
loop in supervised job processes, see :mod:`kda_fuzz.campaign.supervisor`).

The worker is a fork of kda-fuzz's fork server (``process.worker_context``), never of a
process whose torch thread pool runs (it can deadlock in its first parallel op); it
imports the target by its ``MODULE:CALLABLE`` name and judges each case with
``run_case`` itself; parent and worker talk through a pipe in the messages declared
below (``ToWorker``, ``FromWorker``). A worker that dies yields
a ``crash`` verdict, one that does not answer within the timeout is killed and yields a
``timeout`` verdict; either way a fresh worker takes the next case.
"""

from __future__ import annotations

import faulthandler
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.oracle import EnvironmentFailure, Outcome, device_error, expectation, run_case
from kda_fuzz.engine.targets import load_target
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import get_contract
from kda_fuzz.workers.deadline import PastDeadline
from kda_fuzz.workers.process import exit_with_parent, how_it_ended, worker_context, worker_process

# ------------------------------------------------------------------ messages
# Sent over the worker's pipe (multiprocessing's pickler: a case's tensors may go through
# shared memory).


@dataclass(frozen=True)
class Judge:
    """To the worker: judge ``case`` (CPU tensors; the worker moves them to its device)."""

    case: Case


@dataclass(frozen=True)
class Shutdown:
    """To the worker: end."""


@dataclass(frozen=True)
class Ready:
    """From the worker: its contract and target loaded, it waits for cases."""


@dataclass(frozen=True)
class Judged:
    """From the worker: the outcome of the case it was sent."""

    outcome: Outcome


@dataclass(frozen=True)
class EnvironmentFailed:
    """From the worker: the machinery that runs the target failed on the case (an
    ``EnvironmentFailure``: the parent raises it again)."""

    detail: str


@dataclass(frozen=True)
class OracleFailed:
    """From the worker: judging the case failed outside the target (the fuzzer's own
    failure): its traceback (the parent raises ``RuntimeError``)."""

    traceback: str


ToWorker = Judge | Shutdown
FromWorker = Ready | Judged | EnvironmentFailed | OracleFailed


def _worker(conn: Connection, family: str, target: str, device: str,
            judging: dict[str, Any]) -> None:
    faulthandler.disable()  # a target's abort is reported by the parent, not dumped here
    exit_with_parent()
    contract = get_contract(family)
    if device == "cpu" and contract.execution is not None:
        contract.execution.configure_cpu()
    fn = load_target(target).fn
    parent = os.getppid()
    conn.send(Ready())
    while True:
        while not conn.poll(1.0):
            if os.getppid() != parent:  # orphaned (a forked copy may hold the pipe's other end)
                return
        try:
            msg: ToWorker = conn.recv()
        except EOFError:
            return
        if not isinstance(msg, Judge):  # Shutdown
            return
        case = msg.case
        try:
            cpu = time.thread_time()  # immune to the machine's load, unlike wall time
            outcome = run_case(contract, case if device == "cpu" else case.on(device), fn,
                               **judging)
            outcome.cpu_seconds = time.thread_time() - cpu
        except EnvironmentFailure as e:
            conn.send(EnvironmentFailed(str(e)))
            continue
        except Exception as e:
            if device != "cpu" and device_error(e):  # surfaced while judging
                _device_fault(conn, expectation(contract, case), e)
            conn.send(OracleFailed(traceback.format_exc()))  # the oracle's own: parent raises
            continue
        if device != "cpu":
            try:
                torch.cuda.synchronize()
            except Exception as e:  # a sticky CUDA error: this process's context is gone
                _device_fault(conn, outcome.expectation, e)
        conn.send(Judged(outcome))


def _device_fault(conn: Any, exp: Any, error: BaseException) -> NoReturn:
    """Report the device's fault as the target's crash and end this worker (its CUDA
    context is gone)."""
    conn.send(Judged(Outcome("fail", exp, Verdict(
        "crash", "device-fault", f"the device faulted: {str(error).splitlines()[0]}"))))
    os._exit(70)


class IsolatedTarget:
    """A callable-like runner of one target in a child process with a per-case timeout.

    Cases are sent as CPU tensors; on ``cuda`` the worker moves them to its device, so the
    parent never initialises CUDA and a faulting kernel takes down only the worker."""

    def __init__(self, contract: Contract, target: str, *, timeout: float = 60.0,
                 device: str = "cpu", messages: str = "exact", strict: bool = False,
                 deadline: float | None = None) -> None:
        self.contract = contract
        self.target = target
        self.timeout = timeout
        # time.monotonic() past which no start-up or case waits: ``PastDeadline`` (the
        # worker killed), never a verdict
        self.deadline = deadline
        self.device = device
        self.judging = {"messages": messages, "strict": strict}
        self._ctx = worker_context()
        self._proc: Any = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = worker_process(
            self._ctx, _worker,
            (child, self.contract.name, self.target, self.device, self.judging), daemon=True)
        try:
            proc.start()
        finally:
            child.close()
        self._proc = proc
        self._conn = parent
        wait, cut = self._wait(max(self.timeout, 120.0))
        if not parent.poll(wait):
            if cut:
                raise PastDeadline(f"the worker for {self.target} had not started by the "
                                   "deadline")
            raise RuntimeError(f"worker for {self.target} did not start")
        if not isinstance(parent.recv(), Ready):
            raise RuntimeError(f"worker for {self.target} did not start")

    def _wait(self, limit: float) -> tuple[float, bool]:
        """How long to wait for the worker: ``limit``, or less where ``deadline`` comes
        first (then ``True``)."""
        if self.deadline is None:
            return limit, False
        left = max(0.0, self.deadline - time.monotonic())
        return (left, True) if left < limit else (limit, False)

    def _stop(self, kill: bool = False) -> None:
        if self._proc is not None:
            if kill and self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def run(self, case: Case) -> Outcome:
        """Judge ``case`` in the worker; a dead or silent worker is a crash or a timeout.
        Raises ``PastDeadline`` (the worker killed) where ``deadline`` came first."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise PastDeadline(f"no time left to run a case on {self.target}")
        if self._proc is None or not self._proc.is_alive():
            self._stop()
            try:
                self._start()
            except PastDeadline:
                self._stop(kill=True)
                raise
            except (EOFError, OSError, RuntimeError) as e:
                self._stop(kill=True)
                raise RuntimeError(f"cannot start a worker for {self.target}: {e}") from e
        assert self._conn is not None
        timed_out = False
        wait, cut = self._wait(self.timeout)
        try:
            self._conn.send(Judge(case))
            if self._conn.poll(wait):
                got: FromWorker = self._conn.recv()
                match got:
                    case Judged(outcome):
                        return outcome
                    case EnvironmentFailed(detail):
                        raise EnvironmentFailure(detail)
                    case OracleFailed(tb):
                        raise RuntimeError(f"the oracle failed in the worker:\n{tb}")
                raise RuntimeError(f"unexpected message from the worker for {self.target}: "
                                   f"{got!r}")
            timed_out = True
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._proc.join(timeout=10)  # it is dying: let it be reaped
        exp = expectation(self.contract, case)
        code = self._proc.exitcode
        self._stop(kill=True)
        if timed_out and cut:  # the deadline's, not the case's: no verdict
            raise PastDeadline(f"a case on {self.target} was still running at the deadline")
        if timed_out:
            return Outcome("fail", exp, Verdict(
                "timeout", "no-return", f"did not return within {self.timeout:g} s"))
        return Outcome("fail", exp, Verdict(
            "crash", "process-died",
            f"the process running the target died ({how_it_ended(code)})"))

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(Shutdown())
            except (BrokenPipeError, OSError):
                pass
        self._stop(kill=True)

    def __enter__(self) -> IsolatedTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
