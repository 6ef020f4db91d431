"""`kda-fuzz fuzz`: exit codes, JSON summary, targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inprocess import kda_fuzz

ROOT = Path(__file__).resolve().parents[1]
# --budget of the campaigns whose layouts' size is not what they test: a plain torch target
# on cpu otherwise draws layouts of up to 2^18 elements (float64 reference included)
SMALL = "4096"


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kda_fuzz", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_correct_target_exits_0_with_json_summary(tmp_path: Path) -> None:
    """The console command as a process: its exit code, the JSON summary as the last line
    of its stdout (the other campaigns here run the command in this process)."""
    r = _run("fuzz", "--target", "tests.mutants:correct_triton", "--contract", "triton",
             "--max-examples", "60", "--seed", "1", "--json", "--budget", SMALL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "corpus").exists()  # nothing found, no folder left behind
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["failures"] == 0
    assert summary["examples"] == 60
    for key in ("valid_cases", "broken_cases", "seconds", "checks_hit", "validation_gaps",
                "saved"):
        assert key in summary
    assert summary["valid_cases"] > 0 and summary["broken_cases"] > 0


@pytest.fixture(scope="module")
def pad_wrap_run(tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, subprocess.CompletedProcess]:
    """One campaign against a planted bug, saving by default and writing a report: the two
    tests below read what it left (its directory, its exit and output)."""
    where = tmp_path_factory.mktemp("pad_wrap")
    r = kda_fuzz("fuzz", "--target", "tests.mutants:pad_wrap", "--contract", "triton",
                 "--max-examples", "150", "--seed", "1", "--json", "--shrink-seconds", "2",
                 "--budget", SMALL, "--report", "rep", cwd=where)
    return where, r


def test_buggy_target_exits_1_and_saves_into_corpus_found(
        pad_wrap_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    """Without --corpus the minimized case goes to corpus/found under the current
    directory, where the pytest plugin collects it."""
    tmp_path, r = pad_wrap_run
    assert r.returncode == 1, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    # the campaign keeps going: the wrapped padding row shows as distinct failures (the
    # padding row's output, the wrapped-to slot, ...), each saved once, repeats counted
    whats = {d["what"]: d["count"] for d in summary["failure_details"]}
    assert {"padding-row-not-zero", "untouched-state-written"} <= set(whats)
    assert summary["failures"] == len(whats) and whats["padding-row-not-zero"] > 1
    assert {d["kind"] for d in summary["failure_details"]} == {"mismatch"}
    saved = sorted((tmp_path / "corpus" / "found").glob("mismatch-*.json"))
    assert sorted(str(p.relative_to(tmp_path)) for p in saved) == sorted(summary["saved"])
    assert not (tmp_path / "corpus" / "found" / ".inflight").exists()


def test_no_save_writes_no_corpus(tmp_path: Path) -> None:
    r = kda_fuzz("fuzz", "--target", "tests.mutants:pad_wrap", "--contract", "triton",
                 "--max-examples", "60", "--seed", "1", "--json", "--no-save",
                 "--shrink-seconds", "2", "--budget", SMALL, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["saved"] == []
    assert not (tmp_path / "corpus").exists()


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Each usage error exits 2 with its line, no traceback (in this process: the console
    script's own start-up is timed in test_cli_front)."""
    from kda_fuzz.cli import main as cli_main

    for args in (["fuzz", "--target", "no_such_module_xyz:f"],
                 ["fuzz", "--target", "tests.mutants:no_such_callable"],
                 ["fuzz", "--target", "missing_colon"],
                 ["fuzz", "--contract", "cuda-graphs"],
                 ["fuzz", "--max-examples", "0"],
                 ["fuzz", "--jobs", "0"],
                 ["fuzz", "--jobs", "many"],
                 ["fuzz", "--bogus-flag"],
                 ["fuzz", "--max-failures", "0"],
                 ["fuzz", "--device", "tpu"],
                 ["fuzz", "--device", "cuda"],  # no CUDA on this machine
                 ["fuzz", "--device", "cuda:7"],
                 ["fuzz", "--target", "tests.hostile_targets:three_arguments"],
                 ["replay", "--device", "cuda", "corpus"],
                 []):
        code = cli_main(args)
        out, err = capsys.readouterr()
        assert code == 2, (args, out, err)
        assert err.strip(), args
        assert "Traceback" not in err, (args, err)


