"""Domain-aware minimization of a failing case, after Hypothesis' own shrinking.

Hypothesis shrinks the *choices* that built a case; this module shrinks the case itself,
with knowledge of the packed decode layout. Every candidate is re-run with
:func:`kda_fuzz.oracle.run_case` (or the caller's ``run``) and kept only when the target
still fails the same way (same verdict ``kind`` and ``what``, and for contract failures
the same check), so the result never fails differently from the input. The work is
bounded by ``seconds``.

The objective (:func:`case_cost`) is the size of the corpus file the case makes: the
encoded bytes of its tensors (:func:`kda_fuzz.corpus.encoded_base_size`: fills and
zlib-compressed bytes), plus ``1 / RAW_WEIGHT`` of their bytes in memory and of their
sizes, so that among cases of one file size (all fills, say) the smaller layout wins.
Each step gathers every move below, predicts the size of its result from the sizes it
would give (without building it), and tries the moves in order of predicted size,
smallest first, so a time budget goes to the biggest savings (moves predicted under
``SIMPLE_BYTES`` keep the order of the list below). A move is kept when it
fails the same way and makes the case smaller; a *simplifying* move (dtypes toward
float32, flags off, contiguous strides, guard cells removed, simpler values) is kept at
equal size, and at any size up to ``SIMPLE_BYTES``, below which plain beats small.

Moves on layouts the contract accepts (valid rows are independent):

* rows: keep one row (the failing one first), drop chunks of rows (halves first);
  rows made padding (index -1) with the slots they named dropped; unnamed slots dropped;
* heads: keep a subset of value heads consistently (q/k/v segments of ``mixed_qkv``,
  ``a``, ``b``, ``A_log``, ``dt_bias``, the state pool and ``out``); fewer key heads
  (fewer GQA groups, value heads kept);
* trades that keep ``B * HV`` (what a grid of ``(.., B * HV)`` blocks needs) while
  shrinking the rest: value heads halved and rows doubled (each row's second half of
  heads becomes a row of its own, with a slot of its own), or the reverse;
* fewer V and K channels, smallest first (powers of two only where the variant has
  check 14);
* cheaper dtypes (bfloat16, float16) for bulky float tensors, while the case is above
  ``SIMPLE_BYTES``;

on broken layouts: trailing batch rows and state slots dropped together; everywhere:
dtypes toward float32 (indices toward int32), flags off (``use_qk_l2norm_in_kernel=False``,
``lower_bound=None``), ``scale`` toward 1.0 or ``K ** -0.5``, strides toward contiguous,
guard cells removed, values toward simple ones (zero state and gates, unit or rounded
activations: constant bases are stored as fills).

Layout padding (row stride beyond the width, slot stride beyond the slot) is kept when a
size changes, so a failure that depends on it survives; the strides move removes it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from .case import Case, TensorArg, footprint
from .contract import Contract
from .corpus import encoded_base_size
from .oracle import Outcome, expectation, run_case
from .runner import fingerprint
from .verdict import Verdict

ROW_TENSORS = {"mixed_qkv": 2, "a": 2, "b": 2, "ssm_state_indices": 1, "out": 4}
INT_SENTINEL = 2**30 + 7  # the guard value of integer buffers (as kda_layouts builds them)
MAX_STEPS = 4096  # accepted moves at most (the time budget ends it first)
RAW_WEIGHT = 64  # a byte in memory costs 1/64 of a byte in the file
SIMPLE_BYTES = 1 << 16  # below this cost, simplifying moves may grow a case
BULKY_BYTES = 1 << 12  # tensors worth a cheaper dtype
SMALL_AXIS = 64  # axes up to this long try every chunk position ...
MAX_POSITIONS = 8  # ... longer ones this many per chunk size


@dataclass(frozen=True)
class _Move:
    """One candidate: how to build it, and the encoded size its result is predicted to have.

    ``simplify``: kept at equal size (and at any size up to ``SIMPLE_BYTES``).
    """

    label: str
    build: Callable[[], Case]
    size: float
    simplify: bool = False


class _Skip(Exception):
    """A candidate that cannot be built on this layout."""


class _OutOfTime(Exception):
    """The minimization budget is spent."""


# ------------------------------------------------------------------ tensor helpers


def _sentinel(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return False
    return min(INT_SENTINEL, torch.iinfo(dtype).max)


def _tail(arg: TensorArg) -> int:
    """Guard cells after the last element the view reaches."""
    return max(0, arg.base.numel() - max(arg.footprint(), arg.offset))


def _overlapping(shape: Sequence[int], stride: Sequence[int]) -> bool:
    need = 1
    for st, n in sorted((s, n) for s, n in zip(stride, shape) if n > 1):
        if st < need:
            return True
        need = st * n
    return False


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _make(values: torch.Tensor | None, like: TensorArg, shape: Sequence[int],
          stride: Sequence[int], offset: int, tail: int,
          dtype: torch.dtype | None = None) -> TensorArg:
    """A fresh argument: sentinel-filled base, the view written with ``values``."""
    dtype = dtype or like.dtype
    shape, stride = tuple(int(n) for n in shape), tuple(int(s) for s in stride)
    size = max(footprint(shape, stride, offset), offset) + tail
    if like.device.type == "meta":
        return TensorArg(torch.empty(size, dtype=dtype, device="meta"), shape, stride, offset)
    base = torch.full((size,), _sentinel(dtype), dtype=dtype, device=like.device)
    arg = TensorArg(base, shape, stride, offset)
    if values is not None and base.numel() and all(shape):
        if _overlapping(shape, stride):
            raise _Skip("overlapping view")
        arg.view().copy_(values.to(device=like.device, dtype=dtype).reshape(shape))
    return arg


def _relayout(arg: TensorArg, shape: Sequence[int]) -> tuple[int, ...]:
    """Strides for ``shape`` that keep ``arg``'s per-dim padding (row-major layouts only)."""
    old_shape, old = arg.shape, arg.stride
    if len(shape) != len(old_shape):
        raise _Skip("rank changed")
    if not old_shape:
        return ()
    n = len(shape)
    new = [0] * n
    new[-1] = old[-1]
    for d in range(n - 2, -1, -1):
        pad = old[d] - old_shape[d + 1] * old[d + 1]
        if old_shape[d] <= 1:
            pad = max(pad, 0)
        if pad < 0:
            raise _Skip("not a row-major layout")
        new[d] = shape[d + 1] * new[d + 1] + pad
    return tuple(new)


