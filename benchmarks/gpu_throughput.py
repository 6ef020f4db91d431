"""Fuzzing throughput on a GPU: the CLI's default mode beside --no-isolate and naive.

cli-default: `kda-fuzz fuzz --device cuda --jobs N` as a user runs it (supervised,
          isolated jobs: each job runs draw, build, launch and judge itself and keeps a
          flight record; start-up, compiles and the final minimization all counted);
cli-no-isolate: the same command with `--no-isolate` (no flight record, no restarts);
naive:    one Hypothesis example = one layout of any batch size and shape (B <= 256),
          in one process; every new shape compiles anew.
Every CLI run starts with empty compile caches (Triton's, which Helion uses, and
Inductor's), as on a fresh CI machine: the order of the modes does not favour any.
The valid-layout campaign (`--valid-share 1`) is the throughput figure; the CLI's default
plan (broken and valid layouts, `--valid-share 0.5`) is reported beside it.

Prints examples/s and verified rows/s over the wall time of each command (rows of valid
cases that were judged: live and padding rows), live rows/s (the rows compared with the
reference), and the rows/s of each stratum (valid families, scale).

    python benchmarks/gpu_throughput.py [--seconds 60] [--naive-seconds 15] [--jobs auto]
                                        [--modes ...] [--repeat N]
                                        [--cli-args '--scale-share 0']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import paired  # (this script's folder is on sys.path)
import torch

from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.targets import Target, load_target
from kda_fuzz.families import get_contract
from kda_fuzz.report.progress import time_shares


class CompileMeter:
    """Times every call; first calls of a new argument signature count as compiling."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.first, self.steady, self.seen = fn, 0.0, [], set()

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                    for a in args)
        torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            if key in self.seen:
                self.steady.append(dt)
            else:
                self.seen.add(key)
                self.first += dt

    def summary(self) -> dict[str, float]:
        """Distinct signatures compiled and the seconds spent compiling them."""
        typical = statistics.median(self.steady) if self.steady else 0.0
        return {"compiles": len(self.seen),
                "compile_s": max(0.0, self.first - typical * len(self.seen))}


NAIVE = {"families": 0, "bucket": False, "max_b": 256, "budget": 1 << 20}


def run_naive(target: str, variant: str, seconds: float, seed: int) -> dict[str, Any]:
    """One process, one launch per example, any shape (compiles counted by CompileMeter)."""
    meter = CompileMeter(load_target(target).fn)
    t0 = time.perf_counter()
    rep = campaign(get_contract("kda"), variant, [Target(target, meter)], device="cuda",
                   max_examples=10**7, seed=seed, valid_share=1.0, max_seconds=seconds,
                   **NAIVE)
    wall = time.perf_counter() - t0
    return {"mode": "naive", "examples": rep.examples, "rows": rep.facts["rows"],
            "live_rows": rep.facts["live_rows"], "wall": wall,
            "failures": len(rep.failures), **meter.summary()}


