"""CPU tests of the packed GDN decode kernels against the float64 torch reference.

Every numerics case also checks the contract's semantics: the caller's objects are
returned, padding rows are exact zeros over a NaN-filled ``out``, slots no row names
(and the padding between slots) are bit-identical, read-only inputs are unchanged.
Then every documented check, one test each, with its exact message and its place in
the order; the hardened rejections of degenerate sizes; and a sanity check that each
planted bug of ``tests/gdn_mutants.py`` is observable.

Tolerances (kernel vs. ``reference_gdn_packed_decode(compute_dtype=torch.float64)``,
both rounded to the output dtype), as for KDA: float32 atol = rtol = 1e-5; bfloat16
1e-2; float16 2e-3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from kda_fuzz.execution import cpu as _execution
from kda_fuzz_kernels.gdn_decode import (
    fused_recurrent_gated_delta_rule_packed_decode,
    gdn_packed_decode,
    helion_fused_recurrent_gated_delta_rule_packed_decode,
    reference_gdn_packed_decode,
    validate_gdn_packed_decode_inputs,
)
from tests import gdn_mutants

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]

TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
I32, I64 = torch.int32, torch.int64


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
    """Inputs cut from wider tensors: padded row strides of ``mixed_qkv``, ``a`` and
    ``b``, and a padded slot stride of the state pool."""

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

    def args(self, state: torch.Tensor | None = None, out: torch.Tensor | None = None) -> list:
        return [self.mixed_qkv, self.a, self.b, self.A_log, self.dt_bias, self.scale,
                self.initial_state if state is None else state,
                self.out if out is None else out, self.indices]


def make_case(s: Shape, state_dtype: torch.dtype = F32, act_dtype: torch.dtype = F32,
              index_dtype: torch.dtype = I32, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)

    def randn(*size: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(*size, generator=g) * std

    width = 2 * s.H * s.K + s.HV * s.V
    qkv_base = randn(s.B, width + 9).to(act_dtype)  # row stride > width
    a_base = randn(s.B, s.HV + 5, std=2.0)
    a_base[:, ::3] += 24.0  # some gate inputs beyond the softplus threshold of 20
    a_base = a_base.to(act_dtype)
    b_base = randn(s.B, s.HV + 3).to(act_dtype)
    n = s.HV * s.V * s.K
    pool = (randn(s.slots, n + 13) * 0.5).to(state_dtype)  # padded slot stride
    return Case(
        qkv_base=qkv_base,
        mixed_qkv=qkv_base[:, :width],
        a_base=a_base,
        a=a_base[:, : s.HV],
        b_base=b_base,
        b=b_base[:, : s.HV],
        A_log=randn(s.HV, std=0.5),
        dt_bias=randn(s.HV, std=0.5),
        pool=pool,
        initial_state=pool[:, :n].unflatten(1, (s.HV, s.V, s.K)),
        out=torch.full((s.B, 1, s.HV, s.V), float("nan"), dtype=act_dtype),
        indices=torch.tensor(s.indices, dtype=index_dtype),
        scale=s.K**-0.5,
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """A same-sized integer view of ``t`` for bitwise comparison (NaN == NaN there)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_kernel(kernel: Kernel, case: Case, l2norm: bool = False) -> None:
    n = math.prod(case.initial_state.shape[1:])
    ref_pool = case.pool.clone()
    ref_state = ref_pool[:, :n].unflatten(1, case.initial_state.shape[1:])
    ref_out = torch.empty_like(case.out)
    reference_gdn_packed_decode(*case.args(ref_state, ref_out), l2norm,
                                compute_dtype=torch.float64)
    read_only = {name: bits(getattr(case, name)).clone()
                 for name in ("qkv_base", "a_base", "b_base", "A_log", "dt_bias", "indices")}
    pool_before = bits(case.pool).clone()

    result = kernel(*case.args(), l2norm)

    assert result[0] is case.out and result[1] is case.initial_state
    idx = case.indices.to(torch.long)
    pad = idx < 0
    assert torch.equal(bits(case.out[pad]), bits(torch.zeros_like(case.out[pad])))
    torch.testing.assert_close(case.out, ref_out, **TOL[case.out.dtype])
    live = idx[~pad]
    torch.testing.assert_close(case.initial_state[live], ref_state[live],
                               **TOL[case.initial_state.dtype])
    untouched = torch.ones(case.pool.shape[0], dtype=torch.bool)
    untouched[live] = False
    assert torch.equal(bits(case.pool)[untouched], pool_before[untouched])
    assert torch.equal(bits(case.pool)[:, n:], pool_before[:, n:])  # gaps between slots
    for name, before in read_only.items():
        assert torch.equal(bits(getattr(case, name)), before), f"{name} was modified"


