"""Steering a campaign's budget away from layouts like those that crashed or hung.

A crash or a hang costs a job's restart (and a hang the calibrated timeout); once one is
found, running more layouts like it mostly pays that price again. A layout's signature
is its stratum (``broken``, ``valid``, ``scale``) with each of its features: its size
class (:func:`kda_fuzz.timeouts.size_class`), each tensor's dtype and the bit length of
each of its dimensions. For every feature the job counts the layouts it ran and those
that crashed or hung; a drawn layout whose riskiest feature faulted ``f`` times in ``n``
runs is run with probability ``(1 - f / (n + 1))^2`` (at least ``MIN_SHARE``), else it is
rejected as a Hypothesis draw: the arm's examples go to other layouts of the same
stratum, the other strata keep theirs, and the campaign runs its whole example budget.

The decisions are a fixed function of the seed, the position and the counts, which a job
sends with its progress (``state``): a restarted job resumes the counts and replays the
decisions of the draws it fast-forwards through, so it draws the same cases.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

from .case import Case
from .timeouts import size_class

# (round, arm within the job, example within the arm's run): runner.Position
Position = tuple[int, int, int]

MIN_SHARE = 1 / 16  # the least share of its draws a faulting signature keeps

Feature = tuple[Any, ...]


def features(stratum: str, case: Case) -> list[Feature]:
    """The features of a layout that a fault is attributed to (family-agnostic)."""
    out: list[Feature] = [(stratum, "size", size_class(case))]
    for name, t in sorted(case.tensors.items()):
        out.append((stratum, name, "dtype", str(t.dtype).replace("torch.", "")))
        out.extend((stratum, name, d, int(n).bit_length()) for d, n in enumerate(t.shape))
    return out


def describe_feature(f: Feature) -> str:
    """A feature in words: ``valid: mixed_qkv.shape[0] in 64-127``."""
    if f[1] == "size":
        return f"{f[0]}: {2 ** max(0, f[2] - 1)}-{2 ** f[2] - 1} elements"
    if f[2] == "dtype":
        return f"{f[0]}: {f[1]} {f[3]}"
    lo, hi = (0, 0) if f[3] == 0 else (2 ** (f[3] - 1), 2 ** f[3] - 1)
    return f"{f[0]}: {f[1]}.shape[{f[2]}] in {lo}-{hi}"


class Steering:
    """Which draws a job runs, from the crashes and hangs of the layouts it ran."""

    def __init__(self, seed: int, state: dict[str, Any] | None = None) -> None:
        self.seed = seed
        self.runs: Counter = Counter()  # feature -> layouts run (faults included)
        self.faults: Counter = Counter()  # feature -> of those, crashed or hung
        self.rejected: set[Position] = set()  # of the arm in progress
        if state:
            self.runs.update(state["runs"])
            self.faults.update(state["faults"])
            self.rejected = set(state["rejected"])

    def risk(self, stratum: str, case: Case) -> tuple[float, Feature | None]:
        """The riskiest feature of the layout and its fault rate (0 without a fault)."""
        best: tuple[float, Feature | None] = (0.0, None)
        for f in features(stratum, case):
            k = self.faults.get(f, 0)
            if k:
                rate = k / (self.runs[f] + 1)
                if rate > best[0]:
                    best = (rate, f)
        return best

    def admits(self, pos: Position, stratum: str, case: Case, *,
               replay: bool = False) -> tuple[bool, Feature | None]:
        """Whether the draw at ``pos`` is run, and the feature that decided it when not.
        ``replay``: a draw before the resume point, decided as it was then."""
        if replay:
            return pos not in self.rejected, None
        rate, why = self.risk(stratum, case)
        if why is None:
            return True, None
        share = max(MIN_SHARE, (1.0 - rate) ** 2)
        u = zlib.crc32(f"{self.seed}:{pos[0]}:{pos[1]}:{pos[2]}".encode()) / 2**32
        if u < share:
            return True, None
        self.rejected.add(pos)
        return False, why

    def observe(self, stratum: str, case: Case, fault: bool) -> None:
        """A layout was run: it crashed or hung (``fault``) or it returned."""
        for f in features(stratum, case):
            self.runs[f] += 1
            if fault:
                self.faults[f] += 1

    def state(self, position: Position) -> dict[str, Any]:
        """What a job resuming at ``position`` needs (picklable)."""
        here = (position[0], position[1])
        self.rejected = {p for p in self.rejected if (p[0], p[1]) == here}
        return {"runs": dict(self.runs), "faults": dict(self.faults),
                "rejected": sorted(p for p in self.rejected if p < position)}


def note(shifted: dict[str, int]) -> str:
    """One summary line: the draws not run per signature."""
    parts = [f"{k}: {v}" for k, v in sorted(shifted.items(), key=lambda kv: -kv[1])]
    return ("budget shifted away from layouts like those that crashed or hung (draws not "
            "run, by their riskiest feature; their examples went to other layouts of the "
            "same stratum): " + "; ".join(parts))


__all__ = ["MIN_SHARE", "Steering", "describe_feature", "features", "note"]
