"""Time-aware layout sizes: measure a target's cost per row and head before a campaign.

A kernel run by an interpreter on the CPU (a Triton or Helion kernel under the Triton
interpreter) costs milliseconds per program, one program per batch row and value head, so
layouts sized for native code would take minutes each. Before a CPU campaign whose sizes
were not given, the target runs probe layouts of the contract (``Contract.probe``: one
row, ``PROBE_ROWS`` rows, and ``PROBE_ROWS`` wider rows) in an isolated worker; the
differences give its cost per row and head and per state element (the CPU time of the
worker's calling thread, fastest of ``REPEATS``, so that a busy machine does not make
native code look slow). A target that pays milliseconds per row and head (an interpreter
running one program each) gets, from those, the largest B*HV and element budget that keep
a valid example within ``EXAMPLE_SECONDS`` (half of it for each).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kda_fuzz.engine.contract import Contract
from kda_fuzz.workers.isolate import IsolatedTarget

EXAMPLE_SECONDS = 0.5  # wall time a valid example may take on the CPU
PROBE_ROWS, NARROW, WIDE = 32, 16, 64  # probe layouts: rows x (K = V = NARROW or WIDE)
REPEATS = 3  # runs of each probe; a busy machine must not make native code look slow
# A cost per row and head above this is an interpreter's (one program each, ms apiece);
# vectorised code costs microseconds, and timing noise must not cap its sizes.
INTERPRETED_ROW_HEAD = 1e-3


@dataclass(frozen=True)
class Sizing:
    """What calibration measured and the caps it chose."""

    fixed: float
    per_row_head: float
    per_element: float
    max_bhv: int
    budget: int

    def note(self) -> str:
        return (f"sizes capped for a slow target: {1e3 * self.fixed:.0f} ms per call, "
                f"{1e3 * self.per_row_head:.2f} ms per row and head, "
                f"{1e6 * self.per_element:.2f} us per state element measured; at most "
                f"{self.max_bhv} programs (rows x heads) and {self.budget} state elements a "
                f"case (about {EXAMPLE_SECONDS:g} s per example; --budget/--max-b override)")


def calibrate(contract: Contract, variant: str, target: str, *, timeout: float = 60.0,
              default_budget: int = 1 << 18, default_bhv: int = 256 * 64) -> Sizing | None:
    """Measure ``target`` (``MODULE:CALLABLE``) on the CPU; ``None`` when the default sizes
    already fit the time, or when a probe does not pass (the campaign will say why)."""
    probe = contract.probe
    if probe is None:
        return None
    small, rows = probe(1, NARROW, variant), probe(PROBE_ROWS, NARROW, variant)
    wide = probe(PROBE_ROWS, WIDE, variant)
    times = []
    with IsolatedTarget(contract, target, timeout=timeout) as iso:
        for case in (small, small, rows, wide):  # the first call may compile, warm caches
            best = float("inf")
            for _ in range(REPEATS):  # noise only adds time: the fastest run is the cost
                t = time.perf_counter()
                outcome = iso.run(case)
                if outcome.status != "pass":
                    return None
                wall = time.perf_counter() - t
                best = min(best, wall if outcome.cpu_seconds is None else outcome.cpu_seconds)
            times.append(best)
    fixed = times[1]
    per_row = max(0.0, (times[2] - fixed) / (PROBE_ROWS - 1))
    per_elem = max(0.0, (times[3] - times[2]) / (PROBE_ROWS * (WIDE**2 - NARROW**2)))
    if per_row < INTERPRETED_ROW_HEAD:  # vectorised code: the default sizes are cheap
        return None
    half = max(EXAMPLE_SECONDS - fixed, EXAMPLE_SECONDS / 5) / 2
    max_bhv = min(default_bhv, max(1, int(half / per_row)) if per_row else default_bhv)
    budget = min(default_budget, max(NARROW**2, int(half / per_elem)) if per_elem
                 else default_budget)
    if max_bhv >= default_bhv and budget >= default_budget:
        return None
    return Sizing(fixed, per_row, per_elem, max_bhv, budget)


def apply(sizing: Sizing, options: dict[str, Any]) -> None:
    """Cap ``options`` (``plan`` keywords) by ``sizing``."""
    options["max_bhv"] = min(options.get("max_bhv") or sizing.max_bhv, sizing.max_bhv)
    options["max_b"] = min(options.get("max_b") or 256, sizing.max_bhv)
    options["budget"] = min(options.get("budget") or sizing.budget, sizing.budget)
