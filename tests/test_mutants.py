"""The fuzzer finds every planted bug of tests/mutants.py, and no bug in correct twins."""

from __future__ import annotations

import pytest

from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.targets import Target
from kda_fuzz.families import get_contract
from tests import mutants

KDA = get_contract("kda")


def _variant(name: str) -> str:
    return "helion" if name in mutants.HELION_ONLY else "triton"


# the planted bugs a campaign needs the most examples for: the slow tier
SLOW_TO_FIND = {"no_softplus_threshold", "scale_before_l2norm"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_FIND
                                  else n for n in sorted(mutants.MUTANTS)])
def test_campaign_finds_planted_bug(name: str) -> None:
    report = campaign(KDA, _variant(name), [Target(name, mutants.MUTANTS[name])],
                      max_examples=500, seed=1)
    assert report.failures, f"{name} not found in {report.examples} examples"
    kind = report.failures[0].verdict.kind
    assert kind == ("mismatch" if name in mutants.NUMERIC_BUGS else "contract"), (
        report.failures[0].verdict.summary())


@pytest.mark.parametrize("variant", [pytest.param("helion", marks=pytest.mark.slow), "triton"])
def test_correct_twins_give_no_failure(variant: str) -> None:
    twin = mutants.correct_helion if variant == "helion" else mutants.correct_triton
    report = campaign(KDA, variant, [Target("correct", twin)], max_examples=400, seed=11)
    assert not report.failures, report.failures[0].verdict.summary()
    assert report.valid_cases > 100 and report.broken_cases > 100
    expected = {c.number for c in KDA.checks_for(variant)}
    assert expected <= set(report.checks_hit)
