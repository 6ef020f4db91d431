"""The shared example database: a failure found by one shard is replayed first by every
other shard's next run. Against a real redis-server (started here on a free port, skipped
when it is not installed) and Hypothesis' directory database."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from kda_fuzz.campaign.exampledb import (
    REPLAYED_NOTE,
    campaign_key,
    merge_replayed,
    redact,
    replay_stored,
    save_failures,
    secondary,
)
from kda_fuzz.campaign.runner import campaign
from kda_fuzz.engine.targets import Target
from kda_fuzz.families import get_contract
from tests import mutants

pytest_plugins = ["pytester"]

KDA = get_contract("kda")
ROOT = Path(__file__).resolve().parents[1]
MUTANT = "tests.mutants:rank_check_and"


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of its own on a free local port, stopped afterwards."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run "
                    "installs it where it can)")
    redis = pytest.importorskip("redis", reason="the redis package: pip install "
                                                "'kda-fuzz[redis]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kda_fuzz", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _summary(r: subprocess.CompletedProcess) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


def _distinct(summary: dict) -> list[tuple]:
    return [(d["target"], d["kind"], d["what"], d["check"], d["output"])
            for d in summary["failure_details"]]


@pytest.mark.slow  # two sharded campaigns through the CLI
def test_a_failure_found_by_one_shard_is_replayed_first_by_the_next_run_of_another(
        redis_url: str, tmp_path: Path) -> None:
    import redis

    fuzz = ("fuzz", "--target", MUTANT, "--contract", "triton", "--max-examples", "60",
            "--seed", "1", "--example-db", redis_url, "--shrink-seconds", "2", "--json")
    r1 = _run(*fuzz, "--shard", "1/4", "--corpus", str(tmp_path / "one"))
    assert r1.returncode == 1, r1.stderr
    first = _summary(r1)
    found = _distinct(first)
    assert found and first["example_db"]["entries"] == 0
    assert first["example_db"]["saved"] == len(found)
    key = campaign_key("kda", "triton", [MUTANT])
    stored = redis.Redis.from_url(redis_url).smembers(b"hypothesis-example:" + key)
    assert len(stored) == len(found)
    # The next run of shard 2 replays them before its first example: they come first in
    # its report, marked as replayed, and are saved to its corpus as shard 1 saved them.
    r2 = _run(*fuzz, "--shard", "2/4", "--corpus", str(tmp_path / "two"))
    assert r2.returncode == 1, r2.stderr
    second = _summary(r2)
    assert second["example_db"]["entries"] == len(found)
    assert second["example_db"]["replayed_failures"] == len(found)
    head = second["failure_details"][:len(found)]
    assert [d.get("note") for d in head] == [REPLAYED_NOTE] * len(found)
    assert set(_distinct(second)[:len(found)]) == set(found)
    assert {Path(p).name for p in first["saved"]} <= {Path(p).name for p in second["saved"]}
    assert any(f"replayed {len(found)} stored failing example(s) first ({len(found)} still "
               "fail)" in n for n in second["notes"])
    # Nothing new is stored for failures that were replayed: the database does not grow.
    assert second["example_db"]["saved"] == len(second["failure_details"]) - len(found)
    assert len(redis.Redis.from_url(redis_url).smembers(b"hypothesis-example:" + key)) == \
        len(found) + second["example_db"]["saved"]


def test_database_entries_are_kept_the_way_hypothesis_keeps_its_own(tmp_path: Path) -> None:
    """Entries that fail again are replayed; a second entry of one failure moves to the
    secondary key, one that now passes too, an unreadable one is deleted."""
    db = DirectoryBasedExampleDatabase(str(tmp_path / "db"))
    key = campaign_key("kda", "triton", [MUTANT])
    buggy = Target(MUTANT, mutants.rank_check_and)
    # seed 4 draws rank_check_and's failures in 80 examples of the interleaved plan (3 distinct;
    # seeds 1, 2 and 7 draw none); small valid layouts (budget): the bugs are in the checks
    report = campaign(KDA, "triton", [buggy], max_examples=80, seed=4, max_failures=100,
                      budget=1 << 12)
    assert report.failures
    n = len(report.failures)
    assert save_failures(db, key, report.failures, seed=1, shard="1/4") == n
    assert save_failures(db, key, report.failures, seed=1, shard="2/4") == n  # other bytes
    db.save(key, b'{"schema": 2, "kind": "contr')
    replay = replay_stored(db, "dir", key, KDA, "triton", [buggy], isolate=False)
    assert (replay.entries, len(replay.failures), replay.duplicates, len(replay.bad)) == \
        (2 * n + 1, n, n, 1)
    assert all(f.note == REPLAYED_NOTE for f in replay.failures)
    assert {f.signature for f in replay.failures} == {f.signature for f in report.failures}
    assert len(list(db.fetch(key))) == n and len(list(db.fetch(secondary(key)))) == n
    # the campaign found them again: counted as repeats of the replayed ones, kept first
    again = campaign(KDA, "triton", [buggy], max_examples=80, seed=4, max_failures=100,
                     budget=1 << 12)
    new = merge_replayed(again, replay.failures)
    assert new == [] and again.failures == replay.failures
    counts = {f.signature: f.count for f in report.failures}  # + the 2 replayed entries
    assert all(f.count == 2 + counts[f.signature] for f in again.failures)
    # fixed (the same target name): every entry now passes and moves out of the way
    fixed = Target(MUTANT, mutants.correct_triton)
    replay = replay_stored(db, "dir", key, KDA, "triton", [fixed], isolate=False)
    assert (replay.passed, replay.failures) == (n, [])
    assert list(db.fetch(key)) == [] and len(list(db.fetch(secondary(key)))) == 2 * n


def test_isolated_replay_of_a_crash_entry(tmp_path: Path) -> None:
    """Replay runs targets in a worker process: a stored case that kills the target is
    a crash again, not the end of the run."""
    db = DirectoryBasedExampleDatabase(str(tmp_path / "db"))
    target = "tests.hostile_targets:aborts_on_padding"
    key = campaign_key("kda", "triton", [target])
    from kda_fuzz.campaign.spec import CampaignSpec
    from kda_fuzz.campaign.supervisor import Supervisor

    report = Supervisor(CampaignSpec.of("kda", "triton", [target], max_examples=60, seed=1,
                                        max_failures=1)).run()
    assert report.failures and report.failures[0].verdict.kind == "crash"
    save_failures(db, key, report.failures[:1], seed=1)
    from kda_fuzz.engine.targets import load_target

    replay = replay_stored(db, "dir", key, KDA, "triton", [load_target(target)])
    assert [f.verdict.kind for f in replay.failures] == ["crash"]


def test_unusable_databases_are_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from kda_fuzz.cli import main as cli_main

    (tmp_path / "file").write_text("x")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    for url in (f"redis://127.0.0.1:{port}/0", str(tmp_path / "file")):
        code = cli_main(["fuzz", "--target", MUTANT, "--contract", "triton",
                         "--max-examples", "5", "--example-db", url])
        err = capsys.readouterr().err
        assert code == 2, (url, err)
        assert len(err.strip().splitlines()) == 1 and "--example-db" in err
    assert not (tmp_path / "corpus").exists()
    assert redact("redis://u:secret@h:1/0") == "redis://u:***@h:1/0"


# ------------------------------------------------------------------ pytest plugin

LOGGING_TEST = """
    import os
    from hypothesis import given, strategies as st

    @given(st.integers(min_value=0, max_value=10**6))
    def test_below_a_thousand(x):
        with open(os.environ["KDA_TEST_LOG"], "a") as f:
            f.write(f"{x}\\n")
        assert x < 1000
