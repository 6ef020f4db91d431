"""GPU targets with hard faults (for the isolation tests on a CUDA machine)."""

from __future__ import annotations

import torch
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


def reads_a_gate_on_the_host(*args):
    """The project's Triton kernel, after reading ``A_log[0]`` on the host first (a check
    that syncs): fine eagerly, but a CUDA graph cannot capture it."""
    from kda_fuzz_kernels.kda_decode import fused_recurrent_kda_packed_decode

    if args[3].numel() and float(args[3][0]) > 1e30:
        raise ValueError("A_log out of range")
    return fused_recurrent_kda_packed_decode(*args)


_gates: dict[int, torch.Tensor] = {}


def remembers_its_gates(*args):
    """The project's Triton kernel, but a call made while a CUDA graph captures uses the
    copy of ``A_log`` that the last eager call on the same buffer made (as a launcher that
    caches a prepared argument would): always right eagerly, stale when the graph is
    replayed on other values."""
    from kda_fuzz_kernels.kda_decode import fused_recurrent_kda_packed_decode

    a_log = args[3]
    if torch.cuda.is_current_stream_capturing():
        a_log = _gates.get(a_log.data_ptr(), a_log)
    else:
        _gates[a_log.data_ptr()] = a_log.clone()
    return fused_recurrent_kda_packed_decode(args[0], args[1], args[2], a_log, *args[4:])


@triton.jit
def _peek_indices(idx_ptr, scratch_ptr, B, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    got = tl.load(idx_ptr + offs, mask=offs < B + 4, other=0)  # four entries too many
    tl.store(scratch_ptr + offs, tl.where(offs < B, got, 0), mask=offs < B)


def reads_past_the_indices(*args):
    """Correct (the torch reference), but first launches a kernel that reads four entries
    past the end of ``ssm_state_indices`` and masks them out: invisible to a differential
    check, an invalid read under compute-sanitizer's memcheck."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    idx = args[8]
    if idx.device.type == "cuda" and idx.dim() == 1 and idx.numel():
        scratch = torch.empty_like(idx)
        _peek_indices[(1,)](idx, scratch, idx.numel(),
                            BLOCK=triton.next_power_of_2(idx.numel() + 4))
    return reference_kda_packed_decode(*args)


def faults_on_odd_heads(*args):
    """The torch reference, but an illegal memory access on layouts of an odd number of
    value heads, 3 or more (a fault that only some examples of a batch have)."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    out = args[7]
    if out.dim() == 4 and out.shape[2] >= 3 and out.shape[2] % 2 == 1:
        _store_far_away[(1,)](out)
        return out, args[6]
    return reference_kda_packed_decode(*args)