def _reshaped(arg: TensorArg, values: torch.Tensor) -> TensorArg:
    """``arg`` holding ``values`` (a new shape), padding and guard cells kept."""
    shape = tuple(values.shape)
    return _make(values, arg, shape, _relayout(arg, shape), arg.offset, _tail(arg))


def _select(arg: TensorArg, dim: int, index: Sequence[int] | torch.Tensor) -> TensorArg:
    if isinstance(index, range):
        idx = torch.arange(index.start, index.stop, index.step)
    else:
        idx = torch.as_tensor(index, dtype=torch.long)
    if arg.device.type == "meta":
        shape = list(arg.shape)
        shape[dim] = idx.numel()
        return _make(None, arg, shape, _relayout(arg, shape), arg.offset, _tail(arg))
    return _reshaped(arg, arg.view().index_select(dim, idx.to(arg.device)))


def _with_values(arg: TensorArg, values: torch.Tensor) -> TensorArg:
    """The same layout and guard cells, with the view's elements replaced."""
    if arg.device.type == "meta":
        raise _Skip("meta tensor")
    if _overlapping(arg.shape, arg.stride):
        raise _Skip("overlapping view")
    new = TensorArg(arg.base.clone(), arg.shape, arg.stride, arg.offset)
    new.view().copy_(values.to(device=arg.device, dtype=arg.dtype).reshape(arg.shape))
    return new


def _same_values(arg: TensorArg, values: torch.Tensor) -> bool:
    if arg.device.type == "meta":
        return True
    return torch.equal(arg.view(), values.to(device=arg.device, dtype=arg.dtype))


def _replace(case: Case, tensors: dict[str, TensorArg] | None = None,
             scalars: dict[str, Any] | None = None) -> Case:
    t = dict(case.tensors)
    t.update(tensors or {})
    s = dict(case.scalars)
    s.update(scalars or {})
    return Case(case.contract, case.variant, t, s, case.intent, dict(case.notes))


# ------------------------------------------------------------------ layout sizes