def test_a_target_that_cannot_bind_the_arguments_is_named_and_nothing_is_saved(
        tmp_path: Path) -> None:
    r = kda_fuzz("fuzz", "--target", "tests.hostile_targets:three_arguments", cwd=tmp_path)
    assert r.returncode == 2
    assert "three_arguments cannot take the kda contract's 11 arguments" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "corpus").exists()


def test_an_environment_failure_exits_2_and_is_no_verdict(tmp_path: Path) -> None:
    """A target whose execution machinery fails (here an interpreter gap, as the Triton
    interpreter raises for a libdevice function it cannot run) stops the campaign with an
    environment error; nothing is saved against the target."""
    r = kda_fuzz("fuzz", "--target", "tests.hostile_targets:interpreter_gap", "--contract",
                 "triton", "--max-examples", "40", "--seed", "1", "--valid-share", "1",
                 cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "environment error" in r.stderr and "not a verdict" in r.stderr
    assert not (tmp_path / "corpus").exists()


@pytest.mark.slow  # a long campaign: the slow tier
def test_parallel_jobs_survive_an_aborting_target_and_save_it(tmp_path: Path) -> None:
    """`--jobs 2`: the job whose isolated target aborts reports it, the campaign exits 1
    and the case is saved as a crash- corpus file."""
    r = _run("fuzz", "--target", "tests.hostile_targets:aborts_on_padding", "--contract",
             "triton", "--jobs", "2", "--max-examples", "100", "--seed", "1", "--json",
             "--corpus", str(tmp_path))
    assert r.returncode == 1, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["failures"] >= 1
    assert {d["kind"] for d in summary["failure_details"]} == {"crash"}
    saved = sorted(p.name for p in tmp_path.glob("crash-*.json"))
    assert saved and len(saved) == len(summary["saved"])


def test_report_writes_one_self_contained_html_file(
        pad_wrap_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    tmp_path, r = pad_wrap_run
    assert r.returncode == 1, r.stderr
    [page] = (tmp_path / "rep").glob("*.html")
    html = page.read_text()
    assert "padding-row-not-zero" in html and "Error budget" in html
    assert html.count("data:image/png;base64,") >= 3  # checks, error budget, throughput
    assert "http://" not in html and "https://" not in html and "<script" not in html


def test_cuda_jobs_start_before_the_target_import_and_stop_on_a_usage_error(
        monkeypatch, capsys) -> None:
    """On cuda the jobs start first (their imports of a Helion target overlap the parent's
    checks); a target that cannot be imported still exits 2 with one line, jobs stopped."""
    from kda_fuzz import cli
    from kda_fuzz.campaign import supervisor as parallel

    calls: list[str] = []
    monkeypatch.setattr(cli, "_prepare_device", lambda device, contract: None)
    monkeypatch.setattr(parallel.Supervisor, "start", lambda self: calls.append("start"))
    monkeypatch.setattr(parallel.Supervisor, "abort", lambda self: calls.append("abort"))
    assert cli.main(["fuzz", "--device", "cuda", "--jobs", "2", "--no-save",
                     "--target", "no_such_module:decode"]) == 2
    assert calls == ["start", "abort"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_module" in err[0]


@pytest.mark.gpu
def test_a_cuda_campaign_of_isolated_jobs_runs(kda_device_name: str) -> None:
    """The command as users run it on a GPU: jobs forked from the fork server use CUDA (a
    fork server that had imported helion there had initialised CUDA: every job failed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(  # (helion may be on the caller's)
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "kda_fuzz", "fuzz", "--device", kda_device_name,
                        "--contract", "helion", "--max-examples", "40", "--jobs", "2",
                        "--seed", "1", "--json", "--no-save", "--scale-share", "0"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["examples"] == 40


def test_the_command_keeps_its_exit_code_while_a_daemon_thread_runs_torch() -> None:
    """A daemon thread inside torch ops when the command ends (a library's, a user
    target's): the command still exits with its own code, its exit handlers run, where
    the interpreter's teardown would abort the process (SIGABRT, before Python 3.14)."""
    script = (
        "import atexit, sys, threading, torch\n"
        "def spin():\n"
        "    a = torch.randn(256)\n"
        "    while True:\n"
        "        a + a\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "atexit.register(lambda: print('exit handlers ran'))\n"
        "sys.argv = ['kda-fuzz', 'fuzz', '--max-examples', '-1']\n"
        "from kda_fuzz.cli import console\n"
        "console()\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--max-examples" in r.stderr and "terminate called" not in r.stderr, r.stderr
    assert r.stdout.strip() == "exit handlers ran"
