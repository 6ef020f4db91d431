"""Domain-aware minimization of a failing case, after Hypothesis' own shrinking.

Hypothesis shrinks the *choices* that built a case; this module shrinks the case itself,
with knowledge of the packed decode layout. Every candidate is re-run with
:func:`kda_fuzz.oracle.run_case` and kept only when the target still fails the same way
(same verdict ``kind`` and ``what``, and for contract failures the same check), so the
result never fails differently from the input. The work is bounded by ``seconds``.

Passes, tried in order and repeated until none makes progress:

* layouts the contract accepts (valid rows are independent): keep only the failing
  batch row(s) (one row; then chunks of rows dropped), turn other live rows into
  padding rows (index -1), drop state slots no row names (indices remapped), keep a
  subset of value heads consistently (q/k/v segments of ``mixed_qkv``, ``a``, ``b``,
  ``A_log``, ``dt_bias``, the state pool and ``out``), fewer V and K channels;
* broken layouts: trailing batch rows and state slots dropped together;
* everywhere: dtypes toward float32 (indices toward int32), flags off
  (``use_qk_l2norm_in_kernel=False``, ``lower_bound=None``), ``scale`` toward 1.0 or
  ``K ** -0.5``, strides toward contiguous, guard cells removed, values toward simple ones
  (zero state and gates, unit or rounded activations).

Layout padding (row stride beyond the width, slot stride beyond the slot) is kept when a
size changes, so a failure that depends on it survives; the strides pass removes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .case import Case, TensorArg, footprint
from .contract import Contract
from .oracle import Outcome, expectation, run_case
from .runner import fingerprint
from .verdict import Verdict

ROW_TENSORS = {"mixed_qkv": 2, "a": 2, "b": 2, "ssm_state_indices": 1, "out": 4}
INT_SENTINEL = 2**30 + 7  # the guard value of integer buffers (as kda_layouts builds them)
MAX_ROUNDS = 64

Candidate = tuple[str, Callable[[], Case]]


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


def _select(arg: TensorArg, dim: int, index: Sequence[int]) -> TensorArg:
    index = list(index)
    if arg.device.type == "meta":
        shape = list(arg.shape)
        shape[dim] = len(index)
        return _make(None, arg, shape, _relayout(arg, shape), arg.offset, _tail(arg))
    idx = torch.tensor(index, dtype=torch.long, device=arg.device)
    return _reshaped(arg, arg.view().index_select(dim, idx))


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


# ------------------------------------------------------------------ candidates


def _rows_subset(case: Case, rows: Sequence[int]) -> Case:
    return _replace(case, {n: _select(case.tensors[n], 0, rows) for n in ROW_TENSORS})


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of chunks to drop, halves first, then smaller (ddmin order)."""
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            yield start, min(n, start + size)
        size //= 2


def _row_candidates(case: Case, sz: _Sizes, hint: Verdict | None) -> Iterator[Candidate]:
    B = sz.B
    idx = _indices(case)
    if B > 1:
        first = []
        if hint is not None and hint.where and hint.what != "untouched-state-written" \
                and 0 <= hint.where[0] < B:
            first.append(hint.where[0])
        pads = [i for i in range(B) if idx[i] < 0]
        order = list(dict.fromkeys(first + pads + list(range(B))))
        for r in order:
            yield f"keep row {r} of {B}", lambda r=r: _rows_subset(case, [r])
        for start, stop in _chunks(B):
            if stop - start < B:
                keep = [i for i in range(B) if not start <= i < stop]
                yield (f"drop rows {start}..{stop - 1} of {B}",
                       lambda keep=keep: _rows_subset(case, keep))
    for r in (i for i, s in enumerate(idx) if s >= 0):
        new = list(idx)
        new[r] = -1
        vals = torch.tensor(new, dtype=torch.int64)
        yield (f"row {r} made padding",
               lambda vals=vals: _replace(case, {"ssm_state_indices": _with_values(
                   case.tensors["ssm_state_indices"], vals)}))


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


def _slot_candidates(case: Case, sz: _Sizes) -> Iterator[Candidate]:
    idx = _indices(case)
    if any(i >= sz.slots for i in idx):
        return
    used = sorted({i for i in idx if i >= 0})
    if len(used) < sz.slots:
        yield (f"keep the {len(used)} named slot(s) of {sz.slots}",
               lambda: _slots_subset(case, used))
    spare = [s for s in range(sz.slots) if s not in used]
    for start, stop in _chunks(len(spare)):
        if stop - start >= len(spare) and not used:
            continue
        drop = set(spare[start:stop])
        keep = [s for s in range(sz.slots) if s not in drop]
        if keep:
            yield (f"drop {len(drop)} unnamed slot(s) of {sz.slots}",
                   lambda keep=keep: _slots_subset(case, keep))


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


