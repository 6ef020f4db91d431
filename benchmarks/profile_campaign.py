"""Where one campaign process spends its time: cProfile of an in-process campaign, or with
``--kernels`` (cuda) the device time per example and the kernels that take it.

    python benchmarks/profile_campaign.py [--device cuda] [--seconds 20] [--top 25]
                                          [--kernels | --plain] [--max-b N] [--families N]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import Counter
from typing import Any

from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.targets import load_target
from kda_fuzz.families import get_contract


def shaping(device: str, max_b: int | None = None, families: int = 8) -> dict[str, Any]:
    """Valid-layout sizes of the project's kernels as the CLI sets them (no scale stratum):
    ``families`` compile groups (a CLI job's share: 1) and batch buckets on cuda, the
    interpreted kernels' small layouts on cpu."""
    cuda = device.startswith("cuda")
    sizes = get_contract("kda").knobs.resolve({"max_b": max_b if cuda else None}, device, False)
    return {**({"families": families} if cuda else {}), **sizes, "scale_share": 0.0}


def kernel_table(prof: Any, examples: int, wall: float, top: int) -> None:
    """Device time per example, busy share of the wall time, and the top kernels."""
    total: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time_total > 0:
            total[e.name[:90]] += e.device_time_total
            count[e.name[:90]] += 1
    busy = sum(total.values()) / 1e6
    n = sum(count.values())
    print(f"device: {busy:.2f} s of kernels in {wall:.1f} s wall ({100 * busy / wall:.0f} % "
          f"busy); {n} kernels, {n / max(1, examples):.0f} per example, "
          f"{1e3 * busy / max(1, examples):.3f} ms per example")
    for name, us in total.most_common(top):
        print(f"{us / 1e3:10.1f} ms {100 * us / 1e6 / busy:5.1f} % {count[name]:8d}x  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target",
                    default="kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    ap.add_argument("--contract", default="helion")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--valid-share", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--max-b", type=int, default=None,
                    help="largest batch size on cuda (default: the contract's)")
    ap.add_argument("--families", type=int, default=8,
                    help="compile groups on cuda (default 8: every job's; 1: one job's share, "
                         "whose compiles the warm-up takes: the steady state)")
    ap.add_argument("--kernels", action="store_true",
                    help="profile device kernels (torch.profiler) instead of Python (cProfile)")
    ap.add_argument("--plain", action="store_true",
                    help="no profiler: the rate alone (cProfile slows Python-heavy code)")
    args = ap.parse_args()
    target = load_target(args.target)

    def run(seconds: float) -> Any:
        return campaign(get_contract("kda"), args.contract, [target], device=args.device,
                        max_examples=10**7, seed=1, valid_share=args.valid_share,
                        max_seconds=seconds, **shaping(args.device, args.max_b, args.families))

    warm = run(args.seconds / 2)  # compiles out of the way
    if args.plain:
        rep = run(args.seconds)
    elif args.kernels:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            rep = run(args.seconds)
    else:
        cprof = cProfile.Profile()
        cprof.enable()
        rep = run(args.seconds)
        cprof.disable()
    print(f"warm-up {warm.examples} examples; profiled {rep.examples} examples in "
          f"{rep.seconds:.1f} s ({rep.examples / rep.seconds:.1f}/s), {rep.facts['rows']} rows")
    if args.kernels:
        kernel_table(prof, rep.examples, rep.seconds, args.top)
    elif not args.plain:
        pstats.Stats(cprof).sort_stats("cumulative").print_stats(args.top)
        pstats.Stats(cprof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
