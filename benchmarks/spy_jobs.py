"""Where the jobs of a plain CLI campaign spend their wall time in the steady state,
sampled from outside by py-spy (no patch of the tree, no profiler inside the jobs).

The paired benchmark's command (``paired.py``: empty compile caches, ``--valid-share 1``)
runs once; after ``--after`` seconds py-spy attaches to it and its descendants for
``--duration`` seconds, idle samples included (a job waiting on the device counts). Only
the job processes' main threads are counted (the stacks that hold the job body). Prints
each phase's inclusive share of those samples, the examples the command ran, and the
frames with the most samples at the top of the stack (``--native``: C frames too).

    python benchmarks/spy_jobs.py [--seconds 60] [--after 30] [--duration 20] [--rate 100]
                                  [--device cuda] [--jobs auto] [--args '--contract helion']
                                  [--native] [--top 30] [--keep FILE] [--py-spy PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import job_samples  # (this script's folder is on sys.path)
import paired

HERE = paired.HERE
JOB = "_run_job (kda_fuzz/campaign/supervisor.py"


def frame_key(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy frame ``func (path/file.py:line)``."""
    name, _, where = frame.rpartition(" (")
    return name, where.rsplit(":", 1)[0]


def matches(frame: str, keys: tuple[str, ...]) -> bool:
    """Whether ``frame`` is one of ``keys`` (``job_samples.PHASES``' "file tail:function",
    the function by its own name, not its qualified one)."""
    name, path = frame_key(frame)
    return f"{path}:{name.rsplit('.', 1)[-1]}".endswith(keys)


def analyse(raw: str, top: int) -> dict[str, object]:
    """Shares of the job main threads' samples per phase, and the top leaf frames."""
    jobs = 0
    phase: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    under_kernels: collections.Counter[str] = collections.Counter()
    procs: set[str] = set()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or JOB not in stack:
            continue
        n = int(count)
        frames = stack.split(";")
        procs.add([f for f in frames if f.startswith("process ")][-1].split(":")[0])
        jobs += n
        for name, keys in job_samples.PHASES.items():
            if any(matches(f, keys) for f in frames):
                phase[name] += n
        leaf[frames[-1]] += n
        for i, f in enumerate(frames):  # the target's module: its frame and three below
            if "(kernels/" in f or "_kernel.py" in f:
                under_kernels[" > ".join(frame_key(g)[0] for g in frames[i:i + 4])] += n
                break
    return {"samples": jobs, "processes": len(procs),
            "target": sum(under_kernels.values()) / max(1, jobs),
            "phases": {k: phase[k] / max(1, jobs) for k in job_samples.PHASES},
            "leaf": [(k, v / max(1, jobs)) for k, v in leaf.most_common(top)],
            "kernels": [(k, v / max(1, jobs)) for k, v in under_kernels.most_common(top)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="the command's --max-seconds")
    ap.add_argument("--after", type=float, default=30.0,
                    help="seconds into the command when sampling starts (past the compiles)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds sampled")
    ap.add_argument("--rate", type=int, default=100, help="samples per second per process")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", default="auto")
    ap.add_argument("--args", default="--contract helion")
    ap.add_argument("--native", action="store_true", help="C frames too (slower to sample)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--keep", help="write py-spy's raw samples there")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy",
                    help="the py-spy executable (default: the one on PATH)")
    args = ap.parse_args()
    cmd = paired.command(args)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=HERE, env=paired.fresh_caches(tmp),
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(args.after)
        raw = Path(tmp) / "raw.txt"
        spy = subprocess.run(
            [args.py_spy, "record", "--pid", str(proc.pid), "--subprocesses", "--idle",
             "--rate", str(args.rate), "--duration", str(int(args.duration)), "--format",
             "raw", "--nonblocking", "-o", str(raw), *(["--native"] if args.native else [])],
            capture_output=True, text=True)
        out, err = proc.communicate()
        wall = time.monotonic() - t0
        text = raw.read_text() if raw.exists() else ""
        if args.keep:
            Path(args.keep).write_text(text)
    if not text:
        raise SystemExit(f"py-spy recorded nothing (rc {spy.returncode}): {spy.stderr[-2000:]}")
    summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    print(f"{' '.join(cmd[2:])}: {summary.get('examples')} examples in {wall:.1f} s wall "
          f"(rc {proc.returncode}); sampled {args.after:.0f}-{args.after + args.duration:.0f} s "
          f"at {args.rate}/s")
    if proc.returncode not in (0, 1):
        print(err[-2000:])
    a = analyse(text, args.top)
    print(f"job main threads: {a['samples']} samples in {a['processes']} process(es)")
    for name, share in a["phases"].items():  # type: ignore[union-attr]
        print(f"{100 * share:6.1f} %  {name}")
    print(f"{100 * a['target']:6.1f} %  target call (frames of the target's module)")
    print("top of the stack:")
    for frame, share in a["leaf"]:  # type: ignore[union-attr]
        print(f"{100 * share:6.1f} %  {frame}")
    print("in the target's module (first frames from it down):")
    for frame, share in a["kernels"]:  # type: ignore[union-attr]
        print(f"{100 * share:6.1f} %  {frame}")


if __name__ == "__main__":
    main()
