"""``benchmarks/spy_jobs.py`` reads py-spy's raw samples: only the job processes' main
threads count, each phase's share is inclusive, each job process is counted once."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import spy_jobs  # noqa: E402

CMD = 'process 10:"python -m kda_fuzz fuzz"'
SERVER = 'process 11:"python -c forkserver"'
JOB = ";".join(("_run_job (kda_fuzz/campaign/supervisor.py:300)",
                "Campaign.run (kda_fuzz/campaign/runner.py:250)",
                "ConjectureRunner.run (hypothesis/internal/conjecture/engine.py:1026)"))
EXAMPLE = "Campaign._example (kda_fuzz/campaign/runner.py:417)"
RUN_CASE = "launch_case (kda_fuzz/engine/oracle.py:230)"
READ = "_fused_read (kda_fuzz/families/packed/judge.py:360)"
KERNEL = "helion_fused_recurrent_kda_packed_decode (kernels/kda_decode/helion_kernel.py:140)"


def _line(pid: int, frames: list[str], count: int) -> str:
    return ";".join([CMD, SERVER, f'process {pid}:"job"', *frames]) + f" {count}"


def test_the_job_main_threads_shares_by_phase() -> None:
    raw = "\n".join([
        _line(12, [JOB, EXAMPLE, RUN_CASE, "judge (kda_fuzz/families/packed/judge.py:263)",
                   READ], 6),
        _line(13, [JOB, EXAMPLE, RUN_CASE, KERNEL, "Kernel.__call__ (helion/runtime/kernel.py:1)"],
              3),
        _line(13, [JOB, "layouts (kda_fuzz/families/kda/layouts.py:350)"], 1),
        # not a job's main thread: the command itself, a job's other thread
        ";".join([CMD, "Supervisor.run (kda_fuzz/campaign/supervisor.py:500)"]) + " 50",
        _line(12, ["Thread.run (threading.py:1)", "watch (kda_fuzz/workers/deadline.py:9)"],
              40),
    ])
    got = spy_jobs.analyse(raw, top=3)
    assert got["samples"] == 10 and got["processes"] == 2
    phases = got["phases"]
    assert phases["in the campaign loop"] == 1.0
    assert phases["judge (oracle: target call, reference, checks)"] == 0.9
    assert phases["fused judge's read"] == 0.6 and phases["the contract's judge"] == 0.6
    assert phases["draw a layout"] == 0.1 and phases["build a case"] == 0.0
    assert got["target"] == 0.3 and phases["target call"] == 0.3
    assert got["leaf"][0] == (READ, 0.6)
