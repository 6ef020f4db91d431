"""Third-party-style kernels (``tests/foreign``) on CPU through ``_execution``'s hooks,
and the classification of CPU failures into environment errors vs. the kernel's own.

The foreign kernels are called exactly as the oracle calls a target (``target(*args)``,
no help from the project), in the default CPU mode, after ``configure_cpu()`` (which the
pytest plugin runs for each family, as the project's own kernels need it too). Numerics use
``check_kernel`` of ``test_kernels`` (float64 reference, same tolerances and semantic checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import helion
import helion.language as hl
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from helion.runtime.ref_mode import RefMode
from triton.language.extra import libdevice
from triton.language.extra.libdevice import j0, log1p

from kda_fuzz.execution import cpu as _execution
from kda_fuzz.execution.cpu import ExecutionEnvironmentError, environment_error
from tests.foreign import (
    helion_full_slice,
    helion_scalar_index,
    helion_unit_dims,
    triton_grid_stride,
    triton_row_program,
)
from tests.test_kernels import F32, Shape, check_kernel, make_case

BF16 = torch.bfloat16
FOREIGN = {
    "helion_scalar_index": helion_scalar_index.decode,
    "helion_full_slice": helion_full_slice.decode,
    "helion_unit_dims": helion_unit_dims.decode,
    "triton_row_program": triton_row_program.decode,
    "triton_grid_stride": triton_grid_stride.decode,
}
# (shape, state/activation dtype, index dtype, l2norm, lower_bound)
CASES = [
    (Shape(B=3, H=1, HV=2, K=8, V=8, slots=5, indices=(3, -1, 1)), F32, torch.int32, True, None),
    (Shape(B=2, H=2, HV=4, K=16, V=8, slots=3, indices=(2, 0)), F32, torch.int64, False, -5.0),
    (Shape(B=2, H=1, HV=2, K=8, V=16, slots=4, indices=(-1, 3)), BF16, torch.int32, True, None),
]


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # set, then removed: monkeypatch restores the variable after the test even when
    # configure_cpu sets it (a delenv of an absent variable records nothing)
    monkeypatch.setenv(_execution.ENV_VAR, _execution.DEFAULT_CPU_MODE)
    monkeypatch.delenv(_execution.ENV_VAR)


def _raised(fn: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}-{c[2]}-l2{c[3]:d}-lb{c[4]}")
@pytest.mark.parametrize("name", FOREIGN)
def test_foreign_kernel_matches_reference(name: str, case: tuple) -> None:
    shape, dtype, index_dtype, l2norm, lower_bound = case
    c = make_case(shape, state_dtype=dtype, act_dtype=dtype, index_dtype=index_dtype)
    check_kernel(FOREIGN[name], c, l2norm, lower_bound)


def test_size_one_dims_of_helion_code_are_the_cpu_paths_failure() -> None:
    """At B = H = HV = K = V = 1 (two slots) the Triton Helion generates for this correct
    kernel is refused by Triton's frontend under the interpreter: an environment error,
    never the kernel's (the oracle then counts the case as not executable on CPU)."""
    shape = Shape(B=1, H=1, HV=1, K=1, V=1, slots=2, indices=(1,))
    c = make_case(shape)
    e = _raised(lambda: helion_unit_dims.decode(*c.args(c.initial_state, c.out)))
    cause = environment_error(e)
    assert cause is not None and "code Helion generated" in cause, repr(e)
    wider = make_case(Shape(B=2, H=1, HV=2, K=2, V=2, slots=3, indices=(1, -1)))
    check_kernel(helion_unit_dims.decode, wider)  # it is correct where the path runs it


def test_foreign_triton_kernel_masks_non_pow2_heads() -> None:
    c = make_case(Shape(B=2, H=1, HV=2, K=12, V=20, slots=3, indices=(1, -1)))
    check_kernel(triton_row_program.decode, c, True, None)


# --- the eager-mode hazard ------------------------------------------------------------------


@helion.kernel(static_shapes=True, autotune_effort="none", ref_mode=RefMode.OFF)
def _diagonal_probe(
    state: torch.Tensor, w: torch.Tensor, indices: torch.Tensor, out: torch.Tensor
) -> None:
    """``out[i, h] = state[indices[i], h] @ w``, the pool read the way real kernels read it."""
    B, HV, V = out.shape
    K = hl.specialize(state.size(3))
    for i, hv in hl.grid([B, HV]):
        idx = indices[i]
        k_offsets = hl.arange(K)
        w_k = w[k_offsets]
        for tile_v in hl.tile(V):
            s = state[idx, hv, tile_v.index, k_offsets]
            out[i, hv, tile_v] = torch.sum(s * w_k[None, :], dim=1)


def _probe_args() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    state, w = torch.randn(3, 2, 8, 8, generator=g), torch.randn(8, generator=g)
    return state, w, torch.tensor([2, 0], dtype=torch.int32), torch.zeros(2, 2, 8)


