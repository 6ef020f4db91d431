"""Batch invariance: a valid case's rows re-run alone and in reverse order."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from kda_fuzz.campaign.runner import campaign, within_share
from kda_fuzz.corpus.store import load_case, save_failure
from kda_fuzz.engine.case import Case, same_signature
from kda_fuzz.engine.oracle import batch_variance, run_case
from kda_fuzz.engine.targets import Target, load_target
from kda_fuzz.execution import cpu as _execution  # noqa: F401 - kernels run on CPU
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz.families.packed.invariance import sub_batches
from kda_fuzz_kernels.kda_decode import (
    fused_recurrent_kda_packed_decode,
    helion_fused_recurrent_kda_packed_decode,
)
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode as reference
from tests.inprocess import kda_fuzz

KDA = get_contract("kda")
GDN = get_contract("gdn")


def batch_variant(*args):
    """Correct within tolerance, but a batch of more than one row rounds differently (as a
    kernel whose reduction order follows the batch size)."""
    out, state = reference(*args)
    if args[0].shape[0] > 1:
        out.mul_(1 + 2**-20)
    return out, state


def test_sub_batches_keep_the_layout_and_name_the_rows():
    case = build(KdaLayout(B=5, H=1, HV=2, K=4, V=4, padding="first", qkv_row_pad=3, guard=2,
                           seed=3), "triton")
    subs = list(sub_batches(case))
    assert [name for name, _, _ in subs] == ["alone", "padded", "reversed"]
    (_, alone, one), (_, padded, kept), (_, rev, rows) = subs
    assert len(one) == 1 and rows == [4, 3, 2, 1, 0]
    # the padded one: the same row in place, every other row padding, nothing else changed
    idx = case.tensors["ssm_state_indices"].view()
    pidx = padded.tensors["ssm_state_indices"].view()
    assert [r for r in kept if r >= 0] == one and len(kept) == 5
    assert pidx.tolist() == [int(idx[r]) if r >= 0 else -1 for r in kept]
    assert idx.tolist().count(-1) < 4  # (the case's own indices untouched by the copy)
    assert same_signature(case, padded) and same_signature(case, rev)
    assert not same_signature(case, alone)  # a batch of one: another shape
    assert run_case(KDA, padded, reference).status == "pass"
    for name in ("mixed_qkv", "out", "ssm_state_indices"):
        full, sub = case.tensors[name], rev.tensors[name]
        assert sub.stride == full.stride and sub.offset == full.offset  # only the batch moves
        assert sub.shape[0] == 5 and alone.tensors[name].shape[0] == 1
    assert rev.tensors["initial_state"] is case.tensors["initial_state"]  # the whole pool
    idx, ridx = case.tensors["ssm_state_indices"].view(), rev.tensors["ssm_state_indices"].view()
    assert ridx.tolist() == idx.flip(0).tolist()
    assert run_case(KDA, alone, reference).status == "pass"  # each is a valid case


@pytest.mark.parametrize("contract", [KDA, GDN], ids=["kda", "gdn"])
def test_sub_batches_are_judged_like_any_case_and_a_correct_target_passes(contract):
    """A vectorised torch implementation is correct but not bitwise batch-invariant (its
    matrix products block by batch size): under the default policy, no finding."""
    target = [load_target(contract.reference_target)]
    rep = campaign(contract, "triton", target, max_examples=60, seed=1, valid_share=1.0,
                   invariance_every=1, max_failures=20, extra_share=1.0)
    assert rep.batch_checks > 20 and not rep.failures, [f.verdict.summary() for f in rep.failures]
    assert rep.mode_seconds["batch invariance"] > 0  # its time is counted, by mode


@pytest.mark.parametrize("kernel", [fused_recurrent_kda_packed_decode,
                                    helion_fused_recurrent_kda_packed_decode],
                         ids=["triton", "helion"])
def test_the_projects_kernels_are_batch_invariant_bit_for_bit(kernel):
    """One program per row and head: a row's bits do not depend on its batch."""
    # one layout of everything a row's program reads around it (padding rows, row padding,
    # guards, a 16-bit pool, l2norm): each sub-batch is a new shape, a new Helion compile
    case = build(KdaLayout(B=4, H=2, HV=4, K=8, V=4, padding="first", qkv_row_pad=5, guard=3,
                           seed=2, state_dtype=torch.bfloat16, use_qk_l2norm_in_kernel=True),
                 "helion")
    assert case.notes["live_rows"] < 4  # padding rows among the rows moved
    assert batch_variance(KDA, case, kernel).status == "pass"


