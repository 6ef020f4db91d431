"""The ``--max-seconds`` clock: one object, made once by the command from the process's
start, handed to every phase that must end before the command does.

Every instant is on the ``time.monotonic()`` clock (the same in every process of the
machine) and derived here only, from the start and the budget; each phase reserves its
share of the budget before ``end`` (the command's exit), never after it:

* ``calibrate``: foreign targets are measured before the campaign until then at the latest
  (a quarter of the budget: a target that hangs must leave time for the campaign);
* ``replay``: the example database's stored failures are replayed until then at the latest
  (half of the budget; the entries not replayed stay stored);
* ``draw``: the jobs stop drawing examples (``wrap_up`` before ``end``; earlier once a
  failure waits for its minimization, see ``Budget.minimize``);
* ``kill``: a job still in an example is killed, its last progress kept;
* ``settle``: every minimization has ended (its worker killed); findings not minimized by
  then are saved as found;
* ``end``: the findings are saved, the summary printed, the process gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WRAP_UP_SECONDS = 3.0  # at most: the jobs stop drawing this long before the end
KILL_SECONDS = 1.0  # at most: jobs still in an example are killed this long before the end
SETTLE_SECONDS = 1.0  # at most: minimization ends this long before the end (saving after)
CALIBRATION_SHARE = 0.25  # of the budget: calibration of foreign targets ends by then
REPLAY_SHARE = 0.5  # of the budget: the example database's replay ends by then


@dataclass(frozen=True)
class Deadline:
    """The instants of one ``--max-seconds`` budget (``started`` + ``seconds`` = ``end``)."""

    started: float  # time.monotonic() at the process's start
    seconds: float  # the budget, --max-seconds

    @property
    def end(self) -> float:
        """When the command has ended: findings saved, summary printed, processes gone."""
        return self.started + self.seconds

    @property
    def draw(self) -> float:
        """When the jobs stop drawing examples."""
        return self.end - min(WRAP_UP_SECONDS, 0.05 * self.seconds)

    @property
    def kill(self) -> float:
        """When a job still in an example is killed (its last progress kept)."""
        return self.end - min(KILL_SECONDS, 0.025 * self.seconds)

    @property
    def settle(self) -> float:
        """When every minimization has ended; what is not minimized is saved as found."""
        return self.end - min(SETTLE_SECONDS, 0.1 * self.seconds)

    @property
    def calibrate(self) -> float:
        """When the measurement of foreign targets before the campaign gives up."""
        return self.started + CALIBRATION_SHARE * self.seconds

    @property
    def replay(self) -> float:
        """When the replay of the example database's stored failures gives up."""
        return self.started + REPLAY_SHARE * self.seconds

    def left(self, until: float | None = None) -> float:
        """Seconds from now to ``until`` (default ``end``); 0 once past it."""
        return max(0.0, (self.end if until is None else until) - time.monotonic())


class PastDeadline(Exception):
    """A phase was cut by the deadline (not a verdict on any target)."""


class Watchdog:
    """For work that no one can stop (a target called in this process): at ``stop_at``
    ``on_stop()`` asks it to stop; at ``take_at``, unless the work's thread has
    ``claim``-ed the wrap-up by then, ``take_over()`` runs in the watchdog's thread (it
    wraps the command up and ends the process; the work's thread stays where it is)."""

    def __init__(self, stop_at: float, take_at: float, on_stop: Callable[[], None],
                 take_over: Callable[[], None]) -> None:
        self.stop_at, self.take_at = stop_at, take_at
        self.on_stop, self.take_over = on_stop, take_over
        self.fired = False  # on_stop was called
        self._owner: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kda-fuzz-deadline",
                                        daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def claim(self) -> bool:
        """The work's thread wraps up itself (``True``), or the watchdog already does:
        then the caller must leave the wrap-up to it (the process ends there)."""
        with self._lock:
            self._owner = self._owner or "work"
            mine = self._owner == "work"
        if mine:
            self._done.set()
        return mine

    def _watch(self) -> None:
        if self._done.wait(max(0.0, self.stop_at - time.monotonic())):
            return
        self.fired = True
        self.on_stop()
        if self._done.wait(max(0.0, self.take_at - time.monotonic())):
            return
        with self._lock:
            self._owner = self._owner or "watchdog"
            mine = self._owner == "watchdog"
        if mine:
            self.take_over()


__all__ = ["WRAP_UP_SECONDS", "Deadline", "PastDeadline", "Watchdog"]
