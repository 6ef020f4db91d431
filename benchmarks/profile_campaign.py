"""Where one campaign process spends its time: cProfile of an in-process campaign.

    python benchmarks/profile_campaign.py [--device cuda] [--seconds 20] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

from kda_fuzz.contracts import get_contract
from kda_fuzz.runner import campaign, load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target",
                    default="kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    ap.add_argument("--contract", default="helion")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--valid-share", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    shaping = (dict(families=8, bucket=True, max_b=4096, budget=1 << 24) if cuda
               else dict(budget=1 << 13, max_b=64, max_bhv=32))
    target = load_target(args.target)
    warm = campaign(get_contract("kda"), args.contract, [target], device=args.device,
                    max_examples=10**7, seed=1, valid_share=args.valid_share,
                    max_seconds=args.seconds / 2, **shaping)  # compiles out of the way
    prof = cProfile.Profile()
    prof.enable()
    rep = campaign(get_contract("kda"), args.contract, [target], device=args.device,
                   max_examples=10**7, seed=1, valid_share=args.valid_share,
                   max_seconds=args.seconds, **shaping)
    prof.disable()
    print(f"warm-up {warm.examples} examples; profiled {rep.examples} examples in "
          f"{rep.seconds:.1f} s ({rep.examples / rep.seconds:.1f}/s), {rep.rows} rows")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
