"""Calibrated per-call timeouts, as AFL derives its hang timeout from measured runs.

A supervised job times every target call it makes and, before each call, sets the limit
the supervisor enforces for it once the target has hung (``supervisor``'s flight record):

* a call of a layout whose shapes the target has run before in this process:
  ``MULTIPLE`` times the slowest call seen of its size class (the bit length of the
  case's tensor elements; else the nearest smaller class seen, scaled up by the size
  ratio, at most ``MAX_SCALE`` times; else the slowest call of any class);
* the first call of a new shape (a shape-specialising kernel compiles): ``MULTIPLE``
  times the slowest such first call seen, and at least the above;
* the first call of a process (a restarted job: imports, caches, compiles again):
  ``MULTIPLE`` times the slowest first call of a process seen, and at least the above;
* before any call of the target has returned: the ceiling (``--timeout``);

never below ``FLOOR`` seconds (``COMPILE_FLOOR`` for a call that may compile, a first
call of a new shape or process, once the process has seen the target's kernels compile)
nor above the ceiling. Until a target has a proven hang, the supervisor cuts its calls at
the ceiling alone: a cut costs the job a restart (imports and every compile again), and a
slow but returning call of a correct kernel (a loaded machine, a GPU shared by jobs, a
compile for strides the shape key does not tell apart) is never a hang. A first call past
the ceiling is run again in a fresh process under the ceiling; only one that does not
return there either is a proven hang (a stall of the machine does not come back). From
then on its later calls are cut at their calibrated limit, so that repeats of a hang cost
seconds, and a hang's minimization gives each smaller candidate the calibrated limit (its
result is proven past the ceiling again).
What was learned lives in a plain array of floats (the job's shared flight record), so
it survives the job's restarts.
"""

from __future__ import annotations

import math
from collections.abc import MutableSequence
from typing import Any

from kda_fuzz.engine.case import Case

FLOOR = 2.0  # seconds: no call is a hang before this (a GC pause, a page fault storm)
COMPILE_FLOOR = 10.0  # ... nor a call that may compile, of a target seen compiling
MULTIPLE = 10.0  # the limit is this many times the slowest comparable call seen
MAX_SCALE = 8.0  # a larger class extrapolated from a smaller one: at most this many times
CLASSES = 64  # size classes: bit lengths of a case's tensor element count
# floats per target: slowest first call of a process, of a new shape, then per size class
WARM, COMPILE, SLOTS = 0, 1, 2 + CLASSES


def size_class(case: Case) -> int:
    """The bit length of the number of elements of the case's tensor arguments (views)."""
    total = sum(math.prod(t.shape) for t in case.tensors.values())
    return min(CLASSES - 1, int(total).bit_length())


def shape_key(case: Case) -> tuple[Any, ...]:
    """What a shape-specialising kernel may compile for: every tensor's shape and dtype,
    which strides are 1 and which are multiples of 16, and which scalars are ``None``."""
    return (tuple((n, t.shape, str(t.dtype), tuple((s == 1, s % 16 == 0) for s in t.stride))
                  for n, t in sorted(case.tensors.items())),
            tuple(sorted((n, v is None) for n, v in case.scalars.items())))


def store_size(targets: int) -> int:
    """Floats of calibration store that ``targets`` targets need."""
    return SLOTS * max(1, targets)


class Calibration:
    """Per-call time limits of a job's targets, learned from their call times.

    ``store`` holds what was measured (``store_size(targets)`` floats, zero at first; kept
    by the caller across processes); which shapes this process has run is its own."""

    def __init__(self, store: MutableSequence[float], targets: int, ceiling: float, *,
                 floor: float = FLOOR, multiple: float = MULTIPLE, offset: int = 0) -> None:
        if len(store) < offset + store_size(targets):
            raise ValueError(f"a calibration store of {targets} targets needs "
                             f"{store_size(targets)} floats from {offset}, got {len(store)}")
        self.store = _Slice(store, offset) if offset else store
        self.targets, self.ceiling = targets, ceiling
        self.floor, self.multiple = min(floor, ceiling), multiple
        self._shapes: set[tuple[int, tuple[Any, ...]]] = set()
        self.largest = 0.0  # the largest limit set by this process, for its summary

    def _slowest(self, target: int, cls: int) -> float:
        """The slowest call of class ``cls``, else of the nearest smaller class seen scaled
        up by the size ratio (at most ``MAX_SCALE`` times), else the slowest call of any
        class (0: no call of a shape run before seen)."""
        base = target * SLOTS + 2
        for c in range(cls, -1, -1):
            if self.store[base + c] > 0:
                return self.store[base + c] * min(MAX_SCALE, 2.0 ** (cls - c))
        return max((self.store[base + c] for c in range(CLASSES)), default=0.0)

    def limit(self, target: int, case: Case, compiling: bool = False) -> float:
        """Seconds the call of ``target`` (its index) on ``case`` may take; ``compiling``:
        this process has seen kernels compile."""
        base = target * SLOTS
        warm, compile_ = self.store[base + WARM], self.store[base + COMPILE]
        if warm <= 0:
            return self.ceiling  # nothing has returned yet: anything may be a compile
        expect = self._slowest(target, size_class(case))
        floor = self.floor
        if not any(t == target for t, _ in self._shapes):
            expect = max(expect, warm, compile_)
            floor = max(floor, COMPILE_FLOOR if compiling else 0.0)
        elif (target, shape_key(case)) not in self._shapes or expect <= 0:
            expect = max(expect, compile_ or warm)
            floor = max(floor, COMPILE_FLOOR if compiling else 0.0)
        out = min(self.ceiling, max(floor, self.multiple * expect))
        self.largest = max(self.largest, out)
        return out

    def observe(self, target: int, case: Case, seconds: float) -> None:
        """A call of ``target`` on ``case`` returned (or raised) after ``seconds``."""
        key = (target, shape_key(case))
        base = target * SLOTS
        seconds = max(seconds, 1e-9)
        if not any(t == target for t, _ in self._shapes):
            cell = base + WARM
        elif key not in self._shapes:
            cell = base + COMPILE
        else:
            cell = base + 2 + size_class(case)
        self._shapes.add(key)
        self.store[cell] = max(self.store[cell], seconds)

    def in_force(self, target: int) -> float:
        """The limit now set for a call of a shape already run in the largest class seen
        (the ceiling before any call returned)."""
        base = target * SLOTS
        if self.store[base + WARM] <= 0:
            return self.ceiling
        seen = [c for c in range(CLASSES) if self.store[base + 2 + c] > 0]
        expect = self.store[base + 2 + seen[-1]] if seen else (
            self.store[base + COMPILE] or self.store[base + WARM])
        return min(self.ceiling, max(self.floor, self.multiple * expect))


