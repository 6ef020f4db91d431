"""Reports people read: the failure diagnosis, the error budget, the summary, the status
lines off a terminal, the HTML campaign report (and that Chromium renders it)."""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kda_fuzz.campaign.results import Failure, Report
from kda_fuzz.cli import main as cli_main
from kda_fuzz.engine.case import Case
from kda_fuzz.engine.oracle import run_case
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, Values, build
from kda_fuzz.families.packed.judge import judge, layout_summary
from kda_fuzz.report.html import write_report
from kda_fuzz.report.progress import Progress, check_counts, print_summary
from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

KDA = get_contract("kda")


def _case(**kw: Any) -> Case:
    p: dict[str, Any] = dict(B=3, H=1, HV=2, K=4, V=4, spare_slots=2, padding="none",
                             qkv_row_pad=3, slot_pad=2, guard=2, values=Values(), seed=11)
    p.update(kw)
    return build(KdaLayout(**p), "triton")


def _bump(output: str, where: tuple[int, ...]):
    def target(*args):
        out, state = reference_kda_packed_decode(*args)
        (out if output == "out" else state)[where] += 1.0
        return out, state
    return target


# ------------------------------------------------------------------ diagnosis


def test_out_mismatch_names_the_worst_element_in_outs_own_shape_and_the_state() -> None:
    case = _case()
    v = run_case(KDA, case, _bump("out", (2, 0, 1, 3))).verdict
    assert v is not None and v.what == "out-value"
    assert "worst element out[2, 0, 1, 3] (batch row 2, value head 1, v 3)" in v.detail
    assert "1 of 24 elements out of tolerance; state: within tolerance" in v.detail
    assert v.extra["index"] == [2, 0, 1, 3] and v.where == [2, 1, 3]  # minimizer's hint
    assert v.extra["state_out_of_tolerance"] == 0


def test_state_mismatch_is_indexed_by_slot() -> None:
    case = _case()
    idx = case.tensors["ssm_state_indices"].view().tolist()
    slot = idx[1]
    v = run_case(KDA, case, _bump("state", (slot, 1, 2, 3))).verdict
    assert v is not None and v.what == "initial_state-value"
    assert (f"worst element initial_state[{slot}, 1, 2, 3] (slot {slot} of batch row 1, "
            "value head 1, v 2, k 3)") in v.detail
    assert v.extra["index"] == [slot, 1, 2, 3] and v.where == [1, 1, 2, 3]


def test_the_worst_element_wins_over_the_first() -> None:
    def target(*args):
        out, state = reference_kda_packed_decode(*args)
        out[0, 0, 0, 0] += 1e-3
        out[1, 0, 1, 2] += 10.0
        return out, state
    v = run_case(KDA, _case(), target).verdict
    assert v is not None and v.extra["index"] == [1, 0, 1, 2]
    assert "2 of 24 elements" in v.detail


def test_layout_summary_names_sizes_dtypes_and_strides() -> None:
    text = layout_summary(_case(H=1, HV=2, K=4, V=4))
    assert text.startswith("B=3 H=1 HV=2 K=4 V=4, ")
    assert "initial_state: float32[" in text and "stride=" in text


def test_judge_reports_the_error_budget_used() -> None:
    case = _case()
    kwargs, bases = case.materialize()
    before = {n: b.clone() for n, b in bases.items()}
    res = reference_kda_packed_decode(*(kwargs[n] for n in KDA.signature))
    budget: dict[str, float] = {}
    assert judge(case, kwargs, before, bases, res, budget=budget) is None
    assert set(budget) == {"out/float32", "state/float32"}
    assert all(0 <= r < 1 for r in budget.values())
    kwargs["out"][0, 0, 0, 0] += 1.0
    budget.clear()
    assert judge(case, kwargs, before, bases, res, budget=budget) is not None
    assert budget["out/float32"] > 1


# ------------------------------------------------------------------ summary and status


def _report(**kw: Any) -> Report:
    r = Report("kda", "helion", ["mypkg.decode:my_kernel"], examples=40, valid_cases=18,
               broken_cases=22, seconds=8.0, **kw)
    r.checks_hit = Counter({2: 5, 10: 2, 1: 3, 11: 1, "hole:zero-sized K, V or HV": 4})
    return r


