"""The GDN packed decode family through the same engine: the fuzzer finds every planted
bug of tests/gdn_mutants.py on CPU, and no bug in the correct twins."""

from __future__ import annotations

import json

import pytest

from kda_fuzz.campaign.runner import campaign
from kda_fuzz.cli import main
from kda_fuzz.engine.targets import Target
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.contract import CHECKS as KDA_CHECKS
from tests import gdn_mutants

GDN = get_contract("gdn")
SMALL = {"budget": 4096, "max_b": 16}
# l2_eps_outside shows on small norms only: seed 1's interleaved plan draws none in 300
# examples, seeds 2 to 8 each find it
SEEDS = {"l2_eps_outside": 2}


def test_checks_are_the_documented_ones() -> None:
    assert [c.number for c in GDN.checks_for("triton")] == [*range(1, 14), 15, 16, 19, 20,
                                                           21, 22]
    assert [c.number for c in GDN.checks_for("helion")] == [*range(1, 17), 19, 20, 21, 22]
    kda = {c.number: c.message for c in KDA_CHECKS}
    gdn = {c.number: c.message for c in GDN.checks}
    assert all(gdn[i] == kda[i] for i in (*range(1, 14), 19, 20, 22))
    assert gdn[21] == "Invalid packed Q size {q_dim}: must be divisible by K={K}."
    assert "lower_bound" not in GDN.signature


@pytest.mark.parametrize("name", sorted(gdn_mutants.MUTANTS))
def test_campaign_finds_planted_gdn_bug(name: str) -> None:
    report = campaign(GDN, "triton", [Target(name, gdn_mutants.MUTANTS[name])],
                      max_examples=300, seed=SEEDS.get(name, 1), **SMALL)
    assert report.failures, f"{name} not found in {report.examples} examples"
    kind = report.failures[0].verdict.kind
    assert kind == ("mismatch" if name in gdn_mutants.NUMERIC_BUGS else "contract"), (
        report.failures[0].verdict.summary())


@pytest.mark.parametrize("twin,variant", [("correct_triton", "triton"),
                                          ("correct_helion", "helion")])
def test_correct_gdn_twins_give_no_failure(twin: str, variant: str) -> None:
    report = campaign(GDN, variant, [Target(twin, getattr(gdn_mutants, twin))],
                      max_examples=300, seed=11, **SMALL)
    assert not report.failures, report.failures[0].verdict.summary()
    assert report.valid_cases > 50 and report.broken_cases > 50
    assert {c.number for c in GDN.checks_for(variant)} <= set(report.checks_hit)


def test_documented_twin_shows_gaps_not_failures() -> None:
    """The documented checks only: HV = 0 / V = 0 pass through without writing (a gap of
    the contract). K = 0 behind a q/k segment raises ZeroDivisionError there, which the
    spec calls a failure (section 2: anything but ValueError fails); nothing else fails."""
    report = campaign(GDN, "triton", [Target("documented", gdn_mutants.documented_triton)],
                      max_examples=300, seed=11, max_failures=5, **SMALL)
    assert report.validation_gaps.get("zero-sized K, V or HV")
    for f in report.failures:
        assert (f.verdict.what, f.verdict.extra.get("exception")) == (
            "wrong-exception-type", "ZeroDivisionError"), f.verdict.summary()
    strict = campaign(GDN, "triton", [Target("correct", gdn_mutants.correct_triton)],
                      max_examples=150, seed=11, strict=True, **SMALL)
    assert not strict.failures


def test_minimizer_shrinks_a_gdn_failure() -> None:
    target = Target("gqa", gdn_mutants.MUTANTS["gqa_modulo"])
    report = campaign(GDN, "triton", [target], max_examples=300, seed=1, **SMALL,
                      minimize=20.0)
    f = report.failures[0]
    assert f.original is not None and f.case.notes.get("minimized")
    HV = f.case.tensors["initial_state"].shape[1]
    assert f.case.tensors["a"].shape[1] == HV  # gates stayed one per value head
    assert HV <= f.original.tensors["initial_state"].shape[1]


def test_cli_fuzz_and_replay_gdn(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "found"
    code = main(["fuzz", "--family", "gdn", "--contract", "triton", "--target",
                 "tests.gdn_mutants:padding_rows_untouched", "--max-examples", "60",
                 "--seed", "1", "--json", "--corpus", str(corpus), "--no-isolate",
                 "--budget", "4096", "--max-b", "8"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1 and out["contract"] == "gdn" and out["failures"] >= 1
    files = sorted(corpus.glob("*.json"))
    assert files
    code = main(["replay", "--family", "gdn", "--target",
                 "tests.gdn_mutants:padding_rows_untouched", *map(str, files)])
    assert code == 1 and "FAIL" in capsys.readouterr().out
    code = main(["replay", "--family", "gdn", "--target", "tests.gdn_mutants:correct_triton",
                 *map(str, files)])
    assert code == 0, capsys.readouterr().out


def _own_pow2_wording(*args):
    """The correct Helion twin, rejecting non-power-of-two K or V in its own words."""
    try:
        return gdn_mutants.correct_helion(*args)
    except ValueError as e:
        if str(e).startswith("Helion GDN decode requires"):
            raise ValueError("K and V must be powers of two") from None
        raise


def test_the_unworded_power_of_two_check_takes_any_wording() -> None:
    """The spec words no power-of-two check for GDN: a Helion kernel from elsewhere that
    words it its own way passes, and the documented variant is the CLI's default."""
    assert GDN.variants[0] == "triton"
    report = campaign(GDN, "helion", [Target("own-words", _own_pow2_wording)],
                      max_examples=300, seed=11, **SMALL)
    assert not report.failures, report.failures[0].verdict.summary()
    assert report.checks_hit.get(14)
