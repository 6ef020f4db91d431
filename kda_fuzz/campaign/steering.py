"""Steering a campaign's budget away from layouts like those that crashed or hung.

A crash or a hang costs a job's restart (and a hang the calibrated timeout); once one is
found, running more layouts like it mostly pays that price again. A layout's signature
is its stratum (``broken``, ``valid``, ``scale``) with each of its features: its size
class (:func:`kda_fuzz.campaign.timeouts.size_class`) and each tensor's dtype and dimensions, as
"at least 2^k" and "below 2^k" for every k (a fault of large batches is one feature,
whatever their sizes). For every feature the job counts the layouts it ran and those
that crashed or hung. A feature's fault rate is ``f / (n + 1)`` (``f`` faults in ``n``
runs); a drawn layout whose riskiest feature's rate ``r`` is above its stratum's ``r0``
is run with probability ``((1 - r) / (1 - r0))^3`` (at least ``MIN_SHARE``; a feature
that faults no more often than any layout does is no evidence), else it is rejected as
a Hypothesis draw: the arm's examples go to other layouts of the same
stratum, the other strata keep theirs, and the campaign runs its whole example budget.

The decisions are a fixed function of the seed, the position and the counts, which a job
sends with its progress (``state``): a restarted job resumes the counts and replays the
decisions of the draws it fast-forwards through, so it draws the same cases.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

from kda_fuzz.campaign.timeouts import size_class
from kda_fuzz.engine.case import Case

# (round, arm within the job, example within the arm's run): runner.Position
Position = tuple[int, int, int]

MIN_SHARE = 1 / 64  # the least share of its draws a faulting signature keeps

Feature = tuple[Any, ...]


BITS = 40  # thresholds 2^0 .. 2^(BITS-1)


def _thresholds(stratum: str, what: tuple[Any, ...], n: int) -> list[Feature]:
    """``n >= 2^k`` for every k it meets, ``n < 2^k`` for every k it does not."""
    bits = min(BITS, int(n).bit_length())
    return ([(stratum, *what, ">=", k) for k in range(bits)]
            + [(stratum, *what, "<", k) for k in range(bits, BITS)])


def _key(case: Case) -> tuple[Any, ...]:
    """What :func:`features` depends on, in a few words: the size class, and every tensor's
    dtype and bit lengths of its dimensions (cheap to count, expanded only when needed)."""
    return (max(0, size_class(case) - 1),
            tuple((name, str(t.dtype).replace("torch.", ""),
                   tuple(min(BITS, int(n).bit_length()) for n in t.shape))
                  for name, t in sorted(case.tensors.items())))


def _expand(stratum: str, key: tuple[Any, ...]) -> list[Feature]:
    size, tensors = key
    out = [(stratum, "all")]
    out += _thresholds(stratum, ("size",), 1 << size)
    for name, dtype, dims in tensors:
        out.append((stratum, name, "dtype", dtype))
        for d, bits in enumerate(dims):
            out += _thresholds(stratum, (name, d), (1 << bits) >> 1)
    return out


def features(stratum: str, case: Case) -> list[Feature]:
    """The features of a layout that a fault is attributed to (family-agnostic)."""
    return _expand(stratum, _key(case))


def describe_feature(f: Feature) -> str:
    """A feature in words: ``valid: mixed_qkv.shape[0] >= 64``."""
    if f[2] == "dtype":
        return f"{f[0]}: {f[1]} {f[3]}"
    what = "elements" if f[1] == "size" else f"{f[1]}.shape[{f[2]}]"
    return f"{f[0]}: {what} {f[-2]} {2 ** f[-1]}"


class Steering:
    """Which draws a job runs, from the crashes and hangs of the layouts it ran."""

    def __init__(self, seed: int, state: dict[str, Any] | None = None) -> None:
        self.seed = seed
        # (stratum, _key) -> layouts run (faults included), and of those crashed or hung:
        # what every job counts. The per-feature counts below are kept only for strata
        # that have faulted (the only ones a draw is steered in), expanded from these then.
        self.layouts: Counter = Counter()
        self.faulted: Counter = Counter()
        self.runs: Counter = Counter()  # feature -> layouts run (faulted strata only)
        self.faults: Counter = Counter()  # feature -> of those, crashed or hung
        self._expanded: set[str] = set()  # strata whose per-feature counts are kept
        self.rejected: set[Position] = set()  # of the arm in progress
        if state:
            self.layouts.update(state["layouts"])
            self.faulted.update(state["faulted"])
            self.rejected = set(state["rejected"])
            for stratum in {st for st, _ in self.faulted}:
                self._expand_stratum(stratum)

    def _expand_stratum(self, stratum: str) -> None:
        """Keep ``stratum``'s per-feature counts from now on, from its layouts so far."""
        self._expanded.add(stratum)
        for (st, key), n in self.layouts.items():
            if st != stratum:
                continue
            bad = self.faulted.get((st, key), 0)
            for f in _expand(st, key):
                self.runs[f] += n
                if bad:
                    self.faults[f] += bad

    def _rate(self, f: Feature) -> float:
        return self.faults.get(f, 0) / (self.runs.get(f, 0) + 1)

    def risk(self, stratum: str, case: Case) -> tuple[float, float, Feature | None]:
        """The stratum's fault rate, the layout's riskiest feature and its rate (``None``
        when no feature of it faults more often than the stratum)."""
        base = self._rate((stratum, "all"))
        best: tuple[float, float, Feature | None] = (base, base, None)
        if not base:
            return best
        for f in features(stratum, case):
            rate = self._rate(f)
            if rate > best[1]:
                best = (base, rate, f)
        return best

    def admits(self, pos: Position, stratum: str, case: Case, *,
               replay: bool = False) -> tuple[bool, Feature | None]:
        """Whether the draw at ``pos`` is run, and the feature that decided it when not.
        ``replay``: a draw before the resume point, decided as it was then."""
        if replay:
            return pos not in self.rejected, None
        base, rate, why = self.risk(stratum, case)
        if why is None:
            return True, None
        share = max(MIN_SHARE, ((1.0 - rate) / (1.0 - base)) ** 3)
        u = zlib.crc32(f"{self.seed}:{pos[0]}:{pos[1]}:{pos[2]}".encode()) / 2**32
        if share >= 1.0 or u < share:
            return True, None
        self.rejected.add(pos)
        return False, why

    def observe(self, stratum: str, case: Case, fault: bool) -> None:
        """A layout was run: it crashed or hung (``fault``) or it returned."""
        key = (stratum, _key(case))
        self.layouts[key] += 1
        if fault:
            self.faulted[key] += 1
        if stratum in self._expanded:
            for f in _expand(*key):
                self.runs[f] += 1
                if fault:
                    self.faults[f] += 1
        elif fault:
            self._expand_stratum(stratum)

    def state(self, position: Position) -> dict[str, Any]:
        """What a job resuming at ``position`` needs (picklable)."""
        here = (position[0], position[1])
        self.rejected = {p for p in self.rejected if (p[0], p[1]) == here}
        return {"layouts": dict(self.layouts), "faulted": dict(self.faulted),
                "rejected": sorted(p for p in self.rejected if p < position)}


def note(shifted: dict[str, int]) -> str:
    """One summary line: the draws not run per signature."""
    parts = [f"{k}: {v}" for k, v in sorted(shifted.items(), key=lambda kv: -kv[1])]
    return ("budget shifted away from layouts like those that crashed or hung (draws not "
            "run, by their riskiest feature; their examples went to other layouts of the "
            "same stratum): " + "; ".join(parts))


__all__ = ["MIN_SHARE", "Steering", "describe_feature", "features", "note"]
