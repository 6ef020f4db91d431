"""A Triton KDA decode (contract variant ``triton``) whose last step, an
``@triton.autotune`` kernel over ``out``, is right under its first config and wrong under
its second: blocks narrower than 8 lanes double the values they copy, as a tail path
written for wide blocks would. On CPU an autotuner runs its first config, so only
``--helion-configs`` (which also runs an autotuner's other declared configs) shows it; on
a GPU its autotuner may pick either (for a small ``out`` both are as fast)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kda_fuzz_kernels.kda_decode import fused_recurrent_kda_packed_decode


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 4})],
                 key=["n"], restore_value=["out_ptr"])  # (it benchmarks in place on a GPU)
@triton.jit
def _finish(out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(out_ptr + offsets, mask=mask)
    if BLOCK < 8:  # the planted bug
        x = x * 2
    tl.store(out_ptr + offsets, x, mask=mask)


def decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
           use_qk_l2norm_in_kernel=False, lower_bound=None):
    """The project's Triton decode, then an autotuned copy of ``out`` onto itself."""
    fused_recurrent_kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state,
                                      out, ssm_state_indices, use_qk_l2norm_in_kernel,
                                      lower_bound)
    if out.numel():
        flat = out.to(torch.float32).contiguous().view(-1)  # (values exact in float32)
        n = flat.numel()
        _finish[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](flat, n)
        out.copy_(flat.view_as(out))
    return out, initial_state
