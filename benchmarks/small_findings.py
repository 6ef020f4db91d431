"""Corpus file sizes of findings at scale, before and after minimization (issue 22).

The issue's vLLM layout (B=256, 263 slots, HV=8, V=192, K=100, fp32 pool) with a planted
write into a slot no row names (``tests.planted:writes_unnamed_slot``, pure torch), and
optionally a pool past ``--pool-elements`` with an offset that wraps there
(``tests.planted:wraps_past_2_22`` uses 2^22). Prints the encoded size before, the file
size after, the minimization's time and whether the file replays failing on the faulty
target and passing on the reference.

    PYTHONPATH=. python benchmarks/small_findings.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from kda_fuzz.campaign.minimize import minimize_with_verdict
from kda_fuzz.campaign.results import Failure
from kda_fuzz.corpus.store import encoded_size, load_case, save_failure
from kda_fuzz.engine.oracle import run_case
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode
from tests import planted

KDA = get_contract("kda")


def measure(label: str, case, target, name: str, seconds: float) -> None:
    before = encoded_size(case)
    first = run_case(KDA, case, target)
    assert first.status == "fail", first
    t0 = time.perf_counter()
    small, verdict = minimize_with_verdict(KDA, case, target, first.verdict, seconds=seconds)
    took = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = save_failure(Failure(small, verdict, f"tests.planted:{name}"), d,
                            contract=KDA, seed=0)
        size = Path(path).stat().st_size
        loaded, _, _ = load_case(path)
        replay = (run_case(KDA, loaded, target).status,
                  run_case(KDA, loaded, reference_kda_packed_decode).status)
    pool = small.tensors["initial_state"]
    print(f"{label}: {before / 2**20:.1f} MiB encoded before; file {size / 1024:.1f} KiB "
          f"after {took:.1f} s of minimization ({len(small.notes.get('minimized', []))} "
          f"steps); pool {tuple(pool.shape)} stride {pool.stride}; replay on the faulty "
          f"target / the reference: {replay[0]} / {replay[1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="minimization budget")
    ap.add_argument("--skip-wrap", action="store_true", help="only the vLLM layout")
    args = ap.parse_args()
    p = KdaLayout(B=256, H=2, HV=8, K=100, V=192, spare_slots=7, seed=1)
    measure("vLLM layout, write into an unnamed slot", build(p, "triton"),
            planted.writes_unnamed_slot, "writes_unnamed_slot", args.seconds)
    if not args.skip_wrap:
        HV, V, K = 2, 16, 16
        slots = planted.WRAP // (HV * V * K) + 40
        case = build(KdaLayout(B=8, H=1, HV=HV, K=K, V=V, spare_slots=slots - 8, seed=5),
                     "triton")
        idx = case.tensors["ssm_state_indices"]
        idx.view().copy_(torch.arange(slots - 1, slots - 9, -1, dtype=idx.dtype))
        measure(f"pool of {slots} slots past 2^22 elements, offset wraps", case,
                planted.wraps_past_2_22, "wraps_past_2_22", args.seconds)


if __name__ == "__main__":
    main()
