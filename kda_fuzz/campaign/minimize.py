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
removed; above ``SIMPLE_BYTES``, bulky float tensors' values regenerated from recipes
(:mod:`kda_fuzz.engine.recipe`, stored as a recipe plus a patch of the elements kept
bit-exact: none, the non-finite ones, or what ddmin over positions keeps), and a
tensor of a recipe regenerated at its new layout whenever a move reshapes it. The
contract's :class:`~kda_fuzz.engine.contract.Shrinker` (``Contract.shrinker``),
the family's knowledge: its structure (rows, heads, head dims; on broken layouts,
truncation), its scalars (flags off, simpler values) and its values (zeros, ones,
rounded). The packed decode families' shrinker is
:mod:`kda_fuzz.families.packed.shrink`.

Layout padding (row stride beyond the width, slot stride beyond the slot) is kept when a
size changes, so a failure that depends on it survives; the strides move removes it.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from kda_fuzz.campaign.results import Failure
from kda_fuzz.corpus.store import encoded_tensor_size
from kda_fuzz.engine import recipe as _recipe
from kda_fuzz.engine.case import Case, TensorArg, fingerprint
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.oracle import Outcome, expectation, run_case
from kda_fuzz.engine.recipe import Ranges
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
BULKY_BYTES = 1 << 12  # tensors worth a cheaper dtype, or values from a recipe
RECIPE_BYTES = 128  # about what a recipe costs in a file, without its patch
RECIPE_RANGES = 4  # the longest ranges of kept values a step tries to split, per tensor
RECIPE_SPANS = 8  # ... and the spans of each size tried in each of them


class _OutOfTime(Exception):
    """The minimization budget is spent."""


class Cut(BaseException):
    """Raised by a candidate's ``run`` (or ``proven``) to end a minimization at once (an
    interrupt, the ``--max-seconds`` deadline): the smallest failing case found so far is
    kept. Not an ``Exception``, so that no candidate's handling swallows it."""


# ------------------------------------------------------------------ cost


class _Costs:
    """The objective: a tensor costs its encoded bytes in a corpus file plus
    ``1 / RAW_WEIGHT`` of its bytes in memory and of its sizes' sum (so that, among cases
    of one file size, the smaller layout wins, empty tensors included). Each base is
    encoded once."""

    def __init__(self) -> None:
        self._memo: dict[tuple[Any, ...], tuple[weakref.ref[torch.Tensor], int]] = {}

    def encoded(self, arg: TensorArg) -> int:
        base = arg.base
        key = (id(base), arg.shape, arg.stride, arg.offset)  # a recipe's cost needs the view
        hit = self._memo.get(key)
        if hit is not None and hit[0]() is base:
            return hit[1]
        size = encoded_tensor_size(arg)
        self._memo[key] = (weakref.ref(base), size)
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


def _recipe_moves(case: Case, costs: _Costs, size: float) -> Iterator[_Move]:
    """Bulky float tensors' values regenerated from grid recipes
    (:mod:`kda_fuzz.engine.recipe`), stored as the recipe and a patch: each whole (a
    failure that does not depend on the values: a crash, a launch past a grid limit, an
    offset that wraps, a hang), then, for one that must keep some values, its non-finite
    elements only, then halves, quarters... of the cells it still keeps (ddmin order),
    so that a file keeps bit-exact only the elements the failure needs. A whole tensor
    from a recipe is predicted a recipe's bytes more than the same tensor as a fill (the
    family's zero and ones moves), so fills are tried first. None below
    ``SIMPLE_BYTES``."""
    if size <= SIMPLE_BYTES:
        return
    t = case.tensors
    found = _recipe_candidates(case, costs)

    def regenerated(keeps: Mapping[str, Ranges]) -> Case:
        return _regenerated(case, keeps)

    def only_non_finite(n: str, kept: Ranges) -> Case:
        odd = _non_finite(t[n], kept)
        if not 0 < odd.numel() < _recipe.kept_count(kept):
            raise _Skip("no non-finite value, or nothing else")
        return regenerated({n: _recipe.ranges_of(odd)})

    def after(saved: float, paid: int) -> float:
        return size - saved + paid

    for n, kept, enc, paid in found:
        total = _recipe.kept_count(kept)
        yield _Move(f"{n} values from a recipe", lambda n=n: regenerated({n: ()}),
                    after(enc, paid), same_shape=True)
        yield _Move(f"{n}: its non-finite values only kept",
                    lambda n=n, kept=kept: only_non_finite(n, kept), after(enc / 2, paid),
                    same_shape=True)
        for lo, hi in sorted(kept, key=lambda r: r[0] - r[1])[:RECIPE_RANGES]:
            for s, e in _spans(hi - lo):
                keep = _recipe.without(kept, lo + s, lo + e)
                yield _Move(f"{n}: cells {lo + s}..{lo + e - 1} from the recipe",
                            lambda n=n, keep=keep: regenerated({n: keep}),
                            after(enc * (e - s) / total, paid), same_shape=True)


