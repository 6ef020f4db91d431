"""The one replay path: a corpus entry replayed against a target choice, as a typed record;
an entry run by its kind (:func:`replay_entry`), the one stale rule (:func:`stale_reason`)
and the command line that replays a file (:func:`replay_command_line`).

``kda-fuzz replay``, the pytest corpus items, ``kda-fuzz merge`` (its stale rule) and the
example database all go through :func:`replay`; they differ only in how they format its
:class:`ReplayRecord` and in which targets they choose (:func:`kda_fuzz.config.choose_targets`).

An entry is replayed under its own contract family and variant unless the caller names
others: a family that differs is an error (the case cannot be called with another
family's arguments); a variant that differs judges the case under it (the variant
describes the targets), and the stale rule then does not apply. An entry is stale when
what the contract prescribes for its case now differs from what the entry recorded
(:func:`stale_reason`): nothing is run then.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kda_fuzz.corpus.store import CorpusError, _jsonable, corpus_files, load_case, parse_case
from kda_fuzz.engine.case import Case
from kda_fuzz.engine.contract import Contract, Expectation
from kda_fuzz.engine.oracle import EnvironmentFailure, Messages, Outcome, expectation, run_case
from kda_fuzz.engine.targets import Target, TargetChoice, TargetError, load_target, recorded_targets
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import BUILTIN, get_contract
from kda_fuzz.names import SOLE_VARIANT, label
from kda_fuzz.workers.isolate import IsolatedTarget

Status = Literal["PASS", "FAIL", "STALE", "ERROR", "READY", "SKIP"]
#: how an entry's case is run: (contract, case, kind, targets) -> (target name, outcome)
Runner = Callable[[Contract, Case, str, Sequence[Target]], list[tuple[str, Outcome]]]
#: the targets of a family and variant: a choice of specs (loaded here) or loaded targets
Chooser = Callable[[str, str], "TargetChoice | Sequence[Target]"]


FLAKY_RUNS = 5
HARD_TIMEOUT = 60.0  # seconds a worker's target may run before it counts as hung
HARD_KINDS = ("crash", "timeout", "flaky")  # entries always run in a worker process


# ------------------------------------------------------------------ running an entry


def passed(outcome: Outcome) -> bool:
    """A corpus entry passes when the target does what the contract prescribes."""
    return outcome.status in ("pass", "gap", "skip")


def replay_entry(contract: Contract, case: Case, kind: str, targets: Sequence[Target], *,
                 device: str = "cpu", timeout: float = HARD_TIMEOUT,
                 messages: Messages = "exact", strict: bool = False,
                 workers: Mapping[str, IsolatedTarget] | None = None
                 ) -> list[tuple[str, Outcome]]:
    """Run one corpus entry's case on each target the way its kind needs: (target name,
    outcome) per target.

    ``crash-`` and ``timeout-`` entries run each target in a worker process, so one that
    still aborts or hangs fails the entry and the session goes on; ``flaky-`` entries run
    ``FLAKY_RUNS`` times, isolated, and pass only when every run passes (a call past
    ``timeout`` seconds is a hang); the others run in this process (``case`` moved to
    ``device``). ``workers``: open workers by target name, kept by the caller across
    entries; a target that has one runs there whatever the kind."""
    out = []
    here: Case | None = None  # the case on ``device``, for the targets run in this process
    for t in targets:
        iso = workers.get(t.name) if workers is not None else None
        if iso is None and kind not in HARD_KINDS:
            here = here or (case if device == "cpu" else case.on(device))
            out.append((t.name, run_case(contract, here, t.fn, messages=messages,
                                         strict=strict)))
            continue
        with (contextlib.nullcontext(iso) if iso is not None else IsolatedTarget(
                contract, t.name, timeout=timeout, device=device, messages=messages,
                strict=strict)) as worker:
            outcome = worker.run(case)
            for _ in range(FLAKY_RUNS - 1 if kind == "flaky" else 0):
                if not passed(outcome):
                    break
                outcome = worker.run(case)
        out.append((t.name, outcome))
    return out


def stale_reason(contract: Contract, case: Case, recorded: Expectation | None) -> str | None:
    """The one stale rule: why a corpus entry is stale, i.e. the outcome the current
    contract prescribes for its case differs from the one recorded when it was saved (a
    check added, relaxed, renumbered or reworded); None when they agree or nothing was
    recorded. A recorded rejection with neither check nor hole (a hand-made file) only
    asks that the contract still rejects the layout."""
    if recorded is None:
        return None
    now = expectation(contract, case)
    if now.ok == recorded.ok:
        if now.ok or (recorded.check is None and recorded.message is None
                      and recorded.hole is None):
            return None
        if (now.check, now.message) == (recorded.check, recorded.message) \
                and (now.hole is None) == (recorded.hole is None):
            return None
    if recorded.ok:
        was = "recorded as a valid layout; the contract now: it " + now.describe()
    elif now.ok:
        was = ("recorded as a broken layout"
               + (f" (check {recorded.check})" if recorded.check is not None else "")
               + "; the contract now accepts it")
    else:
        said = (f"check {recorded.check}: {recorded.message}" if recorded.message is not None
                else "any ValueError (a contract hole)")
        was = f"recorded: raises {said}; the contract now: it {now.describe()}"
    return (f"stale corpus entry: {was} (the current {contract.name} contract; re-record "
            "the case or delete the file)")


def replay_command_line(target: str, path: str | os.PathLike[str], *, variant: str | None = None,
                        device: str = "cpu", timeout: float = HARD_TIMEOUT,
                        family: str | None = None) -> str:
    """The ``kda-fuzz replay`` command that runs ``path`` against ``target`` as it ran
    (its family when not the default one; its device; its timeout when not the default)."""
    words = ["kda-fuzz replay --target", shlex.quote(target)]
    if family and family != BUILTIN[0]:  # the first built-in family: the default
        words += ["--family", shlex.quote(family)]
    if variant and variant != SOLE_VARIANT:  # (replay takes the file's own variant)
        words += ["--contract", variant]
    if device != "cpu":
        words += ["--device", device]
    if timeout != HARD_TIMEOUT:
        words += ["--timeout", f"{timeout:g}"]
    return " ".join([*words, shlex.quote(str(path))])


# ------------------------------------------------------------------ replaying a file


@dataclass(frozen=True)
class Entry:
    """A loaded corpus entry: ``name`` is its path (or a database entry's name)."""

    name: str
    case: Case
    verdict: Verdict | None
    meta: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.meta["kind"])


