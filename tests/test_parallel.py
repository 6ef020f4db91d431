"""Parallel campaigns: the plan dealt to jobs, merged reports, stop on the first failure."""

from __future__ import annotations

from kda_fuzz.contracts import get_contract
from kda_fuzz.parallel import parallel_campaign
from kda_fuzz.runner import deal, plan

KDA = get_contract("kda")
REFERENCE = "kernels.kda_decode:reference_kda_packed_decode"


def test_deal_gives_every_arm_to_exactly_one_job() -> None:
    for jobs in (1, 2, 3, 7):
        arms = plan(KDA, "triton", 400, seed=3, parts=jobs)
        dealt = [deal(arms, j, jobs) for j in range(jobs)]
        indices = sorted(a.index for d in dealt for a in d)
        assert indices == list(range(len(arms)))
        # every job gets valid examples (the valid arm is split into one part per job)
        assert all(any(a.name.startswith("valid") for a in d) for d in dealt)
        assert sum(a.examples for a in arms) == 400
    # with compile families, each job gets its own
    arms = plan(KDA, "helion", 400, seed=3, families=3, max_b=64)
    dealt = [[a.name for a in deal(arms, j, 3) if a.name.startswith("valid")] for j in range(3)]
    assert sorted(map(len, dealt)) == [1, 1, 1] and len({d[0] for d in dealt}) == 3


def test_jobs_run_the_plan_of_one_campaign() -> None:
    """Two jobs run exactly the examples the campaign's plan holds, valid and broken, and
    the merged report adds them up."""
    arms = plan(KDA, "triton", 120, seed=5, budget=1 << 12, parts=2)
    planned_valid = sum(a.examples for a in arms if not a.name.startswith("broken:"))
    report, per_job = parallel_campaign("kda", "triton", [REFERENCE], 2, max_examples=120,
                                        seed=5, budget=1 << 12, minimize=False)
    assert not report.failures
    assert len(per_job) == 2 and all(job["seconds"] > 0 for job in per_job)
    assert report.examples == 120
    assert report.valid_cases == planned_valid
    assert report.broken_cases + sum(report.validation_gaps.values()) == 120 - planned_valid
    assert sum(report.checks_hit.values()) == report.broken_cases


def test_a_failure_stops_the_other_jobs_and_comes_back_on_the_cpu() -> None:
    report, _ = parallel_campaign("kda", "triton", ["tests.mutants:new_out"], 2,
                                  max_examples=4000, seed=1, budget=1 << 12, valid_share=0.5)
    assert report.failures
    assert report.examples < 4000
    for f in report.failures:
        assert f.verdict.what == "returned-objects"
        assert all(t.device.type in ("cpu", "meta") for t in f.case.tensors.values())