@dataclass(frozen=True)
class _Sizes:
    B: int
    H: int
    HV: int
    K: int
    V: int
    slots: int


def _sizes(case: Case) -> _Sizes | None:
    """Sizes of a layout the contract accepts (``None`` for anything else)."""
    try:
        n, HV, V, K = case.tensors["initial_state"].shape
        B, W = case.tensors["mixed_qkv"].shape
        H = (W - HV * V) // 2 // K
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return _Sizes(B, H, HV, K, V, n)


def _indices(case: Case) -> list[int]:
    return [int(i) for i in case.tensors["ssm_state_indices"].view().tolist()]



# ------------------------------------------------------------------ cost


def _raw_bytes(arg: TensorArg) -> int:
    return 0 if arg.device.type == "meta" else arg.base.numel() * arg.base.element_size()


def _raw_after(arg: TensorArg, shape: Sequence[int], dtype: torch.dtype | None = None) -> int:
    """Bytes of ``arg``'s base once reshaped to ``shape`` (padding and guards kept)."""
    try:
        stride = _relayout(arg, shape)
    except _Skip:
        stride = _contiguous_strides(shape)
    n = max(footprint(shape, stride, arg.offset), arg.offset) + _tail(arg)
    return n * (dtype or arg.dtype).itemsize


class _Costs:
    """The objective: a tensor costs its encoded bytes in a corpus file plus
    ``1 / RAW_WEIGHT`` of its bytes in memory and of its sizes' sum (so that, among cases
    of one file size, the smaller layout wins, empty tensors included). Each base is
    encoded once."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}

    def encoded(self, arg: TensorArg) -> int:
        base = arg.base
        hit = self._memo.get(id(base))
        if hit is not None and hit[0]() is base:
            return hit[1]
        size = encoded_base_size(base)
        self._memo[id(base)] = (weakref.ref(base), size)
        return size

    def tensor(self, arg: TensorArg) -> float:
        return self.encoded(arg) + (_raw_bytes(arg) + sum(arg.shape)) / RAW_WEIGHT

    def case(self, case: Case) -> float:
        return sum(self.tensor(t) for t in case.tensors.values())

    def encoded_case(self, case: Case) -> int:
        return sum(self.encoded(t) for t in case.tensors.values())

    def predict(self, case: Case, after: Mapping[str, tuple[int, Sequence[int]]]) -> float:
        """The cost of ``case`` once the named tensors hold (bytes, shape) ``after``, their
        bytes encoded as densely as now."""
        total = float(self.case(case))
        for name, (n, shape) in after.items():
            arg = case.tensors[name]
            if arg.device.type == "meta":  # no bytes in the file, none in memory
                continue
            enc, before = self.encoded(arg), _raw_bytes(arg)
            ratio = enc / before if before else 4 / 3
            total += ratio * n + (n + sum(shape)) / RAW_WEIGHT - self.tensor(arg)
        return total


def _shapes(sz: _Sizes) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a valid layout of these sizes."""
    B, H, HV, K, V = sz.B, sz.H, sz.HV, sz.K, sz.V
    return {
        "mixed_qkv": (B, 2 * H * K + HV * V), "a": (B, HV * K), "b": (B, HV),
        "A_log": (HV,), "dt_bias": (HV * K,), "initial_state": (sz.slots, HV, V, K),
        "out": (B, 1, HV, V), "ssm_state_indices": (B,),
    }


class _Step:
    """The moves of one step on a valid layout: its sizes and predicted sizes."""

    def __init__(self, case: Case, sz: _Sizes, costs: _Costs, hint: Verdict | None) -> None:
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


