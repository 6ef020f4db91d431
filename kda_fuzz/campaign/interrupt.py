"""SIGINT and SIGTERM during a command: the first one asks the running phase to stop and
wrap up (save what is confirmed, summarize), a second one (or one outside such a phase)
ends the command at once with ``Interrupted``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from kda_fuzz.campaign.channel import ExitReason, Stop

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The command was interrupted by ``signum``; it exits ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def stop_for(signum: int) -> Stop:
    """The stop reason of a signal."""
    name = signal.Signals(signum).name
    reason = ExitReason.INTERRUPTED if signum == signal.SIGINT else ExitReason.TERMINATED
    return Stop(reason, f"interrupted by {name}")


class Signals:
    """Handlers for SIGINT and SIGTERM while installed (``with Signals() as s``).

    Within ``s.stopping(fn)``, the first signal calls ``fn(stop)`` (which must only set
    flags: it runs in a signal handler) and is remembered in ``s.received``; any other
    signal raises :class:`Interrupted`."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._on: Callable[[Stop], None] | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is not threading.main_thread():
            return self  # handlers can be set in the main thread only: signals as before
        for sig in SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._on is None or self.received is not None:
            raise Interrupted(signum)
        self.received = signum
        self._on(stop_for(signum))

    @property
    def stop(self) -> Stop | None:
        """The stop reason of the signal received, if any."""
        return stop_for(self.received) if self.received is not None else None

    @contextmanager
    def stopping(self, on_signal: Callable[[Stop], None]) -> Iterator[None]:
        """A phase in which a first signal calls ``on_signal`` instead of raising."""
        before = self._on
        self._on = on_signal
        try:
            yield
        finally:
            self._on = before


__all__ = ["Interrupted", "Signals", "stop_for"]
