"""What each opt-in check costs: ``paired.py``'s command on this tree, plain and with each
option, on one machine start; the plain command runs first and last, each option between,
and each option's rate is given as a share of the plain runs' mean, with the summary's
time line (where its jobs' time went, the option's own seconds among it).

    python benchmarks/option_cost.py [--seconds 60] [--device cuda] [--jobs auto]
        [--args '--contract helion']
        [--options '--cuda-graphs;--invariance bitwise;--sanitize memcheck;--helion-configs 4']
"""

from __future__ import annotations

import argparse
import statistics
from types import SimpleNamespace

from paired import HERE, arguments, run, settle, warm_up  # (this script's folder is on sys.path)

from kda_fuzz.report.progress import time_shares

OPTIONS = "--cuda-graphs;--invariance bitwise;--sanitize memcheck;--helion-configs 4"


def main() -> None:
    ap = arguments(__doc__, baseline_required=False, rounds=1, seconds=60.0,
                   keep="(unused)")
    ap.add_argument("--options", default=OPTIONS,
                    help=f"';'-separated option sets to measure (default: {OPTIONS})")
    args = ap.parse_args()
    sets = ["", *[o.strip() for o in args.options.split(";") if o.strip()], ""]
    print(f"{HERE}: {args.seconds:g} s on {args.device}, --jobs {args.jobs} {args.args}")
    print(f"{'option':24} {'wall s':>7} {'examples':>9} {'ex/s':>8} {'rows/s':>11} failures")
    warm_up(args)
    got = []
    for extra in sets:
        if args.device.startswith("cuda"):
            settle()
        one = run(HERE, argparse.Namespace(**{**vars(args), "args": f"{args.args} {extra}"}))
        got.append((extra, one))
        print(f"{extra or '(default)':24} {one['wall']:7.1f} {one['examples']:9d} "
              f"{one['examples'] / one['wall']:8.1f} {one['rows'] / one['wall']:11,.0f} "
              f"{one['failures']}", flush=True)
        print(f"{'':24} time: {time_shares(SimpleNamespace(**one['summary']))}")
        if one["timeline"]:
            print(f"{'':24} timeline (s from the command's start): {one['timeline']}")
    base = statistics.mean(o["examples"] / o["wall"] for e, o in got if not e)
    rows = statistics.mean(o["rows"] / o["wall"] for e, o in got if not e)
    for extra, one in got:
        if extra:
            print(f"{extra:24} {100 * one['examples'] / one['wall'] / base:5.0f} % of the "
                  f"default's examples/s, {100 * one['rows'] / one['wall'] / max(rows, 1e-9):5.0f}"
                  " % of its rows/s")


if __name__ == "__main__":
    main()
