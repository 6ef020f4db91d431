"""Planted-bug targets slow enough that a campaign, or a minimization, is still running when
a test interrupts it or its deadline comes."""

from __future__ import annotations

import time

from tests.mutants import pad_wrap

SLOW_CALL_SECONDS = 0.5


def slow_pad_wrap(*args, **kwargs):
    """``tests.mutants:pad_wrap`` (a padding row wraps to the last slot), each call taking
    at least ``SLOW_CALL_SECONDS``."""
    time.sleep(SLOW_CALL_SECONDS)
    return pad_wrap(*args, **kwargs)
