"""A shared example database: failures found on one machine replayed first everywhere.

``--example-db URL`` (or ``example_db`` in ``[tool.kda-fuzz]``) names one of Hypothesis'
own example databases: ``redis://host:port/db`` (``rediss://``, ``unix://`` too) is a
:class:`hypothesis.extra.redis.RedisExampleDatabase` (the ``redis`` package: ``pip
install 'kda-fuzz[redis]'``), anything else a folder holding a
:class:`hypothesis.database.DirectoryBasedExampleDatabase`.

What a campaign stores. Every distinct failure a run finds is saved, after minimization,
under one key per campaign :func:`campaign_key` (contract family, variant and target
names: nothing of the process, the machine, the seed or the shard), as the text of its
corpus file (:mod:`kda_fuzz.corpus.store`). Hypothesis stores choice sequences instead, which
rebuild a case only through the very strategy that drew them; a campaign's strategies
depend on the seed (compile families), the shard, the device and sizes calibrated on
each machine, so a choice sequence found on one runner would draw another case on the
next. A corpus document is the case itself, bit for bit, and is checked by the corpus
loader's rules on the way back (a shared database is input like any corpus file).

What a run does with them. Before its first example, every run (every shard, every job
count) replays every entry stored under its key on its targets, smallest first, exactly
as ``kda-fuzz replay`` replays a corpus file (isolated in a worker process unless
``--no-isolate``). A failure that comes back is recorded first in the report, marked
``replayed from the example database``, saved to the corpus and counted by the campaign
that follows (its repeats add to it; it is not minimized again). The database is kept the
way Hypothesis keeps its own (:meth:`ExampleDatabase.fetch`/``save``/``move``): an entry
that now passes, or repeats a failure a smaller entry already showed, moves to the
secondary key (``KEY.secondary``, not replayed); one that cannot be read is deleted. An
entry that cannot be judged here (``skip``: out of memory) stays.

The pytest plugin's option ``--kda-example-db`` (or the same key) gives the session's
Hypothesis settings this database: property-based tests then save and replay their
failing examples through it natively (Hypothesis' reuse phase).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from kda_fuzz.campaign.results import Failure, Report
from kda_fuzz.corpus.replay import load_entry, replay, replay_entry
from kda_fuzz.corpus.store import CaseTooLarge, CorpusError, encode_entry
from kda_fuzz.engine.oracle import Outcome
from kda_fuzz.engine.targets import Target
from kda_fuzz.workers.deadline import PastDeadline
from kda_fuzz.workers.isolate import IsolatedTarget

REPLAYED_NOTE = "replayed from the example database"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class ExampleDbError(Exception):
    """An example database that cannot be opened or reached (a usage error)."""


def resolve(url: str, root: Path | None = None) -> str:
    """``url`` with a relative folder made absolute against ``root`` (a project's
    ``pyproject.toml`` folder); URLs are returned as given."""
    if url.startswith(REDIS_SCHEMES) or root is None:
        return url
    path = Path(url.removeprefix("file://")).expanduser()
    return str(path if path.is_absolute() else (root / path).resolve())


def open_database(url: str) -> ExampleDatabase:
    """The Hypothesis example database that ``url`` names (see the module docstring);
    a Redis server is pinged first, so an unreachable one fails here, not mid-campaign."""
    if not url.strip():
        raise ExampleDbError("--example-db must be a redis:// URL or a folder, not ''")
    if url.startswith(REDIS_SCHEMES):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise ExampleDbError(f"--example-db {url}: a Redis database needs the redis "
                                 "package (pip install 'kda-fuzz[redis]')") from None
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=10, socket_timeout=60)
            client.ping()
        except (redis.RedisError, ValueError) as e:
            raise ExampleDbError(f"--example-db {url}: cannot reach the Redis server: "
                                 f"{' '.join(str(e).split())}") from None
        return RedisExampleDatabase(client)
    path = Path(url.removeprefix("file://")).expanduser()
    if path.exists() and not path.is_dir():
        raise ExampleDbError(f"--example-db {url}: not a folder")
    return DirectoryBasedExampleDatabase(str(path))


def campaign_key(family: str, variant: str, targets: Sequence[str]) -> bytes:
    """The key a campaign's failures are stored under: the same for every shard, job,
    seed and machine fuzzing these targets on this contract variant."""
    return f"kda-fuzz:{family}:{variant}:{'+'.join(sorted(targets))}".encode()


def secondary(key: bytes) -> bytes:
    """Where entries that no longer fail go (Hypothesis' naming)."""
    return key + b".secondary"


@dataclass
class Replay:
    """What replaying a database's entries found."""

    url: str
    key: bytes
    entries: int = 0
    failures: list[Failure] = field(default_factory=list)
    passed: int = 0  # now passing: moved to the secondary key
    duplicates: int = 0  # the same failure as a smaller entry: moved too
    bad: list[str] = field(default_factory=list)  # unreadable: deleted
    stale: list[str] = field(default_factory=list)  # stale or unjudgeable: moved
    kept: int = 0  # not judgeable here (skip): left in place
    unreplayed: int = 0  # not replayed by the deadline: left in place
    saved: int = 0  # new failures of this run stored afterwards

    def to_json(self) -> dict[str, Any]:
        return {"url": redact(self.url), "key": self.key.decode(), "entries": self.entries,
                "replayed_failures": len(self.failures), "now_passing": self.passed,
                "duplicates": self.duplicates, "bad": len(self.bad), "stale": len(self.stale),
                "saved": self.saved}

    def note(self) -> str:
        parts = [f"{len(self.failures)} still fail"]
        if self.passed:
            parts.append(f"{self.passed} now pass")
        if self.duplicates:
            parts.append(f"{self.duplicates} repeat a smaller entry")
        if self.bad:
            parts.append(f"{len(self.bad)} unreadable, deleted")
        if self.stale:
            parts.append(f"{len(self.stale)} stale or not judgeable, moved aside")
        if self.unreplayed:
            parts.append(f"{self.unreplayed} not replayed by the --max-seconds deadline, "
                         "kept")
        return (f"example database {redact(self.url)}: replayed {self.entries} stored "
                f"failing example(s) first ({', '.join(parts)}); {self.saved} new failure(s) "
                "stored")


def redact(url: str) -> str:
    """``url`` without a password (``redis://user:secret@host`` -> ``redis://user:***@host``)."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def _stored(db: ExampleDatabase, key: bytes) -> list[bytes]:
    return sorted(set(db.fetch(key)), key=lambda v: (len(v), v))


def replay_stored(db: ExampleDatabase, url: str, key: bytes, contract: Any, variant: str,
                  targets: Sequence[Target], *, device: str = "cpu", isolate: bool = True,
                  timeout: float = 60.0, messages: str = "exact",
                  strict: bool = False, deadline: float | None = None) -> Replay:
    """Replay every entry stored under ``key`` on ``targets`` (through
    :func:`kda_fuzz.corpus.replay.replay`, each target's worker kept for all entries); the
    failures that come back, one per distinct failure (the smallest entry showing it), in
    :class:`Replay`. Isolated, the replay ends by ``deadline`` (``time.monotonic()``):
    entries not replayed by then stay as they are (``Replay.unreplayed``)."""
    out = Replay(url, key)
    loaded = []
    for value in _stored(db, key):
        out.entries += 1
        try:
            entry = load_entry(value, f"{key.decode()}#{out.entries}")
            if (entry.case.contract, entry.case.variant) != (contract.name, variant):
                raise CorpusError(entry.name, f"an entry of {entry.case.contract}/"
                                              f"{entry.case.variant}")
        except CorpusError as e:
            out.bad.append(e.reason)
            db.delete(key, value)
            continue
        loaded.append((value, entry))
    if not loaded:
        return out
    with ExitStack() as stack:
        workers = {t.name: stack.enter_context(IsolatedTarget(
            contract, t.name, timeout=timeout, device=device, messages=messages,
            strict=strict, deadline=deadline)) for t in targets} if isolate else {}

        def run(contract: Any, case: Any, kind: str, chosen: Sequence[Target]
                ) -> list[tuple[str, Outcome]]:
            try:  # by its kind; isolated: in the workers kept for all entries
                return replay_entry(contract, case, kind, chosen, device=device,
                                    timeout=timeout, messages=messages,  # type: ignore[arg-type]
                                    strict=strict, workers=workers)
            except PastDeadline:
                raise _OutOfTime from None  # (past replay's own error handling)

        records = []
        for i, (value, entry) in enumerate(loaded):
            try:
                records.append((value, replay(entry, targets, run=run)))
            except _OutOfTime:
                out.unreplayed = len(loaded) - i
                break
    seen: dict[tuple[Any, ...], Failure] = {}
    for value, rec in records:
        if rec.status in ("STALE", "ERROR"):  # the contract changed since; or unjudgeable
            out.stale.append(f"{rec.path}: {rec.reason}")
            db.move(key, secondary(key), value)
            continue
        assert rec.entry is not None
        fails = [r for r in rec.results if r.outcome.status == "fail"]
        new = False
        for r in fails:
            f = Failure(rec.entry.case, r.outcome.verdict, r.target, note=REPLAYED_NOTE)
            if f.signature in seen:
                seen[f.signature].count += 1
                continue
            seen[f.signature] = f
            out.failures.append(f)
            new = True
        if fails and not new:
            out.duplicates += 1
            db.move(key, secondary(key), value)
        elif not fails and any(r.outcome.status == "skip" for r in rec.results):
            out.kept += 1
        elif not fails:
            out.passed += 1
            db.move(key, secondary(key), value)
    return out


class _OutOfTime(BaseException):
    """The deadline came before an entry's replay ended (never the entry's verdict)."""


def merge_replayed(report: Report, replayed: list[Failure]) -> list[Failure]:
    """Put the replayed failures first in ``report``; a failure the campaign found again
    adds its count to the replayed one. Returns the campaign's new distinct failures."""
    by_sig = {f.signature: f for f in replayed}
    new = []
    for f in report.failures:
        r = by_sig.get(f.signature)
        if r is not None:
            r.count += f.count
        else:
            new.append(f)
    report.failures = [*replayed, *new]
    return new


def save_failures(db: ExampleDatabase, key: bytes, failures: Sequence[Failure], *,
                  seed: int | None, shard: str | None = None) -> int:
    """Store each failure's case (its corpus document) under ``key``; returns how many
    were stored (a case over the corpus size cap is not)."""
    n = 0
    for f in failures:
        origin = {"target": f.target, "seed": seed, "tool": "kda-fuzz fuzz",
                  **({"shard": shard} if shard else {})}
        try:
            _, text = encode_entry(f.case, f.verdict, origin=origin,
                                   description=f"{f.verdict.kind}/{f.verdict.what} on "
                                               f"{f.target}")
        except CaseTooLarge as e:
            print(f"kda-fuzz: not stored in the example database: {e}", file=sys.stderr)
            continue
        db.save(key, text.encode("utf-8"))
        n += 1
    return n
