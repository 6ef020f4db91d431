"""Checks for your own tests: one case, one target, the campaign's verdict.

:func:`check` returns what the campaign's oracle concludes about a target on one case
(None: it conforms); :func:`assert_conforms` raises an ``AssertionError`` whose text is
the CLI's failure report. Under the pytest plugin with ``--kda-save-failures DIR``, the
last failing case of each test (after Hypothesis' shrinking, the minimal one) is saved
there as a corpus file, which ``kda-fuzz replay`` and the corpus items replay.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from kda_fuzz.corpus.replay import replay_command_line
from kda_fuzz.corpus.store import save_case
from kda_fuzz.engine.case import Case
from kda_fuzz.engine.oracle import expectation, ready_on_cpu, run_case
from kda_fuzz.engine.targets import Target, check_signature, load_target
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import get_contract
from kda_fuzz.names import label
from kda_fuzz.report.progress import layout_of

__all__ = ["assert_conforms", "check", "failure_report"]

# Set by the pytest plugin: where failing cases of the running test go, and the last one.
SAVE_DIR: Path | None = None
PENDING: dict[str, Any] = {}


def _target(target: str | Callable[..., Any] | Target) -> Target:
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        return load_target(target)
    name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', target)}"
    return Target(name, target)


def check(target: str | Callable[..., Any], case: Case, *,
          messages: Literal["exact", "class"] = "exact", strict: bool = False) -> Verdict | None:
    """What ``target`` does wrong on ``case`` (None: it conforms), judged as a campaign
    judges it: against the case's own family and variant, the documented messages
    (``messages="class"``: any ``ValueError`` passes a broken layout), and the documented
    contract (``strict``: the hardened one, degenerate layouts must raise too).

    ``target`` is a callable with the family's signature or a ``MODULE:CALLABLE`` name."""
    contract = get_contract(case.contract)
    ready_on_cpu(contract, case)  # (before a MODULE:CALLABLE's module imports its kernels)
    t = _target(target)
    check_signature(t, contract)
    outcome = run_case(contract, case, t.fn, messages=messages, strict=strict)
    return outcome.verdict if outcome.status == "fail" else None


def failure_report(target: str, case: Case, verdict: Verdict, saved: Path | None = None,
                   save_dir: Path | None = None) -> str:
    """The CLI's report of one failure: what broke, the layout, how to reproduce it
    (``save_dir``: where the plugin will save the test's minimal failing case)."""
    lines = [f"FAILURE in {target} ({label(case.contract, case.variant)})",
             f"  {verdict.summary()}",
             f"  expected: {_expected(case)}",
             f"  layout: {layout_of(case)}"]
    if saved is not None:
        lines += [f"  saved: {saved}",
                  "  reproduce: " + replay_command_line(target, saved, variant=case.variant,
                                                        family=case.contract)]
    elif save_dir is not None:
        lines.append(f"  (the test's minimal failing case is saved under {save_dir} when the "
                     "test ends)")
    else:
        lines.append("  (run pytest with --kda-save-failures DIR to keep the case as a "
                     "corpus file)")
    return "\n".join(lines)


def _expected(case: Case) -> str:
    return expectation(get_contract(case.contract), case).describe()


def assert_conforms(target: str | Callable[..., Any], case: Case, *,
                    messages: Literal["exact", "class"] = "exact",
                    strict: bool = False) -> None:
    """Raise ``AssertionError`` with the failure report unless ``target`` conforms on
    ``case`` (see :func:`check`)."""
    t = _target(target)
    verdict = check(t, case, messages=messages, strict=strict)
    if verdict is None:
        return
    if SAVE_DIR is not None:  # the plugin saves the last one when the test fails
        PENDING["failure"] = (t.name, case, verdict)
    raise AssertionError(failure_report(t.name, case, verdict, save_dir=SAVE_DIR))


def save_pending(directory: Path, test: str) -> tuple[Path, str, str, str] | None:
    """Save the last failing case of a test (its minimal one) as a corpus file: its path,
    the target's name, the variant and the family."""
    item = PENDING.pop("failure", None)
    if item is None:
        return None
    name, case, verdict = item
    path = save_case(case, verdict, directory,
                     description=f"{verdict.kind}/{verdict.what} on {name} in {test}",
                     origin={"target": name, "test": test, "tool": "pytest"})
    return path, name, case.variant, case.contract
