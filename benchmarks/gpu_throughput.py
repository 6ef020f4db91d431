"""Fuzzing throughput on a GPU: the naive mode and the project's mode side by side.

naive:    one Hypothesis example = one layout of any batch size and shape (B <= 256) ->
          launch + float64 reference + compare; every new shape compiles anew.
project:  compile-aware: examples are spent family by family (heads, dims, dtypes,
          strides and flags fixed per family), B is bucketed to powers of four up to 4096
          with padding rows (every row of a launch is an independent case and is
          verified), layouts are generated on the GPU, the float64 reference and the
          error bounds are one vectorised pass there, and the judge reads back one flag.
project×N: the same campaign dealt to N jobs (processes) sharing the GPU, each family
          compiled by one job (`kda-fuzz fuzz --jobs N`); its wall time includes
          starting the jobs.

Prints examples/s, verified rows/s and the share of wall time spent in compilation
(first call of each distinct argument signature minus a steady launch time).

    python benchmarks/gpu_throughput.py [--seconds 60] [--naive-seconds 30] [--jobs 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from kda_fuzz.contracts import get_contract
from kda_fuzz.parallel import parallel_campaign
from kda_fuzz.runner import Target, campaign, load_target


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
PROJECT = {"bucket": True, "max_b": 4096, "budget": 1 << 24}


def run(mode: str, target: str, variant: str, seconds: float, seed: int, jobs: int,
        families: int) -> dict[str, Any]:
    shaping = NAIVE if mode == "naive" else {**PROJECT, "families": families}
    common = dict(device="cuda", max_examples=10**7, seed=seed, valid_share=1.0,
                  max_seconds=seconds, **shaping)
    t0 = time.perf_counter()
    if jobs == 1:
        meter = CompileMeter(load_target(target).fn)
        rep = campaign(get_contract("kda"), variant, [Target(target, meter)], **common)
        summaries = [meter.summary()]
        wall = time.perf_counter() - t0
        startup = 0.0
    else:
        rep, per_job = parallel_campaign("kda", variant, [target], jobs, wrap=CompileMeter,
                                         minimize=False, **common)
        summaries = [s for job in per_job for s in job["targets"].values()]
        wall = time.perf_counter() - t0
        startup = wall - max(job["seconds"] for job in per_job)
    compile_s = sum(s["compile_s"] for s in summaries)
    return {
        "mode": mode if jobs == 1 else f"{mode}x{jobs}", "examples": rep.examples,
        "rows": rep.rows, "wall": wall,
        "examples_s": rep.examples / wall, "rows_s": rep.rows / wall,
        "drawn_rows_s": (rep.rows - rep.tail_rows) / wall,
        "compiles": sum(s["compiles"] for s in summaries),
        # compile seconds of all jobs over their process-seconds
        "compile_share": compile_s / (wall * jobs),
        "startup": startup, "failures": len(rep.failures),
        "failure": rep.failures[0].verdict.summary() if rep.failures else "",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target",
                    default="kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    ap.add_argument("--contract", default="helion")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--naive-seconds", type=float, default=30.0)
    ap.add_argument("--jobs", default="8",
                    help="jobs of the parallel project mode (comma-separated: one run each)")
    ap.add_argument("--families", type=int, default=3,
                    help="compile families per job in project mode")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="naive,project,parallel",
                    help="comma-separated subset of naive, project, parallel")
    args = ap.parse_args()
    modes = args.modes.split(",")
    rows = []
    if "naive" in modes:
        rows.append(run("naive", args.target, args.contract, args.naive_seconds, args.seed, 1,
                        0))
    if "project" in modes:
        rows.append(run("project", args.target, args.contract, args.seconds, args.seed, 1,
                        args.families))
    for jobs in (int(j) for j in args.jobs.split(",") if int(j) > 1):
        if "parallel" in modes:
            rows.append(run("project", args.target, args.contract, args.seconds, args.seed,
                            jobs, args.families * jobs))
    print(f"target {args.target} on {torch.cuda.get_device_name()}")
    print("rows/s counts every verified row of a launch; drawn rows/s leaves out the padding "
          "rows that fill a batch bucket; compile% is compile time over process time; "
          "wall s includes starting the jobs (startup s)")
    print(f"{'mode':10} {'wall s':>7} {'examples':>9} {'ex/s':>7} {'rows':>9} {'rows/s':>9} "
          f"{'drawn/s':>9} {'compiles':>8} {'compile%':>8} {'startup s':>9} failures")
    for r in rows:
        print(f"{r['mode']:10} {r['wall']:7.1f} {r['examples']:9d} {r['examples_s']:7.1f} "
              f"{r['rows']:9d} {r['rows_s']:9.0f} {r['drawn_rows_s']:9.0f} {r['compiles']:8d} "
              f"{100 * r['compile_share']:7.1f}% {r['startup']:9.1f} "
              f"{r['failures']} {r['failure']}")


if __name__ == "__main__":
    main()
