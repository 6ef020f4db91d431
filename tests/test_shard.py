"""Sharded campaigns: N shards split one campaign's plan, every position run exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kda_fuzz.campaign.interleave import cycle_of
from kda_fuzz.campaign.plan import plan, share_of
from kda_fuzz.campaign.runner import Campaign
from kda_fuzz.campaign.shard import Shard, assign, examples_of, parse_shard, positions
from kda_fuzz.campaign.spec import CampaignOptions
from kda_fuzz.engine.case import fingerprint
from kda_fuzz.engine.targets import Target
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import get_contract
from tests.inprocess import kda_fuzz

KDA = get_contract("kda")
ROOT = Path(__file__).resolve().parents[1]


class _Recording(Campaign):
    """Draws the campaign's cases and records where each was drawn, without judging."""

    drawn: list[tuple[tuple[int, int, int], str]]

    def arms(self):  # type: ignore[no-untyped-def]
        self._dealt = super().arms()
        return self._dealt

    def _example(self, pos, case):  # type: ignore[no-untyped-def]
        arm = self._dealt[pos[1]]  # the arm's index in the whole plan names its seed
        self.drawn.append(((pos[0], arm.index, pos[2]), fingerprint(case)))


def _drawn(variant: str = "triton", **options: object) -> list[tuple[tuple[int, int, int], str]]:
    c = _Recording(KDA, variant, [Target("none", lambda *a: None)],
                   options=CampaignOptions.of(**options))  # type: ignore[arg-type]
    c.drawn = []
    c.run()
    return c.drawn


def test_parse_shard() -> None:
    assert parse_shard("1/1") == Shard(0, 1)
    assert parse_shard("3/8") == Shard(2, 8) and str(Shard(2, 8)) == "3/8"
    for bad in ("0/2", "3/2", "x", "1/0", "2", "1/", "/2", "-1/2", "1/2/3", ""):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_assign_splits_every_position_of_the_plan_once(shards: int) -> None:
    arms = plan(KDA, "triton", 100 * shards, seed=5)
    cycle = cycle_of(max(a.examples for a in arms))  # the rounds the plan runs in
    assert cycle > 1
    full = [p for i, a in enumerate(arms) for p in positions(a.__class__(
        a.name, a.strategy, a.examples, i), cycle)]
    dealt = assign(arms, shards, seed=5)
    mine = [p for d in dealt for a in d for p in positions(a, cycle)]
    assert len(mine) == len(set(mine)) and set(mine) == set(full)
    loads = [sum(examples_of(a) for a in d) for d in dealt]
    assert sum(loads) == 100 * shards
    # a whole arm is at most half a shard's share: no shard runs far more than its share
    assert max(loads) - min(loads) <= 50, loads
    # the seed decides which shard gets which whole arm of equal size; the split is its own
    assert assign(arms, shards, seed=5) == dealt
    assert [[a.name for a in d] for d in assign(arms, shards, seed=6)] != \
        [[a.name for a in d] for d in dealt]


@pytest.mark.parametrize("shards", [2, pytest.param(3, marks=pytest.mark.slow),
                                    pytest.param(4, marks=pytest.mark.slow)])
def test_shards_draw_exactly_the_cases_of_one_campaign(shards: int) -> None:
    """N shards of M examples draw, between them, every (round, arm, example) position of
    one campaign of N*M examples with the same seed, each once, and the same case there;
    breakage strata, compile families and the scale stratum alike."""
    options = dict(max_examples=60 * shards, seed=3, budget=1 << 10, max_failures=10**9,
                   families=3, scale_share=0.05, scale_budget=1 << 24)
    single = _drawn("helion", **options)
    assert {p[1] for p, _ in single} == set(range(len(plan(
        KDA, "helion", 60 * shards, seed=3, families=3, scale_share=0.05,
        scale_budget=1 << 24))))  # every arm of the plan ran
    parts = [_drawn("helion", shard=(i, shards), **options) for i in range(shards)]
    union = [d for part in parts for d in part]
    assert Counter(p for p, _ in union) == Counter(p for p, _ in single)  # no overlap
    assert sorted(union) == sorted(single)  # the same case at every position
    assert all(40 <= len(p) <= 80 for p in parts), [len(p) for p in parts]
    # each shard's summary counts the examples it runs
    assert [len(p) for p in parts] == [share_of(KDA, "helion", CampaignOptions.of(
        shard=(i, shards), **options), 1)["examples"] for i in range(shards)]  # type: ignore


