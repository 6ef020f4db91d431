"""What --sanitize costs on a GPU: small valid cases replayed under compute-sanitizer, one
sanitized process per batch, for the project's kernels (which must be clean) and a fixture
with a masked read past the end of ``ssm_state_indices`` (which must not be).

Prints, per target and batch size, the wall seconds per case and each case's status with
the first error's summary.

    python benchmarks/sanitizer_cost.py [--tool memcheck] [--batches 1 8] [--device cuda]
"""

from __future__ import annotations

import argparse
import time

from kda_fuzz.families.kda.layouts import KdaLayout, build
from kda_fuzz.workers.sanitize import sanitize

TARGETS = ("kda_fuzz_kernels.kda_decode:fused_recurrent_kda_packed_decode",
           "kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode",
           "tests.gpu_targets:reads_past_the_indices")
LAYOUTS = [KdaLayout(B=3, H=1, HV=2, K=32, V=16, seed=1),
           KdaLayout(B=5, H=2, HV=4, K=16, V=32, padding="some", seed=2,
                     use_qk_l2norm_in_kernel=True, lower_bound=-5.0),
           KdaLayout(B=8, H=1, HV=1, K=64, V=64, seed=3),
           KdaLayout(B=2, H=2, HV=2, K=16, V=16, qkv_row_pad=5, guard=3, seed=4),
           KdaLayout(B=16, H=1, HV=2, K=32, V=32, padding="some", seed=5),
           KdaLayout(B=1, H=1, HV=1, K=16, V=16, seed=6),
           KdaLayout(B=4, H=4, HV=8, K=32, V=16, seed=7),
           KdaLayout(B=6, H=1, HV=2, K=128, V=128, seed=8)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tool", default="memcheck")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    cases = [build(lay, "triton") for lay in LAYOUTS]
    for target in TARGETS:
        for batch in args.batches:
            chosen = cases[:batch]
            t = time.monotonic()
            reports = sanitize(args.tool, target, chosen, device=args.device)
            per = (time.monotonic() - t) / len(chosen)
            statuses = [r.status for r in reports]
            first = next((r for r in reports if r.errors), None)
            print(f"{target} batch={batch}: {per:.2f} s/case; {statuses}")
            if first is not None:
                print(f"    {first.errors[0].summary()} ({len(first.errors)} errors)")
            for r in reports:
                if r.status == "failed":
                    print(f"    failed: {r.note[:300]}")


if __name__ == "__main__":
    main()