TRITON = fused_recurrent_gated_delta_rule_packed_decode
HELION = helion_fused_recurrent_gated_delta_rule_packed_decode


@pytest.fixture(params=_execution.CPU_MODES)
def helion_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(_execution.ENV_VAR, request.param)
    return request.param


# (shape, state dtype, activation dtype, index dtype, l2norm)
TRITON_CASES = [
    (Shape(3, 2, 4, 12, 20, 7, (5, -1, 2)), F32, F32, I32, True),  # GQA 2, non-pow2 K, V
    (Shape(4, 1, 4, 12, 20, 6, (0, 5, -7, 3)), F32, F32, I64, False),  # GQA 4
    (Shape(3, 4, 4, 20, 12, 5, (4, 1, -1)), BF16, BF16, I32, True),
    (Shape(5, 2, 4, 24, 10, 8, (-2, 7, 0, -1, 3)), F16, F16, I64, False),
    (Shape(2, 2, 2, 96, 48, 3, (2, 0)), F32, BF16, I32, True),
    (Shape(3, 1, 2, 5, 3, 4, (-1, -1, -100)), BF16, F32, I64, False),  # padding only
    (Shape(3, 2, 4, 128, 128, 7, (5, -1, 2)), F32, F32, I32, True),  # SGLang's shape
]
# power-of-two K and V (contract variant helion)
HELION_CASES = [
    (Shape(3, 2, 4, 16, 32, 7, (5, -1, 2)), F32, F32, I32, True),
    (Shape(4, 1, 4, 8, 16, 6, (0, 5, -7, 3)), BF16, BF16, I64, False),
    (Shape(3, 4, 4, 32, 8, 5, (4, 1, -1)), F16, F16, I32, True),
    (Shape(2, 2, 4, 4, 4, 3, (1, 2)), F32, F16, I64, False),
]


def _case_id(p: tuple) -> str:
    s, sd, ad, xd, l2 = p
    dt = {F32: "f32", BF16: "bf16", F16: "f16", I32: "i32", I64: "i64"}
    return f"B{s.B}H{s.H}HV{s.HV}K{s.K}V{s.V}-state_{dt[sd]}-act_{dt[ad]}-{dt[xd]}-l2{int(l2)}"


@pytest.mark.parametrize("params", TRITON_CASES, ids=_case_id)
def test_triton_kernel(params: tuple) -> None:
    shape, sd, ad, xd, l2 = params
    check_kernel(TRITON, make_case(shape, sd, ad, xd), l2)


@pytest.mark.parametrize("params", HELION_CASES, ids=_case_id)
def test_helion_kernel(params: tuple, helion_mode: str) -> None:
    shape, sd, ad, xd, l2 = params
    check_kernel(HELION, make_case(shape, sd, ad, xd), l2)


@pytest.mark.parametrize("params", [TRITON_CASES[0], HELION_CASES[1]], ids=_case_id)
def test_dispatcher(params: tuple) -> None:
    shape, sd, ad, xd, l2 = params
    check_kernel(gdn_packed_decode, make_case(shape, sd, ad, xd), l2)


@pytest.mark.parametrize("kernel", [TRITON, HELION], ids=["triton", "helion"])
def test_gqa_ratios_and_gates_per_value_head(kernel: Kernel) -> None:
    """Value head hv reads q/k head hv // (HV // H) and its own gate, for ratios 1, 2, 4."""
    for H in (4, 2, 1):
        check_kernel(kernel, make_case(Shape(2, H, 4, 8, 8, 3, (2, 0)), seed=H), l2norm=True)