def _head_candidates(case: Case, sz: _Sizes, hint: Verdict | None) -> Iterator[Candidate]:
    if sz.HV <= 1:
        return
    per_q = sz.HV // sz.H
    h0 = 0
    if hint is not None and hint.output in ("out", "initial_state") and hint.where \
            and len(hint.where) >= 2 and 0 <= hint.where[1] < sz.HV:
        h0 = hint.where[1]
    subsets = [[h0]] + [[h] for h in range(sz.HV) if h != h0]
    if per_q > 1:
        g = h0 // per_q
        subsets.append(list(range(g * per_q, (g + 1) * per_q)))
        subsets.append([kh * per_q + h0 % per_q for kh in range(sz.H)])
    for keep in subsets:
        if len(keep) < sz.HV:
            yield (f"keep value head(s) {keep} of {sz.HV}",
                   lambda keep=keep: _heads_subset(case, sz, keep))


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


def _channel_sets(n: int, hint: int | None) -> list[list[int]]:
    sizes = sorted({s for s in (1, 2, 3, 4, 5, 8, n // 2, n - 1) if 1 <= s < n})
    out = []
    for s in sizes:
        if hint is not None and s == 1:
            out.append([hint])
        out.append(list(range(s)))
    return out


def _dim_candidates(case: Case, sz: _Sizes, hint: Verdict | None) -> Iterator[Candidate]:
    where = hint.where if hint is not None and hint.output in ("out", "initial_state") else None
    v0 = where[2] if where and len(where) >= 3 and 0 <= where[2] < sz.V else None
    k0 = where[3] if where and len(where) >= 4 and 0 <= where[3] < sz.K else None
    for keep in _channel_sets(sz.V, v0):
        yield f"V {sz.V} -> {len(keep)}", lambda keep=keep: _v_subset(case, sz, keep)
    for keep in _channel_sets(sz.K, k0):
        yield f"K {sz.K} -> {len(keep)}", lambda keep=keep: _k_subset(case, sz, keep)


def _truncate_candidates(case: Case) -> Iterator[Candidate]:
    """Broken layouts: drop trailing batch rows (all row tensors alike) and state slots."""
    t = case.tensors
    qkv = t.get("mixed_qkv")
    B = qkv.shape[0] if qkv is not None and qkv.shape else 0
    for n in sorted({1, B // 2, B - 1}):
        if not 0 < n < B:
            continue
        drop = B - n

        def build(drop: int = drop) -> Case:
            new = {}
            for name, ndim in ROW_TENSORS.items():
                arg = t.get(name)
                if arg is not None and len(arg.shape) == ndim and arg.shape[0] >= drop:
                    new[name] = _select(arg, 0, range(arg.shape[0] - drop))
            return _replace(case, new)

        yield f"drop {drop} trailing row(s) of {B}", build
    st = t.get("initial_state")
    if st is not None and len(st.shape) == 4:
        slots = st.shape[0]
        for n in sorted({1, slots // 2, slots - 1}):
            if 0 < n < slots:
                yield (f"keep {n} slot(s) of {slots}",
                       lambda n=n: _replace(case, {"initial_state": _select(st, 0, range(n))}))


def _dtype_candidates(case: Case) -> Iterator[Candidate]:
    floats = [n for n, a in case.tensors.items()
              if a.dtype.is_floating_point and a.dtype != torch.float32]
    ints = [n for n, a in case.tensors.items() if a.dtype == torch.int64]

    def retype(names: Sequence[str], dtype: torch.dtype) -> Case:
        return _replace(case, {n: TensorArg(case.tensors[n].base.to(dtype),
                                            case.tensors[n].shape, case.tensors[n].stride,
                                            case.tensors[n].offset) for n in names})

    if len(floats) > 1:
        yield "all float tensors to float32", lambda: retype(floats, torch.float32)
    for n in floats:
        yield f"{n} to float32", lambda n=n: retype([n], torch.float32)
    for n in ints:
        yield f"{n} to int32", lambda n=n: retype([n], torch.int32)


def _scalar_candidates(case: Case) -> Iterator[Candidate]:
    s = case.scalars
    if s.get("use_qk_l2norm_in_kernel"):
        yield "l2norm off", lambda: _replace(case, scalars={"use_qk_l2norm_in_kernel": False})
    if s.get("lower_bound") is not None:
        yield "lower_bound off", lambda: _replace(case, scalars={"lower_bound": None})
    scale = s.get("scale")
    if isinstance(scale, float) and scale != 1.0:
        yield "scale 1.0", lambda: _replace(case, scalars={"scale": 1.0})
        st = case.tensors.get("initial_state")
        K = st.shape[-1] if st is not None and st.shape else 0
        if K > 0 and scale != K**-0.5:
            yield "scale K**-0.5", lambda: _replace(case, scalars={"scale": float(K**-0.5)})


def _layout_candidates(case: Case) -> Iterator[Candidate]:
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

    strided = [n for n, a in t.items()
               if a.shape and a.stride != _contiguous_strides(a.shape)
               and not _overlapping(a.shape, a.stride)]
    if len(strided) > 1:
        yield "all strides contiguous", lambda: contiguous(strided)
    for n in strided:
        yield f"{n} contiguous", lambda n=n: contiguous([n])
    guarded = [n for n, a in t.items() if a.offset or _tail(a)]
    if len(guarded) > 1:
        yield "all guard cells removed", lambda: unguarded(guarded)
    for n in guarded:
        yield f"{n} guard cells removed", lambda n=n: unguarded([n])


def _value_candidates(case: Case) -> Iterator[Candidate]:
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
    for name, label, fn in plans:
        arg = t.get(name)
        if arg is None or arg.device.type == "meta" or not arg.dtype.is_floating_point:
            continue
        vals = fn(arg.view())
        if _same_values(arg, vals):
            continue
        yield (f"{name} {label}",
               lambda name=name, vals=vals: _replace(case, {name: _with_values(t[name], vals)}))


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


def minimize_with_verdict(contract: Contract, case: Case, target_fn: Callable[..., Any],
                          verdict: Verdict, *, seconds: float = 30.0,
                          keep: Callable[[Case], bool] | None = None,
                          run: Callable[[Case], Outcome] | None = None
                          ) -> tuple[Case, Verdict]:
    """The minimized case and the verdict the target gave on it (same kind and what as
    ``verdict``; its detail describes the smaller case).

    ``keep``, when given, must hold on every candidate (e.g. ``K != V`` for a bug class
    that only shows then). ``run``, when given, judges a candidate instead of
    ``run_case(contract, candidate, target_fn)`` (e.g. an isolated worker's ``run``, so
    that a candidate that aborts the target cannot take the minimizer down). Returns
    ``case`` itself when nothing smaller keeps the failure. The result's notes record the
    accepted steps (``minimized``) and the original layout (``original_layout``).
    """
    deadline = time.monotonic() + seconds
    current, hint = case, verdict
    steps: list[str] = []
    seen = {fingerprint(case)}

    def accept(cand: Case) -> Verdict | None:
        if time.monotonic() > deadline:
            raise _OutOfTime
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

    def shape_pass(c: Case, h: Verdict | None) -> Iterator[Candidate]:
        sz = structured(c)
        if sz is None:
            yield from _truncate_candidates(c)
            return
        yield from _row_candidates(c, sz, h)
        yield from _slot_candidates(c, sz)
        yield from _head_candidates(c, sz, h)
        yield from _dim_candidates(c, sz, h)

    passes: tuple[Callable[[Case, Verdict | None], Iterator[Candidate]], ...] = (
        shape_pass,
        lambda c, h: _dtype_candidates(c),
        lambda c, h: _scalar_candidates(c),
        lambda c, h: _layout_candidates(c),
        lambda c, h: _value_candidates(c),
    )
    try:
        for _ in range(MAX_ROUNDS):
            progressed = False
            for make_pass in passes:
                while True:  # rerun a pass on its own result until it makes no progress
                    for label, build in make_pass(current, hint):
                        try:
                            cand = build()
                        except (_Skip, RuntimeError, ValueError, IndexError, TypeError):
                            continue
                        got = accept(cand)
                        if got is not None:
                            current, hint, progressed = cand, got, True
                            steps.append(label)
                            break
                    else:
                        break
            if not progressed:
                break
    except _OutOfTime:
        pass
    if not steps:
        return case, verdict
    notes = dict(case.notes)
    if "layout" in notes:
        notes["original_layout"] = notes.pop("layout")
    notes["minimized"] = steps
    qkv = current.tensors.get("mixed_qkv")
    if "rows" in notes and qkv is not None and qkv.shape:
        notes["rows"] = qkv.shape[0]
    return Case(current.contract, current.variant, current.tensors, current.scalars,
                current.intent, notes), hint
