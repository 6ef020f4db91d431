"""Targets that end or stall the process that runs them (for the isolation tests)."""

from __future__ import annotations

import os
import time

from kernels.kda_decode import reference_kda_packed_decode


def aborts_on_padding(*args):
    """Correct, except that a batch with a padding row aborts the process."""
    if bool((args[8] < 0).any()):
        os.abort()
    return reference_kda_packed_decode(*args)


def hangs(*args):
    """Never returns."""
    while True:
        time.sleep(3600)


def aborts(*args):
    """Aborts the process on every call."""
    os.abort()
