"""Write the GDN seed regressions into ``corpus/seed/`` (deterministic per seed).

Each planted bug of ``tests/gdn_mutants.py`` is fuzzed (``kda-fuzz``'s own campaign, the
GDN contract, small layouts), its first distinct failure minimized and saved; a file is
kept only when the torch reference and the correct twin pass it.

    python scripts/seed_gdn_corpus.py [--out corpus/seed]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kda_fuzz.campaign.runner import campaign  # noqa: E402
from kda_fuzz.corpus.store import save_failure  # noqa: E402
from kda_fuzz.engine.oracle import run_case  # noqa: E402
from kda_fuzz.engine.targets import Target, load_target  # noqa: E402
from kda_fuzz.families import get_contract  # noqa: E402
from tests import gdn_mutants  # noqa: E402

GDN = get_contract("gdn")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "corpus" / "seed"))
    args = parser.parse_args()
    reference = load_target(GDN.reference_target or "")
    for name, fn in sorted(gdn_mutants.MUTANTS.items()):
        target = Target(f"tests.gdn_mutants:{name}", fn)
        report = campaign(
            GDN, "triton", [target], max_examples=300, seed=1, budget=4096, max_b=16,
            minimize=60.0)
        if not report.failures:
            print(f"{name}: not found", file=sys.stderr)
            return 1
        failure = report.failures[0]
        case = failure.case
        case.notes["mutants"] = [name]
        for check in (reference.fn, gdn_mutants.correct_triton):
            outcome = run_case(GDN, case, check)
            if outcome.status not in ("pass", "gap"):
                print(f"{name}: the seed fails a correct implementation: {outcome}",
                      file=sys.stderr)
                return 1
        path = save_failure(failure, args.out, contract=GDN, seed=1)
        print(f"{name}: {failure.verdict.kind}/{failure.verdict.what} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
