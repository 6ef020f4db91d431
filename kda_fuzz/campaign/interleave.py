"""The order a campaign's plan runs in: rounds, every arm taking its turn from the start.

A plan (:func:`kda_fuzz.campaign.plan.plan`) is a list of arms of ``n`` examples each. It runs in
rounds; one *cycle* of :func:`cycle_of` rounds runs every arm's examples once. The first
round runs one example of every arm, so it holds every stratum and is about as long as the
plan has arms. The other rounds spread each arm's remaining examples evenly (a weighted
round robin): after ``r`` of them an arm has run its share ``r / (cycle - 1)`` of them,
rounded to whole turns of ``MIN_TURN`` examples (one at a time for an arm with a time
share: the scale stratum's cases are costly, and a time-bounded campaign checks its share
between turns); the largest arm runs about ``CHUNK`` examples a round. The shares at the
end of a cycle are the plan's. Every turn is a Hypothesis run seeded by the round: turns
of a few examples keep a later run's skipped first example (see ``Campaign._body``)
cheap, and the larger arms' longer runs let Hypothesis vary its cases as a long run does.
A campaign without a deadline runs one cycle; with a deadline the cycles repeat (new
cases) until the time is up.

The schedule depends on the arms and the whole plan's largest arm only, so the jobs and
shards that split a plan run every arm the way the single campaign would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

CHUNK = 25  # examples of the plan's largest arm per round (after the first)
MIN_TURN = 4  # examples of an arm's turn (but its first and last; 1 with a time share)


class _Sized(Protocol):
    @property
    def examples(self) -> int: ...

    @property
    def time_share(self) -> float | None: ...


A = TypeVar("A", bound=_Sized)


def cycle_of(largest: int) -> int:
    """Rounds of one cycle of a plan whose largest arm has ``largest`` examples: the first
    round and enough for ``CHUNK`` examples of that arm a round."""
    return 1 + max(1, _ceil(largest, CHUNK))


def least_turn(arm: _Sized) -> int:
    """The examples of ``arm``'s turns (but its first and last)."""
    return 1 if arm.time_share is not None else MIN_TURN


def turn(examples: int, cycle: int, rnd: int, least: int = 1) -> int:
    """Examples an arm of ``examples`` with turns of ``least`` runs in round ``rnd`` (of
    any cycle) of ``cycle`` rounds a cycle; one cycle's turns add up to ``examples``."""
    r = rnd % cycle
    return _done(examples, cycle, r + 1, least) - _done(examples, cycle, r, least)


def arm_turn(arm: _Sized, cycle: int, rnd: int) -> int:
    """:func:`turn` of ``arm`` in round ``rnd``."""
    return turn(arm.examples, cycle, rnd, least_turn(arm))


def arm_before(arm: _Sized, cycle: int, rnd: int) -> int:
    """Examples ``arm`` has run in the rounds before round ``rnd`` (of every cycle): the
    number (from 0) of its first example in that round."""
    r = rnd % cycle
    return (rnd // cycle) * arm.examples + _done(arm.examples, cycle, r, least_turn(arm))


def _done(n: int, cycle: int, r: int, least: int) -> int:
    """Examples run after ``r`` rounds: one in the first round, then the share of the rest,
    rounded to whole turns (the nearest; what is left over runs in the last round)."""
    if r >= cycle or not n:
        return n
    if r == 0:
        return 0
    rest, rounds = n - 1, cycle - 1
    least = max(1, min(least, rest))
    turns = (2 * (r - 1) * rest + rounds * least) // (2 * rounds * least)
    return 1 + min(rest, turns * least)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def schedule(arms: Sequence[_Sized], cycle: int, *, repeat: bool = False
             ) -> Iterator[tuple[int, int, int]]:
    """``(round, arm, examples)`` in the order ``arms`` run: one cycle, or cycle after
    cycle with ``repeat``; an arm without examples in a round is left out (nothing at all
    for a plan without examples)."""
    if not any(a.examples for a in arms):
        return
    rnd = 0
    while repeat or rnd < cycle:
        for i, a in enumerate(arms):
            k = arm_turn(a, cycle, rnd)
            if k:
                yield rnd, i, k
        rnd += 1


def in_turn_order(arms: Sequence[A]) -> list[A]:
    """``arms`` in the order they take their turns within a round: the larger first (ties in
    plan order), so valid layouts lead the first round."""
    return sorted(arms, key=lambda a: -a.examples)