@pytest.mark.gpu
@pytest.mark.parametrize("family,kernel", [
    ("kda", "fused_recurrent_kda_packed_decode"),
    ("kda", "helion_fused_recurrent_kda_packed_decode"),
    ("gdn", "fused_recurrent_gated_delta_rule_packed_decode"),
    ("gdn", "helion_fused_recurrent_gated_delta_rule_packed_decode")])
def test_the_projects_kernels_are_batch_invariant_bit_for_bit_at_k_1(family, kernel,
                                                                      kda_device_name):
    """At K = 1, in a batch of one, Helion folds a row tile's loads into scalar loads: the
    Helion kernels indexed their K vectors by the row tile there, and on an H100 a row's
    `out` or state slot alone differed from the whole batch's in the last bit (KDA: 10 of
    these 24 layouts; --invariance bitwise found it in a campaign). They load them as
    scalars now."""
    import importlib

    from kda_fuzz.families.gdn.layouts import build as build_gdn
    from kda_fuzz.families.kda.layouts import GATE_REGIMES, Values

    fn = getattr(importlib.import_module(f"kda_fuzz_kernels.{family}_decode"), kernel)
    make, contract = (build, KDA) if family == "kda" else (build_gdn, GDN)
    regimes = list(GATE_REGIMES.values())
    f16 = torch.float16
    for (lower_bound, l2norm), seed in itertools.product(((-5.0, False), (None, True)),
                                                         range(12)):
        values = Values(**regimes[seed % len(regimes)], qkv_scale=(1.0, 3.0, 10.0)[seed % 3],
                        state_scale=(1.0, 10.0, 100.0)[seed % 3], b_scale=(1.0, 5.0)[seed % 2])
        layout = KdaLayout(B=64, H=5, HV=20, K=1, V=128, spare_slots=3, qkv_dtype=f16,
                           ab_dtype=f16, out_dtype=f16, state_dtype=torch.bfloat16,
                           padding="some" if seed % 2 else "none",
                           use_qk_l2norm_in_kernel=l2norm,
                           lower_bound=lower_bound if family == "kda" else None,
                           values=values, seed=seed)
        got = batch_variance(contract, make(layout, "helion", kda_device_name), fn)
        assert got.status == "pass", (layout, got.verdict)


def test_a_batch_variant_kernel_is_found_bitwise_and_replays(tmp_path: Path):
    t = [Target("batch_variant", batch_variant)]
    lenient = campaign(KDA, "triton", t, max_examples=60, seed=1, valid_share=1.0,
                       invariance="tolerance", invariance_every=1, max_failures=20,
                       extra_share=1.0)
    assert not lenient.failures  # within tolerance: the contract allows it
    strict = campaign(KDA, "triton", t, max_examples=60, seed=1, valid_share=1.0,
                      invariance="bitwise", invariance_every=1, max_failures=20,
                      extra_share=1.0, budget=1 << 10,
                      minimize=20.0)
    [f] = [f for f in strict.failures if f.verdict.what == "batch-variant"]
    assert f.verdict.kind == "mismatch" and "differ bitwise" in f.verdict.detail
    # minimized the way it was found: two rows (one alone differs from the whole batch)
    assert f.case.tensors["mixed_qkv"].shape[0] == 2, f.case.notes.get("minimized")
    path = save_failure(f, tmp_path, contract=KDA, seed=1)
    case, _, _ = load_case(path)
    assert case.notes["invariance"] == "bitwise"  # replayed the way it was found
    assert run_case(KDA, case, batch_variant).verdict.what == "batch-variant"
    # a bitwise-invariant kernel passes it (the vectorised reference is not one)
    assert run_case(KDA, case, fused_recurrent_kda_packed_decode).status == "pass"