def _recipe_candidates(case: Case, costs: _Costs) -> list[tuple[str, Ranges, int, int]]:
    """The bulky float tensors whose values a grid recipe may make, biggest first: (name,
    the base ranges not yet the recipe's, encoded bytes, what the recipe costs to add)."""
    found: list[tuple[str, Ranges, int, int]] = []
    for n, a in case.tensors.items():
        if a.device.type == "meta" or not a.dtype.is_floating_point \
                or not math.prod(a.shape) or _overlapping(a.shape, a.stride):
            continue
        enc = costs.encoded(a)
        h = _recipe.hint_of(a.base)
        if enc <= BULKY_BYTES or (h is not None and h.recipe.name != "grid"):
            continue
        kept = ((0, a.base.numel()),) if h is None else _recipe.known_kept(a)
        if kept:
            found.append((n, kept, enc, RECIPE_BYTES if h is None else 0))
    found.sort(key=lambda f: -f[2])
    return found


def _regenerated(case: Case, keeps: Mapping[str, Ranges]) -> Case:
    """``case`` with each named tensor made by its recipe (its hint's, else a grid recipe of
    its own), the base ranges in ``keeps[name]`` kept as they are."""
    new = {}
    for n, keep in keeps.items():
        a = case.tensors[n]
        h = _recipe.hint_of(a.base)
        recipe, outside = (h.recipe, h.outside) if h is not None else \
            (_recipe.grid_recipe(a, n), _recipe.outside_word(a))
        new[n] = _recipe.regenerate(a, recipe, outside, keep)
    return _replace(case, new)


def _spans(n: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of halves, quarters... of ``range(n)`` (ddmin order), at most
    ``RECIPE_SPANS`` of each size, spread evenly (built without listing them all)."""
    size = n // 2
    while size >= 1:
        count = -(-n // size)
        picks = range(count) if count <= RECIPE_SPANS else \
            sorted({i * (count - 1) // (RECIPE_SPANS - 1) for i in range(RECIPE_SPANS)})
        for i in picks:
            yield i * size, min(n, (i + 1) * size)
        size //= 2


def _non_finite(arg: TensorArg, kept: Ranges) -> torch.Tensor:
    """The base positions in ``kept`` of ``arg``'s non-finite elements, guard cells
    outside the view that hold the recipe's guard word left out."""
    h = _recipe.hint_of(arg.base)
    word = h.outside if h is not None else _recipe.outside_word(arg)
    flat = arg.base.detach().reshape(-1)
    words = flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                       8: torch.int64}[flat.element_size()])
    seen = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    seen.as_strided(arg.shape, arg.stride, arg.offset).fill_(True)
    if word is not None:
        seen |= words != word
    found = [(~torch.isfinite(flat[lo:hi]) & seen[lo:hi]).nonzero().squeeze(1).cpu() + lo
             for lo, hi in kept]
    return torch.cat(found) if found else torch.empty(0, dtype=torch.int64)


def _sticky(current: Case, cand: Case) -> Case:
    """``cand`` with each tensor that ``current`` took from a grid recipe and ``cand``
    gives a new layout (a structure, dtype or stride move) regenerated by that recipe at
    the new layout, the values that are on no grid of its exponent (the ones kept from
    the original) kept: the others did not matter, and a recipe costs a few bytes where
    the values moved there would be stored."""
    new = {}
    for n, b in cand.tensors.items():
        a = current.tensors.get(n)
        h = None if a is None or b.base is a.base else _recipe.hint_of(a.base)
        if a is None or h is None or h.recipe.name != "grid" \
                or _recipe.hint_of(b.base) is not None or b.device.type == "meta" \
                or not b.dtype.is_floating_point or not b.base.numel() \
                or _overlapping(b.shape, b.stride) \
                or (b.dtype, b.shape, b.stride, b.offset, b.base.numel()) \
                == (a.dtype, a.shape, a.stride, a.offset, a.base.numel()):
            continue  # no recipe to follow, or new values on the old layout (a value move)
        recipe = h.recipe
        lo, hi = _recipe.FP16_EXPONENTS
        if b.dtype == torch.float16 and not lo <= recipe.exponent <= hi:
            recipe = _recipe.Recipe("grid", recipe.seed, max(lo, min(hi, recipe.exponent)))
        odd = _recipe.view_positions(b, _recipe.off_grid(b, h.recipe)) \
            if math.prod(b.shape) else torch.empty(0, dtype=torch.int64)
        new[n] = _recipe.regenerate(b, recipe, _recipe.outside_word(b),
                                    _recipe.ranges_of(odd))
    return _replace(cand, new) if new else cand


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
        found += _recipe_moves(c, costs, size)
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
                    cand = _sticky(current, move.build())
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
    except (_OutOfTime, Cut):
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