def load_entry(source: str | os.PathLike[str] | bytes, name: str | None = None) -> Entry:
    """A corpus file (a path), or a corpus document held in memory (``bytes``, named
    ``name``); raises :class:`~kda_fuzz.corpus.store.CorpusError` for a bad one."""
    if isinstance(source, bytes):
        label = name or "<entry>"
        case, verdict, meta = parse_case(source, label)
        return Entry(label, case, verdict, meta)
    case, verdict, meta = load_case(source)
    return Entry(str(source), case, verdict, meta)


@dataclass(frozen=True)
class TargetResult:
    """One target's outcome on a replayed entry."""

    target: str
    outcome: Outcome
    same_as_recorded: bool = False

    @property
    def failed(self) -> bool:
        return not passed(self.outcome)

    def summary(self) -> str:
        """``[kind] what: detail`` of the failure (the whole detail), or the status."""
        v = self.outcome.verdict
        return v.summary() if v is not None else self.outcome.status

    def to_json(self) -> dict[str, Any]:
        r: dict[str, Any] = {"target": self.target, "status": self.outcome.status}
        if self.outcome.verdict is not None:
            r["verdict"] = _jsonable(self.outcome.verdict.to_json())
            r["same_as_recorded"] = self.same_as_recorded
        if self.outcome.note:
            r["note"] = self.outcome.note
        return r


