"""``benchmarks/job_samples.py`` patches one line of a tree's job body: the patched copy of
this tree must still run a campaign, and its job must write the samples it took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