def candidate_timeout(verdict: Verdict, timeout: float) -> float:
    """The per-candidate timeout of a failure's minimization: for a hang, the calibrated
    limit of the call found (a smaller case is no slower), else ``timeout``."""
    limit = verdict.limit_seconds if verdict.kind == "timeout" else None
    return min(timeout, float(limit)) if limit else timeout


def minimized_detail(found: Verdict, minimized: Verdict, timeout: float) -> Verdict:
    """``minimized`` (the verdict on the minimized case), its detail saying where a hang's
    limit came from."""
    if minimized.kind != "timeout" or candidate_timeout(found, timeout) >= timeout:
        return minimized
    return replace(minimized, detail=f"{minimized.detail} (the calibrated per-call timeout "
                   f"its smaller candidates were given; proven past --timeout {timeout:g} s)")


def minimize_failure(contract: Contract, failure: Failure, run: Callable[[Case], Outcome], *,
                     seconds: float = 30.0, keep: Callable[[Case], bool] | None = None,
                     proven: Callable[[Case], bool] | None = None,
                     detail: Callable[[Verdict], Verdict] | None = None) -> bool:
    """Minimize ``failure`` in place, each candidate judged by ``run``: the one entry point
    of the campaign (``campaign(minimize=)``), the finding saver and the sanitizer's
    findings. Its case and verdict become the smallest case found within ``seconds``
    that fails the same way (:func:`minimize_with_verdict`; ``keep`` as there) and the
    verdict on it (through ``detail`` when given), the case as found kept in
    ``original``. ``proven(case)``, when given, is asked of a smaller case that hangs:
    when it says no (or is cut), the failure stays as found, with a note. Whether the
    failure was replaced (by the same case when nothing smaller failed the same way). A
    :class:`Cut` from ``run`` ends the minimization with what it reached so far (each step
    of it failed the same way)."""
    case, verdict = minimize_with_verdict(contract, failure.case, None,  # type: ignore[arg-type]
                                          failure.verdict, run=run, seconds=seconds, keep=keep)
    if proven is not None and verdict.kind == "timeout" and case is not failure.case:
        try:
            hangs = proven(case)
        except Cut:
            hangs = False
        if not hangs:
            failure.add_note("the minimized case was not proven to hang past --timeout: "
                             "the hang is saved as found")
            return False
    failure.original, failure.case = failure.case, case
    failure.verdict = detail(verdict) if detail is not None else verdict
    return True


SMALL_FILE_BYTES = 1 << 20  # the goal for every saved file
NO_ELEMENT_KINDS = ("crash", "timeout", "sanitizer")  # verdicts that name no element


def compacted(case: Case, verdict: Verdict, run: Callable[[Case], Outcome]
              ) -> tuple[Case, Verdict] | None:
    """For a finding whose verdict names elements, still over the file goal after its
    minimization: ``case`` with its bulky float values regenerated from recipes
    (:func:`values_from_recipes`) and the verdict on it, when one ``run`` of it fails the
    same way; None otherwise (a :class:`Cut` from ``run`` passes through)."""
    small = compact_candidate(case)
    if small is None:
        return None
    try:
        outcome = run(small)
    except Exception:  # a candidate the oracle cannot handle is just not kept
        return None
    if outcome.status != "fail" or not _same(verdict, outcome.verdict):
        return None
    assert outcome.verdict is not None
    return small, outcome.verdict


def compact_candidate(case: Case) -> Case | None:
    """``case`` with its bulky float values regenerated from recipes when its file would
    exceed the goal (:data:`SMALL_FILE_BYTES`), to be run before it replaces ``case``;
    None when the file would not (a cheap test of its bytes first) or nothing changes."""
    raw = sum(a.base.numel() * a.base.element_size() for a in case.tensors.values()
              if a.device.type != "meta")
    if raw * 4 // 3 <= SMALL_FILE_BYTES:  # (base64: the most a stored byte costs)
        return None
    return values_from_recipes(case, limit=SMALL_FILE_BYTES)


def values_from_recipes(case: Case, limit: int = SMALL_FILE_BYTES // 2) -> Case | None:
    """``case`` with every bulky float tensor's values regenerated whole from a grid recipe
    (its non-finite elements kept bit for bit), when its tensors would take more than
    ``limit`` bytes in a file; None when they would not, or nothing changes. Not
    re-run: for a finding whose verdict names no element (:data:`NO_ELEMENT_KINDS`) that
    minimization did not shrink in time, so that its file stays small at any scale; the
    case's notes name the tensors (``values_regenerated``)."""
    costs = _Costs()
    if costs.encoded_case(case) <= limit:
        return None
    keeps = {n: _recipe.ranges_of(_non_finite(case.tensors[n], kept))
             for n, kept, _, _ in _recipe_candidates(case, costs)}
    if not keeps:
        return None
    regenerated = _regenerated(case, keeps)
    return replace(regenerated, notes={**regenerated.notes, "values_regenerated": sorted(keeps)})