def test_shards_with_jobs_split_the_plan_of_a_campaign_with_those_jobs() -> None:
    options = dict(max_examples=160, seed=9, budget=1 << 10, max_failures=10**9)
    single = [d for j in range(2) for d in _drawn(job=(j, 2), **options)]
    sharded = [d for i in range(2) for j in range(2)
               for d in _drawn(shard=(i, 2), job=(j, 2), **options)]
    assert sorted(sharded) == sorted(single) and len(set(sharded)) == 160


# ------------------------------------------------------------------ command line


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kda_fuzz", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_bad_shards_are_usage_errors() -> None:
    for bad in ("0/2", "3/2", "x", "1/0"):
        r = _run("fuzz", "--shard", bad, "--max-examples", "1")
        assert r.returncode == 2, (bad, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "--shard" in r.stderr, r.stderr


def _summary(r: subprocess.CompletedProcess) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


def _distinct(summary: dict) -> set[tuple]:
    """The distinct failures of a summary, by the campaign's own root-cause signature."""
    saved = set(Verdict("contract", "x", "").to_json())  # a verdict's keys in the summary
    return {(d["target"], *Verdict.from_json({k: v for k, v in d.items() if k in saved})
             .signature(summary["variant"])) for d in summary["failure_details"]}


@pytest.mark.slow  # a long campaign: the slow tier
def test_four_shards_find_what_one_campaign_finds(tmp_path: Path) -> None:
    """A planted bug: 4 shards of 60 examples find the distinct failures that one
    campaign of 240 finds, run 240 examples between them, and each names its share; the
    four corpora merge into one file per distinct failure."""
    common = ("fuzz", "--target", "tests.mutants:rank_check_and", "--contract", "triton",
              "--seed", "4", "--shrink-seconds", "1")
    single = _run(*common, "--max-examples", "240", "--json", "--no-isolate", "--corpus",
                  str(tmp_path / "single"))
    assert single.returncode == 1, single.stderr
    whole = _summary(single)
    shards = []
    for i in range(1, 5):
        r = _run(*common, "--max-examples", "60", "--shard", f"{i}/4", "--json",
                 "--corpus", str(tmp_path / f"shard{i}"))
        assert r.returncode in (0, 1), r.stderr
        shards.append(_summary(r))
    assert sum(s["examples"] for s in shards) == whole["examples"] == 240
    assert set().union(*map(_distinct, shards)) == _distinct(whole)
    plans = {s["shard"]["plan"] for s in shards}
    assert len(plans) == 1
    for i, s in enumerate(shards, 1):
        assert (s["shard"]["index"], s["shard"]["count"]) == (i, 4)
        assert s["shard"]["examples"] == s["examples"] and s["shard"]["plan_examples"] == 240
        assert s["notes"][0].startswith(f"shard {i}/4: {s['examples']} of the campaign's 240")
    merged = _run("merge", str(tmp_path / "merged"),
                  *(str(tmp_path / f"shard{i}") for i in range(1, 5)
                    if (tmp_path / f"shard{i}").exists()), "--json")
    assert merged.returncode == 0, merged.stderr
    assert _summary(merged)["failures"] == len(_distinct(whole))
    assert len(list((tmp_path / "merged").glob("*.json"))) == len(_distinct(whole))


def test_text_summary_names_the_share(tmp_path: Path) -> None:
    r = kda_fuzz("fuzz", "--target", "tests.mutants:correct_triton", "--contract", "triton",
                 "--max-examples", "20", "--shard", "2/3", "--no-isolate", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "shard 2/3: 20 of the campaign's 60 examples (seed 0" in " ".join(r.stdout.split())
