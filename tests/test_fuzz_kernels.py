"""Property-based fuzz tests of the project's kernels (profile ``ci`` on CPU, ``gpu`` on CUDA)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kda_fuzz.engine.case import Case
from kda_fuzz.engine.oracle import run_case
from kda_fuzz.engine.targets import default_targets
from kda_fuzz.families import get_contract

KDA = get_contract("kda")
# CPU interpreters are slow: keep valid layouts small there (B*HV*V*K elements).
CPU_BUDGET = 1 << 13
GPU_BUDGET = 1 << 22

TARGETS = [(v, t.name.split(":")[1], t.fn) for v in KDA.variants
           for t in default_targets(KDA, v)]


def _check(case: Case, fn, device: str) -> None:
    out = run_case(KDA, case, fn)
    assert out.status != "fail", f"{out.verdict.summary()}\nlayout: {case.describe()}"


@pytest.mark.slow  # a long campaign: the slow tier
@pytest.mark.parametrize("variant,name,fn", TARGETS, ids=[f"{v}-{n}" for v, n, _ in TARGETS])
def test_kernel_valid_layouts(variant: str, name: str, fn) -> None:
    @given(KDA.valid_cases(variant, budget=CPU_BUDGET, max_b=64, max_bhv=32))
    def fuzz(case: Case) -> None:
        _check(case, fn, "cpu")

    fuzz()


@pytest.mark.parametrize("variant,name,fn", TARGETS, ids=[f"{v}-{n}" for v, n, _ in TARGETS])
def test_kernel_broken_layouts(variant: str, name: str, fn) -> None:
    arms = [only for _, only in KDA.broken_arms(variant)]

    @given(st.sampled_from(arms).flatmap(lambda o: KDA.broken_cases(variant, only=o)))
    def fuzz(case: Case) -> None:
        _check(case, fn, "cpu")

    fuzz()


FAMILIES = 4  # compile families per target on the GPU (see kda_fuzz.campaign.plan)


@pytest.mark.gpu
@pytest.mark.parametrize("family", range(FAMILIES))
@pytest.mark.parametrize("variant,name,fn", TARGETS, ids=[f"{v}-{n}" for v, n, _ in TARGETS])
def test_kernel_valid_layouts_gpu(variant: str, name: str, fn, family: int,
                                  kda_device_name: str) -> None:
    """Layouts built on the GPU, B bucketed up to 4096, one compile family per test."""
    fam = KDA.families(variant, FAMILIES, seed=0, budget=GPU_BUDGET)[family]

    @given(KDA.valid_cases(variant, device=kda_device_name, budget=GPU_BUDGET, max_b=4096,
                           bucket=True, family=fam))
    def fuzz(case: Case) -> None:
        _check(case, fn, kda_device_name)

    fuzz()


@pytest.mark.gpu
@pytest.mark.parametrize("variant,name,fn", TARGETS, ids=[f"{v}-{n}" for v, n, _ in TARGETS])
def test_kernel_broken_layouts_gpu(variant: str, name: str, fn, kda_device_name: str) -> None:
    arms = [only for _, only in KDA.broken_arms(variant)]

    @given(st.sampled_from(arms).flatmap(
        lambda o: KDA.broken_cases(variant, only=o, device=kda_device_name)))
    def fuzz(case: Case) -> None:
        _check(case, fn, kda_device_name)

    fuzz()


@pytest.mark.gpu
@pytest.mark.parametrize("variant,name,fn", TARGETS, ids=[f"{v}-{n}" for v, n, _ in TARGETS])
def test_kernel_large_batch_and_head_dims_gpu(variant: str, name: str, fn,
                                              kda_device_name: str) -> None:
    """B = 4096 with K = V = 256: the pool is sized to need and the oracle fits in memory."""
    import torch

    from kda_fuzz.families.kda.layouts import KdaLayout, build

    p = KdaLayout(B=4096, H=1, HV=1, K=256, V=256, spare_slots=3, padding="some",
                  state_dtype=torch.bfloat16, qkv_dtype=torch.bfloat16, seed=5)
    torch.cuda.reset_peak_memory_stats()
    _check(build(p, variant, kda_device_name), fn, kda_device_name)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name}: B=4096 K=V=256 peak {peak:.1f} GiB")
