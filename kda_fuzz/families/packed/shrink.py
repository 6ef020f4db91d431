"""The minimizer's moves for packed decode layouts (KDA and its siblings), moved out of the
engine: what :class:`PackedDecodeShrinker` gives :mod:`kda_fuzz.campaign.minimize`.

Moves on layouts the contract accepts (valid rows are independent):

* rows: keep one row (the failing one first), drop chunks of rows (halves first);
  rows made padding (index -1) with the slots they named dropped; unnamed slots dropped;
* heads: keep a subset of value heads consistently (q/k/v segments of ``mixed_qkv``,
  ``a``, ``b``, ``A_log``, ``dt_bias``, the state pool and ``out``), among them two
  value heads of two key heads (H=2, HV=4: the fewest a GQA ratio shows on); fewer key
  heads (fewer GQA groups, value heads kept);
* trades that keep ``B * HV`` (what a grid of ``(.., B * HV)`` blocks needs) while
  shrinking the rest: value heads halved and rows doubled (each row's second half of
  heads becomes a row of its own, with a slot of its own), or the reverse;
* fewer V and K channels, smallest first (powers of two only in ``pow2_variants``);

on broken layouts: trailing batch rows and state slots dropped together; everywhere:
the slots no row names zeroed (pool size and strides kept: a failure may need a pool past
2^31 elements; the file stores them as one fill run), flags off
(``use_qk_l2norm_in_kernel=False``, ``lower_bound=None``), ``scale`` toward 1.0, -1.0,
``K ** -0.5`` or the nearest power of two, values toward simple ones (zero state and
gates, unit activations, signs, small integers, few bits on a power-of-two grid:
constant bases are stored as fills). Value and scalar moves keep every shape
(``Move.same_shape``).

``gate_per_key``: the gates ``a`` ([B, HV*K]) and ``dt_bias`` ([HV*K]) have one value per
value head and key channel (KDA); otherwise one per value head ([B, HV] and [HV], GDN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.shrink import (
    MAX_POSITIONS,
    SENTINEL_OUTSIDE,
    SMALL_AXIS,
    BaseMarks,
    CostModel,
    ShrinkContext,
)
from kda_fuzz.engine.shrink import Move as _Move
from kda_fuzz.engine.shrink import Skip as _Skip
from kda_fuzz.engine.shrink import chunks as _chunks
from kda_fuzz.engine.shrink import raw_after as _raw_after
from kda_fuzz.engine.shrink import replace_in as _replace
from kda_fuzz.engine.shrink import reshaped as _reshaped
from kda_fuzz.engine.shrink import same_values as _same_values
from kda_fuzz.engine.shrink import select as _select
from kda_fuzz.engine.shrink import with_values as _with_values
from kda_fuzz.engine.verdict import Verdict

ROW_TENSORS = {"mixed_qkv": 2, "a": 2, "b": 2, "ssm_state_indices": 1, "out": 4}


@dataclass(frozen=True)
class _Sizes:
    B: int
    H: int
    HV: int
    K: int
    V: int
    slots: int
    gate_k: bool = True  # a/dt_bias hold one gate per value head and key channel

    @property
    def GK(self) -> int:
        """Gates per value head: K, or 1 when the gate is one scalar per head."""
        return self.K if self.gate_k else 1


def _sizes(case: Case, gate_k: bool = True) -> _Sizes | None:
    """Sizes of a layout the contract accepts (``None`` for anything else)."""
    try:
        n, HV, V, K = case.tensors["initial_state"].shape
        B, W = case.tensors["mixed_qkv"].shape
        H = (W - HV * V) // 2 // K
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return _Sizes(B, H, HV, K, V, n, gate_k)


def _indices(case: Case) -> list[int]:
    return [int(i) for i in case.tensors["ssm_state_indices"].view().tolist()]


def _shapes(sz: _Sizes) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a valid layout of these sizes."""
    B, H, HV, K, V = sz.B, sz.H, sz.HV, sz.K, sz.V
    return {
        "mixed_qkv": (B, 2 * H * K + HV * V), "a": (B, HV * sz.GK), "b": (B, HV),
        "A_log": (HV,), "dt_bias": (HV * sz.GK,), "initial_state": (sz.slots, HV, V, K),
        "out": (B, 1, HV, V), "ssm_state_indices": (B,),
    }


