"""How long ``kda-fuzz`` takes to answer usage errors and ``--help`` (wall time of a fresh
process, best and median of N runs), printed; the goal is under a second.

    python benchmarks/cli_latency.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = (
    [],
    ["--help"],
    ["fuzz", "--help"],
    ["fuzz", "--contract", "foo"],
    ["fuzz", "--max-examples", "-1"],
    ["fuzz", "--jobs", "0"],
    ["replay", "--help"],
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=5)
    runs = p.parse_args().runs
    print(f"{'command':<40} {'exit':>4} {'best s':>7} {'median s':>9}")
    for argv in CASES:
        times = []
        code = None
        for _ in range(runs):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "kda_fuzz", *argv], cwd=ROOT,
                               capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            code = r.returncode
        print(f"{'kda-fuzz ' + ' '.join(argv):<40} {code:>4} {min(times):>7.2f} "
              f"{statistics.median(times):>9.2f}")


if __name__ == "__main__":
    main()