def _chunks(n: int, avoid: int | None = None, whole: bool = False) -> Iterator[tuple[int, int]]:
    """(start, stop) of chunks of ``range(n)``: the whole range when ``whole``, then halves,
    quarters... (ddmin order); chunks holding ``avoid`` last within a size, and at most
    ``MAX_POSITIONS`` chunks per size when ``n > SMALL_AXIS``."""
    if whole and n:
        yield 0, n
    size = n // 2
    while size >= 1:
        spans = [(s, min(n, s + size)) for s in range(0, n, size)]
        spans.sort(key=lambda sp: avoid is not None and sp[0] <= avoid < sp[1])
        yield from spans if n <= SMALL_AXIS else spans[:MAX_POSITIONS]
        size //= 2


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
        "a": _reshaped(t["a"], t["a"].view().reshape(B, HV, K)[:, hv].reshape(B, -1)),
        "b": _reshaped(t["b"], t["b"].view()[:, hv]),
        "A_log": _reshaped(t["A_log"], t["A_log"].view()[hv]),
        "dt_bias": _reshaped(t["dt_bias"], t["dt_bias"].view().reshape(HV, K)[hv].reshape(-1)),
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
        "a": _reshaped(t["a"], halves(t["a"].view().reshape(B, HV, K), hv2).reshape(2 * B, -1)),
        "b": _reshaped(t["b"], halves(t["b"].view(), hv2)),
        "A_log": _reshaped(t["A_log"], t["A_log"].view()[:hv2]),
        "dt_bias": _reshaped(t["dt_bias"], t["dt_bias"].view()[: hv2 * K]),
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
        "a": _reshaped(t["a"], pair(t["a"].view().reshape(B, HV, K)).reshape(h, -1)),
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
    return _replace(case, {
        "mixed_qkv": _reshaped(t["mixed_qkv"], torch.cat([q, k, qkv[:, 2 * H * K :]], 1)),
        "a": _reshaped(t["a"], t["a"].view().reshape(B, HV, K)[:, :, ch].reshape(B, -1)),
        "dt_bias": _reshaped(t["dt_bias"],
                             t["dt_bias"].view().reshape(HV, K)[:, ch].reshape(-1)),
        "initial_state": _reshaped(t["initial_state"], t["initial_state"].view()[..., ch]),
    })


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


# ------------------------------------------------------------------ moves everywhere


def _truncate_moves(case: Case, costs: _Costs) -> Iterator[_Move]:
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


def _retype(case: Case, names: Sequence[str], dtype: torch.dtype) -> Case:
    t = case.tensors
    return _replace(case, {n: TensorArg(t[n].base.to(dtype), t[n].shape, t[n].stride,
                                        t[n].offset) for n in names})


def _dtype_moves(case: Case, costs: _Costs, size: float) -> Iterator[_Move]:
    t = case.tensors

    def move(label: str, names: Sequence[str], dtype: torch.dtype, simplify: bool) -> _Move:
        after = {n: (t[n].base.numel() * dtype.itemsize, t[n].shape) for n in names}
        return _Move(label, lambda: _retype(case, names, dtype), costs.predict(case, after),
                     simplify)

    floats = [n for n, a in t.items() if a.dtype.is_floating_point and a.dtype != torch.float32]
    if len(floats) > 1:
        yield move("all float tensors to float32", floats, torch.float32, True)
    for n in floats:
        yield move(f"{n} to float32", [n], torch.float32, True)
    for n in (n for n, a in t.items() if a.dtype == torch.int64):
        yield move(f"{n} to int32", [n], torch.int32, True)
    if size <= SIMPLE_BYTES:
        return
    bulky = [n for n, a in t.items() if a.device.type != "meta"
             and a.dtype in (torch.float32, torch.float64) and costs.encoded(a) >= BULKY_BYTES]
    for half in (torch.bfloat16, torch.float16):
        name = str(half).replace("torch.", "")
        if len(bulky) > 1:
            yield move(f"bulky float tensors to {name}", bulky, half, False)
        for n in bulky:
            yield move(f"{n} to {name}", [n], half, False)


def _scalar_moves(case: Case, size: float) -> Iterator[_Move]:
    s = case.scalars

    def move(label: str, **scalars: Any) -> _Move:
        return _Move(label, lambda: _replace(case, scalars=scalars), size, True)

    if s.get("use_qk_l2norm_in_kernel"):
        yield move("l2norm off", use_qk_l2norm_in_kernel=False)
    if s.get("lower_bound") is not None:
        yield move("lower_bound off", lower_bound=None)
    scale = s.get("scale")
    if isinstance(scale, float) and scale != 1.0:
        yield move("scale 1.0", scale=1.0)
        st = case.tensors.get("initial_state")
        K = st.shape[-1] if st is not None and st.shape else 0
        if K > 0 and scale != K**-0.5:
            yield move("scale K**-0.5", scale=float(K**-0.5))


