"""A job's sample of passing cases, replayed under compute-sanitizer in the background
while the job goes on drawing (``--sanitize``; :mod:`kda_fuzz.workers.sanitize` runs them).

Cases come in with :meth:`SanitizerQueue.submit`; every ``BATCH`` of them (or what is left
at the end) goes to one sanitized process, one batch at a time. The job collects the reports
with :meth:`ready` between examples and with :meth:`finish` at its end.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from kda_fuzz.engine.case import Case
from kda_fuzz.workers import sanitize as sanitizer

MAX_CASE_BYTES = sanitizer.MAX_CASE_BYTES


@dataclass
class Sample:
    """One case sampled for the sanitizer: ``index`` is the target's in the campaign."""

    case: Case
    target: str
    index: int
    report: sanitizer.SanitizerReport | None = None


class SanitizerQueue:
    """Sanitizes sampled cases in a background thread (see the module's docstring)."""

    def __init__(self, tool: str, device: str, *, batch: int = sanitizer.BATCH,
                 timeout: float = 600.0) -> None:
        self.tool, self.device, self.batch, self.timeout = tool, device, batch, timeout
        self.exe = sanitizer.find_sanitizer()  # SanitizerMissing: before any example
        self._waiting: list[Sample] = []
        self._todo: queue.Queue[list[Sample] | None] = queue.Queue()
        self._done: queue.Queue[Sample] = queue.Queue()
        self._busy = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, sample: Sample) -> None:
        """Queue ``sample``; a full batch starts at once."""
        self._waiting.append(sample)
        if len(self._waiting) >= self.batch:
            self._flush()

    def ready(self) -> list[Sample]:
        """The samples sanitized since the last call (each with its report)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def finish(self, deadline: float | None, stopped: Any = None) -> tuple[list[Sample], int]:
        """Run what is queued and wait for every batch until ``deadline``
        (``time.monotonic()``; ``None``: no limit) or until ``stopped()`` is true; the
        samples sanitized, and how many were given up on."""
        self._flush()
        while True:
            with self._lock:
                busy = self._busy
            if not busy:
                break
            if (deadline is not None and time.monotonic() > deadline) or (
                    stopped is not None and stopped()):
                sanitizer.kill_all()
                break
            time.sleep(0.05)
        done = self.ready()
        with self._lock:
            lost = self._busy
        self._todo.put(None)
        if self._thread is not None and not lost:
            self._thread.join()  # no daemon thread holding tensors at exit (see FindingSaver)
        return done, lost

    def _flush(self) -> None:
        if not self._waiting:
            return
        samples, self._waiting = self._waiting, []
        with self._lock:
            self._busy += len(samples)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="kda-fuzz-sanitize",
                                            daemon=True)
            self._thread.start()
        self._todo.put(samples)

    def _work(self) -> None:
        while True:
            samples = self._todo.get()
            if samples is None:
                return
            by_target: dict[str, list[Sample]] = {}
            for s in samples:
                by_target.setdefault(s.target, []).append(s)
            for target, group in by_target.items():
                try:
                    reports = sanitizer.run(self.exe, self.tool, target,
                                            [s.case for s in group], device=self.device,
                                            timeout=self.timeout)
                except Exception as e:  # the machinery's own: counted, never a verdict
                    reports = [sanitizer.SanitizerReport(self.tool, "failed",
                                                         note=f"{type(e).__name__}: {e}")
                               for _ in group]
                for s, r in zip(group, reports):
                    s.report = r
                    with self._lock:
                        self._busy -= 1
                    self._done.put(s)


def sanitizer_note(report: Any, tool: str, every: int) -> str:
    """The summary's line on the sanitizer: its sample rate and cost."""
    per = (f", {report.sanitize_seconds / report.sanitized:.1f} s of the tool per case"
           if report.sanitized else "")
    failed = (f"; {report.sanitize_failed} sanitized run(s) failed or were given up "
              "(not verdicts)" if report.sanitize_failed else "")
    return (f"sanitizer ({tool}): {report.sanitize_sampled} of {report.valid_cases} valid "
            f"case(s) sampled (1 in {every} passing, up to {MAX_CASE_BYTES >> 20} MiB of "
            f"tensors), {report.sanitized} run under compute-sanitizer{per}{failed}")


def attach_report(failure: Any, tool: str, device: str, timeout: float = 600.0) -> None:
    """Replay a finding's case under ``tool`` and attach the report to its verdict
    (``extra["sanitizer"]``); a run that fails is noted, never a verdict."""
    if failure.verdict.kind == "sanitizer" or " vs " in failure.target:
        return
    try:
        report = sanitizer.sanitize(tool, failure.target, [failure.case], device=device,
                                    timeout=timeout)[0]
    except Exception as e:  # the machinery's own
        failure.note = (failure.note + "; " if failure.note else "") + (
            f"no sanitizer report: {type(e).__name__}: {e}")
        return
    failure.verdict = replace(failure.verdict, extra={**failure.verdict.extra,
                                                      "sanitizer": report.to_json()})


__all__ = ["MAX_CASE_BYTES", "Sample", "SanitizerQueue", "attach_report", "sanitizer_note"]
