"""Fuzz campaigns: Hypothesis drives valid and broken cases through the oracles (the
campaign loop; its results are in :mod:`kda_fuzz.campaign.results`, its plan in
:mod:`kda_fuzz.campaign.plan`, its options in :mod:`kda_fuzz.campaign.spec`)."""

from __future__ import annotations

import contextlib
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from kda_fuzz.campaign import sanitizing
from kda_fuzz.campaign.arms import Arm
from kda_fuzz.campaign.channel import ExitReason, Stop
from kda_fuzz.campaign.interleave import arm_before, cycle_of, in_turn_order, schedule
from kda_fuzz.campaign.minimize import NO_ELEMENT_KINDS, compacted, minimize_failure
from kda_fuzz.campaign.plan import campaign_plan, deal, plan
from kda_fuzz.campaign.results import Failure, Report, minimizable
from kda_fuzz.campaign.shard import shard_arms
from kda_fuzz.campaign.spec import CampaignOptions
from kda_fuzz.campaign.steering import Steering, describe_feature
from kda_fuzz.engine.case import Case, Judging, fingerprint, same_signature
from kda_fuzz.engine.contract import Contract
from kda_fuzz.engine.oracle import (
    EnvironmentFailure,
    Outcome,
    Pending,
    batch_variance,
    expectation,
    graph_replay,
    launch_case,
    run_case,
    run_peers,
    under_configs,
)
from kda_fuzz.engine.targets import (
    Target,
    TargetError,
    check_signature,
    default_targets,
    load_target,
)
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.execution import compiles, configs
from kda_fuzz.execution.variants import CONFIG_SPACE
from kda_fuzz.workers.deadline import PastDeadline

# Loading targets lives in kda_fuzz.engine.targets; the names stay importable from here.
__all__ = ["Arm", "Campaign", "CampaignOptions", "Failure", "Recorder", "Report", "Target",
           "TargetError", "campaign", "check_signature", "deal", "default_targets",
           "fingerprint", "load_target", "minimizable", "plan"]


# A position in a campaign: (round, arm within the job, example within the arm's run).
# Positions grow in the order examples run, and a campaign run again from the same plan
# and seed draws the same case at the same position (the layouts are built from seeded
# generators), which is what lets a supervised job resume after a crash.
Position = tuple[int, int, int]
END: Position = (1 << 62, 0, 0)


def _turn(subs: Iterable[Case], turn: int, keep: Callable[[Case], bool]
          ) -> tuple[list[Case], int]:
    """The ``turn``-th (wrapping round) of the ``subs`` that ``keep`` accepts, as a list of
    one (none: empty), and how many ``keep`` accepts where ``subs`` was drawn to its end (0:
    it was not). ``subs`` is drawn from only as far as it takes: a family that yields its
    sub-cases lazily builds none past the one that runs."""
    kept: list[Case] = []
    for sub in subs:
        if keep(sub):
            if len(kept) == turn:
                return [sub], 0
            kept.append(sub)
    return ([kept[turn % len(kept)]] if kept else []), len(kept)


def within_share(spent: float, turns: int, total: float, share: float) -> bool:
    """Whether an extra check that has taken ``spent`` seconds in ``turns`` turns of a job's
    ``total`` seconds (its own among them) runs one more turn within ``share`` of the time:
    with that turn costing its mean so far, the check stays within the share. The first
    turn (no mean yet) runs once the check is within its share; ``share`` 1 runs every turn.
    """
    if share >= 1:
        return True
    mean = spent / turns if turns else 0.0
    return spent + mean <= share * (total + mean)


class _Stopped(BaseException):
    """Ends the Hypothesis run at once (not an ``Exception``: Hypothesis lets it through
    without replaying or shrinking)."""


class _Halt(BaseException):
    """Carries an error out of the Hypothesis run (internal error, environment failure)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error



@dataclass(frozen=True)
class _Unread:
    """An example whose target was called and whose judging was launched on the device,
    its result not read yet: read with the others of its batch (``options.read_every``)
    or at the end of its turn, and only then counted (see ``Campaign._read``)."""

    pos: Position
    nth: int  # its number in the job
    case: Case
    pending: Pending
    own: compiles.Compiles  # the compiles of its call and judge's launch (not its batch's)


class Recorder:
    """Where a campaign says what it is doing, so that a supervisor can tell a target's
    crash or hang from the fuzzer's own (the in-process default records nothing).

    ``alternative``: 1 + the number of the other kernel configs the calls are made under
    (``CampaignOptions.kernel_configs``), 0 under the kernels' own: a crash or hang there
    is saved with it."""

    alternative: int = 0

    def call(self, position: Position, target: int) -> contextlib.AbstractContextManager[Any]:
        """Wraps one target call."""
        return contextlib.nullcontext()

    def expect(self, case: Case) -> None:
        """The case the next target calls are made on (a supervised job times them)."""

    def settle(self) -> contextlib.AbstractContextManager[Any]:
        """Wraps one case's call and judging: where a device fault the target caused
        (launches are asynchronous) surfaces, at the latest when it ends."""
        return contextlib.nullcontext()

    def progress(self, position: Position) -> None:
        """The examples before ``position`` are done."""

    def unread(self, position: Position | None) -> None:
        """The oldest example whose result is not read yet (None: all are read): a fault
        or hang seen until then may be any unread example's."""


def _short(body: Callable[[Any], None]) -> Callable[[Any], None]:
    """``body`` behind a function of two source lines: Hypothesis reads and hashes the
    source of each test it runs (its database key, even with no database), and a
    campaign runs one test per arm and round (1.2 ms each for ``Campaign._body``, 0.02 ms
    for this one)."""
    def example(x: Any) -> None:
        body(x)
    return example


