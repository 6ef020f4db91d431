"""Findings are one per root cause and known bugs are not saved again (issue 22, part 4)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kda_fuzz.engine.verdict import Verdict, masked
from kda_fuzz.families.kda.contract import CONTRACT as KDA
from tests.inprocess import kda_fuzz

ROOT = Path(__file__).resolve().parents[1]


def _fuzz(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return kda_fuzz("fuzz", *args, cwd=cwd)  # in this process (tests/inprocess.py)


def _summary(r: subprocess.CompletedProcess) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_signature_is_what_the_target_raised_not_the_check() -> None:
    a = Verdict("contract", "wrong-exception-type",
                "raised NotImplementedError: no B=3 yet; expected: it raises check 10",
                check=10, extra={"exception": "NotImplementedError"})
    b = Verdict("contract", "rejected-valid-layout",
                "raised on a layout the contract accepts: NotImplementedError: no B=17 yet",
                extra={"exception": "NotImplementedError"})
    c = Verdict("contract", "wrong-exception-type", "raised TypeError: no B=3 yet; expected: "
                "it raises check 10", check=10, extra={"exception": "TypeError"})
    assert a.signature("triton") == b.signature("triton") != c.signature("triton")
    assert a.signature("triton") != a.signature("helion")
    assert masked("got (3, 128) at 0x7f00ab, K=16") == "got (#, #) at #, K=#"
    # a verdict of an older file (no exception recorded, older wording) reads the same
    old = Verdict("contract", "wrong-exception-type", "raised ZeroDivisionError: integer "
                  "modulo by zero; expected it to raises ValueError", check=21)
    new = Verdict("contract", "wrong-exception-type", "raised ZeroDivisionError: integer "
                  "modulo by zero; expected: it raises ValueError", check=20,
                  extra={"exception": "ZeroDivisionError"})
    assert old.signature() == new.signature()
    # a broken layout accepted is still known by the check that should have fired
    d14 = Verdict("contract", "accepted-broken-layout", "returned normally", check=14)
    d21 = Verdict("contract", "accepted-broken-layout", "returned normally", check=21)
    assert d14.signature() != d21.signature()


def test_out_and_state_wrong_together_are_one_failure_listing_both() -> None:
    both = Verdict("mismatch", "out-value", "...", output="out",
                   extra={"outputs": ["out", "initial_state"]})
    # a file written before "outputs" was recorded, read as the family decodes it
    old_file = KDA.decoded_verdict(Verdict("mismatch", "out-value", "...", output="out",
                                           extra={"state_out_of_tolerance": 7}))
    state = Verdict("mismatch", "initial_state-value", "...", output="initial_state")
    assert both.signature() == old_file.signature() != state.signature()
    assert both.summary().startswith("[mismatch] initial_state-value and out-value")


def test_a_kernel_raising_before_validating_is_one_finding(tmp_path: Path) -> None:
    """Every broken layout and every valid one raises the same NotImplementedError (its
    message naming the input's size): one finding, not one per check."""
    corpus = tmp_path / "found"
    r = _fuzz("--target", "tests.planted:raises_first", "--contract", "triton",
              "--max-examples", "150", "--seed", "1", "--json", "--no-isolate",
              "--corpus", str(corpus), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    s = _summary(r)
    assert s["failures"] == 1, s["failure_details"]
    assert s["failure_details"][0]["count"] > 50
    assert len(list(corpus.glob("*.json"))) == 1 and len(s["saved"]) == 1

    # another seed, the same corpus: the bug is known, counted, not saved again
    again = _fuzz("--target", "tests.planted:raises_first", "--contract", "triton",
                  "--max-examples", "60", "--seed", "2", "--json", "--no-isolate",
                  "--corpus", str(corpus), cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    s2 = _summary(again)
    assert s2["failures"] == 1 and s2["saved"] == []
    assert s2["failure_details"][0]["note"].startswith("seen again:")
    assert "seen again" in again.stderr
    assert len(list(corpus.glob("*.json"))) == 1
