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


@triton.jit
def _touch(ptr):
    tl.store(ptr + tl.program_id(1) * 0, 0.0, mask=tl.program_id(1) < 0)


def grid_y_rows_heads(*args):
    """Correct (the torch reference), but first launches a kernel with one program per row
    and value head on grid axis y, as real kernels of this contract did: past 65,535 the
    launch fails ("invalid argument"), a grid-limit fault only GPU-scale layouts reach."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    out = args[7]
    if out.dim() == 4 and out.numel():
        _touch[(1, out.shape[0] * out.shape[2])](out)
    return reference_kda_packed_decode(*args)
