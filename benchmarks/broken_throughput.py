"""Broken-layout checks per second on one core: contract oracle + target validation.

Pre-generates broken cases with Hypothesis (not timed), then times ``run_case`` (expected
outcome from the contract, fresh views, the target's call, exact type/message check and
the no-mutation check) on meta tensors and on CPU tensors.

    python benchmarks/broken_throughput.py [--cases 2000] [--target MODULE:CALLABLE]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kda_fuzz.engine.oracle import expectation, run_case
from kda_fuzz.engine.targets import load_target
from kda_fuzz.families import get_contract


def generate(contract, variant: str, n: int) -> list:
    cases: list = []
    arms = [only for _, only in contract.broken_arms(variant)]

    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.sampled_from(arms).flatmap(
        lambda o: contract.broken_cases(variant, only=o)), contract.broken_cases(variant)))
    def collect(case) -> None:
        cases.append(case)

    collect()
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--variant", default="helion")
    ap.add_argument("--target",
                    default="kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    contract = get_contract("kda")
    target = load_target(args.target)
    t0 = time.perf_counter()
    cases = generate(contract, args.variant, args.cases)
    gen = time.perf_counter() - t0
    print(f"generated {len(cases)} broken cases in {gen:.1f} s "
          f"({len(cases) / gen:.0f}/s, Hypothesis; not part of the check rate)")
    for device in ("meta", "cpu"):
        batch = cases
        if device == "meta":  # all on meta: layouts broken only by a device mismatch heal
            batch = [m for m in (c.on("meta") for c in cases) if not expectation(contract, m).ok]
        n, fails, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            for c in batch:
                fails += run_case(contract, c, target.fn).status == "fail"
                n += 1
        dt = time.perf_counter() - t0
        print(f"{device:>4}: {n / dt:8.0f} broken-layout checks/s on one core "
              f"({n} checks, {fails} failures, target {args.target})")


if __name__ == "__main__":
    main()
