"""Stale corpus entries: a file whose recorded expectation differs from what the current
contract prescribes is reported as stale, by name and reason, not as an obscure failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from kda_fuzz.corpus.replay import replay_command, stale_reason
from kda_fuzz.corpus.store import load_case, save_case
from kda_fuzz.engine.case import Case
from kda_fuzz.engine.targets import load_target
from kda_fuzz.families import get_contract

pytest_plugins = ["pytester"]

KDA = get_contract("kda")
REFERENCE = load_target(KDA.reference_target or "")


def _broken_case() -> Case:
    found: list[Case] = []

    @settings(max_examples=1, database=None, suppress_health_check=list(HealthCheck))
    @given(KDA.broken_cases("triton", only=("a-width",)))
    def draw(case: Case) -> None:
        found.append(case)

    draw()
    return found[0]


def _replay(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = replay_command(KDA, None, [REFERENCE], [str(path)], as_json=True)
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_fresh_entry_is_not_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_case(_broken_case(), None, tmp_path)
    case, _, meta = load_case(path)
    assert meta["expected"] is not None and meta["expected"].check == 15
    assert stale_reason(KDA, case, meta["expected"]) is None
    code, out = _replay(path, capsys)
    assert code == 0 and out["files"][0]["status"] == "PASS"


@pytest.mark.parametrize("field", ["expected", "verdict"])
def test_changed_expectation_is_reported_stale(field: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """As if check 15's message had been reworded since the file was saved (``verdict``:
    a file from before the ``expected`` field, whose verdict records the message)."""
    case = _broken_case()
    path = save_case(case, None, tmp_path)
    doc = json.loads(path.read_text())
    old = doc["expected"]["message"]
    if field == "expected":
        doc["expected"]["message"] = old.replace("must have shape", "should have shape")
    else:
        del doc["expected"]
        doc["verdict"] = {"kind": "contract", "what": "wrong-message", "detail": "old",
                          "check": 15, "message": old.replace("must", "should"),
                          "output": None, "max_error": None, "where": None, "extra": {}}
    path.write_text(json.dumps(doc))
    code, out = _replay(path, capsys)
    rec = out["files"][0]
    assert code == 1 and rec["status"] == "STALE" and out["stale"] == 1
    assert "stale corpus entry" in rec["reason"] and "should have shape" in rec["reason"]
    assert old in rec["reason"]  # what the current contract says
    replay_command(KDA, None, [REFERENCE], [str(path)])
    text = capsys.readouterr().out
    assert f"STALE {path}" in text and "1 stale" in text


def test_check_now_accepting_is_stale(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded rejection the contract no longer makes (a relaxed check)."""
    path = save_case(_broken_case(), None, tmp_path)
    doc = json.loads(path.read_text())
    doc["expected"] = {"ok": True, "check": None, "message": None, "hole": None}
    path.write_text(json.dumps(doc))
    code, out = _replay(path, capsys)
    assert code == 1 and out["files"][0]["status"] == "STALE"
    assert "recorded as a valid layout" in out["files"][0]["reason"]


def test_pytest_item_reports_stale(tmp_path: Path, pytester: pytest.Pytester) -> None:
    path = save_case(_broken_case(), None, tmp_path)
    doc = json.loads(path.read_text())
    doc["expected"]["check"] = 16
    pytester.makepyprojecttoml(
        '[tool.kda-fuzz]\ncorpus = ["corpus"]\n[tool.kda-fuzz.targets.kda]\n'
        f'triton = ["{KDA.reference_target}"]\nhelion = ["{KDA.reference_target}"]\n')
    (pytester.path / "corpus").mkdir()
    (pytester.path / "corpus" / path.name).write_text(json.dumps(doc))
    for var in ("TRITON_INTERPRET", "KDA_FUZZ_CPU_MODE", "KDA_FUZZ_PROFILE"):
        pytester._monkeypatch.delenv(var, raising=False)
    result = pytester.runpytest("corpus", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*STALE corpus file*stale corpus entry*check 16*"])