def test_the_default_runs_only_sub_batches_of_the_cases_own_shapes(monkeypatch):
    """Under tolerance every sub-batch judged has the whole batch's signature (a kernel
    specialized on shapes compiles nothing for it), one per check, the padded and the
    reversed one in turn (each costs a whole batch's device time); bitwise runs them all
    and adds the batch of one."""
    from kda_fuzz.campaign.runner import Campaign

    judged: list[tuple[Case, Case]] = []  # (the whole batch, a sub-batch judged)
    parent: list[Case] = []
    check, judge = Campaign._batch_invariance, Campaign._judge

    def spy_check(self, pos, case):
        parent.append(case)
        try:
            return check(self, pos, case)
        finally:
            parent.pop()

    def spy_judge(self, pos, index, case, *a, **k):
        if parent:
            judged.append((parent[-1], case))
        return judge(self, pos, index, case, *a, **k)

    from kda_fuzz.families.packed import invariance

    taken, take = [], invariance._take_rows  # the rows each sub-batch built copies

    def spy_take(arg, rows):
        taken.append(len(rows))
        return take(arg, rows)

    monkeypatch.setattr(Campaign, "_batch_invariance", spy_check)
    monkeypatch.setattr(Campaign, "_judge", spy_judge)
    monkeypatch.setattr(invariance, "_take_rows", spy_take)
    for mode in ("tolerance", "bitwise"):
        judged.clear()
        taken.clear()
        rep = campaign(KDA, "triton", [Target("t", reference)], max_examples=10, seed=2,
                       valid_share=1.0, invariance=mode, invariance_every=1, max_failures=20,
                       extra_share=1.0,
                       minimize=False)
        assert rep.batch_checks > 3
        same = [same_signature(whole, sub) for whole, sub in judged]
        if mode == "tolerance":
            assert judged and all(same)
            wholes = [id(whole) for whole, _ in judged]
            assert len(wholes) == len(set(wholes)) <= rep.batch_checks  # one per check at most
            padded = [bool((sub.tensors["ssm_state_indices"].view() < 0).sum()
                           > (whole.tensors["ssm_state_indices"].view() < 0).sum())
                      for whole, sub in judged]
            assert any(padded) and not all(padded)  # both kinds, in turn
            # a reversed copy built is one judged (but the first check's, which learns
            # how many kinds there are): none built only to be skipped
            reversed_built = sum(n > 1 for n in taken) // len(invariance.ROWS)
            assert reversed_built <= padded.count(False) + 1, (reversed_built, padded)
        else:  # the batch of one, of another shape, among them
            assert not all(same) and any(sub.tensors["mixed_qkv"].shape[0] == 1
                                         for _, sub in judged)


def test_the_default_builds_no_sub_batch_past_the_one_it_runs():
    """A family's sub-batches drawn lazily are built only as far as the one that runs:
    the turn-th kept one (wrapping round when there are fewer), nothing after it."""
    from kda_fuzz.campaign.runner import _turn

    built: list[int] = []

    def subs(n: int):
        for i in range(n):
            built.append(i)
            yield i

    keep = lambda i: i % 2 == 1  # noqa: E731 (the odd ones keep the signature)
    assert _turn(subs(6), 0, keep) == ([1], 0) and built == [0, 1]
    built.clear()
    assert _turn(subs(6), 1, keep) == ([3], 0) and built == [0, 1, 2, 3]
    built.clear()  # drawn to the end: 3 kept, 4 % 3 = 1, and the count told
    assert _turn(subs(6), 4, keep) == ([3], 3) and built == list(range(6))
    assert _turn(subs(1), 0, keep) == ([], 0) and _turn([], 3, keep) == ([], 0)
    # KDA's: the padded one (second) is drawn without building the reversed copy (third)
    case = build(KdaLayout(B=5, H=1, HV=2, K=4, V=4, padding="first", seed=3), "triton")
    names = []
    for name, sub, _ in sub_batches(case):
        names.append(name)
        if same_signature(case, sub):
            break
    assert names == ["alone", "padded"]