class _Step:
    """The moves of one step on a valid layout: its sizes and predicted sizes."""

    def __init__(self, case: Case, sz: _Sizes, costs: CostModel, hint: Verdict | None) -> None:
        self.case, self.sz, self.costs, self.hint = case, sz, costs, hint
        self.idx = _indices(case)
        self._memo: dict[_Sizes, float] = {}

    def at(self, **changes: int) -> float:
        """Predicted cost of this layout with the sizes ``changes`` (B=..., K=...)."""
        sz = replace(self.sz, **changes)
        if sz not in self._memo:
            shapes = _shapes(sz)
            self._memo[sz] = self.costs.predict(self.case, {
                n: (_raw_after(a, shapes[n]), shapes[n]) for n, a in self.case.tensors.items()
                if n in shapes and len(a.shape) == len(shapes[n])})
        return self._memo[sz]


# ------------------------------------------------------------------ moves on valid layouts


def _rows_subset(case: Case, rows: Sequence[int] | torch.Tensor) -> Case:
    return _replace(case, {n: _select(case.tensors[n], 0, rows) for n in ROW_TENSORS})


def _rows_without(case: Case, B: int, start: int, stop: int) -> Case:
    """``case`` without rows ``start..stop-1`` of its ``B``."""
    return _rows_subset(case, torch.cat([torch.arange(start), torch.arange(stop, B)]))


def _hint_row(st: _Step) -> int | None:
    h = st.hint
    if h is not None and h.where and h.what != "untouched-state-written" \
            and 0 <= h.where[0] < st.sz.B:
        return h.where[0]
    return None


def _row_moves(st: _Step) -> Iterator[_Move]:
    case, sz, idx = st.case, st.sz, st.idx
    B = sz.B
    first = _hint_row(st)
    if B > 1:
        pads = [i for i in range(B) if idx[i] < 0]
        order = list(dict.fromkeys(([] if first is None else [first]) + pads + list(range(B))))
        if B > SMALL_AXIS:
            order = order[:MAX_POSITIONS]
        for r in order:
            yield _Move(f"keep row {r} of {B}", lambda r=r: _rows_subset(case, [r]), st.at(B=1))
        r0 = order[0]
        if 0 <= idx[r0] < sz.slots and sz.slots > 1:
            yield _Move(f"keep row {r0} of {B} and its slot",
                        lambda: _slots_subset(_rows_subset(case, [r0]), [idx[r0]]),
                        st.at(B=1, slots=1))
        for start, stop in _chunks(B, first):
            yield _Move(f"drop rows {start}..{stop - 1} of {B}",
                        lambda start=start, stop=stop: _rows_without(case, B, start, stop),
                        st.at(B=B - (stop - start)))
    live = [i for i in range(B) if 0 <= idx[i] < sz.slots]
    avoid = live.index(first) if first in live else None
    for start, stop in _chunks(len(live), avoid, whole=True):
        rows = live[start:stop]
        rows_set = set(rows)
        named = {idx[i] for i in range(B) if i not in rows_set}
        freed = len({idx[r] for r in rows} - named)
        left = max(1, sz.slots - freed)
        if left < sz.slots:
            yield _Move(f"{len(rows)} row(s) made padding ({rows[0]}..{rows[-1]}), their "
                        f"slot(s) dropped", lambda rows=rows: _pad_rows(case, rows, True),
                        st.at(slots=left))
    if B <= SMALL_AXIS:
        for r in live:
            yield _Move(f"row {r} made padding", lambda r=r: _pad_rows(case, [r], False),
                        st.at(), simplify=True)


def _pad_rows(case: Case, rows: Sequence[int], drop_slots: bool) -> Case:
    """``rows`` made padding (index -1); with ``drop_slots``, the slots only they named
    are dropped too (one slot is always kept)."""
    idx = _indices(case)
    new = list(idx)
    for r in rows:
        new[r] = -1
    arg = case.tensors["ssm_state_indices"]
    out = _replace(case, {"ssm_state_indices": _with_values(arg, torch.tensor(new))})
    if not drop_slots:
        return out
    freed = {idx[r] for r in rows} - {i for i in new if i >= 0}
    slots = case.tensors["initial_state"].shape[0]
    keep = [s for s in range(slots) if s not in freed] or [min(freed)]
    if len(keep) == slots:
        raise _Skip("no slot freed")
    return _slots_subset(out, keep)


