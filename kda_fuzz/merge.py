"""``kda-fuzz merge OUT_DIR IN_DIR...``: the corpora of many runners merged into one.

Every ``*.json`` below the inputs and ``OUT_DIR`` (hidden entries skipped, as everywhere)
is loaded with the corpus loader's rules (:func:`kda_fuzz.corpus.load_case`) and sorted
into:

* **bad**: it does not load; never copied;
* **stale**: what the file records as the expected outcome (a valid layout to accept; a
  broken one to reject with check N and its message, or with any message in a hole of
  the contract) is not what the contract prescribes for the case now; never copied;
* a **failure**, identified as the campaign identifies distinct failures
  (:attr:`kda_fuzz.runner.Failure.signature`): the recorded target (``origin.target``)
  and the recorded verdict's :meth:`~kda_fuzz.verdict.Verdict.signature` on the file's
  variant. A file without a verdict (a hand-made regression) is its own failure. Of the
  files showing one failure the smallest (bytes; then one already in ``OUT_DIR``; then
  by name) is kept, the others are **duplicates**. Two kept files of one name (one case
  recorded with two verdicts) are one file: the second is a duplicate too.

``OUT_DIR`` ends with one file per distinct failure: the kept files are copied in under
their own names (content-derived, so the same case is one file wherever it was found),
each written atomically (:mod:`kda_fuzz.atomic`), and only then are the files of
``OUT_DIR`` that a smaller file of the same failure replaced removed; a merge cut short
leaves an extra file, never a missing failure. Bad and stale files already in
``OUT_DIR`` are reported and left alone. A file whose bytes are already in place is not
written: merging again is a no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic import write_atomic
from .contracts import get_contract
from .corpus import CorpusError, corpus_files, load_case
from .oracle import expectation

EXIT_OK, EXIT_USAGE = 0, 2


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


def recorded_expectation(kind: str, verdict: Any) -> tuple[bool, int | None, str | None] | None:
    """What a file records that the contract prescribed: ``(accepts, check, message)``
    (``check``/``message`` ``None`` for a rejection with any message), or ``None`` when
    it records nothing about it (a crash or hang)."""
    if verdict is None:  # a hand-made regression: filed by what the contract expected
        return {"contract": (False, None, None), "mismatch": (True, None, None)}.get(kind)
    first = verdict.extra.get("first_kind", verdict.kind) if verdict.kind == "flaky" \
        else verdict.kind
    if first in ("crash", "timeout"):
        return None
    if first == "mismatch" or verdict.what == "rejected-valid-layout" \
            or verdict.what.startswith("peers-"):
        return (True, None, None)
    return (False, verdict.check, verdict.message)


def stale_reason(contract: Any, case: Any, kind: str, verdict: Any) -> str | None:
    """Why the file's recorded expectation is not what ``contract`` prescribes now."""
    rec = recorded_expectation(kind, verdict)
    if rec is None:
        return None
    exp = expectation(contract, case)
    accepts, check, message = rec
    if accepts:
        return None if exp.ok else ("recorded as a valid layout; the contract now: it "
                                    + exp.describe())
    if exp.ok:
        return ("recorded as a broken layout"
                + (f" (check {check})" if check is not None else "")
                + "; the contract now accepts it")
    if verdict is None:
        return None
    if (check, message) != (exp.check, exp.message):
        was = (f"check {check}: {message}" if check is not None
               else "any ValueError (a contract hole)")
        return f"recorded: raises {was}; the contract now: it {exp.describe()}"
    return None


def _classify(path: Path, in_out: bool, result: MergeResult) -> Entry | None:
    try:
        case, verdict, meta = load_case(path)
        contract = get_contract(case.contract)
        reason = stale_reason(contract, case, meta["kind"], verdict)
    except CorpusError as e:
        result.bad.append({"path": str(path), "reason": e.reason})
        return None
    except Exception as e:  # the contract cannot even say what it expects of the case
        result.bad.append({"path": str(path), "reason": f"{type(e).__name__}: {e}"})
        return None
    if reason is not None:
        result.stale.append({"path": str(path), "reason": reason})
        return None
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


def add_parser(sub: Any) -> None:
    """The ``merge`` subcommand of ``kda-fuzz``."""
    m = sub.add_parser("merge", help="merge corpus folders of many runners into one, one "
                                     "file per distinct failure")
    m.add_argument("out", metavar="OUT_DIR",
                   help="the merged corpus (created if missing; its files take part)")
    m.add_argument("inputs", nargs="+", metavar="IN_DIR",
                   help="corpus folders (or files) to merge in")
    m.add_argument("--json", action="store_true",
                   help="print one JSON summary object as the last line of stdout")


def merge_command(args: argparse.Namespace) -> int:
    """``kda-fuzz merge``: 0 when merged, 2 on usage errors (a missing input, an
    ``OUT_DIR`` that is a file)."""
    try:
        result = merge(args.out, args.inputs)
    except (FileNotFoundError, NotADirectoryError) as e:
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
        return EXIT_OK
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
    return EXIT_OK
