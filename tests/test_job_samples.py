"""``benchmarks/job_samples.py`` patches one line of a tree's job body: the patched copy of
this tree must still run a campaign, and its job must write the samples it took."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import job_samples  # noqa: E402

REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"


def test_a_patched_copy_runs_and_its_job_writes_its_samples(tmp_path: Path) -> None:
    tree = job_samples.patched_copy(ROOT, tmp_path / "copy")
    samples = tmp_path / "samples"
    samples.mkdir()
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "kda_fuzz_kernels").symlink_to(tree / "kernels")
    env = {**os.environ, "KDA_FUZZ_SAMPLER": str(ROOT / "benchmarks"),
           "KDA_FUZZ_SAMPLES": str(samples),
           "PYTHONPATH": os.pathsep.join([str(tree), str(shim)])}
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--device", "cpu",
                        "--contract", "helion", "--target", REFERENCE, "--max-examples", "30",
                        "--seed", "1", "--no-save", "--json"],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    m = job_samples.merged(samples)
    assert m["jobs"] == 1
    assert m["examples"] == summary["examples"] > 0
    assert m["samples"] > 0 and m["seconds"] > 0
    shares = job_samples.phases(m)
    assert 0 < shares["judge (oracle: target call, reference, checks)"] <= 1


def test_a_tree_without_the_job_body_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "kda_fuzz").mkdir(parents=True)
    (tree / "kda_fuzz" / "supervisor.py").write_text("def job():\n    return 1\n")
    with pytest.raises(SystemExit, match="0 job bodies"):
        job_samples.patched_copy(tree, tmp_path / "out")


def test_helion_bound_kernels_are_counted_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    class Kernel:
        name = "k"

        def _base_specialization_key(self, args: tuple[int, ...]) -> tuple[int, ...]:
            return (len(args),)

    class BoundKernel:
        def __init__(self, kernel: Kernel, args: tuple[int, ...]) -> None:
            self.args = args

    module = types.ModuleType("helion.runtime.kernel")
    module.BoundKernel = BoundKernel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "helion.runtime.kernel", module)
    monkeypatch.setattr(job_samples, "_binds", collections.Counter())
    monkeypatch.setattr(job_samples, "_bind_seconds", collections.Counter())
    job_samples._count_binds()
    job_samples._count_binds()  # (wrapped once)
    k = Kernel()
    made = [BoundKernel(k, (1,)), BoundKernel(k, (2,)), BoundKernel(k, (1, 2))]
    assert made[2].args == (1, 2)  # Helion's own constructor still runs
    assert job_samples._binds == {"k (1,)": 2, "k (2,)": 1}
    assert set(job_samples._bind_seconds) == {"k (1,)", "k (2,)"}  # and timed


def test_a_paired_run_counts_restarts_from_the_summary_or_an_older_trees_notes() -> None:
    import paired

    assert paired.restarts({"timeout": {"restarts": 3}, "notes": []}) == 3
    assert paired.restarts({"notes": ["x", "7 job restart(s) after a crash or hang"]}) == 7
    assert paired.restarts({"notes": []}) == 0


def test_frozen_jobs_shows_each_jobs_last_stack_and_threads() -> None:
    """``benchmarks/frozen_jobs.py`` on a CPU campaign: every job is found, its stack
    writer's last stack is in the campaign, and its threads are listed."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "frozen_jobs.py"),
                        "--seconds", "16", "--at", "8", "--every", "1", "--no-native", "--args",
                        "--device cpu --contract triton -j 2 --target "
                        "tests.slow_targets:slow_pad_wrap --max-failures 100"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = r.stdout.split("=== job process ")[1:]
    assert r.stdout.startswith("exit status ") and len(jobs) == 2, r.stdout[-3000:]
    assert re.search(r"^campaign: \d+ examples, \d+ failure", r.stdout, re.M), r.stdout[:3000]
    # what the samples were doing, per job and in all, in shares that add up to about 100
    doing = r.stdout.split("what the jobs' main threads were doing (sampled):", 1)[1]
    shares = [int(x) for x in re.findall(r"(\d+)%", doing.split("\n  all: ", 1)[1]
                                          .splitlines()[0])]
    assert doing.count("samples: ") == 2 and 90 <= sum(shares) <= 100, doing[:2000]
    for job in jobs:
        assert "its writer last wrote at " in job and "never" not in job.splitlines()[0]
        assert " s of the campaign (looked at " in job
        assert "kda_fuzz/campaign/runner.py" in job and "threads (tid name state" in job


@pytest.mark.slow
def test_the_census_counts_each_helion_binding_and_collection(tmp_path: Path) -> None:
    """``benchmarks/census`` (``paired.py --census``) in a campaign's processes: each Helion
    binding of a new signature is logged with its signature, the garbage collections of
    the oldest generation too, and ``count_compiles`` sums them per kind."""
    import paired

    env = {**os.environ, "KDA_FUZZ_CENSUS": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks" / "census"), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    start = time.time()
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--contract", "helion",
                        "--jobs", "1", "--max-examples", "4", "--valid-share", "1",
                        "--seed", "3", "--no-save", "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.time() - start
    assert r.returncode == 0, r.stderr[-3000:]
    binds = [line.split("\t") for log in tmp_path.glob("*.log")
             for line in log.read_text().splitlines() if line.startswith("bind\t")]
    assert binds and all(len(b) == 4 and float(b[2]) > 0 and "float" in b[3] for b in binds)
    words = paired.count_compiles(tmp_path)
    assert re.search(rf"\bbind {len(binds)} in 1 process\(es\)", words), words
    assert "distinct signatures bound per process: [" in words
    assert not re.search(r"\b(python|launch|run|stage:\w+) \d", words), words  # marks, not compiles
    # the timeline: the command's stages, and the one job's campaign and examples
    line = paired.timeline(tmp_path, start, wall)
    n = float(json.loads(r.stdout.strip().splitlines()[-1])["examples"])
    assert "per job (min/median/max of 1)" in line and f"examples {n}/{n}/{n}" in line, line
    assert re.search(r"stages .*_choose \d+\.\d\+", line), line
    first, end = (float(re.search(rf"{what} ([\d.]+)/", line).group(1))
                  for what in ("first example", "campaign end"))
    assert 0 < first <= end <= wall + 0.1, line


def test_the_warm_up_run_is_this_trees_command_and_is_cuda_only_by_default(monkeypatch,
                                                                           capsys) -> None:
    import argparse

    import paired

    calls: list[tuple[Path, float, bool]] = []

    def fake_run(tree: Path, args: argparse.Namespace) -> dict[str, float]:
        calls.append((tree, args.seconds, args.census))
        return {"examples": 30, "wall": 15.0}

    monkeypatch.setattr(paired, "run", fake_run)
    args = paired.arguments(None, baseline_required=False, rounds=1, seconds=60.0,
                            keep="").parse_args(["--census"])
    args.device = "cpu"
    paired.warm_up(args)
    assert calls == []
    args.device = "cuda"
    paired.warm_up(args)
    assert calls == [(paired.HERE, 15.0, False)]  # (its compiles not counted either)
    assert "warm-up (not counted): 30 examples in 15.0 s (2.0/s)" in capsys.readouterr().out
    args.warm_up = 0.0
    paired.warm_up(args)
    assert len(calls) == 1