def _slots_subset(case: Case, keep: Sequence[int]) -> Case:
    remap = {old: new for new, old in enumerate(keep)}
    idx = _indices(case)
    if any(i >= 0 and i not in remap for i in idx):
        raise _Skip("a named slot would be dropped")
    vals = torch.tensor([remap.get(i, i) if i >= 0 else i for i in idx], dtype=torch.int64)
    return _replace(case, {
        "initial_state": _select(case.tensors["initial_state"], 0, keep),
        "ssm_state_indices": _with_values(case.tensors["ssm_state_indices"], vals),
    })


def _slot_moves(st: _Step) -> Iterator[_Move]:
    case, sz, idx = st.case, st.sz, st.idx
    if any(i >= sz.slots for i in idx):
        return
    used = sorted({i for i in idx if i >= 0})
    if len(used) < sz.slots:
        yield (_Move(f"keep the {len(used)} named slot(s) of {sz.slots}",
                     lambda: _slots_subset(case, used), st.at(slots=len(used)))
               if used else
               _Move(f"keep 1 slot of {sz.slots}", lambda: _slots_subset(case, [0]),
                     st.at(slots=1)))
    named = set(used)
    spare = [s for s in range(sz.slots) if s not in named]

    def without(start: int, stop: int) -> Case:
        drop = set(spare[start:stop])
        return _slots_subset(case, [s for s in range(sz.slots) if s not in drop])

    for start, stop in _chunks(len(spare)):
        yield _Move(f"drop unnamed slots {spare[start]}..{spare[stop - 1]} ({stop - start}) "
                    f"of {sz.slots}", lambda start=start, stop=stop: without(start, stop),
                    st.at(slots=sz.slots - (stop - start)))