def _layout_moves(case: Case, costs: _Costs) -> Iterator[_Move]:
    t = case.tensors

    def contiguous(names: Sequence[str]) -> Case:
        new = {}
        for n in names:
            a = t[n]
            vals = None if a.device.type == "meta" else a.view()
            new[n] = _make(vals, a, a.shape, _contiguous_strides(a.shape), a.offset, _tail(a))
        return _replace(case, new)

    def unguarded(names: Sequence[str]) -> Case:
        new = {}
        for n in names:
            a = t[n]
            vals = None if a.device.type == "meta" else a.view()
            new[n] = _make(vals, a, a.shape, a.stride, 0, 0)
        return _replace(case, new)

    def dense(names: Sequence[str]) -> float:
        return costs.predict(case, {n: (_raw_after(t[n], t[n].shape), t[n].shape)
                                    for n in names})

    def bare(names: Sequence[str]) -> float:
        return costs.predict(case, {n: (t[n].footprint() * t[n].dtype.itemsize, t[n].shape)
                                    for n in names})

    strided = [n for n, a in t.items()
               if a.shape and a.stride != _contiguous_strides(a.shape)
               and not _overlapping(a.shape, a.stride)]
    if len(strided) > 1:
        yield _Move("all strides contiguous", lambda: contiguous(strided), dense(strided), True)
    for n in strided:
        yield _Move(f"{n} contiguous", lambda n=n: contiguous([n]), dense([n]), True)
    guarded = [n for n, a in t.items() if a.offset or _tail(a)]
    if len(guarded) > 1:
        yield _Move("all guard cells removed", lambda: unguarded(guarded), bare(guarded), True)
    for n in guarded:
        yield _Move(f"{n} guard cells removed", lambda n=n: unguarded([n]), bare([n]), True)


def _value_moves(case: Case, costs: _Costs, size: float) -> Iterator[_Move]:
    t = case.tensors
    plans: list[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]]] = [
        ("initial_state", "zero", torch.zeros_like),
        ("a", "zero", torch.zeros_like),
        ("dt_bias", "zero", torch.zeros_like),
        ("A_log", "zero", torch.zeros_like),
        ("b", "zero", torch.zeros_like),
        ("mixed_qkv", "ones", torch.ones_like),
        ("mixed_qkv", "rounded to halves",
         lambda x: torch.nan_to_num((x.double() * 2).round() / 2)),
        ("initial_state", "rounded to halves",
         lambda x: torch.nan_to_num((x.double() * 2).round() / 2)),
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
                    size - costs.encoded(arg) if const else size, True)


# ------------------------------------------------------------------ driver


def _same(target: Verdict, got: Verdict | None) -> bool:
    if not target.same_failure(got):
        return False
    assert got is not None
    return target.kind != "contract" or got.check == target.check


def minimize(contract: Contract, case: Case, target_fn: Callable[..., Any], verdict: Verdict,
             *, seconds: float = 30.0, keep: Callable[[Case], bool] | None = None,
             run: Callable[[Case], Outcome] | None = None) -> Case:
    """The smallest case found within ``seconds`` on which ``target_fn`` fails like ``verdict``.

    See :func:`minimize_with_verdict`, which also returns the verdict of the result.
    """
    return minimize_with_verdict(contract, case, target_fn, verdict, seconds=seconds,
                                 keep=keep, run=run)[0]


def _structure(case: Case) -> tuple[Any, ...]:
    """A case's layout without its values: dtypes, shapes, strides, offsets, base sizes."""
    return tuple((n, a.dtype, a.device.type, a.shape, a.stride, a.offset, a.base.numel())
                 for n, a in sorted(case.tensors.items()))


def case_cost(case: Case) -> float:
    """The minimizer's objective: the encoded bytes of ``case``'s tensors in a corpus file
    (:func:`kda_fuzz.corpus.encoded_base_size`; the file adds a few KiB of text) plus
    ``1 / RAW_WEIGHT`` of their bytes in memory and of the sum of their sizes."""
    return _Costs().case(case)


