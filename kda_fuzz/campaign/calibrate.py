"""Time-aware layout sizes: measure a target's cost per unit of work before a campaign.

A kernel run by an interpreter on the CPU (a Triton or Helion kernel under the Triton
interpreter) costs milliseconds per program, so layouts sized for native code would take
minutes each. Before a CPU campaign whose sizes were not given, the target runs probe
cases of the contract (``Contract.probe(units, width, variant)``: one unit, ``PROBE_UNITS``
units, and ``PROBE_UNITS`` wider ones) in an isolated worker; the differences give its
cost per unit (a program) and per element (the CPU time of the worker's calling thread,
fastest of ``REPEATS``, so that a busy machine does not make native code look slow). A
target that pays milliseconds per unit (an interpreter running one program each) gets,
from those, the largest counts of units and elements that keep a valid example within
``EXAMPLE_SECONDS`` (half of it for each); the family turns them into caps of its own
sizes (``Knobs.calibrated``).
"""

from __future__ import annotations

import time

from kda_fuzz.campaign.spec import CampaignSpec
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.knobs import Caps, Measured
from kda_fuzz.workers.deadline import PastDeadline
from kda_fuzz.workers.isolate import IsolatedTarget

EXAMPLE_SECONDS = 0.5  # wall time a valid example may take on the CPU
PROBE_UNITS, NARROW, WIDE = 32, 16, 64  # probe cases: units x (width NARROW or WIDE)
REPEATS = 3  # runs of each probe; a busy machine must not make native code look slow
# A cost per unit of work (a program) above this is an interpreter's (one program each,
# ms apiece); vectorised code costs microseconds, and timing noise must not cap its sizes.
INTERPRETED_ROW_HEAD = 1e-3


def calibrate(contract: Contract, variant: str, target: str, *,
              timeout: float = 60.0, deadline: float | None = None) -> Caps | None:
    """Measure ``target`` (``MODULE:CALLABLE``) on the CPU: the family's caps for it,
    ``None`` when its sizes already fit the time, when a probe does not pass (the
    campaign will say why), when the family has no probes or caps, or when the
    measurement is not over by ``deadline`` (``time.monotonic()``; its worker killed)."""
    probe, caps = contract.probe, contract.knobs.calibrated
    if probe is None or caps is None:
        return None
    small, many = probe(1, NARROW, variant), probe(PROBE_UNITS, NARROW, variant)
    wide = probe(PROBE_UNITS, WIDE, variant)
    times = []
    with IsolatedTarget(contract, target, timeout=timeout, deadline=deadline) as iso:
        for case in (small, small, many, wide):  # the first call may compile, warm caches
            best = float("inf")
            for _ in range(REPEATS):  # noise only adds time: the fastest run is the cost
                t = time.perf_counter()
                try:
                    outcome = iso.run(case)
                except PastDeadline:  # the campaign's time is not spent measuring
                    return None
                if outcome.status != "pass":
                    return None
                wall = time.perf_counter() - t
                best = min(best, wall if outcome.cpu_seconds is None else outcome.cpu_seconds)
            times.append(best)
    fixed = times[1]
    per_unit = max(0.0, (times[2] - fixed) / (PROBE_UNITS - 1))
    per_elem = max(0.0, (times[3] - times[2]) / (PROBE_UNITS * (WIDE**2 - NARROW**2)))
    if per_unit < INTERPRETED_ROW_HEAD:  # vectorised code: the default sizes are cheap
        return None
    half = max(EXAMPLE_SECONDS - fixed, EXAMPLE_SECONDS / 5) / 2
    return caps(Measured(fixed, per_unit, per_elem,
                         units=max(1, int(half / per_unit)) if per_unit else None,
                         elements=max(NARROW**2, int(half / per_elem)) if per_elem else None,
                         seconds=EXAMPLE_SECONDS))


def apply(caps: Caps, spec: CampaignSpec) -> CampaignSpec:
    """``spec`` with the family's sizes capped by ``caps``."""
    return spec.with_options(**caps.cap(spec.options.sizes))
