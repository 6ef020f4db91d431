"""How fast findings reach the user, and how well ``--max-seconds`` bounds the command.

Runs ``kda-fuzz fuzz`` as a user would (a subprocess, stderr off a terminal) against a
target with far more examples than fit, and prints per bound: the command's wall time and
its overshoot past the bound (the goal: within max(5 s, 5 %)), the seconds from the start
to the first confirmed and the first saved finding, and how many findings were confirmed
and saved (the goal: all of them).

    python benchmarks/findings_latency.py [--target MODULE:CALLABLE] [--contract triton]
        [--max-seconds 30 60] [--jobs 1] [--shrink-seconds 30] [-- EXTRA FUZZ ARGS]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIRMED = re.compile(r"kda-fuzz: failure \d+ confirmed: ")
SAVED = re.compile(r"kda-fuzz: failure \d+ saved: ")


def run(target: str, contract: str, bound: float, jobs: str, shrink: float,
        extra: list[str]) -> dict[str, float | int | None]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "kda_fuzz", "fuzz", "--target", target, "--contract",
             contract, "--max-examples", "1000000", "--seed", "1", "--max-seconds",
             f"{bound:g}", "--jobs", jobs, "--shrink-seconds", f"{shrink:g}", "--json",
             "--corpus", str(Path(tmp) / "corpus"), *extra],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first_confirmed = first_saved = None
        saved = confirmed = 0
        assert proc.stderr is not None
        for line in proc.stderr:
            now = time.monotonic() - t0
            if CONFIRMED.search(line):
                confirmed += 1
                first_confirmed = first_confirmed if first_confirmed is not None else now
            if SAVED.search(line):
                saved += 1
                first_saved = first_saved if first_saved is not None else now
        proc.wait()
        wall = time.monotonic() - t0
    return {"bound": bound, "wall": wall, "over": wall - bound, "rc": proc.returncode,
            "first_confirmed": first_confirmed, "first_saved": first_saved, "saved": saved,
            "confirmed": confirmed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="tests.mutants:pad_wrap")
    p.add_argument("--contract", default="triton")
    p.add_argument("--max-seconds", type=float, nargs="+", default=[30.0])
    p.add_argument("--jobs", default="1")
    p.add_argument("--shrink-seconds", type=float, default=30.0)
    p.add_argument("extra", nargs="*", help="more `kda-fuzz fuzz` arguments (after --)")
    a = p.parse_args()
    print(f"target {a.target} ({a.contract}), --jobs {a.jobs}, --shrink-seconds "
          f"{a.shrink_seconds:g}")
    print(f"{'bound s':>8} {'wall s':>8} {'over s':>7} {'allowed':>8} {'rc':>3} "
          f"{'1st conf s':>10} {'1st saved s':>11} {'confirmed':>9} {'saved':>5}")
    for bound in a.max_seconds:
        r = run(a.target, a.contract, bound, a.jobs, a.shrink_seconds, a.extra)

        def f(x: object) -> str:
            return "-" if x is None else f"{x:.1f}"

        print(f"{bound:>8g} {r['wall']:>8.1f} {r['over']:>7.1f} "
              f"{max(5.0, 0.05 * bound):>8.1f} {r['rc']:>3} {f(r['first_confirmed']):>10} "
              f"{f(r['first_saved']):>11} {r['confirmed']:>9} {r['saved']:>5}", flush=True)


if __name__ == "__main__":
    main()
