"""Findings reach the user as they happen: saved the moment they are confirmed, kept on
SIGINT/SIGTERM, within --max-seconds; and the typed channel between supervisor and jobs."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from kda_fuzz.campaign.channel import ExitReason, JobFound, JobProgress, JobRepeat, Stop
from kda_fuzz.campaign.interrupt import Interrupted, Signals
from kda_fuzz.campaign.results import Failure, Report
from kda_fuzz.campaign.spec import CampaignSpec
from kda_fuzz.campaign.supervisor import JobError, Supervisor
from kda_fuzz.report.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
SAVED = re.compile(r"kda-fuzz: failure (\d+) saved: (\S+\.json):")
CONFIRMED = re.compile(r"kda-fuzz: failure (\d+) confirmed: ")


def _start(*args: str, cwd: Path) -> subprocess.Popen:
    """The command, its stdout into ``cwd/stdout.txt`` (read it after the exit), its
    stderr a pipe (read by :class:`_Lines` alone)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(cwd / "stdout.txt", "w") as out:
        return subprocess.Popen([sys.executable, "-m", "kda_fuzz", *args], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own process group, as in a shell


def _wait(proc: subprocess.Popen, seconds: float, cwd: Path) -> str:
    """Wait for the command (killing its group past ``seconds``); its stdout."""
    try:
        proc.wait(timeout=seconds)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return (cwd / "stdout.txt").read_text()


class _Lines:
    """The process's stderr lines, read in a thread (so that waiting can be bounded)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self.lines.append("")  # EOF
            self._cv.notify_all()

    def wait_for(self, pattern: re.Pattern[str], seconds: float) -> re.Match[str]:
        end = time.monotonic() + seconds
        with self._cv:
            while True:
                for line in self.lines:
                    m = pattern.search(line)
                    if m:
                        return m
                if time.monotonic() > end or (self.lines and self.lines[-1] == ""
                                              and not self._t.is_alive()):
                    raise AssertionError("not seen: " + pattern.pattern + "\n"
                                         + "\n".join(self.lines[-30:]))
                self._cv.wait(1.0)

    def text(self) -> str:
        self._t.join(timeout=60)
        return "\n".join(self.lines)


def _group_gone(pgid: int, seconds: float = 20.0) -> bool:
    """Whether every process of the group has ended within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(("sig", "group"), [
    # SIGINT (Ctrl-C) while minimizing: the slow tier (the fast tier's SIGTERM case runs the
    # same signal path, and test_a_minimization_cut_short_saves... the cut-short save)
    pytest.param(signal.SIGINT, True, marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, False, marks=pytest.mark.slow),  # the group's case is harder
    (signal.SIGTERM, True)], ids=["SIGINT-group", "SIGTERM", "SIGTERM-group"])
def test_a_signal_mid_campaign_saves_what_is_confirmed_and_summarizes(
        tmp_path: Path, sig: signal.Signals, group: bool) -> None:
    """A long campaign is interrupted once its first failure is confirmed: SIGINT to the
    whole process group (Ctrl-C in a terminal) while that failure is being minimized,
    SIGTERM once it is saved, to the command alone or to its whole group (``timeout``,
    ``docker stop``: the fork server and every worker get it too). Either way every
    confirmed failure is in the corpus (the one cut short saved as found and marked so),
    no worker is taken for crashed, the partial summary and the report are written, the
    exit code is 128 + the signal, no process is left."""
    corpus, report = tmp_path / "corpus", tmp_path / "rep"
    # SIGINT comes while the first failure is being minimized (600 s would not end first);
    # SIGTERM once it is saved, which a short minimization reaches sooner
    shrink = "600" if sig == signal.SIGINT else "1"
    proc = _start("fuzz", "--target", "tests.slow_targets:slow_pad_wrap", "--contract",
                  "triton", "--max-examples", "100000", "--valid-share", "1", "--seed", "1",
                  "--shrink-seconds", shrink, "--corpus", str(corpus), "--report", str(report),
                  cwd=tmp_path)
    lines = _Lines(proc)
    try:
        if sig == signal.SIGINT:
            lines.wait_for(CONFIRMED, 400)
            os.killpg(proc.pid, sig)
        else:
            lines.wait_for(SAVED, 400)
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    finally:
        out = _wait(proc, 120, tmp_path)
    err = lines.text()
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in out and "distinct failure(s)" in out, out
    assert "[crash]" not in out and "internal error" not in err, (out, err)
    saved = {Path(m.group(2)) for m in SAVED.finditer(err)}
    confirmed = {m.group(1) for m in CONFIRMED.finditer(err)}
    assert saved and len(saved) == len(confirmed), err  # every confirmed failure saved
    files = sorted(corpus.glob("*.json"))  # every file announced, none saved twice
    assert {p.name for p in files} == {p.name for p in saved}, err
    assert all(p.name.startswith("mismatch-") for p in files), err
    assert not list(corpus.glob(".*.tmp"))  # atomic writes: no partial file left
    docs = [json.loads(p.read_text()) for p in files]
    if sig == signal.SIGINT:  # the first failure's minimization was cut short
        cut = [d for d in docs if "unminimized" in d["origin"]]
        assert cut and all(d["description"].startswith("[not minimized]") for d in cut)
        assert "SIGINT" in cut[0]["origin"]["unminimized"]
        assert "not minimized" in out
    [page] = report.glob("*.html")
    assert "untouched-state-written" in page.read_text() or \
        "padding-row-not-zero" in page.read_text()
    assert _group_gone(proc.pid), "processes of the campaign outlived it"


@pytest.mark.slow  # a long campaign: the slow tier
def test_max_seconds_bounds_the_command_and_saves_every_finding(tmp_path: Path) -> None:
    """``--max-seconds`` is the command's wall time: a campaign of far more examples than
    fit, whose minimizations would take 600 s each, ends within the bound (generous here:
    the machine is shared) with every confirmed failure saved and a JSON summary."""
    bound = 45.0
    t0 = time.monotonic()
    proc = _start("fuzz", "--target", "tests.slow_targets:slow_pad_wrap", "--contract",
                  "triton", "--max-examples", "100000", "--valid-share", "1", "--seed", "1",
                  "--shrink-seconds", "600", "--max-seconds", f"{bound:g}", "--json",
                  "--corpus", str(tmp_path / "corpus"), cwd=tmp_path)
    lines = _Lines(proc)
    out = _wait(proc, bound + 120, tmp_path)
    wall = time.monotonic() - t0
    err = lines.text()
    assert proc.returncode == 1, err
    # max(5 s, 5 %) past the bound (the process's start counts), and room for the load
    assert wall < bound + max(5, 0.05 * bound) + 5, (wall, err)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["failures"] >= 1 and summary["stopped"] == "deadline"
    saved = {m.group(2) for m in SAVED.finditer(err)}
    assert len(saved) == summary["failures"], err
    assert sorted(summary["saved"]) == sorted(saved)
    for p in saved:
        assert (tmp_path / p).is_file()
    assert _group_gone(proc.pid)


# ---------------------------------------------------------------------- the typed channel


def _failure() -> Failure:
    from kda_fuzz.engine.case import Case
    from kda_fuzz.engine.verdict import Verdict

    case = Case("kda", "triton", {}, {})
    return Failure(case, Verdict("mismatch", "out-value", "wrong"), "t:f")


def test_messages_are_dataclasses_handled_by_type_and_repeats_find_their_failure() -> None:
    """A found failure keeps the signature it arrived with: a repeat of it is counted even
    after its verdict changed (minimized); the found failure is handed on at once; an
    unknown message is the fuzzer's own error."""
    import pickle

    got: list[Failure] = []
    sup = Supervisor(CampaignSpec.of("kda", "triton", ["t:f"], seed=1), on_found=got.append)
    sup.states = [type("S", (), {"last_message": 0.0, "snapshot": None})()]  # type: ignore
    snap = ((0, 0, 1), {"history": []})
    f = _failure()
    sig = f.signature
    sup._handle(JobFound(0, pickle.dumps(f), snap))
    assert len(got) == 1 and got[0].signature == sig and sup.report.failures == got
    got[0].verdict = replace(got[0].verdict, detail="smaller", output="out")  # minimized
    sup._handle(JobRepeat(0, sig, ((0, 0, 2), {"history": []})))
    assert got[0].count == 2
    sup._handle(JobProgress(0, ((0, 0, 3), {"history": [{"t": 0.1}]})))
    assert sup.report.history == [{"t": 0.1, "job": 0}]
    with pytest.raises(JobError, match="unknown message"):
        sup._handle(type("Odd", (), {"job": 0})())  # type: ignore[arg-type]


def test_stop_reasons_are_typed() -> None:
    assert not Stop(ExitReason.STOP_REQUESTED).noteworthy
    s = Stop(ExitReason.MAX_FAILURES, "20 distinct failures (--max-failures)")
    assert s.noteworthy and str(s) == "20 distinct failures (--max-failures)"
    assert str(Stop(ExitReason.DEADLINE)) == "deadline"


# ---------------------------------------------------------------------- the display


def _report(failures: list[Failure]) -> Report:
    r = Report("kda", "triton", ["t:f"], examples=3, valid_cases=2, broken_cases=1)
    r.failures = failures
    return r


def test_plain_lines_show_the_failure_count_and_a_line_per_finding(capsys) -> None:
    p = Progress(100, interval=0.0)
    assert p.plain  # pytest's stderr is no terminal
    f = _failure()
    with p:
        p.found(f)
        p.update(_report([f]))
        f.saved = "corpus/found/mismatch-0.json"
        p.saved(f)
    err = capsys.readouterr().err
    assert "kda-fuzz: failure 1 confirmed: mismatch/out-value on t:f" in err
    assert "kda-fuzz: failure 1 saved: corpus/found/mismatch-0.json: mismatch/out-value" in err
    assert "3/100 examples" in err and "failures 1" in err


def test_the_live_bar_shows_the_failure_count_and_prints_each_finding() -> None:
    p = Progress(100)
    p.console = Console(file=io.StringIO(), force_terminal=True, width=200)
    p.plain = False
    f = _failure()
    with p:
        p.update(_report([]))
        assert "failures 0" in p._bar.tasks[0].fields["stats"]  # type: ignore[union-attr]
        p.found(f)
        p.update(_report([f]))
        assert "failures 1" in p._bar.tasks[0].fields["stats"]  # type: ignore[union-attr]
        f.note = "not minimized: minimization cut short: interrupted by SIGINT"
        p.saved(f)
    shown = p.console.file.getvalue()  # type: ignore[attr-defined]
    assert "failure 1 confirmed: mismatch/out-value on t:f" in shown
    assert "failure 1 not saved: mismatch/out-value on t:f (not minimized" in shown


def test_a_first_signal_asks_the_phase_to_stop_a_second_ends_the_command() -> None:
    got: list[Stop] = []
    before = signal.getsignal(signal.SIGTERM)
    with Signals() as s:
        with s.stopping(got.append):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs between bytecodes of this thread
            assert [g.reason for g in got] == [ExitReason.TERMINATED]
            assert s.stop is not None and "SIGTERM" in str(s.stop)
            with pytest.raises(Interrupted) as e:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)
            assert e.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
    with Signals(), pytest.raises(Interrupted) as e:  # outside a stopping phase: at once
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
    assert e.value.exit_code == 143


def test_a_minimization_cut_short_saves_the_case_as_found_and_marked(tmp_path: Path) -> None:
    """What Ctrl-C during a minimization leaves (the slow tier's SIGINT case runs it end to
    end): the failure is saved as found, its description and origin say why."""
    from kda_fuzz.campaign.findings import FindingSaver
    from kda_fuzz.campaign.runner import campaign
    from kda_fuzz.engine.targets import Target
    from kda_fuzz.families import get_contract
    from tests import mutants

    kda = get_contract("kda")
    target = Target("tests.mutants:pad_wrap", mutants.pad_wrap)
    report = campaign(kda, "triton", [target], max_examples=60, seed=1, valid_share=1.0,
                      max_failures=1, budget=1 << 12)
    (found,) = report.failures
    saver = FindingSaver(CampaignSpec.of(kda, "triton", [], corpus=str(tmp_path), seed=1))
    saver.request(Stop(ExitReason.INTERRUPTED, "interrupted by SIGINT"))
    saver.found_inline(found, target)
    doc = json.loads(Path(found.saved).read_text())
    assert doc["description"].startswith("[not minimized]"), doc["description"]
    assert "SIGINT" in doc["origin"]["unminimized"]
    assert "not minimized" in found.note

