"""Domain-aware minimization of a failing case, after Hypothesis' own shrinking.

Hypothesis shrinks the *choices* that built a case; this module shrinks the case itself,
with the knowledge its contract's shrinker declares. Every candidate is re-run with
:func:`kda_fuzz.engine.oracle.run_case` (or the caller's ``run``) and kept only when the target
still fails the same way (the same :meth:`~kda_fuzz.engine.verdict.Verdict.signature`, and for
contract failures other than a raise the same check), so the result never fails
differently from the input. The work is bounded by ``seconds``.

The objective (:func:`case_cost`) is the size of the corpus file the case makes: the
encoded bytes of its tensors (:func:`kda_fuzz.corpus.store.encoded_base_size`: fills and
zlib-compressed bytes), plus ``1 / RAW_WEIGHT`` of their bytes in memory and of their
sizes, so that among cases of one file size (all fills, say) the smaller layout wins.
Each step gathers every move below, predicts the size of its result from the sizes it
would give (without building it), and tries the moves by predicted bytes saved per
candidate run, so a time budget goes to the biggest savings (a move that changes a shape
counts ``RESHAPE_RUNS`` runs: a shape-specialising kernel compiles anew; below
``SIMPLE_BYTES`` the moves keep the order of the list below). A move is kept when it
fails the same way and makes the case smaller; a *simplifying* move (dtypes toward
float32, flags off, contiguous strides, guard cells removed or filled, simpler values)
is kept at equal size, and at any size up to ``SIMPLE_BYTES``, below which plain beats
small.

Moves come from two places. The engine's own, on any case: dtypes toward float32
(indices toward int32), cheaper dtypes (bfloat16, float16) for bulky float tensors while
the case is above ``SIMPLE_BYTES``, strides toward contiguous, cells outside a view (row
padding, guards) set to the guard value in place (stored as fill runs), guard cells
removed. The contract's :class:`~kda_fuzz.engine.contract.Shrinker` (``Contract.shrinker``),
the family's knowledge: its structure (rows, heads, head dims; on broken layouts,
truncation), its scalars (flags off, simpler values) and its values (zeros, ones,
rounded). The packed decode families' shrinker is
:mod:`kda_fuzz.families.packed.shrink`.

Layout padding (row stride beyond the width, slot stride beyond the slot) is kept when a
size changes, so a failure that depends on it survives; the strides move removes it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from kda_fuzz.corpus.store import encoded_base_size
from kda_fuzz.engine.case import Case, TensorArg, fingerprint
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.oracle import Outcome, expectation, run_case
from kda_fuzz.engine.shrink import SENTINEL_OUTSIDE, ShrinkContext
from kda_fuzz.engine.shrink import Move as _Move
from kda_fuzz.engine.shrink import Skip as _Skip
from kda_fuzz.engine.shrink import contiguous_strides as _contiguous_strides
from kda_fuzz.engine.shrink import make as _make
from kda_fuzz.engine.shrink import overlapping as _overlapping
from kda_fuzz.engine.shrink import raw_after as _raw_after
from kda_fuzz.engine.shrink import raw_bytes as _raw_bytes
from kda_fuzz.engine.shrink import replace_in as _replace
from kda_fuzz.engine.shrink import tail as _tail
from kda_fuzz.engine.verdict import RAISED, Verdict

MAX_STEPS = 4096  # accepted moves at most (the time budget ends it first)
RESHAPE_RUNS = 4  # what a candidate of new shapes costs, in runs of one of the same shapes
RAW_WEIGHT = 64  # a byte in memory costs 1/64 of a byte in the file
SIMPLE_BYTES = 1 << 16  # below this cost, simplifying moves may grow a case
BULKY_BYTES = 1 << 12  # tensors worth a cheaper dtype


class _OutOfTime(Exception):
    """The minimization budget is spent."""



# ------------------------------------------------------------------ cost


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


# ------------------------------------------------------------------ moves everywhere


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
    for n, a in t.items():  # cells the view never reads: row and slot padding, guards
        if a.device.type == "meta" or a.base.numel() <= a.view().numel() \
                or a.base in SENTINEL_OUTSIDE or _overlapping(a.shape, a.stride):
            continue
        after = costs.encoded(a) * a.view().numel() / max(1, a.base.numel()) + 64
        yield _Move(f"{n}: cells outside the view filled",
                    lambda a=a, n=n: _replace(case, {n: _make(a.view(), a, a.shape, a.stride,
                                                              a.offset, _tail(a))}),
                    costs.case(case) - costs.encoded(a) + after, True, same_shape=True)
    guarded = [n for n, a in t.items() if a.offset or _tail(a)]
    if len(guarded) > 1:
        yield _Move("all guard cells removed", lambda: unguarded(guarded), bare(guarded), True)
    for n in guarded:
        yield _Move(f"{n} guard cells removed", lambda n=n: unguarded([n]), bare([n]), True)


# ------------------------------------------------------------------ driver


def _same(target: Verdict, got: Verdict | None) -> bool:
    if not target.same_failure(got):
        return False
    assert got is not None
    # what the target raised is the failure, not which check the layout meant to trip
    return target.kind != "contract" or target.what in RAISED or got.check == target.check


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
    (:func:`kda_fuzz.corpus.store.encoded_base_size`; the file adds a few KiB of text) plus
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

    def accepted(c: Case) -> bool:
        try:
            return expectation(contract, c).ok and not c.notes.get("semantic")
        except Exception:
            return False

    shrinker = contract.shrinker

    def moves(c: Case, h: Verdict | None, size: float) -> list[_Move]:
        ctx = ShrinkContext(costs, size, c.variant, accepted(c))
        found: list[_Move] = []
        if shrinker is not None:
            found += shrinker.structure(c, h, ctx)
        found += _dtype_moves(c, costs, size)
        if shrinker is not None:
            found += shrinker.scalars(c, ctx)
        found += _layout_moves(c, costs)
        if shrinker is not None:
            found += shrinker.values(c, ctx)
        # biggest savings per candidate run first (a candidate of new shapes compiles a
        # shape-specialising kernel anew: it costs RESHAPE_RUNS runs); below SIMPLE_BYTES,
        # in the order above (stable sort)
        if size <= SIMPLE_BYTES:
            return sorted(found, key=lambda m: max(m.size, SIMPLE_BYTES))
        return sorted(found, key=lambda m: -(size - max(m.size, SIMPLE_BYTES))
                      / (1 if m.same_shape else RESHAPE_RUNS))

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
    if shrinker is not None:  # the family's facts of the original, brought up to date
        notes = shrinker.notes(current, notes)
    return Case(current.contract, current.variant, current.tensors, current.scalars,
                current.intent, notes), hint
