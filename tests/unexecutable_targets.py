"""Targets that the CPU execution machinery cannot run on some or all layouts (raised as
the machinery would: ``ExecutionEnvironmentError``), correct wherever they run."""

from __future__ import annotations

from kda_fuzz.execution.cpu import ExecutionEnvironmentError
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def gap_at_one_head(*args):
    """Correct, except that a layout of one value head is not executable here."""
    if args[6].dim() == 4 and args[6].shape[1] == 1:
        raise ExecutionEnvironmentError("the Triton interpreter cannot run this layout")
    return reference_kda_packed_decode(*args)


def never_runs(*args):
    """Never executable here."""
    raise ExecutionEnvironmentError("no interpreter for this kernel")