def test_summary_lists_every_check_in_numeric_order_and_flags_the_never_hit() -> None:
    counts = check_counts(_report())
    keys = [k for k, _ in counts]
    assert keys[:22] == [str(i) for i in range(1, 23)] and keys[22].startswith("hole:")
    assert dict(counts)["14"] == 0 and dict(counts)["10"] == 2
    buf = io.StringIO()
    report = _report()
    report.failures.append(Failure(_case(), Verdict("mismatch", "out-value", "x"),
                                   "mypkg.decode:my_kernel", saved="corpus/found/m.json"))
    print_summary(report, file=buf)
    text = re.sub(r"\s+", " ", buf.getvalue())
    assert "1:3 2:5 3:0" in text and "10:2 11:1" in text
    assert "never hit" in text and "3, 4, 5, 6, 7, 8, 9, 12" in text
    assert "layout: B=3 H=1 HV=2 K=4 V=4" in text
    assert "rows judged" not in text  # no valid rows: no line
    buf = io.StringIO()
    print_summary(_report(facts=Counter(rows=4_100, live_rows=3_000, tail_rows=900)), file=buf)
    text = re.sub(r"\s+", " ", buf.getvalue())
    assert "4,100 of valid cases: 3,000 live" in text and "900 of it filling batch" in text


def test_status_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report()
    with Progress(40, interval=0.0) as p:
        assert p.plain  # captured stderr is not a terminal
        p.update(report)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert re.fullmatch(r"kda-fuzz: 40/40 examples, valid 18 / broken 22, failures 0, "
                        r"[\d.]+/s, \d+ s", err[-1])
    with Progress(40, enabled=False) as p:
        p.update(report)
    assert capsys.readouterr().err == ""


def test_a_time_bounded_campaign_shows_its_time_not_a_total(
        capsys: pytest.CaptureFixture[str]) -> None:
    """With --max-seconds the plan's rounds repeat until the time is up: "4278/300
    examples" would say the campaign ran past its end; the line counts examples and the
    command's seconds of its budget, the bar fills with the time."""
    import time

    from rich.console import Console

    from kda_fuzz.workers.deadline import Deadline

    report = _report()
    clock = Deadline(started=time.monotonic() - 30.0, seconds=120.0)
    with Progress(10, interval=0.0, clock=clock) as p:
        p.update(report)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"kda-fuzz: 40 examples, valid 18 / broken 22, failures 0, "
                        r"[\d.]+/s, 3\d of 120 s", line), line
    bar = Progress(10, clock=clock)
    bar.console = Console(file=io.StringIO(), force_terminal=True, width=200)
    bar.plain = False
    with bar:
        bar.update(report)
        task = bar._bar.tasks[0]  # type: ignore[union-attr]
        assert task.total == 120.0 and 30.0 <= task.completed < 120.0
        assert task.fields["examples"] == 40


def test_no_subcommand_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([]) == 2
    err = capsys.readouterr().err
    assert "fuzz" in err and "replay" in err


# ------------------------------------------------------------------ HTML report


def _history(n: int = 200) -> list[dict[str, Any]]:
    rng, t, out = random.Random(1), 0.0, []
    for i in range(n):
        compiled = i % 50 == 0
        t += (1.0 if compiled else 0.0) + rng.expovariate(8)
        budget = ({"out/float32": 10 ** rng.uniform(-7, -3),
                   "state/bfloat16": 10 ** rng.uniform(-4, -1)} if i % 2 else {})
        out.append({"t": t, "examples": i + 1, "budget": budget, "compile": compiled})
    return out


def _html_report() -> Report:
    report = _report(facts=Counter(rows=52, live_rows=40))
    report.failures.append(Failure(
        _case(), Verdict("mismatch", "out-value", "worst element out[2, 0, 1, 3] <b>"),
        "mypkg.decode:my_kernel", saved="corpus/found/mismatch-0123.json",
        found_seconds=12.34, found_example=456))
    report.saved.append("corpus/found/mismatch-0123.json")
    report.validation_gaps["missing-k-segment"] = 2
    report.stratum_seconds.update(valid=9.0, broken=3.0)
    report.startup_seconds = 1.5
    return report


