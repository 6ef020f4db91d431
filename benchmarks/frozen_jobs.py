"""Which jobs of a campaign are frozen, and where: a diagnosis for campaigns whose jobs stop
in the middle of an example until the deadline kills them (seen on some H100 starts with
Helion kernels, 2026-12-06).

Runs ``kda-fuzz fuzz`` from a copy of this tree whose job body starts a thread writing the
job's main-thread Python stack every ``--every`` seconds; a job whose writer goes silent has
its main thread in a native call holding the GIL. At ``--at`` seconds (or, where no job has
started by then, ``--every`` seconds after they start), for every job process: each
thread's state and kernel wait channel (``/proc``); for up to three jobs whose writer is
silent, native stacks where ``py-spy`` or ``gdb`` is installed. Prints, per
job, when its writer last wrote and the stack it wrote, then what ``/proc`` and the native
tools saw.

    python benchmarks/frozen_jobs.py [--seconds 30] [--at 20] [--every 2]
                                     [--args '--device cuda --contract helion'] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
JOB_BODY = "            rep = c.run()\n"


def start(path: str, every: float) -> None:
    """In a job: write the main thread's stack to ``path`` every ``every`` seconds."""
    main = threading.main_thread().ident
    out = open(path, "a", buffering=1)  # open for the job's lifetime

    def loop() -> None:
        while True:
            time.sleep(every)
            frame = sys._current_frames().get(main)
            if frame is not None:
                stack = traceback.extract_stack(frame)[-80:]
                out.write(f"--- {time.time():.2f}\n" + "".join(
                    f"  {f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno} {f.name}\n"
                    for f in stack))

    threading.Thread(target=loop, name="frozen-jobs-writer", daemon=True).start()


def patched_copy(into: Path) -> Path:
    """A copy of this tree whose job body starts :func:`start`."""
    out = into / "tree"
    shutil.copytree(HERE, out, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".whl", ".bench", ".tox", "__pycache__", ".hypothesis", "fuzz-out"))
    bodies = [p for p in (out / "kda_fuzz").rglob("*.py") if JOB_BODY in p.read_text()]
    if len(bodies) != 1:
        raise SystemExit(f"{len(bodies)} job bodies ({JOB_BODY.strip()!r}) found, expected one")
    hook = ("            import os as _o, sys as _s\n"
            "            _s.path.insert(0, _o.environ['KDA_FUZZ_FROZEN'])\n"
            "            import frozen_jobs as _fj\n"
            "            _fj.start(f\"{_o.environ['KDA_FUZZ_FROZEN_OUT']}/job{job.index}-"
            "{_o.getpid()}.txt\", float(_o.environ['KDA_FUZZ_FROZEN_EVERY']))\n" + JOB_BODY)
    bodies[0].write_text(bodies[0].read_text().replace(JOB_BODY, hook))
    return out


def job_pids(root: int) -> list[int]:
    """The campaign's job processes: the children of its fork server."""
    sys.path.insert(0, str(HERE))
    from kda_fuzz.workers.process import descendants

    out = []
    for pid in descendants(root):
        try:  # (a fork has its server's command line: the server is the one whose isn't)
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            parent_cmd = Path(f"/proc/{parent}/cmdline").read_bytes().decode(errors="ignore")
        except (OSError, ValueError, IndexError):
            continue
        if parent != root and "forkserver" in parent_cmd:
            out.append(pid)
    return out


def _ticks(pids: list[int]) -> dict[tuple[int, str], int]:
    """utime+stime (clock ticks) of every thread of ``pids``."""
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                f = (task / "stat").read_text().rsplit(")", 1)[1].split()
                out[(pid, task.name)] = int(f[11]) + int(f[12])
            except (OSError, ValueError, IndexError):
                continue
    return out


def threads(pid: int, busy: dict[tuple[int, str], int]) -> list[str]:
    """Each thread of ``pid``: name, state, kernel wait channel, CPU % over the last second
    (``busy``: ticks per thread then)."""
    rows = []
    hz = os.sysconf("SC_CLK_TCK")
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            name = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip() or "-"
        except OSError:
            continue
        cpu = 100 * busy.get((pid, task.name), 0) // hz
        rows.append(f"{task.name} {name} {state} {wchan} cpu={cpu}%")
    return rows


