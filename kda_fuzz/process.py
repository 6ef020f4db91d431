"""Small helpers for the worker processes kda-fuzz starts (campaign jobs, isolated targets)."""

from __future__ import annotations

import os
import signal
import threading
import time


def exit_with_parent() -> None:
    """End this process soon after the process that started it is gone (killed, crashed)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="kda-fuzz-orphan-watch", daemon=True).start()


def how_it_ended(code: int | None) -> str:
    """A process exit code in words: ``signal SIGABRT`` or ``exit code 70``."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