def test_html_report_is_one_self_contained_file_with_every_section(tmp_path: Path) -> None:
    path = write_report(_html_report(), tmp_path / "artifacts", history=_history())
    assert path.parent == tmp_path / "artifacts" and list(path.parent.iterdir()) == [path]
    text = path.read_text(encoding="utf-8")
    markup = re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,", text)
    assert not re.search(r"(https?:|//|file:|<link|<script|@import|url\()", markup, re.I)
    assert all(src.startswith("data:image/png;base64,")
               for src in re.findall(r'src="([^"]*)"', text))
    assert len(re.findall(r'src="data:image/png', text)) == 3  # checks, budget, throughput
    for words in ("Campaign", "Failures", "Checks hit", "Validation gaps", "Error budget",
                  "Throughput and compile time", "Never hit: 3, 4, 5",
                  "kda-fuzz replay --target mypkg.decode:my_kernel --contract helion "
                  "corpus/found/mismatch-0123.json", "B=3 H=1 HV=2 K=4 V=4",
                  "out/float32", "state/bfloat16", "4 compiled", "&lt;b&gt;",
                  "52 of valid cases: 40 live",
                  "valid 75 %, broken 25 %; start-up 1.5 s summed over jobs",
                  "<th>first finding</th><td>12.3 s, example 456</td>",
                  "<b>Found</b>: 12.3 s, example 456 from the start"):
        assert words in text, words
    assert "<b>never hit</b>" in text


def test_html_report_without_history_says_so(tmp_path: Path) -> None:
    text = write_report(_report(), tmp_path).read_text(encoding="utf-8")
    assert "No error budget recorded" in text and "No per-example history" in text
    assert "no failure found" in text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_chromium_renders_the_report(tmp_path: Path) -> None:
    from PIL import Image

    path = write_report(_html_report(), tmp_path, history=_history())
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             f"--screenshot={shot}", "--window-size=1200,3000", path.as_uri()],
            check=True, capture_output=True, timeout=120)
    image = Image.open(shot).convert("L")
    assert image.size == (1200, 3000)
    dark = sum(image.histogram()[:128])
    assert dark > 0.01 * 1200 * 3000  # text and plots, not a blank page


def test_verified_rows_leave_out_unjudged_cases_and_are_split_by_stratum() -> None:
    """``valid_rows`` counts the rows of valid cases that were judged (a result too large
    for its dtype is not), per stratum too (``stratum_rows``), through a job's counters."""
    from kda_fuzz.engine.oracle import Outcome, expectation

    case = build(KdaLayout(B=5, H=1, HV=2, K=4, V=4, padding="first", seed=1), "triton")
    exp = expectation(KDA, case)
    r = Report("kda", "triton", [])
    r.record(Outcome("pass", exp), case, "valid")
    r.record(Outcome("skip", exp, note="not judged"), case, "valid")
    r.record(Outcome("fail", exp), case, "scale")
    assert (r.valid_cases, r.skipped, r.facts["rows"], r.facts["live_rows"]) == (3, 1, 10, 8)
    assert r.family_json()["stratum_rows"] == {"valid": 5, "scale": 5}
    merged = Report("kda", "triton", [])
    merged.add_counters(r.counters())
    assert (merged.facts["rows"], merged.facts["live_rows"]) == (10, 8)
    assert merged.family_json()["stratum_rows"] == r.family_json()["stratum_rows"]
    assert r.to_json()["live_rows"] == 8
    assert r.to_json()["stratum_rows"] == {"valid": 5, "scale": 5}


def test_the_time_line_gives_strata_compiles_and_start_up() -> None:
    from types import SimpleNamespace

    from kda_fuzz.report.progress import time_shares

    report = SimpleNamespace(stratum_seconds={"valid": 30.0, "scale": 10.0},
                             compiling_seconds=4.0, startup_seconds=6.25)
    assert time_shares(report) == ("valid 75 %, scale 25 %; compiling 10 %; "
                                   "start-up 6.2 s summed over jobs")
    report.startup_seconds = 0.0
    assert time_shares(report) == "valid 75 %, scale 25 %; compiling 10 %"


def test_the_time_line_gives_the_extra_checks_by_mode() -> None:
    from types import SimpleNamespace

    from kda_fuzz.report.progress import time_shares

    report = SimpleNamespace(stratum_seconds={"valid": 40.0}, compiling_seconds=0.0,
                             startup_seconds=0.0,
                             mode_seconds={"batch invariance": 4.0, "CUDA graphs": 2.0,
                                           "sanitizer": 12.5})
    assert time_shares(report) == ("valid 100 %; of it CUDA graphs 5 %, batch invariance "
                                   "10 %; sanitizer 12.5 s in the background")
