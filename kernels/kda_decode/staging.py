"""bf16 outputs staged through float32 scratch for launches on CPU tensors.

A Triton kernel run on CPU tensors runs under the Triton interpreter, whose stock cast of
float32 to bfloat16 truncates; staging lets torch do the final cast, rounding to nearest
even as the GPU does. Shared by the packed decode kernels of this package and of
``kda_fuzz_kernels.gdn_decode``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def stage_bf16_outputs(
    out: torch.Tensor, state: torch.Tensor, indices: torch.Tensor, enabled: bool = True
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(out, state)`` to launch on, staging bf16 ones through float32 scratch.

    The state scratch keeps the pool's strides (so stride handling stays exercised) and
    only the slots named by an in-range index travel in and out; other slots stay
    bit-identical. With ``enabled=False`` (compiled GPU launches) the caller's tensors are
    yielded as they are.
    """
    stage_out = enabled and out.dtype == torch.bfloat16
    stage_state = enabled and state.dtype == torch.bfloat16
    if not (stage_out or stage_state):
        yield out, state
        return
    out_k = torch.empty(out.shape, dtype=torch.float32) if stage_out else out
    state_k, slots = state, None
    if stage_state:
        state_k = torch.empty_strided(state.shape, state.stride(), dtype=torch.float32)
        slots = indices[(indices >= 0) & (indices < state.shape[0])].to(torch.long)
        state_k[slots] = state[slots].to(torch.float32)
    yield out_k, state_k
    if stage_out:
        out.copy_(out_k)
    if slots is not None:
        state[slots] = state_k[slots].to(torch.bfloat16)
