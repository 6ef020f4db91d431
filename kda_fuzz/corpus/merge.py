"""``kda-fuzz merge OUT_DIR IN_DIR...``: the corpora of many runners merged into one.

Every ``*.json`` below the inputs and ``OUT_DIR`` (hidden entries skipped, as everywhere)
is loaded with the corpus loader's rules (:func:`kda_fuzz.corpus.store.load_case`) and sorted
into:

* **bad**: it does not load; never copied;
* **stale**: what the file records as the expected outcome (its ``expected`` field, else
  what its verdict or kind implies) is not what the contract prescribes for the case now,
  by the one stale rule of the replay path (:func:`kda_fuzz.corpus.replay.stale_reason`); never
  copied;
* a **failure**, identified as the campaign identifies distinct failures
  (:attr:`kda_fuzz.campaign.results.Failure.signature`): the recorded target (``origin.target``)
  and the recorded verdict's :meth:`~kda_fuzz.engine.verdict.Verdict.signature` on the file's
  variant. A file without a verdict (a hand-made regression) is its own failure. Of the
  files showing one failure the smallest (bytes; then one already in ``OUT_DIR``; then
  by name) is kept, the others are **duplicates**. Two kept files of one name (one case
  recorded with two verdicts) are one file: the second is a duplicate too.

``OUT_DIR`` ends with one file per distinct failure: the kept files are copied in under
their own names (content-derived, so the same case is one file wherever it was found),
each written atomically (:mod:`kda_fuzz.corpus.atomic`), and only then are the files of
``OUT_DIR`` that a smaller file of the same failure replaced removed; a merge cut short
leaves an extra file, never a missing failure. Bad and stale files already in
``OUT_DIR`` are reported and left alone. A file whose bytes are already in place is not
written: merging again is a no-op. ``kda-fuzz merge`` exits 1 when it found bad or
stale files (after merging the others).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kda_fuzz.corpus.atomic import write_atomic
from kda_fuzz.corpus.replay import check_entry
from kda_fuzz.corpus.replay import stale_reason as corpus_stale_reason
from kda_fuzz.corpus.store import _recorded_expectation, corpus_files

EXIT_OK, EXIT_BAD, EXIT_USAGE = 0, 1, 2


@dataclass
class Entry:
    """One corpus file that loaded and is not stale."""

    path: Path
    size: int
    signature: tuple[Any, ...]
    in_out: bool

    def rank(self) -> tuple[int, int, str, str]:
        return (self.size, 0 if self.in_out else 1, self.path.name, str(self.path))


@dataclass
class MergeResult:
    """What a merge found and did (paths as strings)."""

    out: str
    inputs: list[str]
    files: int = 0
    kept: list[str] = field(default_factory=list)  # OUT_DIR's files, one per failure
    written: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)  # superseded files of OUT_DIR
    duplicates: list[dict[str, str]] = field(default_factory=list)
    stale: list[dict[str, str]] = field(default_factory=list)
    bad: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "inputs": self.inputs, "files": self.files,
                "failures": len(self.kept), "kept": self.kept, "written": self.written,
                "unchanged": self.unchanged, "removed": self.removed,
                "duplicates": self.duplicates, "stale": self.stale, "bad": self.bad}


def stale_reason(contract: Any, case: Any, kind: str, verdict: Any) -> str | None:
    """Why a file of ``kind`` with ``verdict`` (and no ``expected`` field) is stale: the one
    stale rule, :func:`kda_fuzz.corpus.replay.stale_reason`, on what the file records."""
    return corpus_stale_reason(contract, case, _recorded_expectation(None, kind, verdict))


def _classify(path: Path, in_out: bool, result: MergeResult) -> Entry | None:
    rec = check_entry(path)  # the replay path's first stage: load, the stale rule
    if rec.status == "ERROR":
        result.bad.append({"path": str(path), "reason": rec.reason})
        return None
    if rec.status == "STALE":
        result.stale.append({"path": str(path), "reason": rec.reason})
        return None
    assert rec.entry is not None
    case, verdict, meta = rec.entry.case, rec.entry.verdict, rec.entry.meta
    if verdict is None:
        signature: tuple[Any, ...] = ("regression", meta["kind"], path.name)
    else:
        target = meta["origin"].get("target") if isinstance(meta["origin"], dict) else None
        signature = (target if isinstance(target, str) else "",
                     *verdict.signature(case.variant))
    return Entry(path, path.stat().st_size, signature, in_out)


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def merge(out: str | os.PathLike[str], inputs: list[str | os.PathLike[str]]) -> MergeResult:
    """Merge the corpora ``inputs`` into ``out`` (see the module docstring). Raises
    ``FileNotFoundError`` for an input that does not exist, ``NotADirectoryError`` for an
    ``out`` that is not a folder."""
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir} is not a folder")
    result = MergeResult(str(out_dir), [str(p) for p in inputs])
    mine = [p.resolve() for p in (corpus_files([out_dir]) if out_dir.is_dir() else [])]
    theirs = [p.resolve() for p in corpus_files(inputs)]
    files = list(dict.fromkeys([*mine, *theirs]))
    result.files = len(files)
    out_root = out_dir.resolve()
    groups: dict[tuple[Any, ...], list[Entry]] = {}
    for path in files:
        entry = _classify(path, path.is_relative_to(out_root), result)
        if entry is not None:
            groups.setdefault(entry.signature, []).append(entry)
    winners: list[Entry] = []
    for entries in groups.values():
        entries.sort(key=Entry.rank)
        winners.append(entries[0])
        result.duplicates.extend({"path": str(e.path), "same_as": entries[0].path.name}
                                 for e in entries[1:])
    # files already in place claim their names first; then the smallest
    winners.sort(key=lambda e: (0 if e.in_out else 1, *e.rank()))
    claimed: dict[str, Entry] = {}
    superseded = [e for es in groups.values() for e in es[1:] if e.in_out]
    for e in winners:
        if e.path.name in claimed:  # the same case recorded with another verdict
            result.duplicates.append({"path": str(e.path), "same_as": e.path.name})
            if e.in_out and e.path != claimed[e.path.name].path:
                superseded.append(e)
            continue
        claimed[e.path.name] = e
        dest = e.path if e.in_out else out_root / e.path.name
        text = _read(e.path)
        if dest == e.path or (dest.is_file() and _read(dest) == text):
            result.unchanged += 1
        else:
            write_atomic(dest, text)
            result.written.append(str(dest))
        result.kept.append(str(dest))
    out_root.mkdir(parents=True, exist_ok=True)
    kept = {Path(p) for p in result.kept}
    for e in superseded:  # only after every kept file is in place
        if e.path not in kept and e.path.exists():
            e.path.unlink()
            result.removed.append(str(e.path))
    result.kept.sort()
    return result


def merge_command(args: argparse.Namespace) -> int:
    """``kda-fuzz merge``: 0 when merged, 1 when merged but bad or stale files were found
    (not copied), 2 on usage errors (a missing input, an ``OUT_DIR`` that is a file)."""
    try:
        result = merge(args.out, args.inputs)
    except (FileNotFoundError, NotADirectoryError) as e:
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    code = EXIT_BAD if result.bad or result.stale else EXIT_OK
    if args.json:
        print(json.dumps({**result.to_json(), "exit_code": code}, sort_keys=True))
        return code
    for b in result.bad:
        print(f"BAD        {b['path']}  {b['reason']}")
    for s in result.stale:
        print(f"STALE      {s['path']}  {s['reason']}")
    for d in result.duplicates:
        print(f"DUPLICATE  {d['path']}  (same failure as {d['same_as']})")
    for r in result.removed:
        print(f"REPLACED   {r}  (a smaller file shows the same failure)")
    print(f"merged {result.files} file(s) into {result.out}: {len(result.kept)} distinct "
          f"failure(s), {len(result.written)} written, {result.unchanged} already there, "
          f"{len(result.removed)} replaced; {len(result.duplicates)} duplicate(s), "
          f"{len(result.stale)} stale, {len(result.bad)} bad")
    return code
