"""Time to first finding: ``kda-fuzz fuzz`` against planted bugs with a large budget.

Runs the command line of issue 26 (``--max-examples 100000 --seed 3``, by default also
``--max-seconds 40``) once per target and prints, from the ``--json`` summary, the seconds
and examples from the campaign's start to its first distinct failure, and the stratum
counts at the end. Run from the repository root (the targets are ``tests.mutants``).

    python benchmarks/first_finding.py [--targets tests.mutants:padding_rows_untouched_helion]
        [--max-seconds 40 | --max-seconds 0 (no time limit: --max-failures 1 ends it)]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ("tests.mutants:padding_rows_untouched_helion",  # numeric, valid layouts only
           "tests.mutants:gqa_modulo",  # numeric (GQA head mapping), triton variant
           "tests.mutants:rank_check_and")  # a contract bug: a breakage stratum


def variant_of(target: str) -> str:
    return "helion" if target.endswith("_helion") else "triton"


def run(target: str, max_examples: int, max_seconds: float, seed: int) -> dict:
    cmd = [sys.executable, "-m", "kda_fuzz", "fuzz", "--target", target, "--contract",
           variant_of(target), "--max-examples", str(max_examples), "--seed", str(seed),
           "--no-save", "--json", "--shrink-seconds", "1"]
    cmd += ["--max-seconds", str(max_seconds)] if max_seconds > 0 else ["--max-failures", "1"]
    t = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True)
    wall = time.monotonic() - t
    if r.returncode not in (0, 1):
        raise SystemExit(f"{target}: exit {r.returncode}\n{r.stderr}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    return {"target": target, "wall": wall, **summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", nargs="*", default=list(DEFAULT))
    p.add_argument("--max-examples", type=int, default=100_000)
    p.add_argument("--max-seconds", type=float, default=40.0)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()
    for target in args.targets:
        s = run(target, args.max_examples, args.max_seconds, args.seed)
        first = s["first_finding"]
        found = (f"first finding {first['seconds']:.1f} s, example {first['example']}"
                 if first else "no finding")
        print(f"{target}: {found}; {s['examples']} examples (valid {s['valid_cases']} / "
              f"broken {s['broken_cases']}) in {s['seconds']:.1f} s of campaign, "
              f"{s['wall']:.1f} s wall, {s['failures']} distinct", flush=True)


if __name__ == "__main__":
    main()
