"""Fuzzing throughput on a GPU: the naive mode and the project's mode side by side.

naive:   one Hypothesis example = one layout of any batch size and shape (B <= 256) ->
         launch + float64 reference + compare; every new shape compiles anew.
project: compile-aware: examples are spent family by family (heads, dims, dtypes, strides
         and flags fixed per family), B is bucketed to powers of two up to 4096 with
         padding rows (every row of a launch is an independent case and is verified),
         layouts are generated on the GPU and the reference is vectorised there.

Prints examples/s, verified rows/s and the share of wall time spent in compilation
(first call of each distinct argument signature minus a steady launch time).

    python benchmarks/gpu_throughput.py [--seconds 60] [--naive-seconds 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from kda_fuzz.contracts import get_contract
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

    def compile_seconds(self) -> float:
        typical = statistics.median(self.steady) if self.steady else 0.0
        return max(0.0, self.first - typical * len(self.seen))


def run(mode: str, target: str, variant: str, seconds: float, seed: int) -> dict[str, Any]:
    contract = get_contract("kda")
    meter = CompileMeter(load_target(target).fn)
    kw: dict[str, Any] = (
        {"families": 0, "bucket": False, "max_b": 256, "budget": 1 << 20} if mode == "naive"
        else {"families": 3, "bucket": True, "max_b": 4096, "budget": 1 << 24})
    t0 = time.perf_counter()
    rep = campaign(contract, variant, [Target(target, meter)], device="cuda",
                   max_examples=10**7, seed=seed, valid_share=1.0, max_seconds=seconds, **kw)
    wall = time.perf_counter() - t0
    return {
        "mode": mode, "examples": rep.examples, "rows": rep.rows, "wall": wall,
        "examples_s": rep.examples / wall, "rows_s": rep.rows / wall,
        "drawn_rows_s": (rep.rows - rep.tail_rows) / wall,
        "compiles": len(meter.seen), "compile_share": meter.compile_seconds() / wall,
        "failures": len(rep.failures),
        "failure": rep.failures[0].verdict.summary() if rep.failures else "",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target",
                    default="kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    ap.add_argument("--contract", default="helion")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--naive-seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rows = [run("naive", args.target, args.contract, args.naive_seconds, args.seed),
            run("project", args.target, args.contract, args.seconds, args.seed)]
    print(f"target {args.target} on {torch.cuda.get_device_name()}")
    print("rows/s counts every verified row of a launch; drawn rows/s leaves out the padding "
          "rows that fill a batch bucket")
    print(f"{'mode':8} {'wall s':>7} {'examples':>9} {'ex/s':>7} {'rows':>9} {'rows/s':>9} "
          f"{'drawn/s':>9} {'compiles':>8} {'compile%':>8} failures")
    for r in rows:
        print(f"{r['mode']:8} {r['wall']:7.1f} {r['examples']:9d} {r['examples_s']:7.1f} "
              f"{r['rows']:9d} {r['rows_s']:9.0f} {r['drawn_rows_s']:9.0f} {r['compiles']:8d} "
              f"{100 * r['compile_share']:7.1f}% {r['failures']} {r['failure']}")


if __name__ == "__main__":
    main()