@dataclass
class ReplayRecord:
    """What replaying one entry found.

    ``status``: READY (loaded, not stale, nothing run yet: :func:`check_entry`), PASS
    (every target does what the contract prescribes), FAIL, STALE (``reason`` says how
    the contract changed; nothing was run) or ERROR (``reason``: a bad file, another
    family, targets that cannot be loaded or none chosen (``choice`` with no specs), or
    the oracle's own failure)."""

    path: str
    status: Status
    entry: Entry | None = None
    variant: str | None = None
    results: list[TargetResult] = field(default_factory=list)
    reason: str = ""
    note: str = ""  # recorded against another target than those replayed
    choice: TargetChoice | None = None

    @property
    def failures(self) -> list[TargetResult]:
        return [r for r in self.results if r.failed]

    @property
    def family(self) -> str | None:
        return self.entry.case.contract if self.entry else None

    @property
    def file_variant(self) -> str | None:
        return self.entry.case.variant if self.entry else None

    def failure_line(self, width: int | None = None) -> str:
        """``target: [kind] what: detail (same failure as recorded)`` per failing target,
        joined; ``width`` cuts each detail at a word boundary (``None``: whole)."""
        parts = []
        for r in self.failures:
            text = r.summary() if width is None else shorten(r.summary(), width)
            parts.append(f"{r.target}: {text}"
                         + (" (same failure as recorded)" if r.same_as_recorded else ""))
        return "; ".join(parts)

    def headline(self) -> str:
        """The failure in a few words: ``kind/what on target`` for each failing target."""
        return "; ".join(
            f"{r.outcome.verdict.kind}/{r.outcome.verdict.what} on {r.target}"
            if r.outcome.verdict is not None else f"{r.outcome.status} on {r.target}"
            for r in self.failures)

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"path": self.path, "status": self.status,
                               "results": [r.to_json() for r in self.results]}
        if self.entry is not None:
            rec.update(kind=self.entry.kind, description=self.entry.meta["description"],
                       family=self.family, file_variant=self.file_variant)
        if self.variant is not None:
            rec["variant"] = self.variant
        if self.status == "ERROR":
            rec["error"] = self.reason
        elif self.status in ("FAIL", "STALE"):
            rec["reason"] = self.reason if self.status == "STALE" else self.failure_line()
        if self.note:
            rec["note"] = self.note
        if self.choice is not None:
            rec["targets_from"] = self.choice.source
        return rec


