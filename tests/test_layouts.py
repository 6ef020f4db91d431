"""Layout strategies: valid layouts are valid, edges are reached, GPU shaping holds."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st

from kda_fuzz.engine.oracle import expectation
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import (
    KdaLayout,
    breakages,
    broken_arms,
    bucket_size,
    build,
    families,
    layouts,
)

KDA = get_contract("kda")


@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_valid_layouts_are_accepted_by_the_contract(variant: str) -> None:
    @settings(max_examples=40)
    @given(layouts(variant, budget=1 << 12))
    def probe(p: KdaLayout) -> None:
        case = build(p, variant)
        assert expectation(KDA, case).ok, case.describe()
        idx = case.tensors["ssm_state_indices"].view().to(torch.long)
        live = idx[idx >= 0]
        assert live.unique().numel() == live.numel()  # distinct slots: no races
        assert bool((live < p.num_slots).all())
        if variant == "helion":
            assert p.K & (p.K - 1) == 0 and p.V & (p.V - 1) == 0

    probe()


def test_guard_cells_are_nan_and_views_respect_strides() -> None:
    p = KdaLayout(B=3, H=1, HV=2, K=4, V=4, qkv_row_pad=5, slot_pad=3, guard=2, seed=1)
    case = build(p, "triton")
    qkv = case.tensors["mixed_qkv"]
    assert qkv.stride == (2 * 4 + 8 + 5, 1) and qkv.offset == 2
    assert torch.isnan(qkv.base[:2]).all() and torch.isnan(qkv.base[-2:]).all()
    state = case.tensors["initial_state"]
    assert state.stride[0] == 2 * 4 * 4 + 3
    assert torch.isnan(case.tensors["out"].view()).all()  # out is pre-filled with NaN


def test_bucketed_batches_are_powers_of_four_with_trailing_padding() -> None:
    assert [bucket_size(b) for b in (1, 2, 5, 16, 17, 4096)] == [1, 4, 16, 16, 64, 4096]

    @settings(max_examples=30)
    @given(layouts("helion", budget=1 << 20, max_b=4096, bucket=True))
    def probe(p: KdaLayout) -> None:
        assert p.B == bucket_size(p.B) and 0 <= p.tail_padding < p.B
        # the rows the layout drew fill more than the bucket below
        assert p.B - p.tail_padding > p.B // 4 or p.B == 1
        idx = build(p, "helion").tensors["ssm_state_indices"].view()
        if p.tail_padding:
            assert bool((idx[p.B - p.tail_padding:] < 0).all())

    probe()


def test_bucketed_batches_reach_full_and_nearly_full_buckets_within_the_cap() -> None:
    fam = min(families("helion", 3, seed=2, budget=1 << 16), key=lambda f: f.HV * f.K * f.V)
    cap = (1 << 16) // (fam.HV * fam.K * fam.V)  # 2,730 rows: the 4,096 bucket, not full
    assert 1024 < cap < 4096
    strategy = layouts("helion", budget=1 << 16, max_b=4096, bucket=True, family=fam)
    full = find(strategy, lambda p: p.B >= 256 and p.tail_padding == 0)
    assert full.B == 256 and full.B <= bucket_size(cap)
    short = find(strategy, lambda p: p.B >= 64 and 0 < p.tail_padding <= 3)
    assert short.B == 64

    rows = [0, 0]  # all rows, filler rows

    @settings(max_examples=200, derandomize=True, database=None)
    @given(strategy)
    def probe(p: KdaLayout) -> None:
        assert p.B - p.tail_padding <= min(4096, cap)
        rows[0] += p.B
        rows[1] += p.tail_padding

    probe()
    # most rows are the layout's own (a draw of B then rounded up left about half filler)
    assert rows[1] < 0.35 * rows[0], rows


def test_live_rows_are_the_rows_that_name_a_slot() -> None:
    """``notes["live_rows"]``: what the campaign counts as rows held to the reference."""

    @settings(max_examples=40)
    @given(layouts("triton", budget=1 << 14, max_b=64, bucket=True))
    def probe(p: KdaLayout) -> None:
        case = build(p, "triton")
        idx = case.tensors["ssm_state_indices"].view().to(torch.long)
        assert case.notes["live_rows"] == int((idx >= 0).sum())
        assert case.notes["live_rows"] <= p.B - p.tail_padding

    probe()


def test_every_padding_kind_is_drawn_and_padding_only_batches_are_few() -> None:
    """Each padding kind is reached, and a batch of padding rows only (no arithmetic to
    check) is drawn far less often than the kinds with live rows."""
    fam = families("helion", 1, budget=1 << 16)[0]
    kinds: dict[str, int] = dict.fromkeys(("none", "some", "first", "last", "all"), 0)

    @settings(max_examples=400, derandomize=True, database=None)
    @given(layouts("helion", budget=1 << 16, max_b=4096, bucket=True, family=fam))
    def probe(p: KdaLayout) -> None:
        kinds[p.padding] += 1

    probe()
    assert all(kinds.values()), kinds
    assert kinds["all"] < 0.15 * sum(kinds.values()), kinds


def test_families_fix_what_kernels_compile_for() -> None:
    fams = families("helion", 5, seed=3, budget=1 << 16)
    assert len(fams) == 5

    @settings(max_examples=10)
    @given(layouts("helion", budget=1 << 16, max_b=64, bucket=True, family=fams[2]))
    def probe(p: KdaLayout) -> None:
        f = fams[2]
        for field in ("H", "HV", "K", "V", "qkv_dtype", "state_dtype", "qkv_row_pad",
                      "slot_pad", "use_qk_l2norm_in_kernel", "lower_bound"):
            assert getattr(p, field) == getattr(f, field)
        assert math.log(p.B, 4).is_integer()

    probe()


def test_pairs_of_consecutive_checks_have_their_own_strata() -> None:
    arms = dict(broken_arms("helion"))
    pairs = [only for only in arms.values() if len(only) == 2]
    assert len(pairs) >= 15


@pytest.mark.slow  # every pair: a long property run (each breakage alone is in the fast tier)
@pytest.mark.parametrize("variant", ["helion", "triton"])
def test_every_pair_of_breakages_builds(variant: str) -> None:
    """Any two breakages together (an earlier one may change a tensor's rank) build a case
    the contract can judge; random mixes too."""
    names = [b.name for b in breakages(variant)]
    pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]

    @settings(max_examples=len(pairs) * 2)
    @given(st.sampled_from(pairs).flatmap(lambda o: KDA.broken_cases(variant, only=o))
           | KDA.broken_cases(variant, max_breaks=4))
    def probe(case) -> None:
        expectation(KDA, case)

    probe()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_materialize_copies_every_base_bit_for_bit_into_storage_of_its_own(device: str) -> None:
    """The call's copies hold the bases' bytes in storage of their own (a write to one
    leaves the case as it was), a copy per base. On cuda with the layout where
    ``torch._foreach_copy_`` (one copy per dtype, tried on main) changed the float16 ``a``
    base's copy on an H100 (torch 2.11): a false ``mutated-a`` finding."""
    p = KdaLayout(B=1, H=1, HV=2, K=48, V=138, spare_slots=1, qkv_dtype=torch.float32,
                  ab_dtype=torch.float16, param_dtype=torch.float32, out_dtype=torch.bfloat16,
                  state_dtype=torch.float16, idx_dtype=torch.int64, padding="some",
                  qkv_row_pad=28, guard=2, seed=5)
    for seed in range(8):
        case = build(replace(p, seed=seed), "triton", device)
        kwargs, bases = case.materialize()
        for name, t in case.tensors.items():
            assert bases[name].untyped_storage().data_ptr() != \
                t.base.untyped_storage().data_ptr()
            assert torch.equal(bases[name].view(torch.uint8), t.base.view(torch.uint8)), name
            assert kwargs[name].data_ptr() == \
                bases[name].data_ptr() + t.offset * t.base.element_size()
        kwargs["initial_state"].fill_(7.0)
        assert not bool((case.tensors["initial_state"].view() == 7.0).any())


def test_indices_of_a_gpu_case_are_made_on_the_host(monkeypatch) -> None:
    """On a GPU the state indices come from a host generator of their own (seeded from the
    layout's seed) in the index dtype, pinned for one non-blocking copy: distinct live
    slots in range, padding rows as drawn, the same indices for the same seed."""
    from types import SimpleNamespace

    from kda_fuzz.families.kda import layouts as kda_layouts

    pinned: list[torch.Tensor] = []
    monkeypatch.setattr(torch.Tensor, "pin_memory",
                        lambda t: pinned.append(t) or t.clone())
    gpu = SimpleNamespace(device=torch.device("cuda"))  # (its generator is never drawn from)
    for pad_value in ("-1", "min", "random"):
        p = KdaLayout(B=16, H=1, HV=1, K=4, V=4, spare_slots=5, padding="some",
                      pad_value=pad_value, idx_dtype=torch.int32, seed=11)
        pad = kda_layouts._padding(p)
        assert pad is not None and 0 < int(pad.sum()) < p.B
        calls = len(pinned)
        idx = kda_layouts._indices(p, gpu, pad)
        assert len(pinned) == calls + 1 and torch.equal(pinned[-1], idx)
        assert idx.dtype == torch.int32 and idx.device.type == "cpu"
        live = idx[~pad].long()
        assert live.unique().numel() == live.numel() and bool(((live >= 0)
                                                               & (live < p.num_slots)).all())
        assert bool((idx[pad] < 0).all())
        if pad_value != "random":
            assert set(idx[pad].tolist()) == {-1 if pad_value == "-1" else -(2**31)}
        assert torch.equal(kda_layouts._indices(p, gpu, pad), idx)  # the seed's, each time


@pytest.mark.gpu
def test_a_gpu_case_is_the_same_for_the_same_seed_its_guard_cells_sentinels() -> None:
    """On a GPU the same seed makes the same bytes, the guard cells before each view hold
    their dtype's sentinel and the values are finite."""
    from kda_fuzz.engine.shrink import sentinel

    p = KdaLayout(B=4, H=2, HV=4, K=8, V=8, qkv_dtype=torch.bfloat16,
                  ab_dtype=torch.float16, state_dtype=torch.float32, idx_dtype=torch.int32,
                  guard=2, padding="some", seed=9)
    case, again = build(p, "triton", "cuda"), build(p, "triton", "cuda")
    for name, t in case.tensors.items():
        assert t.device.type == "cuda"
        assert torch.equal(t.base.view(torch.uint8), again.tensors[name].base.view(torch.uint8))
        if t.offset:
            head = t.base[: t.offset].cpu()
            want = torch.full_like(head, sentinel(t.dtype))
            assert torch.equal(head.view(torch.uint8), want.view(torch.uint8)), name
        if name != "out" and t.dtype.is_floating_point:
            assert bool(torch.isfinite(t.view()).all()), name