def _heads_subset(case: Case, sz: _Sizes, hv_keep: Sequence[int]) -> Case:
    B, H, HV, K, V = sz.B, sz.H, sz.HV, sz.K, sz.V
    per_q = HV // H
    kh_keep = sorted({hv // per_q for hv in hv_keep})
    if len(hv_keep) % len(kh_keep) or any(
        sum(1 for hv in hv_keep if hv // per_q == kh) != len(hv_keep) // len(kh_keep)
        for kh in kh_keep
    ):
        raise _Skip("value heads not grouped evenly over key heads")
    hv = torch.tensor(list(hv_keep), dtype=torch.long)
    kh = torch.tensor(kh_keep, dtype=torch.long)
    t = case.tensors
    qkv = t["mixed_qkv"].view()
    q = qkv[:, : H * K].reshape(B, H, K)[:, kh].reshape(B, -1)
    k = qkv[:, H * K : 2 * H * K].reshape(B, H, K)[:, kh].reshape(B, -1)
    v = qkv[:, 2 * H * K :].reshape(B, HV, V)[:, hv].reshape(B, -1)
    return _replace(case, {
        "mixed_qkv": _reshaped(t["mixed_qkv"], torch.cat([q, k, v], 1)),
        "a": _reshaped(t["a"], t["a"].view().reshape(B, HV, sz.GK)[:, hv].reshape(B, -1)),
        "b": _reshaped(t["b"], t["b"].view()[:, hv]),
        "A_log": _reshaped(t["A_log"], t["A_log"].view()[hv]),
        "dt_bias": _reshaped(t["dt_bias"],
                             t["dt_bias"].view().reshape(HV, sz.GK)[hv].reshape(-1)),
        "initial_state": _reshaped(t["initial_state"], t["initial_state"].view()[:, hv]),
        "out": _reshaped(t["out"], t["out"].view()[:, :, hv]),
    })


def _key_heads_subset(case: Case, sz: _Sizes, kh_keep: Sequence[int]) -> Case:
    """Fewer key heads, every value head kept: value head group ``j`` reads the q/k of
    old key head ``kh_keep[j]``."""
    B, H, K = sz.B, sz.H, sz.K
    if sz.HV % len(kh_keep):
        raise _Skip("value heads not grouped evenly over key heads")
    kh = torch.tensor(list(kh_keep), dtype=torch.long)
    qkv = case.tensors["mixed_qkv"]
    x = qkv.view()
    q = x[:, : H * K].reshape(B, H, K)[:, kh].reshape(B, -1)
    k = x[:, H * K : 2 * H * K].reshape(B, H, K)[:, kh].reshape(B, -1)
    return _replace(case, {"mixed_qkv": _reshaped(qkv, torch.cat([q, k, x[:, 2 * H * K :]], 1))})


def _head_moves(st: _Step) -> Iterator[_Move]:
    case, sz, hint = st.case, st.sz, st.hint
    if sz.HV <= 1:
        return
    per_q = sz.HV // sz.H
    h0 = 0
    if hint is not None and hint.output in ("out", "initial_state") and hint.where \
            and len(hint.where) >= 2 and 0 <= hint.where[1] < sz.HV:
        h0 = hint.where[1]
    singles = [h0] + [h for h in range(sz.HV) if h != h0]
    subsets = [[h] for h in (singles if sz.HV <= SMALL_AXIS else singles[:MAX_POSITIONS])]
    if per_q > 1:
        g = h0 // per_q
        subsets.append(list(range(g * per_q, (g + 1) * per_q)))
        subsets.append([kh * per_q + h0 % per_q for kh in range(sz.H)])
    if per_q >= 2 and (per_q > 2 or sz.H > 2):
        # the fewest heads a GQA ratio shows on: two value heads of each of two key heads
        # (H=2, HV=4), or of one (H=1, HV=2), the failing head's among them
        g, j = h0 // per_q, h0 % per_q
        offsets = sorted({j, (j + 1) % per_q})
        pairs = [g, g + 1 if g + 1 < sz.H else g - 1] if sz.H > 1 else [g]
        subsets.append(sorted(kh * per_q + o for kh in pairs for o in offsets))
        subsets.append(sorted(g * per_q + o for o in offsets))
    half = sz.HV // 2
    subsets += [list(range(half)), list(range(half, sz.HV))]
    for keep in subsets:
        if 0 < len(keep) < sz.HV:
            kh = len({hv // per_q for hv in keep})
            yield _Move(f"keep value head(s) {keep} of {sz.HV}",
                        lambda keep=keep: _heads_subset(case, sz, keep),
                        st.at(HV=len(keep), H=kh))
    if sz.H > 1:
        yield _Move(f"1 key head of {sz.H} (value heads kept)",
                    lambda: _key_heads_subset(case, sz, [h0 // per_q]), st.at(H=1))
        if sz.H % 2 == 0 and sz.H > 2:
            yield _Move(f"{sz.H // 2} key heads of {sz.H} (value heads kept)",
                        lambda: _key_heads_subset(case, sz, range(sz.H // 2)),
                        st.at(H=sz.H // 2))


def _split_heads(case: Case, sz: _Sizes) -> Case:
    """B * HV kept: HV halved, B doubled. Row ``B + i`` takes the second half of row
    ``i``'s value heads (their q/k/v, gates, outputs) and a slot of its own holding their
    state; ``A_log``/``dt_bias`` keep the first half's values."""
    B, H, HV, K, V, n = sz.B, sz.H, sz.HV, sz.K, sz.V, sz.slots
    hv2, h2 = HV // 2, (H // 2 if H % 2 == 0 else 1)
    t = case.tensors

    def halves(x: torch.Tensor, per: int) -> torch.Tensor:  # (B, heads, ...) -> (2B, per, ...)
        if x.shape[1] == per:  # one key head, shared by both halves
            return torch.cat([x, x], 0)
        return torch.cat([x[:, :per], x[:, per:]], 0)

    qkv = t["mixed_qkv"].view()
    q = halves(qkv[:, : H * K].reshape(B, H, K), h2).reshape(2 * B, -1)
    k = halves(qkv[:, H * K : 2 * H * K].reshape(B, H, K), h2).reshape(2 * B, -1)
    v = halves(qkv[:, 2 * H * K :].reshape(B, HV, V), hv2).reshape(2 * B, -1)
    state = t["initial_state"].view()
    idx = t["ssm_state_indices"].view().to(torch.int64)
    return _replace(case, {
        "mixed_qkv": _reshaped(t["mixed_qkv"], torch.cat([q, k, v], 1)),
        "a": _reshaped(t["a"], halves(t["a"].view().reshape(B, HV, sz.GK), hv2)
                       .reshape(2 * B, -1)),
        "b": _reshaped(t["b"], halves(t["b"].view(), hv2)),
        "A_log": _reshaped(t["A_log"], t["A_log"].view()[:hv2]),
        "dt_bias": _reshaped(t["dt_bias"], t["dt_bias"].view()[: hv2 * sz.GK]),
        "initial_state": _reshaped(t["initial_state"],
                                   torch.cat([state[:, :hv2], state[:, hv2:]], 0)),
        "out": _reshaped(t["out"], halves(t["out"].view().reshape(B, HV, V), hv2)
                         .reshape(2 * B, 1, hv2, V)),
        "ssm_state_indices": _reshaped(t["ssm_state_indices"],
                                       torch.cat([idx, torch.where(idx >= 0, idx + n, idx)])),
    })


def _merge_rows(case: Case, sz: _Sizes) -> Case:
    """B * HV kept: B halved, HV and H doubled. Row ``i`` takes row ``B/2 + i``'s heads
    after its own, and one slot holding both rows' states (zeros for a padding half);
    unnamed slots are dropped."""
    B, H, HV, K, V, n = sz.B, sz.H, sz.HV, sz.K, sz.V, sz.slots
    h = B // 2
    t = case.tensors

    def pair(x: torch.Tensor) -> torch.Tensor:  # (B, heads, ...) -> (B/2, 2 heads, ...)
        return torch.cat([x[:h], x[h:]], 1)

    qkv = t["mixed_qkv"].view()
    q = pair(qkv[:, : H * K].reshape(B, H, K)).reshape(h, -1)
    k = pair(qkv[:, H * K : 2 * H * K].reshape(B, H, K)).reshape(h, -1)
    v = pair(qkv[:, 2 * H * K :].reshape(B, HV, V)).reshape(h, -1)
    state = t["initial_state"].view()
    idx = t["ssm_state_indices"].view().to(torch.int64)
    live = (idx >= 0) & (idx < n)
    if n == 0:
        raise _Skip("no slots")
    parts = torch.where(live[:, None, None, None], state[torch.where(live, idx, 0)],
                        torch.zeros((), dtype=state.dtype, device=state.device))
    either = live[:h] | live[h:]
    pool = pair(parts)[either]
    if pool.shape[0] == 0:
        pool = torch.zeros((1, 2 * HV, V, K), dtype=state.dtype, device=state.device)
    new_idx = torch.where(either, torch.cumsum(either.to(torch.int64), 0) - 1,
                          torch.where(idx[:h] < 0, idx[:h], -1))
    A_log, dt = t["A_log"].view(), t["dt_bias"].view()
    return _replace(case, {
        "mixed_qkv": _reshaped(t["mixed_qkv"], torch.cat([q, k, v], 1)),
        "a": _reshaped(t["a"], pair(t["a"].view().reshape(B, HV, sz.GK)).reshape(h, -1)),
        "b": _reshaped(t["b"], pair(t["b"].view())),
        "A_log": _reshaped(t["A_log"], torch.cat([A_log, A_log])),
        "dt_bias": _reshaped(t["dt_bias"], torch.cat([dt, dt])),
        "initial_state": _reshaped(t["initial_state"], pool),
        "out": _reshaped(t["out"], pair(t["out"].view().reshape(B, HV, V))
                         .reshape(h, 1, 2 * HV, V)),
        "ssm_state_indices": _reshaped(t["ssm_state_indices"], new_idx),
    })


def _trade_moves(st: _Step) -> Iterator[_Move]:
    """Moves that keep ``B * HV`` while trading rows against value heads."""
    case, sz, idx = st.case, st.sz, st.idx
    if sz.HV % 2 == 0 and (sz.H % 2 == 0 or sz.H == 1):
        yield _Move(f"B*HV kept: HV {sz.HV} -> {sz.HV // 2}, B {sz.B} -> {2 * sz.B}",
                    lambda: _split_heads(case, sz),
                    st.at(B=2 * sz.B, HV=sz.HV // 2, H=max(1, sz.H // 2), slots=2 * sz.slots))
    if sz.B % 2 == 0 and sz.slots:
        h = sz.B // 2
        pairs = sum(1 for i in range(h) if 0 <= idx[i] < sz.slots or 0 <= idx[h + i] < sz.slots)
        yield _Move(f"B*HV kept: B {sz.B} -> {h}, HV {sz.HV} -> {2 * sz.HV}",
                    lambda: _merge_rows(case, sz),
                    st.at(B=h, HV=2 * sz.HV, H=2 * sz.H, slots=max(1, pairs)))


def _v_subset(case: Case, sz: _Sizes, keep: Sequence[int]) -> Case:
    B, H, HV, K, V = sz.B, sz.H, sz.HV, sz.K, sz.V
    ch = torch.tensor(list(keep), dtype=torch.long)
    t = case.tensors
    qkv = t["mixed_qkv"].view()
    v = qkv[:, 2 * H * K :].reshape(B, HV, V)[:, :, ch].reshape(B, -1)
    return _replace(case, {
        "mixed_qkv": _reshaped(t["mixed_qkv"], torch.cat([qkv[:, : 2 * H * K], v], 1)),
        "initial_state": _reshaped(t["initial_state"], t["initial_state"].view()[:, :, ch]),
        "out": _reshaped(t["out"], t["out"].view()[..., ch]),
    })


def _k_subset(case: Case, sz: _Sizes, keep: Sequence[int]) -> Case:
    B, H, HV, K = sz.B, sz.H, sz.HV, sz.K
    ch = torch.tensor(list(keep), dtype=torch.long)
    t = case.tensors
    qkv = t["mixed_qkv"].view()
    q = qkv[:, : H * K].reshape(B, H, K)[:, :, ch].reshape(B, -1)
    k = qkv[:, H * K : 2 * H * K].reshape(B, H, K)[:, :, ch].reshape(B, -1)
    new = {
        "mixed_qkv": _reshaped(t["mixed_qkv"], torch.cat([q, k, qkv[:, 2 * H * K :]], 1)),
        "initial_state": _reshaped(t["initial_state"], t["initial_state"].view()[..., ch]),
    }
    if sz.gate_k:
        new["a"] = _reshaped(t["a"], t["a"].view().reshape(B, HV, K)[:, :, ch].reshape(B, -1))
        new["dt_bias"] = _reshaped(t["dt_bias"],
                                   t["dt_bias"].view().reshape(HV, K)[:, ch].reshape(-1))
    return _replace(case, new)


def _channel_sets(n: int, hint: int | None, pow2: bool) -> list[list[int]]:
    """Channels to keep, fewest first: 1 (the failing one, then the first), 2, 3, ...;
    only power-of-two counts when ``pow2``."""
    sizes = sorted({s for s in (1, 2, 3, 4, 5, 8, n // 2, n - 1) if 1 <= s < n
                    and not (pow2 and s & (s - 1))})
    out = []
    for s in sizes:
        if hint is not None and s == 1:
            out.append([hint])
        out.append(list(range(s)))
    return out


def _count(keep: Sequence[int]) -> str:
    return f"1 (channel {keep[0]})" if len(keep) == 1 else str(len(keep))


def _dim_moves(st: _Step, pow2: bool) -> Iterator[_Move]:
    case, sz, hint = st.case, st.sz, st.hint
    where = hint.where if hint is not None and hint.output in ("out", "initial_state") else None
    v0 = where[2] if where and len(where) >= 3 and 0 <= where[2] < sz.V else None
    k0 = where[3] if where and len(where) >= 4 and 0 <= where[3] < sz.K else None
    for keep in _channel_sets(sz.V, v0, pow2):
        yield _Move(f"V {sz.V} -> {_count(keep)}", lambda keep=keep: _v_subset(case, sz, keep),
                    st.at(V=len(keep)))
    for keep in _channel_sets(sz.K, k0, pow2):
        yield _Move(f"K {sz.K} -> {_count(keep)}", lambda keep=keep: _k_subset(case, sz, keep),
                    st.at(K=len(keep)))


def _truncate_moves(case: Case, costs: CostModel) -> Iterator[_Move]:
    """Broken layouts: drop trailing batch rows (all row tensors alike) and state slots."""
    t = case.tensors
    qkv = t.get("mixed_qkv")
    B = qkv.shape[0] if qkv is not None and qkv.shape else 0
    for n in sorted({1, B // 2, B - 1}):
        if not 0 < n < B:
            continue
        drop = B - n
        names = [name for name, ndim in ROW_TENSORS.items() if name in t
                 and len(t[name].shape) == ndim and t[name].shape[0] >= drop]

        def build(drop: int = drop, names: list[str] = names) -> Case:
            return _replace(case, {name: _select(t[name], 0, range(t[name].shape[0] - drop))
                                   for name in names})

        shapes = {name: (t[name].shape[0] - drop, *t[name].shape[1:]) for name in names}
        size = costs.predict(case, {name: (_raw_after(t[name], shape), shape)
                                    for name, shape in shapes.items()})
        yield _Move(f"drop {drop} trailing row(s) of {B}", build, size)
    st = t.get("initial_state")
    if st is not None and len(st.shape) == 4:
        slots = st.shape[0]
        for n in sorted({1, slots // 2, slots - 1}):
            if 0 < n < slots:
                yield _Move(f"keep {n} slot(s) of {slots}",
                            lambda n=n: _replace(case, {"initial_state": _select(st, 0, range(n))}),
                            costs.predict(case, {"initial_state": (_raw_after(
                                st, (n, *st.shape[1:])), (n, *st.shape[1:]))}))


def _scalar_moves(case: Case, size: float) -> Iterator[_Move]:
    s = case.scalars

    def move(label: str, **scalars: Any) -> _Move:
        return _Move(label, lambda: _replace(case, scalars=scalars), size, True,
                     same_shape=True)

    if s.get("use_qk_l2norm_in_kernel"):
        yield move("l2norm off", use_qk_l2norm_in_kernel=False)
    if s.get("lower_bound") is not None:
        yield move("lower_bound off", lower_bound=None)
    scale = s.get("scale")
    if isinstance(scale, float) and scale != 1.0:
        yield move("scale 1.0", scale=1.0)
        if scale == -1.0 or scale == 0.0:
            return
        st = case.tensors.get("initial_state")
        K = st.shape[-1] if st is not None and st.shape else 0
        if K > 0 and scale != K**-0.5:
            yield move("scale K**-0.5", scale=float(K**-0.5))
        if scale < 0:
            yield move("scale -1.0", scale=-1.0)
        if math.isfinite(scale):  # the magnitude kept, as the nearest power of two
            p2 = math.copysign(2.0 ** round(math.log2(abs(scale))), scale)
            if p2 != scale and p2 != 0.0 and math.isfinite(p2):
                yield move(f"scale {p2!r} (a power of two)", scale=p2)


# pool bases whose unnamed slots a move zeroed, with the slots named then
_UNNAMED_ZEROED = BaseMarks("packed-unnamed-zeroed")


def _named_slots(case: Case) -> frozenset[int] | None:
    st, idx = case.tensors.get("initial_state"), case.tensors.get("ssm_state_indices")
    if st is None or idx is None or len(st.shape) != 4 or len(idx.shape) != 1 \
            or st.device.type == "meta" or idx.device.type == "meta":
        return None
    n = st.shape[0]
    return frozenset(i for i in _indices(case) if 0 <= i < n)


def _unnamed_zeroed(case: Case, named: frozenset[int]) -> Case:
    """Every slot no row names set to zero, with its padding cells (their only role:
    bit-identical afterwards); the pool's size and strides and the named slots kept."""
    st = case.tensors["initial_state"]
    n = st.shape[0]
    mask = torch.ones(n, dtype=torch.bool)
    if named:
        mask[torch.tensor(sorted(named))] = False
    unnamed = mask.nonzero().squeeze(1).to(st.base.device)
    if not unnamed.numel():
        raise _Skip("every slot is named")
    new = TensorArg(st.base.clone(), st.shape, st.stride, st.offset)
    new.view()[unnamed] = 0
    S0, inner = st.stride[0], math.prod(st.shape[1:])
    dense = st.stride[1:] == (st.shape[2] * st.shape[3], st.shape[3], 1)
    if dense and S0 > inner:  # their padding cells too: one stretch of zeros in the file
        whole = min(n, (new.base.numel() - st.offset) // S0)
        spans = new.base.as_strided((whole, S0), (S0, 1), st.offset)
        spans[unnamed[unnamed < whole]] = 0
    if st.base in SENTINEL_OUTSIDE:
        SENTINEL_OUTSIDE.add(new.base)
    _UNNAMED_ZEROED.add(new.base, named)
    return _replace(case, {"initial_state": new})


VALUE_TENSORS = ("mixed_qkv", "initial_state", "a", "b", "dt_bias", "A_log")
SMALL_INTEGER = 4  # values toward the integers -4..4


def _signs(x: torch.Tensor) -> torch.Tensor:
    """0 and +-1."""
    return torch.sign(torch.nan_to_num(x.double()))


def _small_integers(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x.double()).round().clamp(-SMALL_INTEGER, SMALL_INTEGER)


def _power_of_two_grid(x: torch.Tensor) -> torch.Tensor:
    """Small integers times one power of two near the largest magnitude (tiny or huge
    values keep their scale: 1e-15 becomes a few multiples of 2^-52)."""
    v = torch.nan_to_num(x.double(), nan=0.0, posinf=0.0, neginf=0.0)
    top = float(v.abs().max()) if v.numel() else 0.0
    if top == 0.0:
        return v
    unit = 2.0 ** (math.floor(math.log2(top)) - 1)
    return (v / unit).round() * unit


def _value_moves(case: Case, costs: CostModel, size: float) -> Iterator[_Move]:
    t = case.tensors
    named = _named_slots(case)
    st = t.get("initial_state")
    if named is not None and st is not None and len(named) < st.shape[0] \
            and _UNNAMED_ZEROED.get(st.base) != named:
        share = 1 - len(named) / st.shape[0]
        yield _Move(f"initial_state: the {st.shape[0] - len(named)} unnamed slot(s) zeroed",
                    lambda: _unnamed_zeroed(case, named), size - costs.encoded(st) * share,
                    True, same_shape=True)
    plans: list[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]] = [
        ("initial_state", "zero", torch.zeros_like),
        ("a", "zero", torch.zeros_like),
        ("dt_bias", "zero", torch.zeros_like),
        ("A_log", "zero", torch.zeros_like),
        ("b", "zero", torch.zeros_like),
        ("mixed_qkv", "ones", torch.ones_like),
        *((n, "signs", _signs) for n in ("mixed_qkv", "initial_state")),
        *((n, "small integers", _small_integers) for n in VALUE_TENSORS),
        ("mixed_qkv", "rounded to halves",
         lambda x: torch.nan_to_num((x.double() * 2).round() / 2)),
        ("initial_state", "rounded to halves",
         lambda x: torch.nan_to_num((x.double() * 2).round() / 2)),
        *((n, "on a grid of a power of two", _power_of_two_grid) for n in VALUE_TENSORS),
    ]
    def build(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> Case:
        vals = fn(t[name].view())
        if _same_values(t[name], vals):
            raise _Skip("no change")
        return _replace(case, {name: _with_values(t[name], vals)})

    for name, label, fn in plans:
        arg = t.get(name)
        if arg is None or arg.device.type == "meta" or not arg.dtype.is_floating_point:
            continue
        const = label in ("zero", "ones")  # a constant view: a fill or nearly
        yield _Move(f"{name} {label}", lambda name=name, fn=fn: build(name, fn),
                    size - costs.encoded(arg) if const else size, True, same_shape=True)


class PackedDecodeShrinker:
    """The :class:`~kda_fuzz.engine.contract.Shrinker` of packed decode families: rows, slots,
    heads, B*HV trades and head dims on accepted layouts, truncation on broken ones,
    scalars and values everywhere. ``gate_per_key``: gates per key channel (KDA) or per
    value head (GDN); ``pow2_variants``: variants where K and V must stay powers of two."""

    def __init__(self, *, gate_per_key: bool, pow2_variants: frozenset[str] = frozenset()
                 ) -> None:
        self.gate_per_key = gate_per_key
        self.pow2_variants = pow2_variants

    def structure(self, case: Case, hint: Verdict | None,
                  ctx: ShrinkContext) -> Iterator[_Move]:
        sz = _sizes(case, self.gate_per_key) if ctx.accepted else None
        if sz is None:
            yield from _truncate_moves(case, ctx.costs)
            return
        st = _Step(case, sz, ctx.costs, hint)
        for gen in (_row_moves(st), _slot_moves(st), _head_moves(st), _trade_moves(st),
                    _dim_moves(st, ctx.variant in self.pow2_variants)):
            yield from gen

    def scalars(self, case: Case, ctx: ShrinkContext) -> Iterator[_Move]:
        return _scalar_moves(case, ctx.size)

    def values(self, case: Case, ctx: ShrinkContext) -> Iterator[_Move]:
        return _value_moves(case, ctx.costs, ctx.size)

    def notes(self, case: Case, notes: dict[str, Any]) -> dict[str, Any]:
        """The batch size the layout recorded, now the minimized case's; its live rows
        (the original's count) dropped."""
        notes = dict(notes)
        qkv = case.tensors.get("mixed_qkv")
        if "rows" in notes and qkv is not None and qkv.shape:
            notes["rows"] = qkv.shape[0]
        notes.pop("live_rows", None)
        return notes
