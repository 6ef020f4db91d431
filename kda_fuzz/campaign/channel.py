"""The typed channel between a supervisor and its campaign jobs, and why a campaign stopped.

Each job sends one of the ``Job*`` messages below on its own pipe (pickled); the
supervisor handles them with ``match``. A snapshot is ``(position, counters)``: the
position of the next example to run and the job's ``Report.counters()`` there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

Snapshot = tuple[tuple[int, int, int], dict[str, Any]]

_MISSING = object()


def _growing(counters: dict[str, Any]) -> list[tuple[tuple[str, str], dict[Any, Any]]]:
    """The maps of a job's counters that grow with its examples (entries are added or
    changed, never removed): its variants' records per target, its steering's counts per
    layout. Sent whole four times a second they reached a megabyte a message at GPU rates."""
    out = [(("variants", t), seen) for t, seen in counters.get("variants", {}).items()]
    steering = counters.get("steering") or {}
    out += [(("steering", n), steering[n]) for n in ("layouts", "faulted") if n in steering]
    return out


class Changes:
    """A job's side of the growing maps: each message carries only the entries changed
    since the job's last one (:func:`received` makes them whole again)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], dict[Any, Any]] = {}

    def sent(self, counters: dict[str, Any]) -> dict[str, Any]:
        """``counters`` with each growing map cut to its changed entries (in place)."""
        for (group, name), now in _growing(counters):
            last = self._last.setdefault((group, name), {})
            delta = {k: v for k, v in now.items() if last.get(k, _MISSING) != v}
            last.update(delta)
            counters[group][name] = delta
        return counters


def received(before: dict[str, Any] | None, counters: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's side: ``counters`` (a job's message) with each growing map made
    whole: the job's ``before`` counters (its last message made whole) updated with the
    changed entries. Entries the job sends again after a restart replace the old ones."""
    if before is None:
        return counters
    for (group, name), delta in _growing(counters):
        whole = before.get(group, {}).get(name)
        if whole is not None:
            whole.update(delta)
            counters[group][name] = whole
    return counters


class ExitReason(enum.Enum):
    """Why a campaign (or one job of it) stopped drawing examples."""

    COMPLETED = "completed"  # its examples ran out
    STOP_REQUESTED = "stopped"  # its supervisor asked it to stop
    MAX_FAILURES = "max-failures"  # --max-failures distinct failures kept
    HARD_REPEATS = "hard-repeats"  # the same crash or hang too many times
    DEADLINE = "deadline"  # --max-seconds
    INTERRUPTED = "interrupted"  # SIGINT
    TERMINATED = "terminated"  # SIGTERM


@dataclass(frozen=True)
class Stop:
    """A stop reason and what to tell the user about it (empty: the reason says it all)."""

    reason: ExitReason
    detail: str = ""

    def __str__(self) -> str:
        return self.detail or self.reason.value

    @property
    def noteworthy(self) -> bool:
        """Whether the summary should mention it in a note: not a stop the supervisor
        asked for, nor the deadline a time-bounded campaign runs to (its planned end: the
        JSON's ``stopped`` says it) unless it comes with a detail (a job killed)."""
        if self.reason is ExitReason.DEADLINE:
            return bool(self.detail)
        return self.reason not in (ExitReason.COMPLETED, ExitReason.STOP_REQUESTED)


@dataclass(frozen=True)
class JobProgress:
    """Examples done so far."""

    job: int
    snapshot: Snapshot


@dataclass(frozen=True)
class JobFound:
    """A new distinct, confirmed failure (``failure``: a plainly pickled ``Failure``)."""

    job: int
    failure: bytes
    snapshot: Snapshot


@dataclass(frozen=True)
class JobRepeat:
    """One more example of a failure already kept (by its signature)."""

    job: int
    signature: tuple[Any, ...]
    snapshot: Snapshot


@dataclass(frozen=True)
class JobFault:
    """The device faulted in a target call; the job dies right after sending it."""

    job: int
    detail: str


@dataclass(frozen=True)
class JobDone:
    """The job's campaign ended: its last counts and summary (``seconds``, ``stopped``: a
    :class:`Stop` or ``None``, ``notes``, ``targets``: wrapped targets' summaries)."""

    job: int
    snapshot: Snapshot
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobEnvironment:
    """The machinery that runs targets failed (an ``EnvironmentFailure``)."""

    job: int
    detail: str


@dataclass(frozen=True)
class JobFailed:
    """The job failed outside the targets (the fuzzer's own failure): its traceback."""

    job: int
    traceback: str


JobMessage = JobProgress | JobFound | JobRepeat | JobFault | JobDone | JobEnvironment | JobFailed

__all__ = ["Changes", "ExitReason", "JobDone", "JobEnvironment", "JobFailed", "JobFault",
           "JobFound", "JobMessage", "JobProgress", "JobRepeat", "Snapshot", "Stop", "received"]
