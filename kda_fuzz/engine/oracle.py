"""Runs one case against a target and judges it with the contract and differential oracles."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from kda_fuzz.engine.case import Case, Judging, TensorArg
from kda_fuzz.engine.contract import Contract, Deferred, Expectation, Unjudgeable
from kda_fuzz.engine.verdict import RAISED, Verdict, raised_by
from kda_fuzz.execution import configs, variants
from kda_fuzz.execution.variants import Variant

Status = Literal["pass", "fail", "gap", "skip"]
Messages = Literal["exact", "class"]


@dataclass
class Outcome:
    """The result of one case on one target.

    ``wording``: under ``messages="class"``, a broken layout rejected with the right
    exception type but other words: ``(check, expected, got)``."""

    status: Status
    expectation: Expectation
    verdict: Verdict | None = None
    note: str = ""
    wording: tuple[int | None, str, str] | None = None
    budget: dict[str, float] | None = None  # largest |got - ref| / bound per output/dtype
    cpu_seconds: float | None = None  # the calling thread's CPU time (isolated runs)
    rules_held: bool = False  # a skip (``Unjudgeable``) after every rule but the numbers held
    facts: dict[str, Any] | None = None  # what the judge learned (``Contract.judge_facts``)
    # the compiled variants the target's call launched (kda_fuzz.execution.variants)
    variants: tuple[Variant, ...] = ()


OUT_OF_MEMORY = "not judged: out of device memory"


class EnvironmentFailure(Exception):
    """The machinery that runs a target failed, not the target (an interpreter that cannot
    execute a kernel on this device, a device that is gone): never a verdict."""


def device_error(error: BaseException) -> bool:
    """Whether ``error`` is the device's (a CUDA fault, sticky for the process): launches
    are asynchronous, so a target's fault may surface in the judge's first read."""
    accel = getattr(torch, "AcceleratorError", None)
    return (accel is not None and isinstance(error, accel)) or (
        isinstance(error, RuntimeError) and "CUDA error" in str(error))


def _environment_cause(error: BaseException, case: Case, contract: Contract) -> str | None:
    """Why ``error`` is the execution environment's rather than the target's, if it is."""
    if any(t.device.type == "cuda" for t in case.tensors.values()):
        return None
    execution = contract.execution
    return None if execution is None else execution.environment_error(error)


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


MUTATED_CAT_BYTES = 1 << 26  # bases up to this size are compared as one buffer first


def _mutated(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    """The names whose bases changed, read back once per device (where none did and the
    bases are small: their bytes compared at once, four kernels instead of two a base)."""
    by_device: dict[torch.device, list[str]] = {}
    for n, t in before.items():
        if t.device.type != "meta":
            by_device.setdefault(t.device, []).append(n)
    changed = []
    for names in by_device.values():
        olds = [before[n].view(torch.uint8).view(-1) for n in names]
        if sum(t.numel() for t in olds) <= MUTATED_CAT_BYTES and not bool(
                (torch.cat(olds) != torch.cat([after[n].view(torch.uint8).view(-1)
                                               for n in names])).any()):
            continue
        same = torch.stack([(before[n].view(torch.uint8) == after[n].view(torch.uint8)).all()
                            for n in names]).tolist()
        changed += [n for n, ok in zip(names, same) if not ok]
    return [n for n in before if n in changed]


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
                 error: BaseException | None, mutated: list[str],
                 messages: Messages = "exact") -> Verdict | None:
    v = _error_verdict(contract, case, exp, error, mutated, messages)
    return None if v is None else contract.valued(v)  # the family's values masked


def _error_verdict(contract: Contract, case: Case, exp: Expectation,
                   error: BaseException | None, mutated: list[str],
                   messages: Messages) -> Verdict | None:
    if error is None:
        return Verdict("contract", "accepted-broken-layout",
                       f"returned normally; expected: it {exp.describe()}",
                       check=exp.check, message=exp.message)
    if not isinstance(error, contract.exception):
        return Verdict("contract", "wrong-exception-type",
                       f"raised {type(error).__name__}: {error}; expected: it "
                       f"{exp.describe()}", check=exp.check, message=exp.message,
                       exception=type(error).__name__)
    got = str(error)
    if exp.message is not None and got != exp.message and messages == "exact":
        other = _which_message(contract, case, got)
        if other is not None:
            return Verdict("contract", "wrong-check-order",
                           f"raised check {other}'s message {got!r}; check {exp.check} comes "
                           f"first and says {exp.message!r}", check=exp.check, message=exp.message,
                           got=got, got_check=other)
        return Verdict("contract", "wrong-message",
                       f"raised ValueError({got!r}); check {exp.check} says {exp.message!r}",
                       check=exp.check, message=exp.message, got=got)
    if mutated:
        return Verdict("contract", "mutated-on-error",
                       f"raised the right error but modified {', '.join(mutated)} first",
                       check=exp.check, message=exp.message)
    return None


_cpu_ready: list[Any] = []  # the contracts' Execution objects set up in this process


def ready_on_cpu(contract: Contract, case: Case) -> None:
    """Set up the contract's CPU execution (``Execution.configure_cpu``) once per process
    before the first call on a case with tensors on CPU: the front ends do it before they
    import kernels; this is for every other caller (a script, :func:`kda_fuzz.check`)."""
    execution = contract.execution
    if execution is None or any(e is execution for e in _cpu_ready):
        return
    if any(t.device.type == "cpu" for t in case.tensors.values()):
        _cpu_ready.append(execution)
        execution.configure_cpu()


def run_case(contract: Contract, case: Case, target: Callable[..., Any], *,
             messages: Messages = "exact", strict: bool = False,
             guard: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
             budget: bool = False) -> Outcome:
    """Call ``target`` on a fresh copy of ``case`` and judge what it did.

    ``messages="class"``: a broken layout passes when the target raises the contract's
    exception type with any words (the difference is returned in ``Outcome.wording``);
    the first-check-wins order can only be judged with ``"exact"``. A layout in one of the
    contract's holes (documented checks let it through, e.g. HV = 0) passes as a
    validation gap when the target returns and changes nothing; ``strict`` demands the
    hardened contract's exception there. ``guard`` wraps the target's call alone (the
    campaign's flight recorder). ``budget``: also report the error budget used, where the
    contract's judge can (``Outcome.budget``). Raises :class:`EnvironmentFailure` when the
    call failed in the execution machinery rather than in the target, and a device fault
    (:func:`device_error`) that surfaces after the target returned."""
    got = launch_case(contract, case, target, messages=messages, strict=strict, guard=guard,
                      budget=budget, defer=False)
    assert isinstance(got, Outcome)
    return got


@dataclass(frozen=True)
class Pending:
    """A case called and its judging launched on the device, the verdict not read yet
    (:func:`launch_case`): ``finish()`` waits for the device and returns the
    :class:`Outcome`, raising what :func:`run_case` would have raised."""

    finish: Callable[[], Outcome]


def launch_case(contract: Contract, case: Case, target: Callable[..., Any], *,
                messages: Messages = "exact", strict: bool = False,
                guard: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                budget: bool = False, defer: bool = True) -> Outcome | Pending:
    """:func:`run_case`, except that with ``defer`` a valid case whose judge returned a
    :class:`~kda_fuzz.engine.contract.Deferred` (a contract with ``judge_defers``, the
    case on a device) comes back :class:`Pending`: the caller reads its verdict later
    (a campaign's ``--read-every``: with other cases', in one wait on the device)."""
    ready_on_cpu(contract, case)
    exp = expectation(contract, case)
    if exp.ok and case.notes.get("semantic"):
        return Outcome("gap", exp, note="the contract accepts a layout broken by "
                       + ", ".join(case.notes.get("breakages", [])))
    policy = Judging.of(case)  # a case saved under --strict, --messages class, by a mode
    strict = strict or policy.strict
    messages = policy.messages or messages
    try:
        kwargs, bases = case.materialize()
        # the case's own bases are what the target's copies held before the call (nothing
        # writes them): no second snapshot of every buffer
        before = {n: t.base for n, t in case.tensors.items()}
    except torch.OutOfMemoryError:
        return Outcome("skip", exp, note=OUT_OF_MEMORY)
    error: BaseException | None = None
    result: Any = None
    saved = policy.configs if exp.ok else None  # a finding under other configs
    with (guard or contextlib.nullcontext)(), variants.recording() as ran, \
            (configs.pinned(saved) if saved else contextlib.nullcontext()):
        alt = configs.active()
        try:
            result = target(*call_args(contract, kwargs))
        except Exception as e:  # the oracle judges every exception type
            error = e
    launched = tuple(sorted(ran, key=lambda v: v.label))
    if isinstance(error, torch.OutOfMemoryError):  # the device is full: not a verdict
        return Outcome("skip", exp, note=f"{OUT_OF_MEMORY} (in the target)")
    if error is not None and alt is not None:  # under other configs than the kernels' own
        why = configs.unavailable(error) or _environment_cause(error, case, contract)
        if why is not None:
            alt.unavailable = alt.unavailable or why
            return Outcome("skip", exp, note=f"not judged: {why}", variants=launched)
    if error is not None and not isinstance(error, contract.exception):
        cause = _environment_cause(error, case, contract)
        if cause is not None:
            raise EnvironmentFailure(cause) from error
    if not exp.ok:
        mutated = _mutated(before, bases)
        if exp.hole is not None and not strict and error is None and not mutated:
            return Outcome("gap", exp, note=f"the documented checks accept it ({exp.hole}); "
                           "the target returned and changed nothing")
        v = _judge_error(contract, case, exp, error, mutated, messages)
        if v is None and error is not None and exp.message is not None \
                and str(error) != exp.message:
            return Outcome("pass", exp, wording=(exp.check, exp.message, str(error)))
        if v is not None and exp.hole is not None and error is None and mutated:
            v = Verdict("contract", "wrote-on-degenerate-layout",
                        f"returned normally on a degenerate layout ({exp.hole}) but modified "
                        f"{', '.join(mutated)}", hole=exp.hole)
        return Outcome("fail" if v else "pass", exp, v)
    if error is not None:
        tb = "".join(traceback.format_exception_only(type(error), error)).strip()
        return Outcome("fail", exp, contract.valued(Verdict(
            "contract", "rejected-valid-layout", f"raised on a layout the contract accepts: {tb}",
            exception=type(error).__name__)))
    used: dict[str, float] | None = {} if budget and contract.judge_budget \
        else None
    facts: dict[str, Any] = {}
    extra: dict[str, Any] = {"facts": facts} if contract.judge_facts else {}
    if used is not None:
        extra["budget"] = used
    # a saved finding of a mode re-runs that mode after the judge's pass: never deferred
    defer = defer and contract.judge_defers and not saved and not policy.graph \
        and not (policy.invariance == "bitwise" and contract.batch is not None)
    if defer:
        extra["defer"] = True

    def concluded(judged: Callable[[], Any]) -> Outcome:
        """The outcome of the judge's verdict (``judged()``), as :func:`run_case`'s."""
        try:
            v = judged()
        except Unjudgeable as e:
            return Outcome("skip", exp, note=str(e), rules_held=True, facts=facts or None)
        except torch.OutOfMemoryError:
            return Outcome("skip", exp, note=f"{OUT_OF_MEMORY} (in the oracle)")
        except Exception as e:  # e.g. the target resized or re-typed the caller's tensors
            if device_error(e):  # the target's asynchronous fault: the caller's to report
                raise
            return Outcome("fail", exp, Verdict(
                "mismatch", "outputs-unreadable",
                f"the oracle could not read the caller's tensors after the call: "
                f"{type(e).__name__}: {e}"))
        if v is None and policy.invariance == "bitwise" and contract.batch is not None:
            return batch_variance(contract, case, target, kwargs=kwargs)  # a saved finding
        if v is None and policy.graph:  # a saved finding of the CUDA-graph mode
            return graph_replay(contract, case, target)
        if v is not None and saved:
            v = under_configs(v, saved)
        return Outcome("fail" if v else "pass", exp, v, budget=used or None,
                       facts=facts or None, variants=launched)

    deferred: list[Deferred] = []  # what the judge launched, when it deferred its read

    def judged() -> Verdict | None:
        v = contract.judge(case, kwargs, before, bases, result, **extra)
        if isinstance(v, Deferred):
            deferred.append(v)
            return None
        return v

    outcome = concluded(judged)
    return Pending(lambda: concluded(deferred[0].finish)) if deferred else outcome


def under_configs(verdict: Verdict, saved: dict[str, Any]) -> Verdict:
    """``verdict`` of a call made under other configs of its kernels than their own
    (``configs.note``): their tag joins its signature, the configs its detail."""
    if verdict.config:
        return verdict
    raised: dict[str, Any] = {}
    if verdict.kind == "contract" and verdict.what in RAISED:  # known by what it raised
        raised["exception"], raised["got"] = raised_by(verdict)
    fitted = f"; {saved['fitted']}" if saved.get("fitted") else ""
    return replace(verdict, config=configs.tag(saved), **raised,
                   detail=f"under other kernel configs ({configs.describe(saved)}{fitted}; "
                          "the campaign runs other configs only on cases that pass under the "
                          "kernels' own): " + verdict.detail)


def batch_variance(contract: Contract, case: Case, target: Callable[..., Any], *,
                   kwargs: dict[str, Any] | None = None,
                   guard: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
                   ) -> Outcome:
    """Run a valid case's sub-batches (``contract.batch``) and compare their members with
    the full batch's bitwise: ``fail`` with a ``batch-variant`` verdict where they differ.
    ``kwargs``: the full batch's arguments after a call already made. A sub-batch the
    target raises on is left to the campaign's own judging (each is a valid case)."""
    exp = expectation(contract, case)
    assert contract.batch is not None and exp.ok
    if kwargs is None:
        kwargs, _ = case.materialize()
        with (guard or contextlib.nullcontext)():
            target(*call_args(contract, kwargs))
    unit = contract.batch.unit
    for name, sub_case, members in contract.batch.sub_batches(case):
        sub, _ = sub_case.materialize()
        try:
            with (guard or contextlib.nullcontext)():
                target(*call_args(contract, sub))
        except Exception:  # judged as a case of its own, not here
            continue
        where = contract.batch.differs(case, kwargs, sub_case, sub, members)
        if where is not None:
            shown = [m for m in members if m >= 0]
            return Outcome("fail", exp, Verdict(
                "mismatch", "batch-variant",
                f"{unit} re-run in another batch ({name}: {unit} {shown[:8]}"
                f"{'...' if len(shown) > 8 else ''} of the whole batch's) differ "
                f"bitwise from the same {unit} of the whole batch: {where} (--invariance "
                "bitwise asks for this; the contract asks only for the tolerance)",
                notes={"sub_batch": name, unit: members[:64]}))
    return Outcome("pass", exp)


def rolled_values(case: Case) -> Case:
    """The same layout with other values: each floating view's elements rolled by one
    (guard cells and integer tensors as they are)."""
    tensors = {}
    for name, t in case.tensors.items():
        if t.device.type == "meta" or not t.dtype.is_floating_point:
            tensors[name] = t
            continue
        base = t.base.clone()
        arg = TensorArg(base, t.shape, t.stride, t.offset)
        view = arg.view(base)
        if view.numel() > 1:
            view.copy_(view.flatten().roll(1).view(view.shape))
        tensors[name] = arg
    return replace(case, tensors=tensors)


def graph_replay(contract: Contract, case: Case, target: Callable[..., Any]) -> Outcome:
    """Judge ``target`` replayed from a CUDA graph captured on ``case`` (see the module)."""
    exp = expectation(contract, case)
    if not exp.ok or case.notes.get("semantic"):
        return Outcome("pass", exp)
    if not any(t.device.type == "cuda" for t in case.tensors.values()):
        raise EnvironmentFailure("CUDA-graph replay needs the case on a CUDA device")
    fresh = rolled_values(case)
    kwargs, bases = case.materialize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            target(*call_args(contract, kwargs))
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception:  # an eager failure: the eager judge's to report
        return Outcome("pass", exp)
    for name, base in bases.items():
        base.copy_(case.tensors[name].base)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            result = target(*call_args(contract, kwargs))
    except Exception as e:
        torch.cuda.synchronize()
        return Outcome("fail", exp, Verdict(
            "mismatch", "graph-capture-failed",
            f"capturing one call in a CUDA graph raised {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}", graph=True))
    for name, base in bases.items():
        base.copy_(fresh.tensors[name].base)
    graph.replay()
    torch.cuda.synchronize()
    before = {n: t.base for n, t in fresh.tensors.items()}
    try:
        v = contract.judge(fresh, kwargs, before, bases, result)
    except Unjudgeable as e:
        return Outcome("skip", exp, note=str(e), rules_held=True)
    if v is None:
        return Outcome("pass", exp)
    return Outcome("fail", exp, replace(
        v, what=f"graph-{v.what}", graph=True,
        detail="replayed from a CUDA graph captured on other values of the same buffers: "
               + v.detail))


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