"""


def _tried(log: Path) -> list[int]:
    values = [int(x) for x in log.read_text().split()]
    log.unlink()
    return values


@pytest.mark.parametrize("how", ["option", pytest.param("config", marks=pytest.mark.slow)])
def test_pytest_sessions_share_failing_examples(pytester: pytest.Pytester, redis_url: str,
                                                how: str) -> None:
    """A property-based test's failing example found on one runner is the first example
    the next runner tries (Hypothesis' reuse phase, through the shared database)."""
    import redis
    from hypothesis import settings

    before = settings.get_current_profile_name()
    pytester.makepyfile(test_prop=LOGGING_TEST)
    log = pytester.path / "tried.log"
    pytester._monkeypatch.setenv("KDA_TEST_LOG", str(log))
    args = ["-p", "no:cacheprovider"]
    if how == "option":
        args += ["--kda-example-db", redis_url]
    else:
        pytester.makefile(".toml", pyproject=f"[tool.kda-fuzz]\nexample_db = '{redis_url}'\n")
    pytester.runpytest(*args).assert_outcomes(failed=1)
    assert _tried(log)[0] != 1000  # the first runner had to find it
    assert redis.Redis.from_url(redis_url).keys(b"hypothesis-example:*")
    shutil.rmtree(pytester.path / ".hypothesis", ignore_errors=True)  # another machine
    pytester.runpytest(*args).assert_outcomes(failed=1)
    assert _tried(log)[0] == 1000
    # the sessions ran in this process: each left its Hypothesis settings as it found them
    assert settings.get_current_profile_name() == before


def test_pytest_shards_split_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_many="\n".join(f"def test_{i}(): pass" for i in range(7)))
    ran = []
    for i in (1, 2, 3):
        result = pytester.runpytest("-p", "no:cacheprovider", "--kda-shard",
                                               f"{i}/3", "-v")
        ran.append({line.split("::")[1].split()[0] for line in result.outlines
                    if "::test_" in line and "PASSED" in line})
    assert [len(r) for r in ran] == [3, 2, 2]
    assert set().union(*ran) == {f"test_{i}" for i in range(7)} and sum(map(len, ran)) == 7
    result = pytester.runpytest("--kda-shard", "3/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kda-shard 3/2: I must be between 1 and N=2" in result.stderr.str()


def test_config_key_is_checked(tmp_path: Path) -> None:
    from kda_fuzz.config import ConfigError, load_config

    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.kda-fuzz]
        example_db = "hypothesis-db"
    """))
    assert load_config(tmp_path).example_db == "hypothesis-db"
    (tmp_path / "pyproject.toml").write_text("[tool.kda-fuzz]\nexample_db = 3\n")
    with pytest.raises(ConfigError, match="example_db must be a non-empty string"):
        load_config(tmp_path)