def run_cli(mode: str, target: str, variant: str, seconds: float, seed: int, jobs: str,
            valid_share: float, extra: list[str]) -> dict[str, Any]:
    """The CLI exactly as a user runs it; wall time includes start-up and minimization.
    Each run starts with empty Triton and Inductor caches, so that every mode pays the
    same compiles whatever ran before it."""
    cmd = [sys.executable, "-m", "kda_fuzz", "fuzz", "--device", "cuda", "--target", target,
           "--contract", variant, "--jobs", jobs, "--max-examples", str(10**7),
           "--max-seconds", str(seconds), "--seed", str(seed), "--valid-share",
           str(valid_share), "--no-save", "--json", *extra]
    with tempfile.TemporaryDirectory() as cache:  # compile caches of a fresh machine
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=paired.fresh_caches(cache))
        wall = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    return {"mode": mode, "examples": summary["examples"], "rows": summary["valid_rows"],
            "live_rows": summary["live_rows"],
            "wall": wall, "campaign_s": summary["seconds"], "failures": summary["failures"],
            "notes": summary.get("notes", []),
            "stratum_seconds": summary.get("stratum_seconds", {}),
            "stratum_rows": summary.get("stratum_rows", {}),
            "compiling_seconds": summary.get("compiling_seconds", 0.0),
            "startup_seconds": summary.get("startup_seconds", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target",
                    default="kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    ap.add_argument("--contract", default="helion")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--naive-seconds", type=float, default=15.0)
    ap.add_argument("--jobs", default="auto", help="--jobs of the CLI runs (default auto)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="naive,default,no-isolate,plan",
                    help="comma-separated subset of naive, default, no-isolate, plan")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the CLI modes this many times, in turn (single 60 s runs vary "
                         "by about 15 %%); the ratio is then also given as a median")
    ap.add_argument("--cli-args", default="",
                    help="more arguments for every CLI run, e.g. '--scale-share 0'")
    args = ap.parse_args()
    more = args.cli_args.split()
    modes = args.modes.split(",")
    rows = []
    if "naive" in modes:
        rows.append(run_naive(args.target, args.contract, args.naive_seconds, args.seed))
    common = (args.target, args.contract, args.seconds, args.seed, args.jobs)
    for _ in range(args.repeat):
        if "default" in modes:
            rows.append(run_cli("cli-default", *common, 1.0, more))
        if "no-isolate" in modes:
            rows.append(run_cli("cli-no-isolate", *common, 1.0, ["--no-isolate", *more]))
        if "plan" in modes:
            rows.append(run_cli("cli-default-plan", *common, 0.5, more))
    print(f"target {args.target} on {torch.cuda.get_device_name()}, --jobs {args.jobs}, "
          f"{os.cpu_count()} CPU cores")
    print("ex/s and rows/s are over the wall time of the whole command (start-up, compiles "
          "and minimization included); campaign s is the campaign alone")
    print("rows: every row of the valid cases judged (live and padding rows); live: the rows "
          "that name a slot, whose out and state were compared with the reference")
    print(f"{'mode':18} {'wall s':>7} {'campaign s':>10} {'examples':>9} {'ex/s':>7} "
          f"{'rows':>10} {'rows/s':>10} {'live/s':>10} failures")
    for r in rows:
        print(f"{r['mode']:18} {r['wall']:7.1f} {r.get('campaign_s', r['wall']):10.1f} "
              f"{r['examples']:9d} {r['examples'] / r['wall']:7.1f} {r['rows']:10d} "
              f"{r['rows'] / r['wall']:10.0f} {r['live_rows'] / r['wall']:10.0f} "
              f"{r['failures']}")
    for r in rows:  # where the jobs' time went (summed over jobs)
        shares = time_shares(SimpleNamespace(**r))
        if shares:
            print(f"{r['mode']:18} time: {shares} "
                  f"({sum(r['stratum_seconds'].values()):.0f} job-seconds)")
        if r.get("stratum_rows"):  # where the verified rows come from
            print(f"{r['mode']:18} rows/s by stratum: " + ", ".join(
                f"{k} {v / r['wall']:,.0f}" for k, v in sorted(r["stratum_rows"].items())))
        for note in r.get("notes", []):  # the stratum, and what restarts cost
            if note.startswith("scale stratum") or "restart" in note \
                    or "calibrated per-call timeout" in note:
                print(f"{r['mode']:18} {note}")
    rate = {m: [r["examples"] / r["wall"] for r in rows if r["mode"] == m]
            for m in ("cli-default", "cli-no-isolate")}
    ratios = [a / max(1e-9, b) for a, b in zip(rate["cli-default"], rate["cli-no-isolate"])]
    if ratios:  # each run of the default against the --no-isolate run of its turn
        print("isolated / no-isolate throughput: "
              + ", ".join(f"{100 * q:.0f} %" for q in ratios)
              + (f" (median {100 * statistics.median(ratios):.0f} %)" if len(ratios) > 1
                 else ""))


if __name__ == "__main__":
    main()
