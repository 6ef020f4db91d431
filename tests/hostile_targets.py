"""Targets that end or stall the process that runs them (for the isolation tests)."""

from __future__ import annotations

import os
import time

from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def aborts_on_padding(*args):
    """Correct, except that a batch with a padding row aborts the process."""
    # a meta tensor has no values to look at: the reference's checks reject the layout
    if args[8].device.type != "meta" and bool((args[8] < 0).any()):
        os.abort()
    return reference_kda_packed_decode(*args)


def aborts_when_told(*args):
    """Correct, unless the environment says ``KDA_FUZZ_TEST_ABORT=1``."""
    if os.environ.get("KDA_FUZZ_TEST_ABORT") == "1":
        os.abort()
    return reference_kda_packed_decode(*args)


def hangs(*args):
    """Never returns."""
    while True:
        time.sleep(3600)


def aborts(*args):
    """Aborts the process on every call."""
    os.abort()


def three_arguments(mixed_qkv, a, b):
    """Cannot take the contract's arguments."""
    return mixed_qkv, a


def interpreter_gap(*args):
    """Fails in the execution machinery (as an interpreter without a libdevice function
    does), not in its own code."""
    from kda_fuzz.execution.cpu import ExecutionEnvironmentError

    if bool((args[8] >= 0).any()):
        raise ExecutionEnvironmentError("libdevice.erfcx has no CPU implementation")
    return reference_kda_packed_decode(*args)


_calls = [0]


def flaky_padding(*args):
    """Correct, except that every third call leaves its padding rows untouched (a failure
    that re-running the same case does not always show)."""
    _calls[0] += 1
    out, state = reference_kda_packed_decode(*args)
    if _calls[0] % 3 == 0:
        out[args[8] < 0] = 1.0
    return out, state


def two_faced(*args):
    """Wrong on every call, alternately in the state (NaN in the live slots) and in
    ``out`` (all NaN): a failure whose re-runs fail differently, never one that goes away."""
    _calls[0] += 1
    out, state = reference_kda_packed_decode(*args)
    idx = args[8]
    live = idx[idx >= 0].long()
    if _calls[0] % 2 and live.numel():
        state[live] = float("nan")
    else:
        out.fill_(float("nan"))
    return out, state


def aborts_on_wide_batches(*args):
    """Correct, except that a batch of exactly 12 rows aborts the process (rare)."""
    if args[0].dim() == 2 and args[0].shape[0] == 12 and args[7].dim() == 4:
        os.abort()
    return reference_kda_packed_decode(*args)


def _rows(args) -> int:
    return args[0].shape[0] if args[0].dim() >= 1 else 0


def hangs_past_64_rows(*args):
    """Correct, except that a batch of more than 64 rows never returns (valid and broken
    layouts alike)."""
    if _rows(args) > 64:
        while True:
            time.sleep(3600)
    return reference_kda_packed_decode(*args)


def aborts_past_16_rows(*args):
    """Correct, except that a batch of more than 16 rows aborts the process (valid and
    broken layouts alike: a frequent crash)."""
    if _rows(args) > 16:
        os.abort()
    return reference_kda_packed_decode(*args)


def slow_but_correct(*args):
    """Correct, and one second and a half per call (a job likely mid-call at its end)."""
    time.sleep(1.5)
    return reference_kda_packed_decode(*args)


# aborts_then_slow_to_return: a crash whose restarted job cannot get back to it in time
_MARK = os.environ.get("KDA_FUZZ_TEST_MARK")
if _MARK and os.path.exists(_MARK):  # a process started after the crash: a slow import
    time.sleep(float(os.environ.get("KDA_FUZZ_TEST_SLOW_IMPORT", "60")))


def aborts_then_slow_to_return(*args):
    """Correct, except that the first valid call aborts the process (once: it leaves the
    file ``KDA_FUZZ_TEST_MARK``); a process that imports this module after that sleeps
    ``KDA_FUZZ_TEST_SLOW_IMPORT`` seconds first (a library slow to import again)."""
    if _MARK and args[8].device.type != "meta" and not os.path.exists(_MARK):
        open(_MARK, "w").close()
        os.abort()
    return reference_kda_packed_decode(*args)