def test_eager_mode_silently_reads_a_diagonal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why eager mode is refused to foreign kernels: it returns wrong numbers, no error
    (helion 1.4.0; spec section 6). The generated Triton gets the same load right."""
    args = _probe_args()
    state, w, indices, out = args
    expected = state[indices.long()] @ w
    _execution.run_helion(_diagonal_probe, args)
    torch.testing.assert_close(out, expected)
    monkeypatch.setenv(_execution.ENV_VAR, "eager")
    out.zero_()
    _execution.run_helion(_diagonal_probe, args)  # the project's own path: trusted, no error
    assert not torch.allclose(out, expected)  # ... which this pattern does not deserve


def test_eager_mode_refuses_foreign_helion_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_execution.ENV_VAR, "eager")
    e = _raised(lambda: _diagonal_probe(*_probe_args()))
    assert isinstance(e, ExecutionEnvironmentError)
    assert "eager" in str(e) and "diagonal" in str(e)
    assert environment_error(e) == f"ExecutionEnvironmentError: {e}"
    c = make_case(CASES[0][0])
    assert "diagonal" in (environment_error(_raised(lambda: check_kernel(
        helion_scalar_index.decode, c))) or "")


# --- environment errors vs. the kernel's own -------------------------------------------------


@triton.jit
def _probe_kernel(x, y, MODE: tl.constexpr):
    o = tl.arange(0, 8)
    v = tl.load(x + o)
    if MODE == 0:
        w = log1p(v.to(tl.float32))  # a libdevice stub imported by name, patched in
    elif MODE == 1:
        w = j0(v.to(tl.float32))  # a stub without a CPU body
    elif MODE == 2:
        w = libdevice.erfcinv(v.to(tl.float32))
    elif MODE == 3:
        w = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.float32,
                                      is_pure=True, pack=1)
    elif MODE == 4:
        w = v + v  # arithmetic on bfloat16 words
    elif MODE == 5:
        w = v.to(tl.float32).to(tl.bfloat16)  # a cast only: rounds to nearest even
    elif MODE == 6:
        tl.static_assert(MODE < 0, "the kernel's own assertion")
        w = v
    elif MODE == 8:
        w = libdevice.exp(v)  # a patched libdevice function, but on bfloat16 words
    else:
        w = v + tl.arange(0, 4)  # a shape error the GPU compiler reports too
    tl.store(y + o, w)


def _launch(mode: int, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    y = torch.zeros_like(x, dtype=out_dtype)
    _probe_kernel[(1,)](x, y, MODE=mode)
    return y


@pytest.mark.parametrize(("mode", "dtype", "cause"), [
    (1, F32, "libdevice.j0 has no implementation under the Triton interpreter"),
    (2, F32, "libdevice.erfcinv has no implementation"),
    (3, F32, "the Triton interpreter cannot run this kernel: NotImplementedError: inline_asm"),
    (4, BF16, "the Triton interpreter has no bfloat16 arithmetic"),
    (8, BF16, "libdevice.exp on bfloat16 values"),
])
def test_interpreter_gaps_are_environment_errors(mode: int, dtype: torch.dtype,
                                                 cause: str) -> None:
    e = _raised(lambda: _launch(mode, torch.rand(8).to(dtype)))
    assert cause in (environment_error(e) or ""), repr(e)


def test_stubs_imported_by_name_and_bf16_casts_work() -> None:
    x = torch.rand(8) * 3
    torch.testing.assert_close(_launch(0, x), torch.log1p(x))
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    x[:6] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-7 + 2**-9), float("inf"),
                          3.3895e38, 1e-40])  # ties to even, above a tie, overflow, subnormal
    assert torch.equal(_launch(5, x[:8], BF16).view(torch.int16),
                       x[:8].to(BF16).view(torch.int16))  # truncation would differ
    assert torch.equal(torch.from_numpy(_execution._f32_to_bf16(x.numpy()).view(np.int16)),
                       x.to(BF16).view(torch.int16))


@triton.autotune(configs=[triton.Config({"BS": 4}), triton.Config({"BS": 8})], key=["n"])
@triton.jit
def _autotuned(x, y, n, BS: tl.constexpr):
    o = tl.program_id(0) * BS + tl.arange(0, BS)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


def test_autotuned_triton_kernel_runs_its_first_config() -> None:
    """Benchmarking would need a GPU driver ('0 active drivers')."""
    x, y = torch.rand(10), torch.zeros(10)
    _autotuned[lambda meta: (triton.cdiv(10, meta["BS"]),)](x, y, 10)
    assert torch.equal(y, x * 2)


def _raise_runtime_error(*_: Any) -> None:
    raise RuntimeError("the wrapper's own failure")


@pytest.mark.parametrize("call", [
    lambda: _launch(6, torch.rand(8)),  # static assert, raised inside the interpreter
    lambda: _launch(7, torch.rand(8)),  # shape error in device code
    lambda: _raise_runtime_error(),
    lambda: triton_row_program.decode(*make_case(CASES[0][0]).args(
        torch.zeros(2, 8, 8), torch.zeros(3, 1, 2, 8))),  # its validator: a 3-D state
    lambda: torch.zeros(2, 3) @ torch.zeros(2, 3),  # its own torch code
], ids=["static-assert", "shape-error", "wrapper-raise", "validator", "torch"])
def test_kernel_errors_are_not_environment_errors(call: Callable[[], Any]) -> None:
    e = _raised(call)
    assert not isinstance(e, ExecutionEnvironmentError)
    assert environment_error(e) is None, repr(e)


def test_wrapping_an_environment_error_keeps_the_cause() -> None:
    def wrapper() -> None:
        try:
            _launch(1, torch.rand(8))
        except Exception as inner:
            raise RuntimeError("kernel launch failed") from inner

    assert "libdevice.j0" in (environment_error(_raised(wrapper)) or "")
