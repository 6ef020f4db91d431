"""CPU tests of the packed KDA decode kernels against the float64 torch reference.

Every numerics case also checks the contract's semantics: the caller's objects are
returned, padding rows are exact zeros over a NaN-filled ``out``, slots no row names
(and the padding between slots) are bit-identical, read-only inputs are unchanged.

Tolerances (kernel vs. ``reference_kda_packed_decode(compute_dtype=torch.float64)``, both
rounded to the output dtype): float32 atol = rtol = 1e-5; bfloat16 atol = rtol = 1e-2;
float16 atol = rtol = 2e-3. fp32 math in the kernel against fp64 math in the reference
leaves about 1e-6 relative on these sizes; the 16-bit budgets are a few ulps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from kda_fuzz.execution import cpu as _execution
from kda_fuzz_kernels.kda_decode import (
    fused_recurrent_kda_packed_decode,
    helion_fused_recurrent_kda_packed_decode,
    kda_packed_decode,
    reference_kda_packed_decode,
)

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]

TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@dataclasses.dataclass(frozen=True)
class Shape:
    B: int
    H: int
    HV: int
    K: int
    V: int
    slots: int
    indices: tuple[int, ...]


@dataclasses.dataclass
class Case:
    """Inputs built from wider tensors so that every strided layout is exercised."""

    qkv_base: torch.Tensor
    mixed_qkv: torch.Tensor
    a_base: torch.Tensor
    a: torch.Tensor
    b_base: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    pool: torch.Tensor  # the wider storage behind initial_state
    initial_state: torch.Tensor
    out: torch.Tensor
    indices: torch.Tensor
    scale: float

    def args(self, state: torch.Tensor, out: torch.Tensor) -> tuple:
        return (
            self.mixed_qkv,
            self.a,
            self.b,
            self.A_log,
            self.dt_bias,
            self.scale,
            state,
            out,
            self.indices,
        )


def make_case(
    s: Shape,
    state_dtype: torch.dtype = F32,
    act_dtype: torch.dtype = F32,
    index_dtype: torch.dtype = torch.int32,
    seed: int = 0,
    device: str = "cpu",
) -> Case:
    """Random inputs of ``s`` (drawn on CPU, so cases are the same on every device)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*size: int, std: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=g) * std).to(device)

    width = 2 * s.H * s.K + s.HV * s.V
    qkv_base = randn(s.B, width + 9).to(act_dtype)  # row stride > width
    a_base = randn(s.B, s.HV * s.K + 5, std=2.0)
    a_base[:, ::7] += 24.0  # some gate inputs beyond the softplus threshold of 20
    a_base = a_base.to(act_dtype)
    b_base = randn(s.B, s.HV + 3).to(act_dtype)
    n = s.HV * s.V * s.K
    pool = (randn(s.slots, n + 13) * 0.5).to(state_dtype)  # padded slot stride
    return Case(
        qkv_base=qkv_base,
        mixed_qkv=qkv_base[:, :width],
        a_base=a_base,
        a=a_base[:, : s.HV * s.K],
        b_base=b_base,
        b=b_base[:, : s.HV],
        A_log=randn(s.HV, std=0.5),
        dt_bias=randn(s.HV * s.K, std=0.5),
        pool=pool,
        initial_state=pool[:, :n].unflatten(1, (s.HV, s.V, s.K)),
        out=torch.full((s.B, 1, s.HV, s.V), float("nan"), dtype=act_dtype, device=device),
        indices=torch.tensor(s.indices, dtype=index_dtype, device=device),
        scale=s.K**-0.5,
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """A same-sized integer view of ``t`` for bitwise comparison (NaN == NaN there)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_kernel(
    kernel: Kernel,
    case: Case,
    l2norm: bool = False,
    lower_bound: float | None = None,
) -> None:
    ref_pool = case.pool.clone()
    ref_state = ref_pool[:, : math.prod(case.initial_state.shape[1:])].unflatten(
        1, case.initial_state.shape[1:]
    )
    ref_out = torch.empty_like(case.out)
    reference_kda_packed_decode(
        *case.args(ref_state, ref_out), l2norm, lower_bound, compute_dtype=torch.float64
    )
    read_only = {
        name: bits(getattr(case, name)).clone()
        for name in ("qkv_base", "a_base", "b_base", "A_log", "dt_bias", "indices")
    }
    pool_before = bits(case.pool).clone()

    result = kernel(*case.args(case.initial_state, case.out), l2norm, lower_bound)

    assert result[0] is case.out and result[1] is case.initial_state
    idx = case.indices.to(torch.long)
    pad = idx < 0
    assert torch.equal(case.out[pad], torch.zeros_like(case.out[pad]))
    torch.testing.assert_close(case.out, ref_out, **TOL[case.out.dtype])
    live = idx[~pad]
    torch.testing.assert_close(
        case.initial_state[live], ref_state[live], **TOL[case.initial_state.dtype]
    )
    untouched = torch.ones(case.pool.shape[0], dtype=torch.bool, device=case.pool.device)
    untouched[live] = False
    assert torch.equal(bits(case.pool)[untouched], pool_before[untouched])
    # the padding between slots belongs to no slot: it must survive too
    gap = math.prod(case.initial_state.shape[1:])
    assert torch.equal(bits(case.pool)[:, gap:], pool_before[:, gap:])
    for name, before in read_only.items():
        assert torch.equal(bits(getattr(case, name)), before), f"{name} was modified"


@pytest.fixture(params=_execution.CPU_MODES)
def helion_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(_execution.ENV_VAR, request.param)
    return request.param


# Every kernel once per CPU mode that changes how it runs (the Triton kernel has one).
KERNEL_MODES = [
    pytest.param((fused_recurrent_kda_packed_decode, "triton"), id="triton_kernel"),
    *(
        pytest.param((kernel, mode), id=f"{name}-{mode}")
        for name, kernel in (
            ("helion_kernel", helion_fused_recurrent_kda_packed_decode),
            ("dispatch", kda_packed_decode),
        )
        for mode in _execution.CPU_MODES
    ),
]
all_kernels = pytest.mark.parametrize("kernel", KERNEL_MODES, indirect=True)


@pytest.fixture
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Kernel:
    fn, mode = request.param
    monkeypatch.setenv(_execution.ENV_VAR, mode)
    return fn


UPSTREAM = Shape(B=3, H=2, HV=4, K=128, V=128, slots=7, indices=(5, -1, 2))

# (shape, state dtype, activation dtype, index dtype, l2norm, lower_bound)
TRITON_CASES = [
    (Shape(3, 2, 4, 12, 20, 7, (5, -1, 2)), F32, F32, torch.int32, True, None),
    (Shape(4, 1, 4, 12, 20, 6, (0, 5, -7, 3)), F32, F32, torch.int64, False, -5.0),
    (Shape(3, 4, 4, 20, 12, 5, (4, 1, -1)), BF16, BF16, torch.int32, True, -5.0),
    (Shape(5, 2, 4, 24, 10, 8, (-2, 7, 0, -1, 3)), F16, F16, torch.int64, False, None),
    (Shape(2, 2, 2, 96, 48, 3, (2, 0)), F32, BF16, torch.int32, True, None),
    (Shape(3, 1, 2, 5, 3, 4, (-1, -1, -100)), BF16, F32, torch.int64, False, None),
    (UPSTREAM, F32, F32, torch.int32, True, None),
]

# power-of-two K and V (contract variant helion)
HELION_CASES = [
    (Shape(3, 2, 4, 16, 32, 7, (5, -1, 2)), F32, F32, torch.int32, True, None),
    (Shape(4, 1, 4, 8, 16, 6, (0, 5, -7, 3)), BF16, BF16, torch.int64, False, -5.0),
    (Shape(3, 4, 4, 32, 8, 5, (4, 1, -1)), F16, F16, torch.int32, True, -5.0),
    (UPSTREAM, F32, F32, torch.int64, True, None),
]


def _case_id(p: tuple) -> str:
    s, sd, ad, xd, l2, lb = p
    dt = {F32: "f32", BF16: "bf16", F16: "f16", torch.int32: "i32", torch.int64: "i64"}
    return (
        f"B{s.B}H{s.H}HV{s.HV}K{s.K}V{s.V}-state_{dt[sd]}-act_{dt[ad]}-{dt[xd]}-l2{int(l2)}-lb{lb}"
    )


@pytest.mark.parametrize("params", TRITON_CASES, ids=_case_id)
def test_triton_kernel(params: tuple) -> None:
    shape, sd, ad, xd, l2, lb = params
    check_kernel(fused_recurrent_kda_packed_decode, make_case(shape, sd, ad, xd), l2, lb)


@pytest.mark.parametrize("params", HELION_CASES, ids=_case_id)
def test_helion_kernel(params: tuple, helion_mode: str) -> None:
    shape, sd, ad, xd, l2, lb = params
    check_kernel(helion_fused_recurrent_kda_packed_decode, make_case(shape, sd, ad, xd), l2, lb)


@pytest.mark.parametrize(
    "params", [TRITON_CASES[0], TRITON_CASES[2], HELION_CASES[0], HELION_CASES[1]], ids=_case_id
)
def test_dispatcher(params: tuple, helion_mode: str) -> None:
    shape, sd, ad, xd, l2, lb = params
    check_kernel(kda_packed_decode, make_case(shape, sd, ad, xd), l2, lb)


@all_kernels
def test_gqa_ratios_share_query_heads(kernel: Kernel) -> None:
    """Value head hv reads q/k head hv // (HV // H) for ratios 1, 2 and 4."""
    for H in (4, 2, 1):
        case = make_case(Shape(2, H, 4, 8, 8, 3, (2, 0)), seed=H)
        check_kernel(kernel, case, l2norm=True)


@pytest.mark.parametrize("kernel", KERNEL_MODES[:3], indirect=True)
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_16bit_outputs_round_like_a_gpu(kernel: Kernel, dtype: torch.dtype) -> None:
    """A 16-bit state/out must equal the fp32 run rounded by torch (round-to-nearest-even).

    Guards the interpreter's truncating float32 -> bfloat16 cast (see ``_execution``).
    """
    case = make_case(Shape(3, 2, 4, 16, 16, 5, (4, -1, 1)), dtype, dtype, seed=3)
    f32_state = case.initial_state.to(F32)
    f32_out = torch.empty(case.out.shape, dtype=F32)
    kernel(*case.args(f32_state, f32_out), True, None)
    kernel(*case.args(case.initial_state, case.out), True, None)
    live = case.indices[case.indices >= 0].long()
    assert torch.equal(bits(case.out), bits(f32_out.to(dtype)))
    assert torch.equal(bits(case.initial_state[live]), bits(f32_state[live].to(dtype)))


@all_kernels
def test_empty_batch_is_a_noop(kernel: Kernel) -> None:
    case = make_case(Shape(0, 2, 4, 8, 8, 3, ()))
    pool_before = bits(case.pool).clone()
    result = kernel(*case.args(case.initial_state, case.out))
    assert result[0] is case.out and result[1] is case.initial_state
    assert torch.equal(bits(case.pool), pool_before)


def _raised(fn: Callable[[], object]) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize("K, V", [(12, 20), (16, 8)])
def test_dispatcher_errors_match_triton_variant(K: int, V: int) -> None:
    """Broken layouts raise the triton variant's error; never the power-of-two one."""
    case = make_case(Shape(2, 2, 4, K, V, 3, (2, 0)))
    bad_a = case.a_base[:, : 4 * K - 1]
    for args in (
        (case.mixed_qkv, bad_a, *case.args(case.initial_state, case.out)[2:]),
        (*case.args(case.initial_state, case.out)[:7], case.out[:, 0], case.indices),
        (*case.args(case.initial_state, case.out)[:8], case.indices[:1]),
        case.args(case.pool[0], case.out),  # 1-D state: no (V, K) to dispatch on
        case.args(case.initial_state[0], case.out),  # 3-D state, pow2 tail
    ):
        expected = _raised(lambda a=args: fused_recurrent_kda_packed_decode(*a))
        assert _raised(lambda a=args: kda_packed_decode(*a)) == expected
        assert "power-of-two" not in expected


@all_kernels
@pytest.mark.parametrize(
    "shape",
    [Shape(1, 1, 1, 1, 1, 1, (0,)), Shape(3, 1, 2, 4, 2, 0, (-1, -1, -1))],
    ids=["K1V1", "no-slots-all-padding"],
)
def test_degenerate_shapes(kernel: Kernel, shape: Shape) -> None:
    check_kernel(kernel, make_case(shape, BF16, BF16, torch.int64), l2norm=True)


@all_kernels
def test_out_of_range_index_never_touches_the_pool(kernel: Kernel) -> None:
    """Not in the contract (a known hole): our kernels treat idx >= num_slots as padding."""
    case = make_case(Shape(3, 2, 4, 8, 8, 4, (2, 4, 1000)), BF16, BF16)
    pool_before = bits(case.pool).clone()
    kernel(*case.args(case.initial_state, case.out), True, None)
    assert torch.equal(case.out[1:], torch.zeros_like(case.out[1:]))
    assert not case.out[0].isnan().any()
    untouched = torch.tensor([True, True, False, True])
    assert torch.equal(bits(case.pool)[untouched], pool_before[untouched])


def test_non_pow2_goes_to_triton_and_helion_refuses_it() -> None:
    case = make_case(Shape(2, 2, 4, 12, 20, 3, (2, 0)))
    msg = _raised(
        lambda: helion_fused_recurrent_kda_packed_decode(*case.args(case.initial_state, case.out))
    )
    assert (
        msg == "Helion KDA decode requires power-of-two key and value head dimensions "
        "(got K=12, V=20)."
    )
    check_kernel(kda_packed_decode, case)


def test_cpu_mode_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    # set, then removed: monkeypatch restores the variable after the test even when
    # configure_cpu sets it (a delenv of an absent variable records nothing)
    monkeypatch.setenv(_execution.ENV_VAR, _execution.DEFAULT_CPU_MODE)
    monkeypatch.delenv(_execution.ENV_VAR)
    assert _execution.cpu_mode() == _execution.DEFAULT_CPU_MODE == "triton"
    monkeypatch.setenv(_execution.ENV_VAR, "bogus")
    with pytest.raises(ValueError, match="KDA_FUZZ_CPU_MODE"):
        _execution.cpu_mode()
    assert _execution.configure_cpu("eager") == "eager"
    with pytest.raises(ValueError):
        _execution.configure_cpu("interpreted")  # type: ignore[arg-type]


def test_helion_interpret_env_maps_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """HELION_INTERPRET=1 next to TRITON_INTERPRET=1 is resolved, and kernels still run."""
    # set, then removed: monkeypatch restores the variable after the test even when
    # configure_cpu sets it (a delenv of an absent variable records nothing)
    monkeypatch.setenv(_execution.ENV_VAR, _execution.DEFAULT_CPU_MODE)
    monkeypatch.delenv(_execution.ENV_VAR)
    monkeypatch.setenv("HELION_INTERPRET", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _execution.configure_cpu() == "eager"
    assert "HELION_INTERPRET" not in os.environ
    check_kernel(
        helion_fused_recurrent_kda_packed_decode, make_case(Shape(2, 2, 4, 8, 8, 3, (2, -1)))
    )


def test_a_script_runs_the_kernels_on_cpu_without_setting_anything_up() -> None:
    """The kernels are a plain package (they install no CPU hooks of their own): in a
    script (no pytest plugin, no command line) the oracle sets CPU execution up before its
    first CPU case, so the Triton and Helion kernels run there as under the front ends."""
    code = (
        "import kda_fuzz\n"
        "from kda_fuzz.families.kda.layouts import KdaLayout, build\n"
        "case = build(KdaLayout(B=2, H=1, HV=1, K=4, V=4, seed=0), 'helion')\n"
        "for name in ('fused_recurrent_kda_packed_decode',\n"
        "             'helion_fused_recurrent_kda_packed_decode'):\n"
        "    print(kda_fuzz.check('kda_fuzz_kernels.kda_decode:' + name, case))\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "HELION_INTERPRET", _execution.ENV_VAR)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"], done.stdout + done.stderr
