"""Campaign progress and summaries: a rich bar on a terminal, plain status lines off one."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from kda_fuzz.corpus.replay import replay_command_line
from kda_fuzz.corpus.store import SEEN_AGAIN
from kda_fuzz.families import get_contract
from kda_fuzz.names import label as family_label

STATUS_INTERVAL = 5.0  # seconds between plain status lines off a terminal


class Progress:
    """Progress of a campaign's examples on stderr: a bar on a terminal; off one (CI logs,
    pipes), a plain one-line status every ``interval`` seconds and one at the end. Each
    new finding gets a line when it is confirmed and one when it is saved (``found``,
    ``saved``; also with the display disabled: stderr only). ``clock``: the ``--max-seconds``
    :class:`~kda_fuzz.workers.deadline.Deadline` of a campaign whose plan of ``total``
    examples repeats until the time is up: the bar shows the command's time, the lines
    the examples run, without a total."""

    def __init__(self, total: int, enabled: bool = True,
                 interval: float = STATUS_INTERVAL, clock: Any = None) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.plain = enabled and not self.console.is_terminal
        self.interval = interval
        self._bar: RichProgress | None = None
        self._task: Any = None
        self.total = total
        self.clock = clock
        self._t0 = time.monotonic()
        self._next = self._t0 + interval
        self._last: Any = None
        self._lock = threading.Lock()  # findings are announced from minimizing threads
        self._numbers: dict[int, int] = {}  # id(failure) -> its number in this campaign

    def __enter__(self) -> Progress:
        self._t0 = time.monotonic()
        self._next = self._t0 + self.interval
        if self.enabled and not self.plain:
            count = (MofNCompleteColumn() if self.clock is None
                     else TextColumn("{task.fields[examples]} examples"))
            clock = (TimeElapsedColumn() if self.clock is None
                     else TextColumn(f"{{task.fields[spent]}} of {self.clock.seconds:g} s"))
            self._bar = RichProgress(
                TextColumn("[bold]fuzz[/]"), BarColumn(), count,
                TextColumn("{task.fields[stats]}"), clock,
                console=self.console, transient=True,
            )
            self._bar.__enter__()
            total = self.total if self.clock is None else self.clock.seconds
            self._task = self._bar.add_task("fuzz", total=total,
                                            stats="", examples=0, spent=0)
        return self

    def update(self, report: Any) -> None:
        self._last = report
        if self._bar is not None:
            failures = len(getattr(report, "failures", ()))
            stats = (f"valid {report.valid_cases} · broken {report.broken_cases} · "
                     f"checks {len(report.checks_hit)} · "
                     + (f"[bold red]failures {failures}[/]" if failures else "failures 0"))
            done = (report.examples if self.clock is None
                    else min(self.clock.seconds, self._spent()))
            self._bar.update(self._task, completed=done, stats=stats, examples=report.examples,
                             spent=f"{done:.0f}")
        elif self.plain and time.monotonic() >= self._next:
            self._next = time.monotonic() + self.interval
            self._status()

    def status_line(self, report: Any) -> str:
        """``kda-fuzz: 120/300 examples, valid 60 / broken 60, failures 0, 2.4/s, 50 s``
        (bound by ``--max-seconds``: ``120 examples, ..., 50 of 600 s``)."""
        elapsed = time.monotonic() - self._t0
        failures = getattr(report, "failures", None)
        timed = self.clock is not None
        count = f"{report.examples}" if timed else f"{report.examples}/{self.total}"
        return (f"kda-fuzz: {count} examples, valid "
                f"{report.valid_cases} / broken {report.broken_cases}"
                + (f", failures {len(failures)}" if failures is not None else "")
                + f", {report.examples / max(elapsed, 1e-9):.1f}/s, "
                + (f"{self._spent():.0f} of {self.clock.seconds:g} s" if timed
                   else f"{elapsed:.0f} s"))

    def _spent(self) -> float:
        """Seconds of the ``--max-seconds`` clock gone (from the process's start)."""
        return time.monotonic() - self.clock.started

    def found(self, failure: Any) -> None:
        """``kda-fuzz: failure 2 confirmed: mismatch/out-value on T (minimizing)``."""
        with self._lock:
            n = self._numbers.setdefault(id(failure), len(self._numbers) + 1)
        self._line(f"kda-fuzz: failure {n} confirmed: {failure.verdict.kind}/"
                   f"{failure.verdict.what} on {failure.target} (minimizing, then saving)")

    def saved(self, failure: Any) -> None:
        """``kda-fuzz: failure 2 saved: PATH`` (with its note: not minimized, not saved)."""
        with self._lock:
            n = self._numbers.setdefault(id(failure), len(self._numbers) + 1)
        what = f"{failure.verdict.kind}/{failure.verdict.what} on {failure.target}"
        note = f" ({failure.note})" if getattr(failure, "note", "") else ""
        if failure.saved and str(getattr(failure, "note", "")).startswith(SEEN_AGAIN):
            self._line(f"kda-fuzz: failure {n} known: {failure.saved}: {what}{note}")
        elif failure.saved:
            self._line(f"kda-fuzz: failure {n} saved: {failure.saved}: {what}{note}")
        else:
            self._line(f"kda-fuzz: failure {n} not saved: {what}{note}")

    def _line(self, text: str) -> None:
        with self._lock:
            if self._bar is not None:  # printed above the live bar
                self.console.print(escape(text), highlight=False, soft_wrap=True)
            else:
                print(text, file=sys.stderr, flush=True)

    def _status(self) -> None:
        print(self.status_line(self._last), file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self.plain and self._last is not None:
            self._status()


def contract_of(report: Any) -> Any:
    """The report's contract (the one it was made with, else the family registered under
    its name); ``ValueError`` when none is known."""
    hooks = getattr(report, "contract_hooks", None)
    contract = hooks() if hooks is not None else get_contract(report.contract)
    if contract is None:
        raise ValueError(f"unknown contract family {report.contract!r}")
    return contract


def check_counts(report: Any) -> list[tuple[str, int]]:
    """Every check of the report's variant in numeric order, then the contract's holes
    (``hole:NAME``), each with its count (0: never hit); keys the contract does not know
    come last."""
    counts = dict(report.checks_hit)
    try:
        contract = contract_of(report)
        keys: list[Any] = [c.number for c in contract.checks_for(report.variant)]
        keys += [f"hole:{h.name}" for h in contract.holes]
    except ValueError:  # unknown family or variant: show what was counted
        keys = []
    keys += sorted((k for k in counts if k not in keys),
                   key=lambda k: (isinstance(k, str), k if isinstance(k, int) else 0, str(k)))
    return [(str(k), int(counts.get(k, 0))) for k in keys]


def time_shares(report: Any) -> str:
    """``valid 81 %, broken 14 %, scale 5 %; compiling 12 %; of it batch invariance 4 %``
    of the jobs' summed time (compiling: seconds in Triton and Helion compiles,
    kda_fuzz.execution.compiles; the extra checks of passing cases by mode), the
    sanitizer's background seconds and the jobs' summed start-up (launch to first example)
    beside it."""
    by = dict(getattr(report, "stratum_seconds", {}) or {})
    total = sum(by.values())
    if total <= 0:
        return ""
    parts = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in
                      sorted(by.items(), key=lambda kv: -kv[1]))
    compiling = getattr(report, "compiling_seconds", 0.0)
    startup = getattr(report, "startup_seconds", 0.0)
    modes = dict(getattr(report, "mode_seconds", {}) or {})
    inline = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in sorted(modes.items())
                       if k != "sanitizer" and v > 0)
    background = modes.get("sanitizer", 0.0)
    return (parts + (f"; compiling {100 * compiling / total:.0f} %" if compiling else "")
            + (f"; of it {inline}" if inline else "")
            + (f"; sanitizer {background:.1f} s in the background" if background else "")
            + (f"; start-up {startup:.1f} s summed over jobs" if startup else ""))


