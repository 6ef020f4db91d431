"""Terminal progress and summaries (rich), silent when not on a terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table


class Progress:
    """A progress bar over a campaign's examples on stderr, only when it is a terminal."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self._bar: RichProgress | None = None
        self._task: Any = None
        self.total = total

    def __enter__(self) -> Progress:
        if self.enabled:
            self._bar = RichProgress(
                TextColumn("[bold]fuzz[/]"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                console=self.console, transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("fuzz", total=self.total, stats="")
        return self

    def update(self, report: Any) -> None:
        if self._bar is not None:
            stats = (f"valid {report.valid_cases} · broken {report.broken_cases} · "
                     f"checks {len(report.checks_hit)}")
            self._bar.update(self._task, completed=report.examples, stats=stats)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)


def print_summary(report: Any, file: Any = None) -> None:
    """Human-readable summary of a campaign: counts, checks hit, gaps and failures."""
    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    t = Table(title=f"kda-fuzz {report.contract}/{report.variant}", show_header=False)
    t.add_row("targets", ", ".join(report.targets))
    t.add_row("examples", f"{report.examples} in {report.seconds:.1f} s "
              f"({report.examples / max(report.seconds, 1e-9):.1f}/s)")
    t.add_row("valid / broken", f"{report.valid_cases} / {report.broken_cases}"
              + (f" ({report.skipped} valid not judged: result overflows its dtype)"
                 if report.skipped else ""))
    hit = ", ".join(f"{k}:{v}" for k, v in sorted(report.checks_hit.items(), key=str))
    t.add_row("checks hit", hit or "none")
    console.print(t)
    if report.validation_gaps:
        console.print("[bold yellow]Validation gaps[/] (broken layouts the contract accepts; "
                      "findings about the contract, not target failures):")
        for label, n in sorted(report.validation_gaps.items()):
            console.print(f"  - {label}: {n} case(s)")
    if not report.failures:
        console.print("[bold green]no failure found[/]")
        return
    for f in report.failures:
        console.print(f"[bold red]FAILURE[/] in {f.target}")
        console.print(f"  {escape(f.verdict.summary())}")
        console.print(f"  layout: {escape(f.case.describe())}")
        if f.saved:
            console.print(f"  saved: {escape(f.saved)}")
            console.print(escape(f"  reproduce: kda-fuzz replay --target {f.target} "
                                 f"--contract {report.variant} {f.saved}"))