def test_helion_int64_index_twin(helion_mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 64-bit-index kernel (picked for views past 2^31 elements) computes the same."""
    from kda_fuzz_kernels.gdn_decode import helion_kernel

    monkeypatch.setattr(helion_kernel, "INT32_REACH", 0)
    launched = []
    run = _execution.run_helion  # (how the hooks run the project's own Helion kernels)
    monkeypatch.setattr(_execution, "run_helion",
                        lambda k, args: launched.append(k) or run(k, args))
    check_kernel(HELION, make_case(HELION_CASES[0][0]), l2norm=True)
    assert launched == [helion_kernel.gdn_packed_decode_kernel_i64]


@pytest.mark.parametrize("kernel", [TRITON, HELION], ids=["triton", "helion"])
def test_empty_batch_is_a_noop(kernel: Kernel) -> None:
    case = make_case(Shape(0, 2, 4, 8, 8, 3, ()))
    pool_before = bits(case.pool).clone()
    result = kernel(*case.args())
    assert result[0] is case.out and result[1] is case.initial_state
    assert torch.equal(bits(case.pool), pool_before)


@pytest.mark.parametrize("kernel", [TRITON, HELION], ids=["triton", "helion"])
def test_out_of_range_index_never_touches_the_pool(kernel: Kernel) -> None:
    """Not in the contract (a known hole): our kernels treat idx >= num_slots as padding."""
    case = make_case(Shape(3, 2, 4, 8, 8, 4, (2, 4, 1000)), BF16, BF16)
    pool_before = bits(case.pool).clone()
    kernel(*case.args(), True)
    assert torch.equal(case.out[1:], torch.zeros_like(case.out[1:]))
    assert not case.out[0].isnan().any()
    untouched = torch.tensor([True, True, False, True])
    assert torch.equal(bits(case.pool)[untouched], pool_before[untouched])


# ------------------------------------------------------------------- validation

# B=3, H=2, HV=4, K=8, V=4: mixed_qkv width 2*2*8 + 4*4 = 48
BASE = Shape(3, 2, 4, 8, 4, 5, (4, -1, 1))
VALIDATORS = {
    "validate_triton": lambda *a: validate_gdn_packed_decode_inputs(*a[:5], *a[6:9], "triton"),
    "validate_helion": lambda *a: validate_gdn_packed_decode_inputs(*a[:5], *a[6:9], "helion"),
    "reference": reference_gdn_packed_decode,
    "triton": TRITON,
    "helion": HELION,
    "dispatch": gdn_packed_decode,
}
ALL_TARGETS = list(VALIDATORS)
POW2_ONLY = ["validate_helion", "helion"]


def _set(args: list, **changes: torch.Tensor) -> list:
    names = ["mixed_qkv", "a", "b", "A_log", "dt_bias", "scale", "initial_state", "out",
             "indices"]
    return [changes.get(n, v) for n, v in zip(names, args)]


def _break(check: str, case: Case, args: list) -> list:
    """``args`` with the one thing broken that check ``check`` rejects."""
    s = BASE
    width = 2 * s.H * s.K + s.HV * s.V
    if check == "1":
        return _set(args, mixed_qkv=case.mixed_qkv.unsqueeze(0))
    if check == "2":
        return _set(args, mixed_qkv=torch.randn(s.B, 2 * width)[:, ::2])
    if check == "3":
        return _set(args, a=case.a.unsqueeze(0))
    if check == "4":
        return _set(args, b=torch.randn(s.B, 2 * s.HV)[:, ::2])
    if check == "5":
        return _set(args, A_log=case.A_log.unsqueeze(0))
    if check == "6":
        return _set(args, A_log=torch.randn(2 * s.HV)[::2])
    if check == "7":
        return _set(args, indices=case.indices.unsqueeze(0))
    if check == "8":
        return _set(args, out=torch.zeros(s.B, 1, s.V, s.HV).transpose(2, 3))
    if check == "9":
        return _set(args, a=case.a.to("meta"))
    if check == "10":
        return _set(args, a=case.a[:2])
    if check == "11":
        return _set(args, indices=case.indices[:2])
    if check == "12":
        return _set(args, initial_state=case.initial_state[0])
    if check == "13":
        st = torch.zeros(s.slots, s.HV, s.V, 2 * s.K)[..., ::2]
        return _set(args, initial_state=st)
    if check == "ab":
        return _set(args, b=case.b_base[:, : s.HV + 1])
    if check == "alog":
        return _set(args, dt_bias=torch.randn(s.HV + 1))
    if check == "19":
        return _set(args, out=torch.zeros(s.B, 1, s.HV, s.V + 1))
    if check == "20":
        return _set(args, mixed_qkv=case.qkv_base[:, : width + 1])
    if check == "21":
        return _set(args, mixed_qkv=case.qkv_base[:, : width + 2])
    if check == "22":  # H = 3 does not divide HV = 4
        return _set(args, mixed_qkv=torch.randn(s.B, 2 * 3 * s.K + s.HV * s.V))
    raise AssertionError(check)


# The spec's messages, typed out for BASE and the breakages above.
MESSAGES = {
    "1": "`mixed_qkv` must be a 2D tensor (got ndim=3).",
    "2": "`mixed_qkv` must be contiguous in the last dim.",
    "3": "`a` and `b` must be 2D tensors (got a.ndim=3, b.ndim=2).",
    "4": "`a`/`b` must be contiguous in the last dim.",
    "5": "`A_log`/`dt_bias` must be 1D tensors.",
    "6": "`A_log`/`dt_bias` must be contiguous.",
    "7": "`ssm_state_indices` must be 1D for packed decode (got ndim=2).",
    "8": "`out` must be contiguous.",
    "9": "All inputs must be on the same device.",
    "10": "Mismatched batch sizes: mixed_qkv.shape[0]=3, a.shape[0]=2, b.shape[0]=3.",
    "11": "`ssm_state_indices` must have shape [B] (got (2,); expected (3,)).",
    "12": "`initial_state` must be a 4D tensor (got ndim=3).",
    "13": "`initial_state` must be contiguous in the last dim.",
    "ab": "`a`/`b` must have shape [B, HV] with HV=4 (got a.shape=(3, 4), b.shape=(3, 5)).",
    "alog": "`A_log` and `dt_bias` must have 4 elements (got A_log.numel()=4, "
            "dt_bias.numel()=5).",
    "19": "`out` must have shape (3, 1, 4, 4) (got out.shape=(3, 1, 4, 5)).",
    "20": "Invalid packed `mixed_qkv` last dim=49 for HV=4, V=4.",
    "21": "Invalid packed Q size 17: must be divisible by K=8.",
    "22": "Invalid head config inferred from mixed_qkv: H=3, HV=4.",
}
ORDER = list(MESSAGES)
# For each check, a later check broken at the same time that it must win over (the first
# failing check wins); checks 20-22 exclude one another.
LATER = {c: "alog" for c in ORDER[: ORDER.index("ab") + 1]} | {"alog": "19", "19": "20"}


def _raised(fn: Callable[[], object]) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


@pytest.mark.parametrize("target", ALL_TARGETS)
@pytest.mark.parametrize("check", ORDER)
def test_documented_check_message(check: str, target: str) -> None:
    case = make_case(BASE)
    fn = VALIDATORS[target]
    args = _break(check, case, case.args())
    assert _raised(lambda: fn(*args)) == MESSAGES[check]
    if check in LATER:  # order: with a later check failing too, this one still wins
        both = _break(check, case, _break(LATER[check], case, case.args()))
        assert _raised(lambda: fn(*both)) == MESSAGES[check]


POW2_MESSAGE = ("Helion GDN decode requires power-of-two key and value head dimensions "
                "(got K=12, V=4).")


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_power_of_two_check_is_helion_only_and_after_check_13(target: str) -> None:
    s = dataclasses.replace(BASE, K=12)
    case = make_case(s)
    fn = VALIDATORS[target]
    broken_13 = _set(case.args(), initial_state=torch.zeros(5, 4, 4, 24)[..., ::2])
    assert _raised(lambda: fn(*broken_13)) == MESSAGES["13"]
    broken_ab = _set(case.args(), b=case.b_base[:, :5])
    expected_ab = MESSAGES["ab"]
    if target in POW2_ONLY:
        assert _raised(lambda: fn(*case.args())) == POW2_MESSAGE
        assert _raised(lambda: fn(*broken_ab)) == POW2_MESSAGE
    else:
        assert _raised(lambda: fn(*broken_ab)) == expected_ab
        fn(*case.args())  # triton variant: K = 12 is valid


def _zero_case(which: str) -> list:
    """A layout with K, V or HV of 0 that reaches checks 20-21."""
    B, H, HV, K, V, S = 2, 2, 4, 4, 4, 3
    if which == "K":
        K, width = 0, HV * V + 2  # q_dim = 1, then 1 % 0
    elif which == "V":
        V, width = 0, 2 * H * K
    else:
        HV, width = 0, 2 * H * K
    return [torch.randn(B, width), torch.randn(B, HV), torch.randn(B, HV), torch.randn(HV),
            torch.randn(HV), 1.0, torch.zeros(S, HV, V, K), torch.zeros(B, 1, HV, V),
            torch.tensor([0, -1], dtype=I32)]


@pytest.mark.parametrize("target", ALL_TARGETS)
@pytest.mark.parametrize("which", ["K", "V", "HV"])
def test_hardened_contract_rejects_degenerate_sizes(which: str, target: str) -> None:
    args = _zero_case(which)
    msg = _raised(lambda: VALIDATORS[target](*args))
    if target in POW2_ONLY and which != "HV":
        assert msg.startswith("Helion GDN decode requires power-of-two")
    elif which == "K":
        assert msg == "Invalid packed Q size 1: must be divisible by K=0."
    else:
        HV, V = (0, 4) if which == "HV" else (4, 0)
        assert msg == f"Invalid packed `mixed_qkv` last dim=16 for HV={HV}, V={V}."


def test_documented_contract_keeps_upstream_holes() -> None:
    """``hardened=False``: the documented checks only, as upstream (spec section 2)."""
    def documented(args: list) -> tuple[int, ...]:
        return validate_gdn_packed_decode_inputs(*args[:5], *args[6:9], "triton",
                                                 hardened=False)

    assert documented(_zero_case("HV")) == (2, 2, 0, 4, 4)
    assert documented(_zero_case("V")) == (2, 2, 4, 4, 0)
    with pytest.raises(ZeroDivisionError):
        documented(_zero_case("K"))


def test_non_pow2_goes_to_triton_and_helion_refuses_it() -> None:
    case = make_case(Shape(2, 2, 4, 12, 20, 3, (2, 0)))
    msg = _raised(lambda: HELION(*case.args()))
    assert msg == ("Helion GDN decode requires power-of-two key and value head dimensions "
                   "(got K=12, V=20).")
    check_kernel(gdn_packed_decode, case)


# ------------------------------------------------------------- planted bugs


@pytest.mark.parametrize("name", gdn_mutants.NUMERIC_BUGS)
def test_planted_numeric_bug_is_observable(name: str) -> None:
    """On a GQA layout with padding and l2norm (small q/k norms for the epsilon bug),
    each numeric mutant fails ``check_kernel`` and its correct twins pass."""
    def case() -> Case:
        c = make_case(Shape(3, 2, 4, 8, 4, 5, (4, -1, 1)), seed=7)
        c.qkv_base[:, : 2 * 2 * 8] *= 1e-3
        return c

    for twin in (gdn_mutants.correct_triton, gdn_mutants.correct_helion,
                 gdn_mutants.documented_triton):
        check_kernel(twin, case(), True)
    with pytest.raises(AssertionError):
        check_kernel(gdn_mutants.MUTANTS[name], case(), True)


def test_planted_contract_bugs_are_observable() -> None:
    case = make_case(BASE)
    both = _break("ab", case, _break("alog", case, case.args()))
    assert _raised(lambda: gdn_mutants.correct_triton(*both)) == MESSAGES["ab"]
    assert _raised(lambda: gdn_mutants.swap_ab_alog_checks(*both)) == MESSAGES["alog"]
    bad_q = _break("21", case, case.args())
    assert _raised(lambda: gdn_mutants.correct_triton(*bad_q)) == MESSAGES["21"]
    assert _raised(lambda: gdn_mutants.kda_check_21_message(*bad_q)) == (
        MESSAGES["21"] + gdn_mutants.KDA_21_TAIL)
