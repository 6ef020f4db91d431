"""Planted-bug targets slow enough that a campaign, or a minimization, is still running when
a test interrupts it or its deadline comes."""

from __future__ import annotations

import time

from tests.mutants import pad_wrap

SLOW_CALL_SECONDS = 0.25


def slow_pad_wrap(*args, **kwargs):
    """``tests.mutants:pad_wrap`` (a padding row wraps to the last slot), each call taking
    at least ``SLOW_CALL_SECONDS``."""
    time.sleep(SLOW_CALL_SECONDS)
    return pad_wrap(*args, **kwargs)


def stalls_twice(*args, **kwargs):
    """Correct, but two of its calls take 3 s each (a loaded machine's stall, past the 2 s
    floor of a fast target's calibrated limit): its first two calls on a batch of 9 rows or
    more once its process has made 10 calls (the timeouts are calibrated by then). Kept in
    the folder ``KDA_FUZZ_TEST_STALL_DIR``, which outlives the processes that call it."""
    import os
    from pathlib import Path

    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    _calls[0] += 1
    rows = args[0].shape[0] if args[0].dim() >= 1 else 0
    where = Path(os.environ["KDA_FUZZ_TEST_STALL_DIR"])
    stalls = sorted(where.iterdir())
    if rows >= 9 and _calls[0] > 10 and len(stalls) < 2:
        (where / f"stall-{len(stalls)}").write_text(str(tuple(args[0].shape)))
        time.sleep(3.0)
    return reference_kda_packed_decode(*args, **kwargs)


def stalls_once_past_the_ceiling(*args, **kwargs):
    """Correct, but one call stalls for 4 s, past a ``--timeout 2``: its first call on a
    batch of 9 rows or more once its process has made 10 calls (a machine's stall: a
    library deadlocked in the process, a GPU shared with others), kept in the folder
    ``KDA_FUZZ_TEST_STALL_DIR`` so that the call's re-run in a fresh process returns."""
    import os
    from pathlib import Path

    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    _calls[0] += 1
    rows = args[0].shape[0] if args[0].dim() >= 1 else 0
    where = Path(os.environ["KDA_FUZZ_TEST_STALL_DIR"])
    if rows >= 9 and _calls[0] > 10 and not any(where.iterdir()):
        (where / "stall").write_text(str(tuple(args[0].shape)))
        time.sleep(4.0)
    return reference_kda_packed_decode(*args, **kwargs)


def compile_stalls_once(*args, **kwargs):
    """Correct, but its compiler stalls once for 4 s, past a ``--timeout 2`` (inside
    ``kda_fuzz.execution.compiles.compiling``, as a Triton or Helion compile would be): its
    first call on a batch of 9 rows or more once its process has made 10 calls, kept in
    ``KDA_FUZZ_TEST_STALL_DIR`` so that the call's re-run in a fresh process returns."""
    _compiler_stall(*args, again=False)
    return _reference()(*args, **kwargs)


def compile_never_returns_on_one_layout(*args, **kwargs):
    """Correct, but its compiler never returns on one layout (a compiler's deadlock): the
    first batch of 9 rows or more it sees once its process has made 10 calls, and every
    later call on that shape, in any process (the shape is kept in
    ``KDA_FUZZ_TEST_STALL_DIR``)."""
    _compiler_stall(*args, again=True)
    return _reference()(*args, **kwargs)


def _compiler_stall(*args, again: bool) -> None:
    import os
    from pathlib import Path

    from kda_fuzz.execution import compiles

    _calls[0] += 1
    rows = args[0].shape[0] if args[0].dim() >= 1 else 0
    shape = str((tuple(args[0].shape), tuple(args[4].shape)))
    mark = Path(os.environ["KDA_FUZZ_TEST_STALL_DIR"]) / "stall"
    if rows >= 9 and _calls[0] > 10 and not mark.exists():
        mark.write_text(shape)
        with compiles.compiling():
            time.sleep(4.0 if not again else 3600.0)
    elif again and mark.exists() and mark.read_text() == shape:
        with compiles.compiling():
            time.sleep(3600.0)


def _reference():
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    return reference_kda_packed_decode


_calls = [0]