def minimize_with_verdict(contract: Contract, case: Case, target_fn: Callable[..., Any],
                          verdict: Verdict, *, seconds: float = 30.0,
                          keep: Callable[[Case], bool] | None = None,
                          run: Callable[[Case], Outcome] | None = None
                          ) -> tuple[Case, Verdict]:
    """The minimized case and the verdict the target gave on it (same kind and what as
    ``verdict``; its detail describes the smaller case).

    Minimizes the case's cost (:func:`case_cost`), biggest predicted savings
    first. ``keep``, when given, must hold on every candidate (e.g. ``K != V`` for a bug
    class that only shows then). ``run``, when given, judges a candidate instead of
    ``run_case(contract, candidate, target_fn)`` (e.g. an isolated worker's ``run``, so
    that a candidate that aborts the target cannot take the minimizer down). Returns
    ``case`` itself when nothing smaller keeps the failure. The result's notes record the
    accepted steps (``minimized``), the original layout (``original_layout``) and the
    encoded tensor bytes before and after (``minimized_bytes``).
    """
    deadline = time.monotonic() + seconds
    costs = _Costs()
    current, hint = case, verdict
    steps: list[str] = []
    seen = {fingerprint(case)}

    def out_of_time() -> None:
        if time.monotonic() > deadline:
            raise _OutOfTime

    def accept(cand: Case) -> Verdict | None:
        out_of_time()
        fp = fingerprint(cand)
        if fp in seen:
            return None
        seen.add(fp)
        if keep is not None and not keep(cand):
            return None
        try:
            outcome = run(cand) if run is not None else run_case(contract, cand, target_fn)
        except Exception:  # a candidate the oracle cannot handle is just not kept
            return None
        if outcome.status == "fail" and _same(verdict, outcome.verdict):
            return outcome.verdict
        return None

    def structured(c: Case) -> _Sizes | None:
        try:
            ok = expectation(contract, c).ok and not c.notes.get("semantic")
        except Exception:
            return None
        return _sizes(c) if ok else None

    pow2 = any(c.number == 14 for c in contract.checks_for(case.variant)) \
        if contract.name == "kda" else False

    def moves(c: Case, h: Verdict | None, size: float) -> list[_Move]:
        sz = structured(c)
        found: list[_Move] = []
        if sz is None:
            found += _truncate_moves(c, costs)
        else:
            st = _Step(c, sz, costs, h)
            for gen in (_row_moves(st), _slot_moves(st), _head_moves(st), _trade_moves(st),
                        _dim_moves(st, pow2)):
                found += gen
        found += _dtype_moves(c, costs, size)
        found += _scalar_moves(c, size)
        found += _layout_moves(c, costs)
        found += _value_moves(c, costs, size)
        # biggest savings first; below SIMPLE_BYTES, in the order above (stable sort)
        return sorted(found, key=lambda m: max(m.size, SIMPLE_BYTES))

    # Moves that failed on a layout of the same structure are tried again only after
    # every other move (values and scalars may have changed since): a failure that needs
    # B*HV rows x heads fails every row drop, each time a value move is kept.
    failed: set[tuple[str, tuple[Any, ...]]] = set()
    size0 = costs.encoded_case(case)
    try:
        for _ in range(MAX_STEPS):
            size = costs.case(current)
            limit = max(size, SIMPLE_BYTES)
            shape = _structure(current)
            found = moves(current, hint, size)
            fresh = [m for m in found if (m.label, shape) not in failed]
            for move in fresh + [m for m in found if (m.label, shape) in failed]:
                out_of_time()
                if move.size > limit or (move.size >= size and not move.simplify):
                    continue
                failed.add((move.label, shape))
                try:
                    cand = move.build()
                except (_Skip, RuntimeError, ValueError, IndexError, TypeError):
                    continue
                new = costs.case(cand)
                if not (new < size or (move.simplify and new <= limit)):
                    continue
                got = accept(cand)
                if got is not None:
                    current, hint = cand, got
                    steps.append(move.label)
                    break
            else:
                break
    except _OutOfTime:
        pass
    if not steps:
        return case, verdict
    notes = dict(case.notes)
    if "layout" in notes:
        notes["original_layout"] = notes.pop("layout")
    notes["minimized"] = steps
    notes["minimized_bytes"] = [size0, costs.encoded_case(current)]
    qkv = current.tensors.get("mixed_qkv")
    if "rows" in notes and qkv is not None and qkv.shape:
        notes["rows"] = qkv.shape[0]
    return Case(current.contract, current.variant, current.tensors, current.scalars,
                current.intent, notes), hint
