"""docs/architecture.md stays true to the tree: every module it names exists, and every
module of the layered folders is named in its folder's row of the table."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
LAYERED = ("engine", "execution", "workers", "corpus", "campaign", "report")


def _rows() -> dict[str, str]:
    """Folder -> its row of the folder table."""
    rows = {}
    for line in DOC.splitlines():
        m = re.match(r"\| `kda_fuzz/(\w+)/` \|(.*)", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_every_module_of_a_layered_folder_is_in_its_row() -> None:
    rows = _rows()
    assert set(LAYERED) <= set(rows), sorted(rows)
    missing = [f"{d}/{p.name}" for d in LAYERED
               for p in sorted((ROOT / "kda_fuzz" / d).glob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in rows[d]
               and f"{d}/{p.name}" not in rows[d]]
    assert not missing, f"docs/architecture.md does not say what these are for: {missing}"


def test_every_module_the_doc_names_exists() -> None:
    rows = _rows()
    gone = []
    for folder, row in rows.items():  # a bare name in a row: a module of that folder
        for name in re.findall(r"`(\w+\.py)`", row):
            if not (ROOT / "kda_fuzz" / folder / name).exists():
                gone.append(f"{folder}/{name}")
    bases = [ROOT, ROOT / "kda_fuzz", *(ROOT / "kda_fuzz" / f for f in rows)]
    for path in set(re.findall(r"`?((?:kda_fuzz/|tests/|docs/)?[\w/]+/\w+\.(?:py|md))", DOC)):
        if not any((base / path).exists() for base in bases):
            gone.append(path)
    assert not gone, f"docs/architecture.md names modules that are not there: {sorted(gone)}"
