"""Sharded campaigns: one campaign's plan split between machines (``--shard I/N``).

A campaign's plan (:func:`kda_fuzz.campaign.plan.plan`) is a list of arms: the breakage strata,
the mix, the valid layouts (one arm, or one per job or compile family), the scale
stratum. The arms run interleaved in rounds (:mod:`kda_fuzz.campaign.interleave`); arm ``a``'s
turn in a round is a Hypothesis run seeded by ``(seed, a.index, round)``, its size set
by ``a.examples`` and the whole plan's largest arm, so a position ``(round, arm,
example)`` draws the same case in every process on every machine.

``N`` shards of ``M`` examples each run the plan of one campaign of ``N*M`` examples with
the same seed and options, and split its positions without overlap:

* an arm larger than half a shard's share is shared example by example: the arm's example
  ``e`` (counted from 0 over its turns) belongs to shard ``(e + a.index + seed) mod N``.
  Every shard draws the whole of each turn (the draws stay aligned) and runs its own
  examples only;
* every other arm goes whole to one shard: largest first, each to the least loaded shard,
  arms of one size in an order shuffled by the seed.

So the N shards together run every position of the single campaign exactly once, and a
shard's examples add up to about M. The shards of one campaign must share its command
line but ``--shard`` (seed, ``--max-examples``, ``--jobs``, sizes): :func:`describe`
fingerprints the plan so that a summary shows which plan a shard split.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kda_fuzz.campaign.interleave import arm_before, arm_turn

if TYPE_CHECKING:  # arms are only passed through and replaced here
    from kda_fuzz.campaign.arms import Arm

DEFAULT_SEED = 0  # a sharded campaign without --seed: every shard must draw the same plan


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``; written ``I/N`` with ``I`` from 1."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index + 1}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"I/N"`` (1 <= I <= N) as a :class:`Shard`; ``ValueError`` with a one-line reason."""
    head, sep, tail = text.strip().partition("/")
    try:
        i, n = int(head), int(tail)
    except ValueError:
        i = n = 0
    if not sep or n < 1:
        raise ValueError(f"--shard must be I/N with 1 <= I <= N (e.g. 2/8), not {text!r}")
    if not 1 <= i <= n:
        raise ValueError(f"--shard {text}: I must be between 1 and N={n}")
    return Shard(i - 1, n)


def assign(arms: list[Arm], shards: int, seed: int = 0) -> list[list[Arm]]:
    """Each shard's arms (in plan order; ``index`` set to the position in ``arms``): whole
    arms, and slices (``Arm.share``) of the arms shared example by example."""
    arms = [replace(a, index=i) for i, a in enumerate(arms)]
    out: list[list[Arm]] = [[] for _ in range(shards)]
    if shards == 1:
        return [arms]
    total = sum(a.examples for a in arms)
    share = total / shards
    loads = [0] * shards
    whole = []
    for a in arms:
        if a.examples > share / 2:
            for s in range(shards):
                r = (s - a.index - seed) % shards  # examples e with e % shards == r
                out[s].append(replace(a, share=(r, shards)))
                loads[s] += len(range(r, a.examples, shards))
        else:
            whole.append(a)
    order = random.Random(f"kda-fuzz shard {seed}").sample(whole, len(whole))
    for a in sorted(order, key=lambda a: -a.examples):  # stable: the seed orders ties
        s = min(range(shards), key=lambda k: (loads[k], k))
        out[s].append(a)
        loads[s] += a.examples
    return [sorted(o, key=lambda a: a.index) for o in out]


def deal_kept(arms: list[Arm], job: int, jobs: int) -> list[Arm]:
    """:func:`kda_fuzz.campaign.plan.deal` for a shard's arms: the same round-robin of broken
    and valid arms between the shard's jobs, keeping the arms' plan indices (seeds)."""
    broken = [a for a in arms if a.name.startswith("broken:")]
    valid = [a for a in arms if not a.name.startswith("broken:")]
    return broken[job::jobs] + valid[job::jobs]


def shard_arms(arms: list[Arm], shard: tuple[int, int], *, job: tuple[int, int] = (0, 1),
               seed: int = 0) -> list[Arm]:
    """The arms job ``job`` of shard ``shard`` (``(index, count)``) runs, from the whole
    campaign's plan ``arms``."""
    index, count = shard
    return deal_kept(assign(arms, count, seed)[index], *job)


def examples_of(arm: Arm) -> int:
    """Examples of ``arm`` run where it is (its share of the run, for a slice)."""
    r, k = arm.share
    return len(range(r, arm.examples, k))


def positions(arm: Arm, cycle: int = 1, rounds: int | None = None
              ) -> set[tuple[int, int, int]]:
    """``(round, plan index, example)`` of every example ``arm`` runs in ``rounds`` rounds
    (default: one cycle, a campaign without a deadline) of a plan of ``cycle`` rounds a
    cycle (:mod:`kda_fuzz.campaign.interleave`; a later round draws one example more and skips its
    first, the simplest case)."""
    r, k = arm.share
    return {(rd, arm.index, e) for rd in range(cycle if rounds is None else rounds)
            for e in range(rd > 0, arm_turn(arm, cycle, rd) + (rd > 0))
            if (arm_before(arm, cycle, rd) + e - (rd > 0)) % k == r}


def plan_digest(arms: list[Arm]) -> str:
    """12 hex digits naming a plan (its arms' names and sizes, in order): shards of one
    campaign show the same digest."""
    text = "\n".join(f"{a.name}:{a.examples}" for a in arms)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def describe(arms: list[Arm], shard: Shard, seed: int) -> dict[str, Any]:
    """A shard's share of the plan ``arms``, for the summary (text and JSON)."""
    mine = assign(arms, shard.count, seed)[shard.index]
    return {
        "index": shard.index + 1,
        "count": shard.count,
        "examples": sum(examples_of(a) for a in mine),
        "plan_examples": sum(a.examples for a in arms),
        "whole_arms": [a.name for a in mine if a.share[1] == 1],
        "shared_arms": [a.name for a in mine if a.share[1] > 1],
        "plan_arms": len(arms),
        "plan": plan_digest(arms),
        "seed": seed,
    }


def note(info: dict[str, Any]) -> str:
    """One summary line naming a shard's share."""
    shared = info["shared_arms"]
    return (f"shard {info['index']}/{info['count']}: {info['examples']} of the campaign's "
            f"{info['plan_examples']} examples (seed {info['seed']}, plan {info['plan']}): "
            f"{len(info['whole_arms'])} of its {info['plan_arms']} arms whole"
            + (f", 1/{info['count']} of {', '.join(shared)}" if shared else ""))


NOMINAL_SCALE_BUDGET = 1 << 40  # plan structure on cuda without touching the device