_LEAD = st.integers(0, 255)  # the first draw of a costly arm's example (Campaign._body_drawn)


# seconds before the jobs' deadline under which a new big finding is sent as found, not
# first run again with regenerated values (a GPU-scale case's run takes seconds)
COMPACT_MARGIN = 5.0


class Campaign:
    """One fuzz campaign over a contract variant: a plan of arms run through Hypothesis,
    every case judged on every target, distinct failures kept (with repeat counts) until
    ``max_failures`` of them, the examples or the time run out.

    A campaign can start part-way (``resume``: the position of its first example to run,
    with the counts it had there) and be told which positions already crashed or hung
    (``hard``: position -> (target index, verdict)); those cases are regenerated, recorded
    as failures and not run again, past the clock or a stop too (the job then walks its
    plan to them running nothing else); those of ``unexecutable`` (position -> why) are
    counted as not executable, not run. ``seen``: signatures of failures already kept by
    whoever runs this campaign (a restarted job's supervisor); they count as repeats.
    Draws like layouts that crashed or hung get less of the budget
    (:mod:`kda_fuzz.campaign.steering`; its state resumes with ``resume``'s counts)."""

    def __init__(self, contract: Contract, variant: str, targets: list[Target], *,
                 peers: list[Target] | None = None, options: CampaignOptions | None = None,
                 on_example: Callable[[Report], None] | None = None,
                 on_failure: Callable[[Failure, bool], None] | None = None,
                 stop: Callable[[], bool] | None = None, recorder: Recorder | None = None,
                 resume: tuple[Position, dict[str, Any]] | None = None,
                 hard: dict[Position, tuple[int, Verdict]] | None = None,
                 seen: frozenset[tuple[Any, ...]] = frozenset(),
                 unexecutable: dict[Position, str] | None = None) -> None:
        contract.checks_for(variant)  # rejects unknown variants early
        self.contract, self.variant = contract, variant
        self.peers = list(peers or [])
        self.targets = [*targets, *self.peers]
        self.options = options or CampaignOptions()
        declared = [u for t in self.targets for u in getattr(t.fn, "kda_fuzz_unsupported", ())]
        if declared:  # what a target says it does not support is never drawn for it
            self.options = replace(self.options, unsupported=tuple(dict.fromkeys(
                [*self.options.unsupported, *declared])))
        if self.options.seed is None:
            self.options = replace(self.options, seed=random.randrange(2**31))
        self.report = Report(contract.name, variant, [t.name for t in self.targets],
                             seed=self.options.seed, family=contract)
        self.on_example, self.on_failure, self.stop = on_example, on_failure, stop
        self.recorder = recorder or Recorder()
        self.resume_at: Position = (-1, 0, 0)  # seeds run at (-1, 0, i) (see _run_seeds)
        if resume is not None:
            self.resume_at = resume[0]
            self.report.add_counters(resume[1])
        self.hard = dict(hard or {})
        self.unexecutable = dict(unexecutable or {})
        self._stratum = "valid"  # the stratum of the arm being run (see _run_arm)
        self._mark: float | None = None  # its last tick (None: no arm running, see _tick)
        self._arm = "valid"  # and its name
        self.known: dict[tuple[Any, ...], Failure] = {}
        self.seen = seen  # failures kept elsewhere (by the supervisor): repeats here
        self.stopped: Stop | None = None  # why it stopped early (None: not yet, or never)
        self._pos: list[int] = [0, 0, 0]
        self._share: tuple[int, int] = (0, 1)
        self._strategy: st.SearchStrategy[Case] = st.nothing()
        self._cycle = 1  # rounds of a cycle of the plan (see _run_rounds)
        self._first = 0  # the number (over its turns) of the arm's first example of this turn
        self._largest: int | None = None  # the whole plan's largest arm (see arms)
        self._t0 = time.monotonic()
        self._nth = 0  # the number of the example being run (from 1)
        self._deadline: float | None = self.options.deadline  # (run() sets it for good)
        self._sanitizer: sanitizing.SanitizerClient | None = None  # with options.sanitize
        self._sub_kinds = 0  # the most sub-batches of a case's signature seen (see _turn)
        self._mode_turns: Counter[str] = Counter()  # extra checks' turns run here (_timed)
        self._batching = False  # in a turn whose examples' results may be read in batches
        self._unread: list[_Unread] = []  # the batch launched, oldest first (see _read)
        self.steering = Steering(self.options.seed or 0,
                                 resume[1].get("steering") if resume is not None else None)

    # ------------------------------------------------------------------ running

    def arms(self) -> list[Arm]:
        """This job's share of the campaign's plan."""
        o = self.options
        arms = campaign_plan(self.contract, self.variant, o)
        # the whole plan's largest arm sets the rounds (kda_fuzz.campaign.interleave): every job and
        # shard runs its arms the way the single campaign would
        self._largest = max((a.examples for a in arms), default=1)
        mine = (shard_arms(arms, o.shard, job=o.job, seed=o.seed or 0) if o.shard[1] > 1
                else deal(arms, *o.job))
        return in_turn_order(mine)

    def run(self) -> Report:
        """Run the campaign (from ``resume`` on); raises what halted it (an internal
        error or an ``EnvironmentFailure``)."""
        t0 = time.monotonic()
        o = self.options
        self._t0 = o.origin if o.origin is not None else t0
        deadline = o.deadline if o.deadline is not None else (
            None if o.max_seconds is None else t0 + o.max_seconds)
        self._deadline = deadline
        arms = self.arms()
        largest = self._largest or max((a.examples for a in arms), default=1)
        self._sanitizer_start(deadline)
        try:
            self._run_seeds(deadline)
        except _Stopped:
            arms = []
        except _Halt as h:
            raise h.error from None
        with _global_constants_only():
            self._run_rounds(arms, largest, deadline)
        self._sanitizer_finish(deadline)
        if self.contract.status is not None:
            self.report.notes += self.contract.status()
        self.recorder.progress(END)
        self.report.seconds = time.monotonic() - t0
        self.report.stopped = self.stopped
        return self.report

    def _run_seeds(self, deadline: float | None) -> None:
        """Run this job's share of the seed cases (``options.seeds``: corpus files of the
        contract's family) before any draw, at positions ``(-1, 0, i)``."""
        o = self.options
        parts = o.shard[1] * o.job[1]
        mine = o.job[0] * o.shard[1] + o.shard[0]
        self._stratum = "seed"
        for i, path in enumerate(o.seeds):
            pos: Position = (-1, 0, i)
            if i % parts != mine or pos < self.resume_at:
                continue
            if deadline is not None and time.monotonic() > deadline:
                self.stopped = self.stopped or Stop(ExitReason.DEADLINE)
                if not self.hard:
                    raise _Stopped
            if pos not in self.hard and self._owing():
                continue  # past the clock: only the crashes and hangs owed are recorded
            case = load_seed(self.contract, path)
            if o.device != "cpu":
                case = case.on(o.device)
            self._pos = [-1, 0, i]
            self.report.seeds += 1
            self._run_one(pos, case)

    def _run_rounds(self, arms: list[Arm], largest: int, deadline: float | None) -> None:
        """Run the arms interleaved (:func:`kda_fuzz.campaign.interleave.schedule`): in every round
        each arm its share, the plan's ``largest`` arm CHUNK examples; one cycle of rounds,
        or cycles until the ``deadline``."""
        cycle = self._cycle = cycle_of(largest)
        try:
            for rounds, ai, n in schedule(arms, cycle, repeat=deadline is not None):
                arm = arms[ai]
                if (rounds, ai, 1 << 62) < self.resume_at:
                    continue  # done before the resume point
                if deadline is not None and time.monotonic() > deadline:
                    self.stopped = self.stopped or Stop(ExitReason.DEADLINE)
                    if not self.hard:
                        raise _Stopped
                if self._owing() and (rounds, ai, 0) > max(self.hard):
                    raise _Stopped  # what is owed lies behind: its draws ended before it
                if deadline is not None and self._over_time_share(arm, arms) \
                        and not any(p[:2] == (rounds, ai) for p in self.hard):
                    continue  # its stratum has had its share of the time for now
                self._pos = [rounds, ai, 0]
                self._run_arm(arm, n, rounds)
        except _Stopped:
            pass
        except _Halt as h:
            raise h.error from None

    def _over_time_share(self, arm: Arm, arms: list[Arm]) -> bool:
        """Whether the arm's stratum has taken more than ``arm.time_share`` of this job's
        time so far (never when the job has no arm without a time share: it would idle)."""
        if arm.time_share is None or all(a.time_share is not None for a in arms):
            return False
        spent = self.report.stratum_seconds
        return spent[arm.stratum] > arm.time_share * sum(spent.values())

    def _run_arm(self, arm: Arm, n: int, rounds: int) -> None:
        self._share = arm.share
        self._stratum = arm.stratum
        self._arm = arm.name
        self._strategy = arm.strategy
        self._first = arm_before(arm, self._cycle, rounds)
        # every Hypothesis run starts with the arm's simplest case: after the first round
        # it is skipped (see _body), so an arm of one example per round does not run that
        # case again and again. The case is the test's argument (a draw from ``st.data()``
        # costs about half a millisecond more per example), but in an arm whose cases are
        # costly (a time share: GPU-scale layouts), where it is skipped before it is drawn
        costly = arm.time_share is not None
        test = settings(
            max_examples=n + (rounds > 0), database=None, deadline=None,
            phases=(Phase.generate,),
            suppress_health_check=list(HealthCheck), print_blob=False,
        )(given(st.data())(_short(self._body_drawn)) if costly
          else given(arm.strategy)(_short(self._body)))
        seed = self.options.seed or 0
        self._mark = time.monotonic()
        self._batching = not costly and self.options.read_every > 1
        try:
            hypothesis_seed((seed * 1009 + arm.index) * 7919 + rounds)(test)()
            self._read()  # the turn's last batch
        except BaseException:
            # what ended the turn early may be a device fault of an unread example (surfacing
            # in a later draw): the batch's read says so first, as the batch's
            with contextlib.suppress(_Stopped):
                self._read()
            raise
        finally:
            self._batching = False
            self._tick()
            self._mark = None

    def _tick(self) -> None:
        """Count the seconds since the last tick as the current arm's stratum's (after
        each example too, so that a job's progress, and a job ended in the middle of an
        arm, carry them)."""
        if self._mark is None:  # (a seed case: no arm's)
            return
        now = time.monotonic()
        self.report.stratum_seconds[self._stratum] += now - self._mark
        self._mark = now

    def _body_drawn(self, data: st.DataObject) -> None:
        """``_body`` of an arm of costly cases: a later round's first example is skipped
        before its case is built."""
        # one cheap draw first: an example that draws nothing would end the run (Hypothesis
        # takes its choices as exhausted)
        data.draw(_LEAD)
        if self._pos[0] and not self._pos[2]:
            self._pos[2] += 1
            return  # a later round's first example: the simplest case, run in the first round
        self._body(data.draw(self._strategy))

    def _body(self, case: Case) -> None:
        pos: Position = (self._pos[0], self._pos[1], self._pos[2])
        self._pos[2] += 1  # (a case the strategy rejects never gets here: no position)
        if pos[0] and not pos[2]:
            return  # a later round's first example: the simplest case, run in the first round
        if (self._first + pos[2] - (pos[0] > 0)) % self._share[1] != self._share[0]:
            return  # another shard's example (drawn all the same: the draws stay aligned)
        if pos not in self.hard and pos not in self.unexecutable:
            run, why = self.steering.admits(pos, self._stratum, case,
                                            replay=pos < self.resume_at)
            if not run:
                if why is not None:
                    self.report.shifted[describe_feature(why)] += 1
                reject()  # like layouts that crashed or hung: another draw instead
        if pos < self.resume_at:
            return  # fast-forward: this example ran before the resume point
        if pos not in self.hard and self._owing():
            self._walk_past(pos, case)
            return
        self._run_one(pos, case)

    def _owing(self) -> bool:
        """Past the clock or a stop with crashes or hangs of an earlier run of this job
        still to record (``hard``): they are recorded, nothing else is run."""
        if not self.hard:
            return False
        return (self._deadline is not None and time.monotonic() > self._deadline) \
            or (self.stop is not None and self.stop())

    def _walk_past(self, pos: Position, case: Case) -> None:
        """On the way to an owed position: the example is not run, but steering counts it
        as the earlier run did (so the draws after it stay the same)."""
        if self.unexecutable.pop(pos, None) is None:
            self.steering.observe(self._stratum, case, fault=False)

    def _run_one(self, pos: Position, case: Case) -> None:
        """Run the example at ``pos``, then record the progress past it."""
        try:
            batched = self._example(pos, case)
        except (_Stopped, _Halt):
            raise
        except Exception as e:  # an error of the fuzzer or of the environment
            raise _Halt(e) from e
        if not batched:  # (else done when its batch is read)
            self._done(pos)

    def _done(self, pos: Position) -> None:
        """The example at ``pos`` is counted: its seconds ticked, the progress past it
        recorded."""
        self._tick()
        self.recorder.progress((pos[0], pos[1], pos[2] + 1))

    def _batched(self, pos: Position) -> bool:
        """Whether this example's result may be read with a batch (``_read``): one target,
        a turn of cheap cases, nothing that runs after a pass (batch invariance, CUDA
        graphs, other configs, the sanitizer) due on it, and not a position a re-run reads
        one at a time (``options.read_each_through``)."""
        o = self.options
        return (self._batching and len(self.targets) == 1 and self.contract.judge_defers
                and not o.kernel_configs and o.sanitize is None
                and (o.read_each_through is None or pos > o.read_each_through)
                and not self._batch_due(pos) and not self._graph_due(pos))

    def _read(self) -> None:
        """Read the batch's results, oldest first (one wait on the device, for the first),
        then count and record each as ``_example`` would have (each under its own example
        number; the number of the example being run is kept)."""
        nth = self._nth
        while self._unread:
            unread = self._unread.pop(0)
            pos, case, target = unread.pos, unread.case, self.targets[0]
            self._nth = unread.nth
            try:
                outcome = unread.pending.finish()
                self._ran(pos, 0, case, target, outcome)
                # (counted from now as if its own compiles had just run: those of the
                # examples launched after it are theirs)
                self._conclude(pos, case, outcome, [outcome], compiles.totals() - unread.own,
                               observed=True)
            except (_Stopped, _Halt):
                raise
            except Exception as e:  # a device fault of its target, or the fuzzer's own error
                raise _Halt(e) from e
            if not self._unread:  # (a fault read leaves it: the supervisor needs it)
                self.recorder.unread(None)
            self._done(pos)
        self._nth = nth

    def _example(self, pos: Position, case: Case) -> bool:
        """Run the example at ``pos``; True where its result is left to its batch's read
        (``_read``, which counts it)."""
        self._nth = self.report.examples + len(self._unread) + 1  # its number in the job
        hard = self.hard.pop(pos, None)
        if hard is not None:  # crashed or hung here before: record it, never run it again
            index, verdict = hard
            outcome = Outcome("fail", expectation(self.contract, case), verdict)
            self._count(outcome, case)
            alt = verdict.config_alternative
            if alt is not None:  # it died under other configs: the file re-runs them
                saved = {"index": int(alt), "seed": self.options.seed or 0,
                         "configs": {k: {} for k in self._configurable(self.targets[index])}}
                case = Judging(configs=saved).mark(case)
                verdict = under_configs(verdict, saved)
            self._failed(case.on("cpu"), verdict, self.targets[index], confirmed=True)
            self.steering.observe(self._stratum, case, fault=True)
            return False
        skipped = self.unexecutable.pop(pos, None)
        if skipped is not None:  # its compile stalled twice: not a verdict, not run again
            self.report.not_executable(expectation(self.contract, case).ok, skipped)
            return False
        if self.stop is not None and self.stop():
            self.stopped = self.stopped or Stop(ExitReason.STOP_REQUESTED)
            raise _Stopped
        if self._deadline is not None and time.monotonic() > self._deadline:
            self.stopped = self.stopped or Stop(ExitReason.DEADLINE)
            raise _Stopped
        batched = self._batched(pos)
        if not batched:
            self._read()  # nothing runs while results are unread but the batch's own calls
        first: Outcome | None = None
        outcomes: list[Outcome] = []
        built = compiles.totals()
        try:
            for index, target in enumerate(self.targets):
                outcome = self._launch(pos, index, case, target, budget=first is None,
                                       defer=batched)
                if isinstance(outcome, Pending):  # its result is read with the batch's
                    if not self._unread:
                        self.recorder.unread(pos)
                    self._unread.append(_Unread(pos, self._nth, case, outcome,
                                                compiles.totals() - built))
                    # (steering counts it now, as it would have: the next draws stay the same)
                    self.steering.observe(self._stratum, case, fault=False)
                    if len(self._unread) >= self.options.read_every:
                        self._read()
                    return True
                first = first or outcome
                outcomes.append(outcome)
                self._ran(pos, index, case, target, outcome)
                if outcome.status in ("gap", "skip"):
                    break
        except EnvironmentFailure as e:  # not executable here: counted, never a verdict
            self._compiled(built)
            self.report.not_executable(expectation(self.contract, case).ok, str(e))
            if self.on_example is not None:
                self.on_example(self.report)
            return False
        assert first is not None
        self._conclude(pos, case, first, outcomes, built)
        return False

    def _ran(self, pos: Position, index: int, case: Case, target: Target,
             outcome: Outcome) -> None:
        """One target's outcome on the example at ``pos``: its variants counted, a failure
        kept (``_failed``)."""
        self.report.ran(target.name, outcome.variants, case, self._layout)
        if outcome.status == "fail":
            assert outcome.verdict is not None
            self._failed(case, outcome.verdict, target, pos=pos, index=index)

    def _conclude(self, pos: Position, case: Case, first: Outcome, outcomes: list[Outcome],
                  built: compiles.Compiles, observed: bool = False) -> None:
        """After the targets' outcomes (``first``: the first target's): the checks that
        run after a pass, then the example counted (``observed``: steering has counted
        it)."""
        if first.status == "pass" and self._batch_turn(pos, first) \
                and self._within_share("batch invariance"):
            with self._timed("batch invariance"):
                self._batch_invariance(pos, case)
        if first.status == "pass" and self._graph_turn(pos, first) \
                and self._within_share("CUDA graphs"):
            with self._timed("CUDA graphs"):
                self._graph(pos, case)
        if self.options.kernel_configs and first.expectation.ok and self._stratum != "scale" \
                and any(o.status == "pass" for o in outcomes) \
                and self._within_share("other kernel configs"):
            with self._timed("other kernel configs"):
                self._other_configs(pos, case, outcomes)
        if first.status == "pass" and self._sanitize_turn(pos, first, case):
            self._sanitizer_submit(pos, case)
        self._sanitizer_collect()
        for peer in self.peers if first.status == "pass" else ():
            main = self.targets[0]
            pair = run_peers(self.contract, case, [(main.name, main.fn), (peer.name, peer.fn)])
            if pair.status == "fail" and pair.verdict is not None:
                self._failed(case, pair.verdict, Target(f"{main.name} vs {peer.name}", main.fn),
                             confirmed=True)
        compiled = self._compiled(built)
        self._count(first, case)
        if not observed:
            self.steering.observe(self._stratum, case, fault=False)
        if self.options.history:
            self._remember(first, compiled)
        if len(self.report.failures) >= self.options.max_failures:
            self.stopped = Stop(ExitReason.MAX_FAILURES,
                                f"{len(self.report.failures)} distinct failures (--max-failures)")
            raise _Stopped

    def _batch_turn(self, pos: Position, first: Outcome) -> bool:
        """Whether this passing example's rows are re-run in other batches."""
        return first.expectation.ok and self._batch_due(pos)

    def _batch_due(self, pos: Position) -> bool:
        """Whether the example at ``pos``, if valid and passing, is re-run in other
        batches."""
        o = self.options
        return (o.invariance != "off" and self.contract.batch is not None
                and self._stratum != "scale"
                and zlib.crc32(f"batch:{o.seed}:{pos}".encode()) % max(1, o.invariance_every)
                == 0)

    def _batch_invariance(self, pos: Position, case: Case) -> None:
        """Re-run the case's rows in the family's sub-batches on each target: each judged
        as a case of its own, and under ``bitwise`` compared with the whole batch's rows.
        Under ``tolerance`` one sub-batch of the case's own signature runs, each check
        the next one in turn (no compile: a batch of another size is a draw of its own;
        each re-run is a whole batch's device time, and a GPU campaign is bound by it)."""
        assert self.contract.batch is not None
        self.report.batch_checks += 1
        found = (sub for _, sub, _ in self.contract.batch.sub_batches(case))
        if self.options.invariance == "bitwise":
            subs = list(found)
        else:
            subs, kinds = _turn(found, self.report.batch_checks % (self._sub_kinds or 2**30),
                                lambda sub: same_signature(case, sub))
            self._sub_kinds = max(self._sub_kinds, kinds)
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            for sub in subs:
                outcome = self._judge(pos, index, sub, target)
                if outcome.status == "fail" and outcome.verdict is not None:
                    self._failed(sub, outcome.verdict, target, pos=pos, index=index)
                    return
            if self.options.invariance != "bitwise":
                continue
            self.recorder.expect(case)
            with self.recorder.settle():
                v = batch_variance(self.contract, case, target.fn,
                                   guard=lambda i=index: self.recorder.call(pos, i))
            if v.status == "fail" and v.verdict is not None:
                marked = Judging(invariance="bitwise").mark(case)
                self._failed(marked, v.verdict, target, pos=pos, index=index)
                return

    def _graph_turn(self, pos: Position, first: Outcome) -> bool:
        """Whether this passing example is also replayed from a CUDA graph."""
        return first.expectation.ok and self._graph_due(pos)

    def _graph_due(self, pos: Position) -> bool:
        """Whether the example at ``pos``, if valid and passing, is replayed from a CUDA
        graph."""
        o = self.options
        return (o.cuda_graphs and self._stratum != "scale"
                and zlib.crc32(f"graph:{o.seed}:{pos}".encode()) % max(1, o.graph_every) == 0)

    def _graph(self, pos: Position, case: Case) -> None:
        """Capture the case in a CUDA graph on each target and judge its replay on other
        values of the same buffers."""
        self.report.graph_checks += 1
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            self.recorder.expect(case)
            with self.recorder.settle(), self.recorder.call(pos, index):
                outcome = graph_replay(self.contract, case, target.fn)
            if outcome.status == "fail" and outcome.verdict is not None:
                marked = Judging(graph=True).mark(case)
                self._failed(marked, outcome.verdict, target, pos=pos, index=index)
                return

    def _within_share(self, mode: str) -> bool:
        """Whether the extra check ``mode`` runs on this turn (:func:`within_share` of the
        job's time so far); a turn that waits is counted (``Report.mode_held``)."""
        if within_share(self.report.mode_seconds[mode], self._mode_turns[mode],
                        sum(self.report.stratum_seconds.values()), self.options.extra_share):
            return True
        self.report.mode_held[mode] += 1
        return False

    @contextlib.contextmanager
    def _timed(self, mode: str) -> Iterator[None]:
        """Count the block's seconds as ``mode``'s (``Report.mode_seconds``) and the turn."""
        t = time.monotonic()
        try:
            yield
        finally:
            self.report.mode_seconds[mode] += time.monotonic() - t
            self._mode_turns[mode] += 1

    def _sanitize_turn(self, pos: Position, first: Outcome, case: Case) -> bool:
        """Whether this passing example is also replayed under compute-sanitizer: one in
        ``sanitize_every``, while fewer than ``sanitizing.SANITIZE_BACKLOG`` of this job's
        samples wait for the tool (a case takes it seconds: more would only wait, unrun,
        and cost the job their copies)."""
        o = self.options
        return (o.sanitize is not None and first.expectation.ok and self._stratum != "scale"
                and zlib.crc32(f"sanitize:{o.seed}:{pos}".encode()) % max(1, o.sanitize_every)
                == 0 and (self._sanitizer is None
                          or self._sanitizer.backlog() < sanitizing.SANITIZE_BACKLOG)
                and sum(t.footprint() * t.base.element_size()
                        for t in case.tensors.values()) <= sanitizing.MAX_CASE_BYTES)

    def _sanitizer_start(self, deadline: float | None) -> None:
        """With ``sanitize``: connect to the campaign's sanitized worker now (its start-up
        overlaps the examples; SanitizerMissing before any)."""
        o = self.options
        if o.sanitize is None:
            return
        self._sanitizer = sanitizing.SanitizerClient(
            o.sanitize, o.device, [t.name for t in self.targets[:len(self.targets)
                                                                - len(self.peers)]],
            name=f"{o.job[0]}:{o.shard[0]}", seed=o.seed, origin=o.origin, deadline=deadline)
        self._sanitizer.start()

    def _sanitizer_submit(self, pos: Position, case: Case) -> None:
        if self._sanitizer is None:
            return
        cpu = case.on("cpu")
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            self.report.sanitize_sampled += 1
            self._sanitizer.submit(sanitizing.Sample(cpu, target.name, index, (pos, index)))

    def _sanitizer_collect(self, samples: list[sanitizing.Sample] | None = None) -> None:
        """Count the sanitized samples back (``samples``, else those ready now); a report
        with errors is a failure of its own kind. A sanitizer that cannot run at all is
        the environment's failure."""
        client = self._sanitizer
        if client is None:
            return
        if client.unavailable is not None and not client.unavailable.ran \
                and not self.report.sanitized:
            raise EnvironmentFailure(f"--sanitize {client.tool}: {client.unavailable.detail}")
        for s in client.ready() if samples is None else samples:
            r = s.report
            if r is None:
                continue
            if not s.counted:
                s.counted = True
                if r.status == "failed":
                    self.report.sanitize_failed += 1
                    self.report.sanitize_causes[_sanitizer_cause(r.note)] += 1
                    continue
                self.report.sanitized += 1
                self.report.sanitize_seconds += r.seconds
                self.report.mode_seconds["sanitizer"] += r.seconds
            verdict = r.verdict()  # (a later report: errors printed after the case ended)
            if verdict is not None and not s.found:
                s.found = True
                self.report.sanitize_found += 1
                self._failed(s.case, verdict, self.targets[s.index], confirmed=True)

    def _sanitizer_finish(self, deadline: float | None) -> None:
        """Collect the samples still with the sanitizer (until ``deadline``); those not
        run by then stay counted as not run."""
        if self._sanitizer is None:
            return
        done, _ = self._sanitizer.finish(deadline,
                                         stopped=lambda: self.stop is not None and self.stop())
        self._sanitizer_collect(done)

    def _layout(self, case: Case) -> str:
        summarize = self.contract.summarize
        return summarize(case) if summarize is not None else case.describe()

    def _other_configs(self, pos: Position, case: Case, outcomes: list[Outcome]) -> None:
        """Run a valid case that passed on a target again under ``kernel_configs`` other
        configs of the configurable kernels it launched, each judged like any case; a
        config that does not compile or run here is skipped (counted), not a verdict."""
        counted = False
        for index, target in enumerate(self.targets[:len(self.targets) - len(self.peers)]):
            own = outcomes[index] if index < len(outcomes) else None
            if own is None or own.status != "pass" or not any(
                    configurable(v) for v in own.variants):
                continue
            if not counted:
                self.report.config_checks += 1
                counted = True
            for i in range(self.options.kernel_configs):
                self.recorder.alternative = i + 1
                try:
                    with configs.alternative(i, self.options.seed or 0) as alt:
                        outcome = self._judge(pos, index, case, target)
                finally:
                    self.recorder.alternative = 0
                if alt.exhausted:
                    break  # no more configs for this layout
                if alt.unavailable and outcome.status == "skip":
                    self.report.config_skips[_cause(alt.unavailable)] += 1
                    continue
                if not alt.used:
                    break  # it launched no configurable kernel this time
                self.report.config_runs += 1
                self.report.config_adjusted += bool(alt.adjusted)
                self.report.ran(target.name, outcome.variants, case, self._layout)
                if outcome.status == "fail" and outcome.verdict is not None:
                    saved = configs.note(alt)
                    marked = Judging(configs=saved).mark(case)
                    self._failed(marked, under_configs(outcome.verdict, saved), target,
                                 pos=pos, index=index)
                    return

    def _configurable(self, target: Target) -> list[str]:
        """The kernels with other configs to run the target was seen launching."""
        return sorted({r.kernel for r in self.report.variants.get(target.name, {}).values()
                       if configurable(r)})

    def _judge(self, pos: Position, index: int, case: Case, target: Target,
               budget: bool = False) -> Outcome:
        got = self._launch(pos, index, case, target, budget=budget, defer=False)
        assert isinstance(got, Outcome)
        return got

    def _launch(self, pos: Position, index: int, case: Case, target: Target,
                budget: bool = False, defer: bool = False) -> Outcome | Pending:
        """The outcome of one call of ``target`` on ``case``; with ``defer``, where the
        judge deferred its read: :class:`Pending`, the recorder's ``settle`` still open
        (the call stays the target's until its verdict is read)."""
        self.recorder.expect(case)
        with contextlib.ExitStack() as settling:
            settling.enter_context(self.recorder.settle())
            got = launch_case(self.contract, case, target.fn, messages=self.options.messages,
                              strict=self.options.strict,
                              guard=lambda: self.recorder.call(pos, index),
                              budget=budget and self.options.history, defer=defer)
            if isinstance(got, Pending):
                return Pending(_finished_in(settling.pop_all(), got))
            return got

    def _compiled(self, before: compiles.Compiles) -> compiles.Compiles:
        """Count the compiles since ``before`` (this example's) in the report."""
        new = compiles.totals() - before
        self.report.compiles += new.count
        self.report.compiling_seconds += new.seconds
        return new

    def _remember(self, outcome: Outcome, compiled: compiles.Compiles) -> None:
        """One history record."""
        self.report.history.append({
            "t": round(time.monotonic() - self._t0, 4), "examples": self.report.examples,
            "budget": outcome.budget or {}, "compile": compiled.count > 0,
            "compile_seconds": round(compiled.seconds, 4)})

    def _count(self, outcome: Outcome, case: Case) -> None:
        self.report.record(outcome, case, self._stratum)
        if ":pin:" in self._arm:  # a pinned layout's arm: "valid:pin:NAME[:partJ]"
            self.report.pinned[f"{self._stratum}:{self._arm.split(':')[2]}"] += 1
        if self.on_example is not None:
            self.on_example(self.report)

    def _failed(self, case: Case, verdict: Verdict, target: Target, *, confirmed: bool = False,
                pos: Position | None = None, index: int = 0) -> None:
        """Keep a new distinct failure (re-run first: one that does not come back every
        time is ``flaky``) or count a repeat of a known one."""
        seconds = time.monotonic() - self._t0  # first seen (before any re-run)
        failure = Failure(case, verdict, target.name)
        known = self._known(failure)
        if known is None and not confirmed and self.options.confirm_runs:
            failure = self._confirm(failure, target, pos, index)
            known = self._known(failure)
        if known is None and pos is not None:
            self._compact(failure, target, pos, index)
        if known is not None:
            known.count += 1
            if self.on_failure is not None:
                self.on_failure(known, False)
            return
        if any(t.device.type == "cuda" for t in failure.case.tensors.values()):
            failure.case = failure.case.on("cpu")
        policy = Judging(strict=self.options.strict,
                         messages="class" if self.options.messages == "class" else None)
        if policy.notes():  # replay judges the saved case the way the campaign did
            failure.case = policy.mark(failure.case)
        failure.found_seconds = seconds
        failure.found_example = self._nth
        self.known[failure.signature] = failure
        self.report.failures.append(failure)
        if self.on_failure is not None:
            self.on_failure(failure, True)

    def _compact(self, failure: Failure, target: Target, pos: Position, index: int) -> None:
        """A new failure whose verdict names elements and whose case would make a file over
        the goal (1 MiB; a GPU-scale layout): its bulky float values regenerated from
        recipes, kept when one run of that case here (the target's kernels compiled, the
        case on its device) fails the same way, so that it is saved small even when the
        deadline leaves its minimization no time."""
        if failure.verdict.kind in (*NO_ELEMENT_KINDS, "flaky"):
            return
        started = time.monotonic()

        def run(small: Case) -> Outcome:
            spent = time.monotonic() - started  # (regenerating the values)
            if self._deadline is not None \
                    and time.monotonic() + max(COMPACT_MARGIN, 4 * spent) > self._deadline:
                # no time for the run (the failure is sent only after it: a job killed at
                # the deadline in the middle of it would lose the finding); the saver
                # compacts it if it can
                raise PastDeadline("no time to run the compacted case")
            return self._judge(pos, index, small, target)

        try:
            got = compacted(failure.case, failure.verdict, run)  # (run's errors: not kept)
        except Exception as e:  # (out of device memory, ...): it is saved as it stands
            failure.add_note(f"values not regenerated: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}")
            return
        if got is None:
            return
        failure.case, failure.verdict = got
        failure.add_note("float values regenerated from recipes ("
                         f"{', '.join(failure.case.notes['values_regenerated'])}): the case "
                         "was over 1 MiB, and one run of it failed the same way")

    def _known(self, failure: Failure) -> Failure | None:
        sig = failure.signature
        if sig in self.seen and sig not in self.known:
            self.known[sig] = replace(failure, count=0)  # kept elsewhere: count repeats
        return self.known.get(sig)

    def _confirm(self, failure: Failure, target: Target, pos: Position | None,
                 index: int) -> Failure:
        """Re-run the failing case: a failure that a re-run does not show is ``flaky``.
        A re-run that fails again (in any way: a target racing on duplicate writes fails
        differently each time) reproduces it; a skip is no evidence, unless the rules the
        failure broke were judged and held (``Outcome.rules_held``)."""
        runs = same = 0
        other: list[str] = []
        numeric = failure.verdict.behaviour()[1] == "wrong-values"
        for _ in range(self.options.confirm_runs):
            again = (self._judge(pos, index, failure.case, target) if pos is not None
                     else Outcome("fail", expectation(self.contract, failure.case),
                                  failure.verdict))
            if again.status == "skip" and (numeric or not again.rules_held):
                continue  # e.g. out of device memory: no evidence either way
            runs += 1
            if again.status == "fail":
                same += 1
                if again.verdict is not None and again.verdict.signature() != \
                        failure.verdict.signature():
                    other.append(f"{again.verdict.kind}/{again.verdict.what}")
        if same == runs:
            notes = []
            if runs < self.options.confirm_runs:
                notes.append(f"re-run {runs} of {self.options.confirm_runs} times")
            if other:
                notes.append("re-runs failed differently: " + ", ".join(sorted(set(other))))
            failure.note = "; ".join(notes)
            return failure
        v = failure.verdict
        flaky = replace(v, kind="flaky", detail=f"seen once, then in {same} of {runs} re-runs "
                        f"of the same case: {v.detail}", reproduced=same, reruns=runs,
                        first_kind=v.kind)
        return Failure(failure.case, flaky, failure.target)