def machine() -> str:
    """What bounds the jobs' CPU: cores, affinity, the cgroup's quota and throttling,
    pressure, load and memory."""
    lines = [f"cpu_count={os.cpu_count()} affinity={len(os.sched_getaffinity(0))} "
             f"loadavg={Path('/proc/loadavg').read_text().split()[:3]}"]
    for f in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu.stat",
              "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.stat",
              "/proc/pressure/cpu", "/proc/pressure/memory", "/proc/pressure/io"):
        try:
            lines.append(f"{f}: " + " | ".join(Path(f).read_text().split("\n")))
        except OSError:
            pass
    mem = {k: v for k, v in (ln.split(":", 1) for ln in
                             Path("/proc/meminfo").read_text().splitlines()[:3])}
    lines.append("meminfo: " + ", ".join(f"{k}={v.strip()}" for k, v in mem.items()))
    return "\n".join(lines)


def native(pid: int) -> str:
    """Native stacks of ``pid`` from py-spy or gdb (whichever is installed), else ''."""
    for tool, cmd in (("py-spy", ["py-spy", "dump", "--native", "--pid", str(pid)]),
                      ("gdb", ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"])):
        if shutil.which(tool):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                return f"{tool}: no answer within 60 s"
            return f"{tool}:\n{r.stdout[-6000:]}{r.stderr[-1000:]}"
    return ""


# what a sampled stack is doing: the first of these whose text one of its frames holds
WHERE = (("importing", ("<frozen importlib", "importlib/__init__")),
         ("helion binding/codegen", ("helion/_compiler", "BoundKernel", "compile_config",
                                     "_subclasses/fake_tensor")),
         ("triton compile", ("triton/compiler", "_do_compile", "triton/backends")),
         ("judging", ("judge.py", "fused.py", "oracle.py:2", "reference.py")),
         ("target call", ("helion/runtime", "variants.py", "launched")),
         ("building a layout", ("layouts.py", "build")),
         ("hypothesis", ("hypothesis/",)),
         ("supervision", ("supervisor.py", "runner.py")))


def where(stack: str) -> str:
    """What one sampled main-thread stack was doing (see :data:`WHERE`)."""
    for name, marks in WHERE:
        if any(m in stack for m in marks):
            return name
    return "other"


def census_of(out: Path) -> str:
    """Per job and in all: what its sampled stacks were doing, in shares of its samples."""
    import collections

    rows, total = [], collections.Counter()
    for f in sorted(out.glob("job*.txt")):
        c = collections.Counter(where(b) for b in f.read_text().split("--- ")[1:])
        total += c
        n = sum(c.values()) or 1
        rows.append(f"  {f.stem}: {sum(c.values())} samples: " + ", ".join(
            f"{k} {100 * v // n}%" for k, v in c.most_common()))
    n = sum(total.values()) or 1
    return ("what the jobs' main threads were doing (sampled):\n" + "\n".join(rows)
            + "\n  all: " + ", ".join(f"{k} {100 * v // n}%" for k, v in total.most_common()))


def _silent(out: Path, pid: int, seconds: float) -> bool:
    """Whether job ``pid``'s writer has written nothing for ``seconds`` (or ever)."""
    files = list(out.glob(f"job*-{pid}.txt"))
    if not files:
        return False  # (not a job)
    blocks = files[0].read_text().split("--- ")[1:]
    return not blocks or time.time() - float(blocks[-1].split("\n", 1)[0]) > seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--at", type=float, default=20.0,
                    help="when to look at the jobs (or, where none has started by then, "
                         "--every seconds after they start)")
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--args", default="--device cuda --contract helion")
    ap.add_argument("--out", default=None, help="keep the stacks written there")
    ap.add_argument("--no-native", dest="native", action="store_false",
                    help="no py-spy or gdb (they pause each job while they read it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = patched_copy(Path(tmp))
        out = Path(args.out or tmp) / "stacks"
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "KDA_FUZZ_FROZEN": str(HERE / "benchmarks"),
               "KDA_FUZZ_FROZEN_OUT": str(out), "KDA_FUZZ_FROZEN_EVERY": str(args.every),
               "TRITON_CACHE_DIR": f"{tmp}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(tree),
                                                           os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "kda_fuzz", "fuzz", "--jobs", "auto", "--max-seconds",
               str(args.seconds), "--valid-share", "1", "--max-examples", str(10**7),
               "--seed", "1", "--no-save", "--json", *shlex.split(args.args)]
        t0, wall0 = time.monotonic(), time.time()
        err = open(out.parent / "campaign.err", "w")
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        lives: dict[int, list[float]] = {}  # job pid: [first seen, last seen] (s)

        def census() -> None:
            while proc.poll() is None:
                now = time.monotonic() - t0
                for pid in job_pids(proc.pid):
                    lives.setdefault(pid, [now, now])[1] = now
                time.sleep(0.25)

        threading.Thread(target=census, daemon=True).start()
        time.sleep(max(0.0, args.at - (time.monotonic() - t0)))
        if not job_pids(proc.pid):  # not started yet (a loaded machine): look once they
            while not job_pids(proc.pid) and proc.poll() is None:  # are, and have written
                time.sleep(0.25)
            time.sleep(args.every)
        looked = time.monotonic() - t0
        pids = job_pids(proc.pid)
        before, facts0 = _ticks(pids), machine()
        time.sleep(1.0)
        after = _ticks(pids)
        busy = {k: v - before.get(k, v) for k, v in after.items()}
        rows = {pid: threads(pid, busy) for pid in pids}  # (all at once, before any tool)
        silent = [pid for pid in pids if _silent(out, pid, 2 * args.every + 1.0)]
        deep = set(silent[:3]) if args.native else set()  # (a tool pauses a job a while)
        seen = {pid: (rows[pid], native(pid) if pid in deep else "") for pid in pids}
        last = proc.communicate()[0].strip().splitlines()[-1:]
        (out.parent / "summary.json").write_text(last[0] if last else "")
        print(f"exit status {proc.returncode}; worker processes (pid: first and last seen, s): "
              + ", ".join(f"{p}: {a:.1f}-{b:.1f}" for p, (a, b) in sorted(lives.items())))
        print("campaign's stderr, last lines:\n    " + "\n    ".join(
            (out.parent / "campaign.err").read_text().splitlines()[-25:]))
        try:
            summary = json.loads(last[0])
            print(f"campaign: {summary.get('examples')} examples, {summary.get('failures')} "
                  f"failure(s), timeout "
                  f"{json.dumps(summary.get('timeout'))[:200]}")
            for n in summary.get("notes") or []:
                print(f"  note: {n[:400]}")
            print(f"  stopped: {summary.get('stopped')}; start-up "
                  f"{summary.get('startup_seconds')}; compiling {summary.get('compiling_seconds')}")
            for d in summary.get("failure_details") or []:
                print(f"  failure: {json.dumps(d)[:1500]}")
        except (IndexError, ValueError):
            print(f"campaign: {last[0][:300] if last else 'no summary'}")
        print(census_of(out))
        print(f"machine at {looked:.1f} s:\n{facts0}\nmachine at the end:\n{machine()}")
        for pid, (rows, stacks) in seen.items():
            files = list(out.glob(f"job*-{pid}.txt"))
            if not files:  # (the fork server's other workers: isolated replays, minimizing)
                print(f"\n=== worker process {pid} (not a job): threads\n    "
                      + "\n    ".join(rows))
                continue
            blocks = files[0].read_text().split("--- ")[1:]
            at = (f"{float(blocks[-1].split(chr(10), 1)[0]) - wall0:.1f} s" if blocks
                  else "never")
            print(f"\n=== job process {pid} ({files[0].name}): its writer last wrote at "
                  f"{at} of the campaign (looked at {looked:.1f} s)")
            if blocks:
                print("  last Python stack (innermost last):\n" + blocks[-1].split("\n", 1)[1])
            print("  threads (tid name state wait channel):\n    " + "\n    ".join(rows))
            if stacks:
                print(stacks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
