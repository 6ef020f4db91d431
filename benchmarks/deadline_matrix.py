"""Does ``kda-fuzz fuzz --max-seconds S`` end within max(5 s, 5 %) after S, with every flag,
with no finding on a correct kernel, every planted fault found and every file under 1 MiB?

Runs the command line once per row of a matrix on cpu (the project's triton and helion
kernels, the torch reference as a helion target, which has contract findings to minimize
and save, and the hostile targets of ``tests/hostile_targets.py`` and
``tests/slow_targets.py``: hangs, aborts, slow calls; with --jobs 1 and 2, --invariance
bitwise, --helion-configs 2, --shrink-seconds 600, --no-isolate, an example database of
hangs), each with a corpus in a temporary folder, and prints per command its wall time
(from before the process started), exit code and over-run past S. A row with a ``SETUP``
run has its example database filled first (untimed). Flags: ``OVER`` past the allowance,
``KILLED`` (the benchmark had to), ``LEFTOVER`` (its processes outlived it by more than
``LEFTOVER_GRACE``), ``ERROR`` (it exited with a usage or internal error, 2), ``NOVERDICT``
(exit 2 with no example judged by the clock, in a row that must find or not find), ``LOST``
(fewer corpus files than the failures its JSON summary counts), ``FALSE`` (a finding on a
correct kernel), ``MISSED`` (no finding on a planted fault), ``BIG`` (a saved file of 1 MiB
or more). With ``--device cuda`` the rows are ``GPU_MATRIX``'s: the project's kernels with
every GPU flag and the planted GPU faults (sanitizer, GPU scale, other configs, CUDA
graphs). Run from the repository root:

    python benchmarks/deadline_matrix.py [--device cpu|cuda] [--max-seconds 20]
        [--only NAME ...] [--list]
        [--load N (N busy processes beside the commands: a machine others use too)]

Exit status 1 when any row is flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
LEFTOVER_GRACE = 3.0  # seconds the command's other processes may outlive it
LONG = ("--shrink-seconds", "600")  # minimization that would outlast any deadline
MiB = 1 << 20
NOTHING_JUDGED = ("no example was judged", "the campaign had not begun")

# name -> the command's arguments after ``fuzz`` (--device cpu, --max-seconds, --corpus,
# --max-examples and --seed are added to every row)
MATRIX: dict[str, tuple[str, ...]] = {
    "triton-j1": ("--contract", "triton", "-j", "1"),
    "triton-j2-bitwise": ("--contract", "triton", "-j", "2", "--invariance", "bitwise"),
    "helion-j1-configs": ("--contract", "helion", "-j", "1", "--helion-configs", "2"),
    "helion-j2-bitwise-configs": ("--contract", "helion", "-j", "2", "--invariance",
                                  "bitwise", "--helion-configs", "2"),
    "helion-noisolate-bitwise": ("--contract", "helion", "--no-isolate", "--invariance",
                                 "bitwise"),
    "reference-j1-shrink": ("--target", REFERENCE, "--contract", "helion", "-j", "1", *LONG),
    "reference-j2-shrink-bitwise": ("--target", REFERENCE, "--contract", "helion", "-j", "2",
                                    "--invariance", "bitwise", "--helion-configs", "2", *LONG),
    "reference-noisolate-shrink": ("--target", REFERENCE, "--contract", "helion",
                                   "--no-isolate", *LONG),
    "reference-j2-noisolate-shrink": ("--target", REFERENCE, "--contract", "helion", "-j",
                                      "2", "--no-isolate", *LONG),
    "hangs-j1": ("--target", "tests.hostile_targets:hangs", "--contract", "helion", "-j",
                 "1", *LONG),
    "hangs-j2": ("--target", "tests.hostile_targets:hangs", "--contract", "helion", "-j",
                 "2", *LONG),
    "hangs-noisolate": ("--target", "tests.hostile_targets:hangs", "--contract", "helion",
                        "--no-isolate", *LONG),
    "aborts-j2": ("--target", "tests.hostile_targets:aborts", "--contract", "helion", "-j",
                  "2", *LONG),
    "hangs-past-64-j2": ("--target", "tests.hostile_targets:hangs_past_64_rows",
                         "--contract", "helion", "-j", "2", *LONG),
    "aborts-past-16-j1": ("--target", "tests.hostile_targets:aborts_past_16_rows",
                          "--contract", "helion", "-j", "1", *LONG),
    "slow-j2-shrink": ("--target", "tests.slow_targets:slow_pad_wrap", "--contract",
                       "triton", "-j", "2", "--valid-share", "1", *LONG),
    "slow-noisolate-shrink": ("--target", "tests.slow_targets:slow_pad_wrap", "--contract",
                              "triton", "--no-isolate", "--valid-share", "1", *LONG),
    # an example database holding hangs (stored by SETUP, below), replayed first
    "exampledb-hangs-j2": ("--target", "tests.hostile_targets:hangs_past_64_rows",
                           "--contract", "helion", "-j", "2", "--example-db", "{tmp}/db",
                           *LONG),
}
# on cuda (--jobs auto): the project's correct kernels under every GPU flag, and planted faults
GPU_FLAGS = ("--cuda-graphs", "--invariance", "bitwise", "--sanitize", "memcheck")
GPU_MATRIX: dict[str, tuple[str, ...]] = {
    "triton-every-flag": ("--contract", "triton", *GPU_FLAGS),
    "helion-configs": ("--contract", "helion", "--helion-configs", "6"),
    "helion-every-flag": ("--contract", "helion", *GPU_FLAGS, "--helion-configs", "2"),
    "reads-past-sanitize": ("--target", "tests.gpu_targets:reads_past_the_indices",
                            "--contract", "triton", "--sanitize", "memcheck"),
    "grid-y-scale": ("--target", "tests.gpu_targets:grid_y_rows_heads", "--contract",
                     "triton"),
    "config-bug": ("--target", "tests.helion_config_bug:decode", "--contract", "helion",
                   "--helion-configs", "4"),
    "gates-graphs": ("--target", "tests.gpu_targets:remembers_its_gates", "--contract",
                     "triton", "--cuda-graphs"),
}
# what each row must give: no finding ("clean") or at least one ("finds"); rows not named
# are judged on time, errors and lost or big files only
EXPECT: dict[str, str] = {
    "triton-j1": "clean", "triton-j2-bitwise": "clean", "helion-j1-configs": "clean",
    "helion-j2-bitwise-configs": "clean", "helion-noisolate-bitwise": "clean",
    "reference-j1-shrink": "finds",  # (a first hang is proven only past --timeout, 60 s)
    "aborts-j2": "finds", "triton-every-flag": "clean", "helion-configs": "clean",
    "helion-every-flag": "clean", "reads-past-sanitize": "finds", "grid-y-scale": "finds",
    "config-bug": "finds", "gates-graphs": "finds",
}
# rows whose database or corpus a first, untimed run fills (its own arguments)
SETUP: dict[str, tuple[str, ...]] = {
    "exampledb-hangs-j2": ("--target", "tests.hostile_targets:hangs_past_64_rows",
                           "--contract", "helion", "-j", "2", "--example-db", "{tmp}/db",
                           "--timeout", "2", "--max-seconds", "15", "--shrink-seconds", "1",
                           "--max-examples", "1000000", "--no-save"),
}


def allowance(seconds: float) -> float:
    """How long past ``--max-seconds`` the process may take to exit."""
    return max(5.0, 0.05 * seconds)


def _group(pgid: int) -> list[str]:
    """The command lines of the processes still in process group ``pgid``."""
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != pgid:  # a zombie, another group
                continue
            left.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except (OSError, ValueError, IndexError):
            continue
    return left


def _leftover(pgid: int, grace: float) -> list[str]:
    """What of the group is still there ``grace`` seconds after its leader exited."""
    end = time.monotonic() + grace
    while True:
        left = _group(pgid)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def run_row(name: str, extra: tuple[str, ...], seconds: float, kill_after: float,
            device: str = "cpu") -> dict[str, Any]:
    """Run one row (after its ``SETUP`` run, if any); its wall time, exit code and flags."""
    with tempfile.TemporaryDirectory(prefix=f"deadline-{name}-") as tmp:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        if name in SETUP:
            subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--device", "cpu",
                            "--seed", "2", *(a.format(tmp=tmp) for a in SETUP[name])],
                           cwd=ROOT, env=env, capture_output=True, timeout=kill_after)
        cmd = [sys.executable, "-m", "kda_fuzz", "fuzz", "--device", device, "--max-seconds",
               f"{seconds:g}", "--max-examples", "1000000", "--seed", "1", "--json",
               "--corpus", str(Path(tmp) / "corpus"), *(a.format(tmp=tmp) for a in extra)]
        err_path, out_path = Path(tmp) / "stderr.txt", Path(tmp) / "stdout.txt"
        t0 = time.monotonic()
        with open(err_path, "w") as err, open(out_path, "w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                    stderr=err, start_new_session=True)
            killed = False
            try:
                proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                killed = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.monotonic() - t0
        # its helpers (the fork server, jobs) get a moment to notice it is gone
        leftover = _leftover(proc.pid, LEFTOVER_GRACE)
        if leftover:
            os.killpg(proc.pid, signal.SIGKILL)
        files = list((Path(tmp) / "corpus").rglob("*.json"))
        saved, largest = len(files), max((f.stat().st_size for f in files), default=0)
        tail = err_path.read_text().strip().splitlines()[-3:]
        lines = out_path.read_text().strip().splitlines()
        try:
            failures = json.loads(lines[-1])["failures"] if lines else None
        except (ValueError, KeyError):
            failures = None
    over = wall - seconds
    # exit 2 because nothing was judged by the clock (a start-up or a first call that
    # outlasted it): no verdict, not an error; a row that expects one is flagged NOVERDICT
    unjudged = not killed and proc.returncode == 2 and any(
        said in line for line in tail for said in NOTHING_JUDGED)
    error = not killed and proc.returncode not in (0, 1) and not unjudged
    lost = failures is not None and saved < failures  # a confirmed failure not saved
    expect = EXPECT.get(name)
    flags = [f for f, on in (("KILLED", killed), ("OVER", over > allowance(seconds)),
                             ("LEFTOVER", bool(leftover)), ("ERROR", error),
                             ("LOST", lost), ("BIG", largest >= MiB),
                             ("NOVERDICT", unjudged and expect is not None),
                             ("FALSE", expect == "clean" and bool(failures)),
                             ("MISSED", expect == "finds" and not failures)) if on]
    return {"name": name, "wall": wall, "rc": None if killed else proc.returncode,
            "over": over, "saved": saved, "largest": largest, "failures": failures,
            "flags": flags, "tail": tail + [f"left: {c}" for c in leftover]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu (MATRIX) or cuda[:N] (GPU_MATRIX)")
    p.add_argument("--max-seconds", type=float, default=20.0)
    p.add_argument("--only", nargs="*", help="rows to run (names, or prefixes of names)")
    p.add_argument("--list", action="store_true", help="print the rows and their flags")
    p.add_argument("--kill-after", type=float, default=None,
                   help="kill a command this many seconds after its start (default S + 60)")
    p.add_argument("--load", type=int, default=0,
                   help="busy processes to run beside the commands (default 0)")
    args = p.parse_args()
    matrix = MATRIX if args.device == "cpu" else GPU_MATRIX
    rows = {n: a for n, a in matrix.items()
            if not args.only or any(n.startswith(o) for o in args.only)}
    if args.list:
        for n, a in rows.items():
            print(f"{n}: {' '.join(a)}")
        return 0
    s = args.max_seconds
    kill_after = args.kill_after or s + 60.0
    print(f"--max-seconds {s:g}: allowed over-run {allowance(s):.1f} s; load average "
          f"{os.getloadavg()[0]:.2f}; {args.load} busy process(es) beside", flush=True)
    bad = []
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.load)]
    try:
        for name, extra in rows.items():
            bad += _report(name, run_row(name, extra, s, kill_after, args.device))
    finally:
        for b in burners:
            b.kill()
            b.wait()
    print(f"{len(rows) - len(bad)}/{len(rows)} within the allowance"
          + (f"; flagged: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def _report(name: str, r: dict[str, Any]) -> list[str]:
    """Print one row's line (and the tail of its stderr when flagged); ``[name]`` if flagged."""
    rc = "-" if r["rc"] is None else r["rc"]
    print(f"{name:32s} wall {r['wall']:6.1f} s  rc {rc!s:>3}  over {r['over']:+6.1f} s  "
          f"failures {r['failures'] if r['failures'] is not None else '-'!s:>2} saved "
          f"{r['saved']:2d} largest {r['largest'] / 1024:7.1f} kB  {' '.join(r['flags'])}",
          flush=True)
    if not r["flags"]:
        return []
    for line in r["tail"]:
        print(f"    | {line[:200]}")
    return [name]


if __name__ == "__main__":
    sys.exit(main())