def shorten(text: str, width: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``width`` characters."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 4].rsplit(" ", 1)[0]
    return cut + " ..."


def check_entry(entry: Entry | str | os.PathLike[str], *, family: str | None = None,
                variant: str | None = None) -> ReplayRecord:
    """The first stage of :func:`replay`, nothing run: ERROR (a bad file, another family),
    STALE (the one stale rule, when judged under the entry's own variant) or READY."""
    if not isinstance(entry, Entry):
        try:
            entry = load_entry(entry)
        except CorpusError as e:
            return ReplayRecord(str(e.path), "ERROR", reason=e.reason)
    rec = ReplayRecord(entry.name, "ERROR", entry)
    case = entry.case
    if family is not None and family != case.contract:
        rec.reason = (f"file is for contract family {case.contract!r}, replaying "
                      f"{family!r}")
        return rec
    try:
        contract = get_contract(case.contract)
    except ValueError as e:
        rec.reason = str(e)
        return rec
    rec.variant = variant or case.variant
    if rec.variant == case.variant:
        try:
            stale = stale_reason(contract, case, entry.meta["expected"])
        except Exception as e:  # the contract cannot even say what it expects of the case
            rec.reason = f"{type(e).__name__}: {e}"
            return rec
        if stale is not None:
            rec.status, rec.reason = "STALE", stale
            return rec
    rec.status = "READY"
    return rec


def sanitizer_tool(entry: Entry, sanitize: str | None = None) -> str | None:
    """The compute-sanitizer tool an entry is replayed under: ``sanitize``, else the one a
    ``sanitizer-`` file was found with."""
    if sanitize is not None:
        return sanitize
    if entry.kind == "sanitizer" and entry.verdict is not None:
        return entry.verdict.tool or "memcheck"
    return None


def _sanitized(tool: str, case: Case, outcomes: list[tuple[str, Outcome]], device: str,
               timeout: float, required: bool) -> list[tuple[str, Outcome]]:
    """Each passing target's outcome, also judged by ``tool``'s report; ``required`` (a
    ``sanitizer-`` file): where the tool cannot run, raise :class:`NotRunHere`."""
    from kda_fuzz.workers.sanitize import sanitize

    if not device.startswith("cuda"):
        if required:
            raise NotRunHere(f"needs --device cuda and compute-sanitizer ({tool})")
        raise EnvironmentFailure(f"--sanitize {tool} needs --device cuda")
    out = []
    for name, outcome in outcomes:
        if passed(outcome):
            report = sanitize(tool, name, [case], device=device, timeout=timeout)[0]
            if report.status == "failed":
                raise NotRunHere(f"the sanitized run failed: {report.note}")
            verdict = report.verdict()
            if verdict is not None:
                outcome = Outcome("fail", outcome.expectation, verdict)
        out.append((name, outcome))
    return out


class NotRunHere(EnvironmentFailure):
    """An entry that cannot be replayed in this environment (a ``sanitizer-`` file without
    a GPU or compute-sanitizer): skipped, never a verdict."""


def replay(entry: Entry | str | os.PathLike[str],
           targets: Sequence[Target] | Chooser | None = None, *,
           family: str | None = None, variant: str | None = None, device: str = "cpu",
           timeout: float = HARD_TIMEOUT, run: Runner | None = None,
           sanitize: str | None = None) -> ReplayRecord:
    """Replay ``entry`` (a corpus file's path or a loaded :class:`Entry`).

    ``targets``: loaded targets, or a function of the entry's family and variant giving
    a :class:`~kda_fuzz.engine.targets.TargetChoice` (its specs are loaded here) or targets, or
    ``None`` for the contract's own kernels. ``family``/``variant``: replay under these
    rather than the entry's own. ``run``: how the case is run (default: by its kind,
    :func:`replay_entry`). ``sanitize``: also run each passing
    target under this compute-sanitizer tool (``sanitizer-`` files always run under theirs;
    where they cannot, the record is SKIP with the reason)."""
    rec = check_entry(entry, family=family, variant=variant)
    if rec.status != "READY":
        return rec
    assert rec.entry is not None and rec.variant is not None
    entry, use = rec.entry, rec.variant
    rec.status = "ERROR"
    contract = get_contract(entry.case.contract)
    case = entry.case if use == entry.case.variant else Case(
        entry.case.contract, use, entry.case.tensors, entry.case.scalars, entry.case.intent,
        entry.case.notes)
    picked: Any = (TargetChoice(tuple(contract.default_targets.get(use, ())), "default")
                   if targets is None else targets(case.contract, use) if callable(targets)
                   else list(targets))
    rec.choice = picked if isinstance(picked, TargetChoice) else None
    try:
        chosen = ([load_target(s) for s in picked.specs] if rec.choice is not None
                  else list(picked))
    except TargetError as e:
        rec.reason = f"cannot load the targets: {e}"
        return rec
    if not chosen:
        rec.reason = "no replay target for the " + (
            f"{case.contract} family" if use == SOLE_VARIANT else f"{case.contract}/{use} variant")
        return rec
    recorded = recorded_targets(entry.meta.get("origin"))
    if recorded and not any(t.name in recorded for t in chosen):
        rec.note = (f"recorded on {' vs '.join(recorded)}, replayed against "
                    f"{', '.join(t.name for t in chosen)}")
    try:
        if run is None:
            outcomes = replay_entry(contract, case, entry.kind, chosen, device=device,
                                    timeout=timeout)
        else:
            outcomes = run(contract, case, entry.kind, chosen)
        tool = sanitizer_tool(entry, sanitize)
        if tool is not None:
            outcomes = _sanitized(tool, case, outcomes, device, timeout,
                                  required=entry.kind == "sanitizer")
    except NotRunHere as e:
        rec.status, rec.reason = "SKIP", str(e)
        return rec
    except EnvironmentFailure:  # the machinery's, not the entry's: the caller's to report
        raise
    except Exception as e:  # the oracle itself failed on this entry
        rec.reason = f"oracle error: {type(e).__name__}: {e}"
        return rec
    rec.results = [TargetResult(name, o, bool(entry.verdict is not None and o.verdict is not None
                                              and entry.verdict.same_failure(o.verdict)))
                   for name, o in outcomes]
    rec.status = "FAIL" if rec.failures else "PASS"
    return rec


DETAIL_WIDTH = 240  # characters of a failure's detail ``kda-fuzz replay`` prints per target


def replay_paths(paths: Sequence[str], targets: Sequence[Target] | Chooser | None = None,
                   *, family: str | None = None, variant: str | None = None,
                   device: str = "cpu", as_json: bool = False, timeout: float = HARD_TIMEOUT,
                   verbose: bool = False, sanitize: str | None = None) -> int:
    """``kda-fuzz replay``: 0 when every file passes (or is skipped: not replayable here,
    while others ran), 1 on any failure, stale or bad file, 2 on usage errors (a path that
    does not exist, no corpus file found) and when no file could run here. Details are cut
    at a word boundary unless ``verbose``."""
    try:
        files = corpus_files(paths)
    except FileNotFoundError as e:
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return 2
    if not files:
        print(f"kda-fuzz: error: no *.json corpus file under {', '.join(map(str, paths))}",
              file=sys.stderr)
        return 2
    records = []
    width = None if verbose else DETAIL_WIDTH
    for path in files:
        rec = replay(path, targets, family=family, variant=variant, device=device,
                     timeout=timeout, sanitize=sanitize)
        records.append(rec)
        if rec.entry is not None and rec.variant not in (None, rec.file_variant):
            print(f"note: {path} was recorded for the {rec.file_variant} variant; judging it "
                  f"under {rec.variant} (--contract)", file=sys.stderr)
        if as_json:
            continue
        if rec.status == "PASS":
            names = ", ".join(r.target for r in rec.results)
            extra = "; ".join(f"{r.target}: {r.outcome.status}" for r in rec.results
                              if r.outcome.status != "pass")
            print(f"PASS  {path}  [{label(rec.family, rec.variant)}; {names}]"
                  + (f" ({extra})" if extra else "")
                  + (f"\n      note: {rec.note}" if rec.note else ""))
        elif rec.status == "FAIL":
            line = rec.failure_line(width)
            print(f"FAIL  {path}  [{label(rec.family, rec.variant)}] {line}"
                  + (f"\n      note: {rec.note}" if rec.note else ""))
        else:
            print(f"{rec.status:<5} {path}  {rec.reason}")
    cut = not verbose and any(rec.failure_line() != rec.failure_line(width) for rec in records)
    counts = {s: sum(r.status == s for r in records)
              for s in ("PASS", "FAIL", "STALE", "ERROR", "SKIP")}
    code = (0 if counts["PASS"] + counts["SKIP"] == len(records) else 1) \
        if counts["SKIP"] < len(records) else 2
    if as_json:
        print(json.dumps({"files": [r.to_json() for r in records], "passed": counts["PASS"],
                          "failed": counts["FAIL"], "stale": counts["STALE"],
                          "errors": counts["ERROR"], "skipped": counts["SKIP"],
                          "device": device, "exit_code": code},
                         sort_keys=True, allow_nan=False))
    else:
        stale = f", {counts['STALE']} stale" if counts["STALE"] else ""
        stale += (f", {counts['SKIP']} not replayable here (skipped)" if counts["SKIP"]
                  else "")
        print(f"replayed {len(records)} file(s): {counts['PASS']} passed, {counts['FAIL']} "
              f"failed{stale}, {counts['ERROR']} bad"
              + ("; details cut at a word boundary: --verbose shows them whole" if cut else ""))
    return code


def replay_command(contract: Contract | None, variant: str | None,
                   targets: Sequence[Target] | Callable[[str], Sequence[Target]] | None,
                   paths: Sequence[str], *, device: str = "cpu", as_json: bool = False,
                   timeout: float = HARD_TIMEOUT) -> int:
    """:func:`replay_paths` under the signature ``kda_fuzz.corpus.store.replay_command`` had:
    ``contract`` ``None`` replays each file under its own family; ``targets`` a function
    of the variant, loaded targets, or ``None`` (the contract's own kernels)."""
    chooser: Any = (lambda _family, v: targets(v)) if callable(targets) else targets
    return replay_paths(paths, chooser, family=contract.name if contract is not None else None,
                        variant=variant, device=device, as_json=as_json, timeout=timeout)
