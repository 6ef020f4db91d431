"""Hangs and crashes found through the CLI: a calibrated timeout, the whole budget run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
WALL = 600  # bounded wait: a loaded CI machine; the README gives measured figures


pytestmark = pytest.mark.slow  # long campaigns: the slow tier


def _kda_fuzz(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kda_fuzz", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=WALL)


def _summary(r: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target,kind", [
    ("tests.hostile_targets:hangs_past_64_rows", "timeout"),
    ("tests.hostile_targets:aborts_past_16_rows", "crash"),
])
def test_a_fault_on_some_layouts_is_saved_and_the_whole_budget_runs(
        tmp_path: Path, target: str, kind: str) -> None:
    """A target with correct math that hangs (or aborts) on batches past a size, broken
    and valid layouts alike: the campaign ends with exit 1 after all 500 examples, the
    fault saved once, its repeats cheap (a calibrated timeout; draws like it shifted)."""
    r = _kda_fuzz("fuzz", "--target", target, "--contract", "helion", "--device", "cpu",
                  "--max-examples", "500", "--seed", "1", "--corpus", str(tmp_path), "--json")
    assert r.returncode == 1, r.stderr[-3000:]
    summary = _summary(r)
    assert summary["examples"] == 500  # the whole budget, whatever the fault rate
    faults = [f for f in summary["failure_details"] if f["kind"] == kind]
    assert len(faults) == 1 and faults[0]["count"] >= 1, summary["failure_details"]
    saved = [Path(p) for p in summary["saved"] if Path(p).name.startswith(f"{kind}-")]
    assert len(saved) == 1 and saved[0].exists()
    timeout = summary["timeout"]["targets"][target]
    assert timeout["in_force_seconds"] <= summary["timeout"]["ceiling_seconds"] == 60
    if kind == "timeout":
        # the first hang is proven past the ceiling (--timeout); every later one is cut
        # at the calibrated limit, far below --timeout's minute
        limits = summary["timeout"]["hang_limits_seconds"]
        assert 60 in limits and all(x < 30 for x in limits if x != 60), limits
        # proven by a re-run in a fresh process, which did not return either
        assert summary["timeout"]["rerun"] == summary["timeout"]["rerun_hung"] == 1
        assert summary["timeout"]["rerun_returned"] == 0
        if faults[0]["count"] > 1:
            assert any(x < 30 for x in limits), limits
        # minimized with the calibrated limit, then proven past the ceiling
        assert "proven past --timeout 60 s" in faults[0]["detail"], faults[0]["detail"]
    if faults[0]["count"] > 1:
        assert summary["shifted"], "repeats of the fault shifted no draws"
    # the saved file fails on the faulty target and passes on a correct one
    bad = _kda_fuzz("replay", "--target", target, "--contract", "helion", "--timeout", "5",
                    str(saved[0]))
    assert bad.returncode == 1 and kind in bad.stdout, bad.stdout + bad.stderr
    good = _kda_fuzz("replay", "--target", REFERENCE, "--contract", "helion", "--timeout", "60",
                     str(saved[0]))
    assert good.returncode == 0, good.stdout + good.stderr


def _stalled_campaign(tmp_path: Path, target: str, stalls: int,
                      extra: tuple[str, ...] = ()) -> dict:
    """A campaign of 150 valid examples against a correct target of tests/slow_targets.py
    that stalls ``stalls`` times: it exits 0 with no finding saved; its summary."""
    where = tmp_path / "stalls"
    where.mkdir()
    env = {**ENV, "KDA_FUZZ_TEST_STALL_DIR": str(where)}
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--target",
                        f"tests.slow_targets:{target}", "--contract", "triton",
                        "--max-examples", "150", "--seed", "1", "--valid-share", "1",
                        "--budget", "262144",  # (no sizing probes: the stalls are for the jobs)
                        "--corpus", str(tmp_path / "corpus"), "--json", *extra], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=WALL)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = _summary(r)
    assert len(list(where.iterdir())) == stalls  # every stall happened
    assert summary["failures"] == 0 and not (tmp_path / "corpus").exists()
    return summary


def test_a_slow_call_of_a_correct_target_is_never_cut_before_the_ceiling(
        tmp_path: Path) -> None:
    """A correct target whose first two calls on larger batches stall for 3 s (past the
    2 s floor of a fast target's calibrated limit): neither is cut (no restart, no
    finding): only a call past --timeout is a hang."""
    summary = _stalled_campaign(tmp_path, "stalls_twice", stalls=2)
    t = summary["timeout"]
    assert t["restarts"] == 0 and t["hangs"] == 0, t


def test_a_call_past_the_ceiling_that_returns_when_run_again_is_no_finding(
        tmp_path: Path) -> None:
    """A correct target whose one call stalls past --timeout (2 s here) once: the call is
    run again in a fresh process, where it returns: no finding, the summary says so; a
    target that hangs every time is still found (test above, tests/test_isolation.py)."""
    summary = _stalled_campaign(tmp_path, "stalls_once_past_the_ceiling", stalls=1,
                                extra=("--timeout", "2"))
    t = summary["timeout"]
    assert t["rerun"] == t["rerun_returned"] == 1 and t["rerun_hung"] == t["hangs"] == 0, t
    assert t["restarts"] == 1, t  # the re-run's
    assert any("1 call(s) past --timeout ran again in a fresh process: 0 did not return "
               "again (hangs), 1 returned" in n for n in summary["notes"]), summary["notes"]


def test_a_call_stopped_inside_a_compile_is_the_compilers_stall_never_a_finding(
        tmp_path: Path) -> None:
    """A correct target whose compiler stalls once past --timeout: the call runs again in
    a fresh process and returns: no finding, no hang counted; the summary says so."""
    summary = _stalled_campaign(tmp_path, "compile_stalls_once", stalls=1,
                                extra=("--timeout", "2"))
    t = summary["timeout"]
    assert t["compile_stalls"] == 1 and t["compile_skipped"] == 0, t
    assert t["rerun"] == t["hangs"] == 0 and t["restarts"] == 1, t
    assert any("1 call(s) stopped past their limit inside a kernel compile" in n
               for n in summary["notes"]), summary["notes"]


def test_a_compile_that_never_returns_is_not_executable_never_a_timeout_finding(
        tmp_path: Path) -> None:
    """A correct target whose compiler never returns on one layout (a deadlock there, in
    every process): that example is counted as not executable after its re-run stalls
    too, the campaign goes on past it and ends with no finding (exit 0)."""
    summary = _stalled_campaign(tmp_path, "compile_never_returns_on_one_layout", stalls=1,
                                extra=("--timeout", "2"))
    t = summary["timeout"]
    assert t["compile_skipped"] >= 1 and t["compile_stalls"] >= t["compile_skipped"], t
    assert t["hangs"] == 0 and summary["failures"] == 0, t
    skipped = summary["not_executable"]
    assert skipped["valid"] == skipped["examples"] == t["compile_skipped"], skipped
    assert any("a kernel compile did not return within 2 s, twice" in c
               for c in skipped["causes"]), skipped


def test_a_job_killed_inside_a_compile_at_the_deadline_says_so(tmp_path: Path) -> None:
    """A compile that does not return before --max-seconds (shorter than --timeout): the
    job is killed at the deadline, no finding, and the summary says it was inside a kernel
    compile (a compiler's stall, as seen on some GPU machines), and for how long."""
    where = tmp_path / "stalls"
    where.mkdir()
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--target",
                        "tests.slow_targets:compile_never_returns_on_one_layout", "--contract",
                        "triton", "--jobs", "1", "--max-seconds", "20", "--seed", "1",
                        "--valid-share", "1", "--budget", "262144", "--corpus",
                        str(tmp_path / "corpus"), "--json"], cwd=ROOT,
                       env={**ENV, "KDA_FUZZ_TEST_STALL_DIR": str(where)},
                       capture_output=True, text=True, timeout=WALL)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = _summary(r)
    assert summary["failures"] == 0 and (where / "stall").exists()
    assert summary["timeout"]["compile_stalls"] == 0  # (--timeout 60 never came)
    notes = [n for n in summary["notes"] if "stopped in the middle of an example" in n]
    assert len(notes) == 1 and "; it had been inside a kernel compile for " in notes[0], notes
