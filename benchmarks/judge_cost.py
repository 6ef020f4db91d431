"""What the oracle costs on one large valid case (the part of a GPU campaign's time that
grows with the case): the judge's seconds, and its most expensive torch ops.

    python benchmarks/judge_cost.py [--device cpu|cuda] [--B 1024] [--HV 4] [--K 128]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from kda_fuzz.engine.oracle import call_args
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--B", type=int, default=1024)
    ap.add_argument("--HV", type=int, default=4)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--padding", default="none", help="none | some | all | first | last")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    kda = get_contract("kda")
    p = KdaLayout(B=args.B, H=args.HV // 2 or 1, HV=args.HV, K=args.K, V=args.K, seed=1,
                  padding=args.padding)
    case = build(p, "triton", args.device)
    kwargs, bases = case.materialize()
    before = {n: t.base for n, t in case.tensors.items()}
    result = reference_kda_packed_decode(*call_args(kda, kwargs))

    def judge() -> object:
        v = kda.judge(case, kwargs, before, bases, result)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return v

    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        verdict = judge()
        times.append(time.perf_counter() - t)
    state = case.tensors["initial_state"]
    print(f"B={p.B} HV={p.HV} K=V={p.K} ({p.B * p.HV * p.K * p.K:,} state elements of the "
          f"rows, pool {state.footprint():,}) on {args.device}: judge {min(times) * 1e3:.1f} ms "
          f"(fastest of {args.repeats}), verdict {verdict}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        judge()
    key = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=15))


if __name__ == "__main__":
    main()
