"""Cost of the error budget on the judge's fast path: ``judge(...)`` with and without
``budget={}`` on one valid layout, median of repeated calls (the target is the torch
reference, run once; only the judge is timed).

    python benchmarks/judge_budget.py --device cuda --B 1024 --HV 16 --K 128 --V 128

Measured on one H200 (torch 2.11), the added work alone (|err| / bound and its max per
output, beside the within-bound check): +0.08 ms on a 3.5 ms judge (B=64, HV=8, K=V=64),
+1.4 ms on 27 ms (B=1024, HV=16, K=V=128), +11 ms on 203 ms (B=4096, HV=32, K=V=128):
2-6 % of the judge, and nothing when no budget is asked for.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, Values, build
from kda_fuzz.families.packed.judge import judge
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--HV", type=int, default=8)
    p.add_argument("--K", type=int, default=64)
    p.add_argument("--V", type=int, default=64)
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    kda = get_contract("kda")
    case = build(KdaLayout(B=a.B, H=max(1, a.HV // 2), HV=a.HV, K=a.K, V=a.V, spare_slots=2,
                           padding="some", qkv_row_pad=0, slot_pad=0, guard=1,
                           values=Values(), seed=1), "triton", a.device)
    kwargs, bases = case.materialize()
    before = {n: b.clone() for n, b in bases.items()}
    res = reference_kda_packed_decode(*(kwargs[n] for n in kda.signature))

    def timed(budget: bool) -> float:
        times = []
        for _ in range(a.reps):
            t = time.perf_counter()
            judge(case, kwargs, before, bases, res, budget={} if budget else None)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    timed(True)  # warm-up
    for _ in range(2):
        plain, with_budget = timed(False), timed(True)
        print(f"{a.device} B={a.B} HV={a.HV} K={a.K} V={a.V}: judge {plain:.2f} ms, "
              f"with budget {with_budget:.2f} ms ({100 * (with_budget / plain - 1):+.1f} %)")
    b: dict[str, float] = {}
    judge(case, kwargs, before, bases, res, budget=b)
    print("budget:", {k: f"{v:.3g}" for k, v in b.items()})


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