class _Slice:
    """``store[offset:]`` as a writable view (a shared array's slice is a copy)."""

    def __init__(self, store: MutableSequence[float], offset: int) -> None:
        self.base, self.offset = store, offset

    def __getitem__(self, i: int) -> float:
        return self.base[self.offset + i]

    def __setitem__(self, i: int, value: float) -> None:
        self.base[self.offset + i] = value

    def __len__(self) -> int:
        return len(self.base) - self.offset


def merged(stores: list[MutableSequence[float]], targets: int, offset: int = 0) -> list[float]:
    """The cell-wise largest of several jobs' stores (what any of them measured)."""
    n = store_size(targets)
    return [max((s[offset + i] for s in stores), default=0.0) for i in range(n)]


def describe(store: MutableSequence[float], targets: list[str], ceiling: float, *,
             floor: float = FLOOR, multiple: float = MULTIPLE) -> dict[str, Any]:
    """The policy and, per target, what it measured and the limit in force (JSON)."""
    cal = Calibration(store, len(targets), ceiling, floor=floor, multiple=multiple)
    store = cal.store
    per: dict[str, Any] = {}
    for i, name in enumerate(targets):
        base = i * SLOTS
        classes = [store[base + 2 + c] for c in range(CLASSES) if store[base + 2 + c] > 0]

        def seconds(x: float) -> float | None:
            return round(x, 4) if x > 0 else None

        per[name] = {
            "in_force_seconds": round(cal.in_force(i), 3),
            "slowest_first_call_of_a_process_seconds": seconds(store[base + WARM]),
            "slowest_first_call_of_a_shape_seconds": seconds(store[base + COMPILE]),
            "slowest_call_seconds": seconds(max(classes, default=0.0)),
        }
    return {"policy": f"{multiple:g}x the slowest call of its size class (of a first call "
                      f"for a new shape or process), at least {floor:g} s, at most --timeout; it "
                      "cuts a target's calls once one has not returned within --timeout",
            "ceiling_seconds": ceiling, "floor_seconds": min(floor, ceiling),
            "multiple": multiple, "targets": per}


def note(summary: dict[str, Any]) -> str:
    """One summary line: the timeout in force per target."""
    parts = [f"{name} {t['in_force_seconds']:g} s" for name, t in summary["targets"].items()]
    rerun, hung = summary.get("rerun", 0), summary.get("rerun_hung", 0)
    back = summary.get("rerun_returned", 0)
    cut = rerun - hung - back
    again = (f"; {rerun} call(s) past --timeout ran again in a fresh process: {hung} did not "
             f"return again (hangs), {back} returned (stalled, not hung: no finding)"
             + (f", {cut} cut by the campaign's end before they returned or hung again (not "
                "proven: no finding; a longer --max-seconds or a shorter --timeout proves "
                "them)" if cut > 0 else "")) if rerun else ""
    stalls, skipped = summary.get("compile_stalls", 0), summary.get("compile_skipped", 0)
    compiler = (f"; {stalls} call(s) stopped past their limit inside a kernel compile (the "
                f"compiler's stall, never a finding) ran again in a fresh "
                f"process, {skipped} of them stalled there again (counted as not "
                "executable)") if stalls else ""
    return (f"calibrated per-call timeout ({summary['policy']}): in force at the end: "
            + ", ".join(parts) + again + compiler)


__all__ = ["CLASSES", "COMPILE_FLOOR", "FLOOR", "MULTIPLE", "Calibration",
           "describe", "merged", "note", "shape_key", "size_class",
           "store_size"]