def test_an_extra_check_waits_once_it_has_taken_its_share_of_the_time():
    """Past ``extra_share`` of the job's time, a turn of batch invariance waits (counted);
    the draws, and so the turns, are the same as with every turn run."""
    target = [load_target(KDA.reference_target)]
    every = campaign(KDA, "triton", target, max_examples=60, seed=1, valid_share=1.0,
                     invariance_every=1, max_failures=20, extra_share=1.0)
    held = campaign(KDA, "triton", target, max_examples=60, seed=1, valid_share=1.0,
                    invariance_every=1, max_failures=20, extra_share=0.01)
    assert not every.mode_held and held.mode_held["batch invariance"] > 0
    assert held.batch_checks + held.mode_held["batch invariance"] == every.batch_checks
    assert 0 < held.batch_checks < every.batch_checks
    assert held.mode_seconds["batch invariance"] < every.mode_seconds["batch invariance"]
    assert held.to_json()["mode_held"] == {"batch invariance": held.mode_held["batch invariance"]}


def test_a_turn_runs_only_where_its_mean_cost_keeps_the_check_within_its_share():
    # the first turn has no mean: it runs whenever the check is within its share
    assert within_share(0.0, 0, 0.0, 0.15) and within_share(0.0, 0, 10.0, 0.15)
    # 1 s in one turn of 10 s: one more makes 2 of 11 (18 %), past 15 %; 20 % allows it
    assert not within_share(1.0, 1, 10.0, 0.15) and within_share(1.0, 1, 10.0, 0.2)
    # 1 s in four turns (0.25 s each) of 10 s: one more makes 1.25 of 10.25 (12 %)
    assert within_share(1.0, 4, 10.0, 0.15)
    # already past its share (a restarted job's counted seconds, no turn of its own yet)
    assert not within_share(2.0, 0, 10.0, 0.15)
    assert within_share(5.0, 1, 5.0, 1.0)  # 1: every turn


def test_the_summary_counts_the_turns_that_waited_and_the_share_is_checked():
    r = kda_fuzz("fuzz", "--target", KDA.reference_target, "--contract", "triton",
                 "--max-examples", "300", "--valid-share", "1", "--seed", "1", "--no-save",
                 "--extra-share", "0.001")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "more turn(s) waited: the check would have taken more than its 0.1 % of the " \
           "job's time (--extra-share)" in r.stdout, r.stdout[-2000:]
    for bad in ("0", "1.5"):
        r = kda_fuzz("fuzz", "--extra-share", bad)
        assert r.returncode == 2
        assert r.stderr.strip() == "kda-fuzz: error: --extra-share must be more than 0 and " \
                                   "at most 1"


def test_off_runs_no_sub_batch():
    rep = campaign(KDA, "triton", [Target("batch_variant", batch_variant)], max_examples=40,
                   seed=1, valid_share=1.0, invariance="off", invariance_every=1)
    assert rep.batch_checks == 0 and not rep.failures


def test_rows_are_taken_without_an_index_where_a_slice_does_and_differences_are_located():
    """Runs of rows are slices (a reversed run a flipped slice); ``differs`` names the
    first row whose ``out`` or state slot differs bit for bit, whatever the order."""
    from kda_fuzz.families.packed.invariance import _rows_of, differs

    x = torch.arange(24.0).reshape(6, 4)
    for rows in ([2], [1, 2, 3], [5, 4, 3, 2, 1, 0], [4, 1, 3]):
        assert torch.equal(_rows_of(x, rows), x[torch.tensor(rows)])
    case = build(KdaLayout(B=4, H=1, HV=1, K=4, V=4, seed=3), "helion")
    idx = case.tensors["ssm_state_indices"].view().to(torch.long)
    full = {"out": torch.randn(4, 1, 1, 4), "initial_state": torch.randn(8, 1, 4, 4)}
    rows = [3, 2, 1, 0]
    sub = {"out": full["out"].flip(0).clone(), "initial_state": full["initial_state"].clone()}
    assert differs(case, full, case, sub, rows) is None
    sub["out"][2, 0, 0, 1] = float("nan")  # row 2 of the sub-batch: the case's row 1
    assert differs(case, full, case, sub, rows).startswith("`out` row 1 (row 2 of the sub-batch)")
    sub["out"] = full["out"].flip(0).clone()
    live = [r for r in rows if int(idx[r]) >= 0]
    slot = int(idx[live[-1]])
    sub["initial_state"][slot, 0, 0, 0] += 1.0
    got = differs(case, full, case, sub, rows)
    assert got is not None and got.startswith(f"state slot {slot} of row {live[-1]}"), got
