"""A verdict's facts: typed fields for those the engine reads, ``notes`` for the rest, and
one ``extra`` object of them all in a saved verdict (the file format)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kda_fuzz.engine.verdict import FACTS, Verdict

SAVED = {"kind": "flaky", "what": "out-value", "detail": "d", "check": None, "message": None,
         "output": "out", "max_error": 2.0, "where": [1, 0],
         "extra": {"index": [1, 0], "ratio": 3.5, "outputs": ["out", "initial_state"],
                   "config": "configs:_k", "graph": True, "first_kind": "mismatch",
                   "reproduced": 0, "reruns": 2}}


def test_a_saved_verdicts_facts_load_into_their_fields_and_save_back_as_they_were() -> None:
    v = Verdict.from_json(SAVED)
    assert v.wrong_outputs == ["out", "initial_state"] and v.config == "configs:_k"
    assert v.graph and v.first_kind == "mismatch" and (v.reproduced, v.reruns) == (0, 2)
    assert v.notes == {"index": [1, 0], "ratio": 3.5}  # the free-form ones only
    assert v.to_json() == SAVED
    assert Verdict.from_json(v.to_json()) == v


def test_facts_given_the_old_way_or_typed_make_the_same_verdict() -> None:
    old = Verdict("contract", "wrong-check-order", "d", 3, "m",
                  extra={"got": "x 12", "got_check": 4, "exception": "ValueError"})
    new = Verdict("contract", "wrong-check-order", "d", 3, "m", got="x 12", got_check=4,
                  exception="ValueError")
    assert old == new and old.signature("v") == new.signature("v")
    assert old.extra == {"exception": "ValueError", "got": "x 12", "got_check": 4}
    with pytest.raises(TypeError):
        old.extra["got"] = "y"  # type: ignore[index]  # a read-only view


def test_replace_keeps_or_clears_typed_facts() -> None:
    v = Verdict("timeout", "no-return", "d", limit_seconds=1.5, config="configs:_k")
    assert replace(v, detail="e").limit_seconds == 1.5  # the view replace passes is ignored
    assert replace(v, config=None).extra == {"limit_seconds": 1.5}
    # an ``extra`` given sets every fact (as it did when it held them all)
    assert replace(v, extra={"tool": "memcheck"}).saved_extra() == {"tool": "memcheck"}


def test_a_flaky_verdict_built_from_anothers_extra_keeps_its_facts() -> None:
    v = Verdict("contract", "rejected-valid-layout", "raised ValueError: n=3",
                exception="ValueError", got="n=3", config="configs:_k")
    flaky = Verdict("flaky", v.what, v.detail, v.check, v.message, v.output, v.max_error,
                    v.where, {**v.extra, "reproduced": 1, "reruns": 2, "first_kind": v.kind})
    assert flaky.signature()[1:] == ("configs:_k", "flaky", *v.signature()[2:])


def test_notes_hold_no_typed_fact_and_saved_verdicts_no_unknown_field() -> None:
    with pytest.raises(ValueError, match="fields of their own"):
        Verdict("crash", "process-died", "d", notes={"tool": "memcheck"})
    with pytest.raises(TypeError, match="unknown"):
        Verdict.from_json({**SAVED, "config": "x"})
    assert set(FACTS.values()) >= {"exception", "got", "got_pattern", "hole", "outputs",
                                   "graph", "config", "first_kind", "limit_seconds", "tool"}
