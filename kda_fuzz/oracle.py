"""Runs one case against a target and judges it with the contract and differential oracles."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .case import Case
from .contract import Contract, Expectation, Unjudgeable
from .verdict import Verdict

Status = Literal["pass", "fail", "gap", "skip"]


@dataclass
class Outcome:
    """The result of one case on one target."""

    status: Status
    expectation: Expectation
    verdict: Verdict | None = None
    note: str = ""


def call_args(contract: Contract, kwargs: dict[str, Any]) -> list[Any]:
    """Positional arguments in the contract's signature order."""
    return [kwargs[name] for name in contract.signature]


def expectation(contract: Contract, case: Case) -> Expectation:
    """What the contract prescribes for ``case`` (no data is copied or touched)."""
    args: dict[str, Any] = {n: t.view() for n, t in case.tensors.items()}
    args.update(case.scalars)
    return contract.expect(args, case.variant)


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN-safe); meta tensors hold no bits and compare equal."""
    if x.device.type == "meta":
        return True
    return torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def _mutated(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    return [n for n in before if not same_bits(before[n], after[n])]


def _which_message(contract: Contract, case: Case, text: str) -> int | None:
    """The number of the check whose rendered message is ``text`` on this case, if any."""
    args: dict[str, Any] = {n: t.view() for n, t in case.tensors.items()}
    args.update(case.scalars)
    ns = contract.namespace(args)
    for check in contract.checks_for(case.variant):
        try:
            if check.render(ns) == text:
                return check.number
        except Exception:  # a later check's values may not exist on this layout
            continue
    return None


def _judge_error(contract: Contract, case: Case, exp: Expectation,
                 error: BaseException | None, mutated: list[str]) -> Verdict | None:
    if error is None:
        return Verdict("contract", "accepted-broken-layout",
                       f"returned normally; expected: it {exp.describe()}",
                       check=exp.check, message=exp.message)
    if not isinstance(error, contract.exception):
        return Verdict("contract", "wrong-exception-type",
                       f"raised {type(error).__name__}: {error}; expected: it "
                       f"{exp.describe()}", check=exp.check, message=exp.message)
    got = str(error)
    if exp.message is not None and got != exp.message:
        other = _which_message(contract, case, got)
        if other is not None:
            return Verdict("contract", "wrong-check-order",
                           f"raised check {other}'s message {got!r}; check {exp.check} comes "
                           f"first and says {exp.message!r}", check=exp.check, message=exp.message,
                           extra={"got": got, "got_check": other})
        return Verdict("contract", "wrong-message",
                       f"raised ValueError({got!r}); check {exp.check} says {exp.message!r}",
                       check=exp.check, message=exp.message, extra={"got": got})
    if mutated:
        return Verdict("contract", "mutated-on-error",
                       f"raised the right error but modified {', '.join(mutated)} first",
                       check=exp.check, message=exp.message)
    return None


def run_case(contract: Contract, case: Case, target: Callable[..., Any]) -> Outcome:
    """Call ``target`` on a fresh copy of ``case`` and judge what it did."""
    exp = expectation(contract, case)
    if exp.ok and case.notes.get("semantic"):
        return Outcome("gap", exp, note="the contract accepts a layout broken by "
                       + ", ".join(case.notes.get("breakages", [])))
    kwargs, bases = case.materialize()
    before = {n: b.clone() for n, b in bases.items()}
    error: BaseException | None = None
    result: Any = None
    try:
        result = target(*call_args(contract, kwargs))
    except Exception as e:  # the oracle judges every exception type
        error = e
    if not exp.ok:
        v = _judge_error(contract, case, exp, error, _mutated(before, bases))
        return Outcome("fail" if v else "pass", exp, v)
    if error is not None:
        tb = "".join(traceback.format_exception_only(type(error), error)).strip()
        return Outcome("fail", exp, Verdict("contract", "rejected-valid-layout",
                                            f"raised on a layout the contract accepts: {tb}",
                                            extra={"exception": type(error).__name__}))
    try:
        v = contract.judge(case, kwargs, before, bases, result)
    except Unjudgeable as e:
        return Outcome("skip", exp, note=str(e))
    except Exception as e:  # e.g. the target resized or re-typed the caller's tensors
        return Outcome("fail", exp, Verdict(
            "mismatch", "outputs-unreadable",
            f"the oracle could not read the caller's tensors after the call: "
            f"{type(e).__name__}: {e}"))
    return Outcome("fail" if v else "pass", exp, v)


def run_peers(contract: Contract, case: Case,
              targets: list[tuple[str, Callable[..., Any]]]) -> Outcome:
    """Peer mode: run two targets on fresh copies of an accepted ``case`` and compare their
    outputs with each other (each is judged against the reference by ``run_case``)."""
    exp = expectation(contract, case)
    if not exp.ok or case.notes.get("semantic") or contract.cross_judge is None:
        return Outcome("pass", exp)
    results = []
    before: dict[str, torch.Tensor] = {}
    for name, fn in targets:
        kwargs, bases = case.materialize()
        before = {n: b.clone() for n, b in bases.items()}
        try:
            fn(*call_args(contract, kwargs))
        except Exception:  # judged on its own by run_case
            return Outcome("skip", exp, note=f"{name} raised")
        results.append((name, kwargs))
    try:
        v = contract.cross_judge(case, before, results)
    except Unjudgeable as e:
        return Outcome("skip", exp, note=str(e))
    return Outcome("fail" if v else "pass", exp, v)