def print_summary(report: Any, file: Any = None) -> None:
    """Human-readable summary of a campaign: counts, every check with its count (never-hit
    ones flagged), gaps and failures (with the layout's sizes, dtypes and strides)."""
    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    t = Table(title=f"kda-fuzz {family_label(report.contract, report.variant)}", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")  # long target names wrap whole, never cut
    t.add_row("targets", ", ".join(report.targets))
    t.add_row("examples", f"{report.examples} in {report.seconds:.1f} s "
              f"({report.examples / max(report.seconds, 1e-9):.1f}/s)")
    t.add_row("valid / broken", f"{report.valid_cases} / {report.broken_cases}"
              + (f" ({report.skipped} valid not judged: result overflows its dtype)"
                 if report.skipped else ""))
    for label, text in family_rows(report):
        if text:
            t.add_row(label, text)
    spent = time_shares(report)
    if spent:
        t.add_row("time", spent)
    first = first_finding(report)
    if first:
        t.add_row("first finding", first)
    counts = check_counts(report)
    t.add_row("checks hit", "  ".join(escape(f"{k}:{n}") if n else f"[bold yellow]{escape(k)}:0[/]"
                                      for k, n in counts) or "none")
    never = [k for k, n in counts if not n]
    if never:
        t.add_row("never hit", f"[bold yellow]{escape(', '.join(never))}[/]")
    console.print(t)
    for note in getattr(report, "notes", ()):
        console.print(f"[yellow]note:[/] {escape(note)}")
    wording = getattr(report, "wording", None)
    if wording:
        console.print(f"[bold yellow]Wording differences[/] (--messages class: the right "
                      f"exception type with other words; not failures): "
                      f"{sum(wording.values())} case(s)")
        for check, expected, got in report.wording_samples:
            console.print(escape(f"  - check {check}: expected {expected!r}, got {got!r}"))
    for line in variant_lines(report):
        console.print(escape(line))
    if report.validation_gaps:
        console.print("[bold yellow]Validation gaps[/] (broken layouts the contract accepts; "
                      "findings about the contract, not target failures):")
        for label, n in sorted(report.validation_gaps.items()):
            console.print(f"  - {label}: {n} case(s)")
    if not report.failures:
        console.print("[bold green]no failure found[/]")
        return
    console.print(f"[bold red]{len(report.failures)} distinct failure(s)[/]")
    for f in report.failures:
        seen = getattr(f, "count", 1)
        console.print(f"[bold red]FAILURE[/] in {escape(f.target)}"
                      + (f" (seen in {seen} examples)" if seen > 1 else ""))
        console.print(f"  {escape(f.verdict.summary())}")
        console.print(f"  layout: {escape(layout_of(f.case))}")
        if getattr(f, "note", ""):
            console.print(f"  [yellow]{escape(f.note)}[/]")
        if getattr(f, "found_seconds", None) is not None:
            console.print(f"  found: {found_after(f)}")
        if f.saved:
            console.print(f"  saved: {escape(f.saved)}")
            console.print(escape(f"  reproduce: {reproduce(f, report.variant, report.contract)}"))


VARIANTS_SHOWN = 6  # per target in the terminal summary (--json and --report list all)


def variant_lines(report: Any, shown: int = VARIANTS_SHOWN) -> list[str]:
    """Variant coverage: per target, the compiled variants it ran (most examples first),
    each with the smallest layout that reached it, then the variants the ones that ran
    show exist but did not run."""
    seen = getattr(report, "variants", None) or {}
    lines = []
    for target, by_label in sorted(seen.items()):
        kernels = sorted({r.kernel for r in by_label.values() if r.kernel != "*"})
        lines.append(f"Variants of {target}: {len(by_label)} ran, of {len(kernels)} "
                     f"kernel(s) ({', '.join(kernels)})")
        ranked = sorted(by_label.items(), key=lambda kv: (-kv[1].count, kv[0]))
        for label, r in ranked[:shown]:
            lines.append(f"  - {label}: {r.count} example(s); smallest: {r.layout}")
        if len(ranked) > shown:
            lines.append(f"  ... and {len(ranked) - shown} more (--json or --report lists "
                         "them all)")
    unrun = report.unrun_variants() if hasattr(report, "unrun_variants") else []
    lines += [f"Variants not run: {u}" for u in unrun]
    return lines


def found_after(failure: Any) -> str:
    """``12.3 s, example 456``: the time and example from the campaign's start to a
    failure's first sighting."""
    at = failure.found_example
    return f"{failure.found_seconds:.1f} s" + (f", example {at}" if at is not None else "")


def first_finding(report: Any) -> str:
    """:func:`found_after` of the campaign's earliest distinct failure ("" without one)."""
    found = [f for f in getattr(report, "failures", ())
             if getattr(f, "found_seconds", None) is not None]
    if not found:
        return ""
    return found_after(min(found, key=lambda f: f.found_seconds))


def family_rows(report: Any) -> list[tuple[str, str]]:
    """The summary's rows on the family's own facts (``Contract.report_rows``: label and
    text, "" when there is nothing to say), e.g. the batch rows its valid cases verified."""
    hooks = getattr(report, "contract_hooks", None)
    family = hooks() if hooks is not None else None
    if family is None or family.report_rows is None:
        return []
    return family.report_rows(report)


def reproduce(failure: Any, variant: str, family: str | None = None) -> str:
    """The command that replays a saved failure (its own, else a plain replay)."""
    if getattr(failure, "reproduce", ""):
        return failure.reproduce
    return replay_command_line(failure.target, failure.saved, variant=variant, family=family)


def layout_of(case: Any) -> str:
    """The contract's one-line layout summary (sizes, dtypes, strides) of a case."""
    try:
        summarize = get_contract(case.contract).summarize
    except ValueError:
        summarize = None
    return summarize(case) if summarize is not None else case.describe()
