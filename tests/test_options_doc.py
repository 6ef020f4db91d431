"""The user guide's table of ``kda-fuzz fuzz`` options stays true to the command line: every
option the parser takes has a row, and every row names an option the parser takes."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kda_fuzz import cli

ROOT = Path(__file__).resolve().parents[1]


def _table() -> str:
    """The "Options of `kda-fuzz fuzz`" section of docs/user-guide.md."""
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    start = guide.index("## Options of `kda-fuzz fuzz`")
    return guide[start:guide.index("\n## ", start + 1)]


def _fuzz_options() -> set[str]:
    """The long options of ``kda-fuzz fuzz`` (help's own left out)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o for a in sub.choices["fuzz"]._actions for o in a.option_strings
            if o.startswith("--") and o != "--help" and a.help != argparse.SUPPRESS}


def test_every_fuzz_option_has_a_row() -> None:
    rows = {m for line in _table().splitlines() if line.startswith("| `--")
            for m in re.findall(r"`(--[a-z-]+)", line.split("|")[1])}
    taken = _fuzz_options()
    assert taken - rows == set(), "options without a row in the user guide"
    assert rows - taken == set(), "rows of options the command does not take"