def _finished_in(settling: contextlib.ExitStack, pending: Pending) -> Callable[[], Outcome]:
    """``pending.finish`` inside ``settling`` (a device fault in it is the call's)."""
    def finish() -> Outcome:
        with settling:
            return pending.finish()
    return finish


def configurable(variant: Any) -> bool:
    """Whether a variant's kernel has other configs to run (``--helion-configs``): a Helion
    config space, or an autotuner declaring more than one config."""
    return variant.space == CONFIG_SPACE or variant.space > 1


def _cause(text: str) -> str:
    """A skipped config's cause with its numbers masked (few distinct ones are kept)."""
    from kda_fuzz.engine.verdict import masked

    return masked(text)[:160]


def load_seed(contract: Contract, path: str) -> Case:
    """The case of the corpus file ``path`` as a seed of a ``contract`` campaign; raises
    ``ValueError`` for a file of another family or one that does not decode."""
    from kda_fuzz.corpus.store import load_case

    try:
        case, _, _ = load_case(path)
    except Exception as e:  # a bad file is the user's to fix: say which one
        raise ValueError(f"seed layout {path}: {e}") from e
    if case.contract != contract.name:
        raise ValueError(f"seed layout {path} is a {case.contract!r} case, the campaign "
                         f"fuzzes {contract.name!r}")
    return case





