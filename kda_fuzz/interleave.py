"""The order a campaign's plan runs in: rounds, every arm taking its turn from the start.

A plan (:func:`kda_fuzz.runner.plan`) is a list of arms of ``n`` examples each. It runs in
rounds; one *cycle* of :func:`cycle_of` rounds runs every arm's examples once, the largest
arm about ``CHUNK`` examples a round. In round ``r`` an arm of ``n`` examples runs
:func:`turn` of them: its ``k``-th example falls in round ``floor(k * cycle / n)``, so each
arm's examples are spread evenly over the cycle (a smooth weighted round robin), every arm
runs in the first round, and after any number of rounds each arm has run its share of the
examples so far, within one example. A campaign without a deadline runs one cycle; with a
deadline the cycles repeat (new cases: each round of an arm is a Hypothesis run seeded by
the round) until the time is up.

The schedule depends on the arms' sizes and the whole plan's largest arm only, so the jobs
and shards that split a plan run every arm the same way the single campaign would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

CHUNK = 25  # examples of the plan's largest arm per round


class _Sized(Protocol):
    @property
    def examples(self) -> int: ...


A = TypeVar("A", bound=_Sized)


def cycle_of(largest: int) -> int:
    """Rounds of one cycle of a plan whose largest arm has ``largest`` examples."""
    return max(1, -(-largest // CHUNK))


def turn(examples: int, cycle: int, rnd: int) -> int:
    """Examples an arm of ``examples`` runs in round ``rnd`` (of any cycle) of ``cycle``
    rounds a cycle; one cycle's turns add up to ``examples``."""
    r = rnd % cycle
    return _ceil((r + 1) * examples, cycle) - _ceil(r * examples, cycle)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def schedule(sizes: Sequence[int], cycle: int, *, repeat: bool = False
             ) -> Iterator[tuple[int, int, int]]:
    """``(round, arm, examples)`` in the order a plan of arms of ``sizes`` runs: one cycle,
    or cycle after cycle with ``repeat``; an arm without examples in a round is left out."""
    rnd = 0
    while repeat or rnd < cycle:
        for i, n in enumerate(sizes):
            k = turn(n, cycle, rnd)
            if k:
                yield rnd, i, k
        rnd += 1


def in_turn_order(arms: Sequence[A]) -> list[A]:
    """``arms`` in the order they take their turns within a round: the larger first (ties in
    plan order), so valid layouts lead the first round."""
    return sorted(arms, key=lambda a: -a.examples)
