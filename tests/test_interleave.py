"""The interleaved plan: every stratum runs from the first examples on, in proportion to
its share, and a campaign still runs exactly the plan's examples of every arm."""

from __future__ import annotations

from collections import Counter

import pytest

from kda_fuzz.contracts import get_contract
from kda_fuzz.interleave import CHUNK, cycle_of, in_turn_order, schedule, turn
from kda_fuzz.runner import (
    Arm,
    Campaign,
    CampaignOptions,
    Target,
    _Stopped,
    deal,
    fingerprint,
    plan,
)
from kda_fuzz.shard import NOMINAL_SCALE_BUDGET

KDA = get_contract("kda")
BUDGET = 100_000


def _first_seen(arms: list[Arm], largest: int) -> tuple[dict[str, int], Counter]:
    """Per arm name: how many examples ran before its first; and each arm's examples."""
    first: dict[str, int] = {}
    ran: Counter = Counter()
    done = 0
    for _, i, n in schedule([a.examples for a in arms], cycle_of(largest)):
        first.setdefault(arms[i].name, done)
        ran[arms[i].name] += n
        done += n
    return first, ran


@pytest.mark.parametrize("device,jobs", [("cpu", 1), ("cuda", 1), ("cuda", 8)])
def test_every_stratum_runs_within_the_first_percent(device: str, jobs: int) -> None:
    """100,000 examples: valid layouts (every family), every breakage, every pair of
    checks, the mix and (on cuda) the scale stratum each run within the first 1 % of a
    job's examples; at the end every arm has run exactly the plan's examples."""
    cuda = dict(families=8, scale_share=0.03, scale_budget=NOMINAL_SCALE_BUDGET)
    arms = plan(KDA, "helion", BUDGET, device=device, seed=3, parts=jobs,
                **(cuda if device == "cuda" else {}))
    largest = max(a.examples for a in arms)
    names = {a.stratum for a in arms}
    assert {"valid", "broken"} <= names and (("scale" in names) == (device == "cuda"))
    breakages = [n for n, _ in KDA.broken_arms("helion")]
    assert {f"broken:{n}" for n in breakages} | {"broken:mix"} <= {a.name for a in arms}
    for job in range(jobs):
        mine = in_turn_order(deal(arms, job, jobs))  # as the job runs them
        total = sum(a.examples for a in mine)
        first, ran = _first_seen(mine, largest)
        assert set(first) == {a.name for a in mine}
        late = {n: k for n, k in first.items() if k > total // 100}
        assert not late, (job, total, late)
        assert ran == Counter({a.name: a.examples for a in mine})  # the old plan's shares


def test_every_round_keeps_each_arms_share() -> None:
    """After any number of rounds each arm has run its share of the cycle so far, within one
    example, and every arm runs in the first round."""
    sizes = [615, 1, 7, 10_025, 50_000, 0, 24, 26]
    cycle = cycle_of(max(sizes))
    assert cycle == -(-50_000 // CHUNK)
    done = [0] * len(sizes)
    rounds = 0
    for rnd, i, n in schedule(sizes, cycle):
        assert n >= 1 and n <= CHUNK
        if rnd != rounds:  # a round is over
            rounds = rnd
            for k, size in enumerate(sizes):
                assert abs(done[k] - size * rnd / cycle) < 1, (k, rnd, done[k])
        if rnd == 0:
            assert done[i] == 0  # (each arm once a round)
        done[i] += n
    assert done == sizes
    assert all(turn(s, cycle, 0) >= 1 for s in sizes if s)
    # with a deadline the cycles repeat, each the plan's shares again
    again = Counter()
    for rnd, i, n in schedule(sizes, cycle, repeat=True):
        if rnd >= 3 * cycle:
            break
        again[i] += n
    assert [again[i] for i in range(len(sizes))] == [3 * s for s in sizes]


class _Drawing(Campaign):
    """Draws the campaign's cases in order, judging none; stops after ``limit``."""

    limit = 10**9
    drawn: list[tuple[str, tuple[int, int, int], str]]  # (arm, position, case)

    def arms(self):  # type: ignore[no-untyped-def]
        self._dealt = super().arms()
        return self._dealt

    def _example(self, pos, case) -> None:  # type: ignore[no-untyped-def]
        self.drawn.append((self._dealt[pos[1]].name, pos, fingerprint(case)))
        if len(self.drawn) >= self.limit:
            raise _Stopped


def _drawing(limit: int = 10**9, resume: tuple | None = None, **options: object
             ) -> list[tuple[str, tuple[int, int, int], str]]:
    c = _Drawing(KDA, "helion", [Target("none", lambda *a: None)],
                 options=CampaignOptions(**options), resume=resume)  # type: ignore[arg-type]
    c.drawn, c.limit = [], limit
    c.run()
    return c.drawn


def test_a_campaign_of_100000_examples_runs_every_arm_in_its_first_percent() -> None:
    """The campaign itself (cases drawn, none judged): of 100,000 examples the first 1,000
    hold every arm of the plan, valid layouts among the first hundred."""
    arms = plan(KDA, "helion", BUDGET, seed=3)
    strata = [name for name, _, _ in _drawing(BUDGET // 100, max_examples=BUDGET, seed=3)]
    assert set(strata) == {a.name for a in arms}
    assert "valid" in strata[:100]


def test_a_whole_campaign_runs_the_plans_examples_of_every_arm() -> None:
    options = dict(max_examples=400, seed=5, budget=1 << 10)
    arms = plan(KDA, "helion", 400, seed=5, budget=1 << 10)
    strata = [name for name, _, _ in _drawing(**options)]
    assert Counter(strata) == Counter({a.name: a.examples for a in arms})
    assert len(strata) == 400 and "valid" in strata[:40]


def test_a_campaign_resumed_part_way_draws_the_rest() -> None:
    """A job restarted at a position (after a crash) draws the cases from there on, the
    same ones at the same positions: the two parts together are the whole campaign."""
    options = dict(max_examples=300, seed=2, budget=1 << 10)
    whole = _drawing(**options)
    half = len(whole) // 2
    cut = whole[half][1]
    assert cut[0] > 0  # a later round than the first
    rest = _drawing(resume=(cut, Campaign(KDA, "helion", []).report.counters()), **options)
    assert rest == whole[half:]