@contextlib.contextmanager
def _global_constants_only() -> Iterator[None]:
    """Now and then Hypothesis draws a constant found in the (non-library) modules loaded
    in the process, and which modules are loaded differs between processes (a kernel
    imported on its first call, a test run before): the same seed would then draw
    different cases, and a restarted job would not resume where it stood. Campaigns draw
    from Hypothesis' global constants only (its internals; a no-op where they differ)."""
    try:
        from hypothesis.internal.conjecture import providers

        original = providers._get_local_constants
        empty = providers.Constants()
        cache = providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):
        yield
        return
    providers._get_local_constants = lambda: empty
    cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.clear()


def campaign(contract: Contract, variant: str, targets: list[Target], *,
             minimize: float | None = None,
             peers: list[Target] | None = None,
             on_example: Callable[[Report], None] | None = None,
             stop: Callable[[], bool] | None = None,
             on_failure: Callable[[Failure, bool], None] | None = None,
             **options: Any) -> Report:
    """Run a campaign in this process (targets called directly) and minimize each distinct
    failure for ``minimize`` seconds (:func:`kda_fuzz.campaign.minimize.minimize_failure`;
    ``None``: not minimized); ``options`` are :class:`CampaignOptions` fields or the
    family's sizes (:meth:`CampaignOptions.of`). Stops at
    the first distinct failure unless ``max_failures`` says otherwise. ``on_failure(f,
    new)`` is told of each confirmed failure as it is found (``new``: a distinct one)."""
    c = Campaign(contract, variant, targets, peers=peers, options=CampaignOptions.of(**options),
                 on_example=on_example, stop=stop, on_failure=on_failure)
    report = c.run()
    if c.stopped is not None and c.stopped.noteworthy:
        report.notes.append(f"stopped: {c.stopped}")
    if minimize is not None:
        by_name = {t.name: t for t in c.targets}
        for f in report.failures:
            target = by_name.get(f.target)
            if target is None or not minimizable(f.verdict):
                continue
            minimize_failure(contract, f, lambda cand, t=target: run_case(
                contract, cand, t.fn, messages=c.options.messages, strict=c.options.strict),
                seconds=minimize)
    return report





def _sanitizer_cause(note: str) -> str:
    """A failed sanitized run's cause, its numbers masked (so that causes count together)."""
    import re

    return re.sub(r"0x[0-9a-fA-F]+|\d+", "N", note)[:160] or "no cause given"


