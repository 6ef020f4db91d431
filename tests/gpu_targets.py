"""GPU targets with hard faults (for the isolation tests on a CUDA machine)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _store_far_away(ptr):
    tl.store(ptr + (1 << 40), 1.0)


def writes_out_of_bounds(*args):
    """Writes one float far outside `out`: an illegal memory access on the GPU."""
    out = args[7]
    _store_far_away[(1,)](out)
    return out, args[6]
