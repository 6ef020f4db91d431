"""Parallel campaigns: one campaign's arms dealt to worker processes sharing the GPUs.

Each job runs ``runner.campaign`` on its share of the plan's arms (its own compile
families among them) and, on ``cuda``, on GPU ``job mod n`` with its share of that GPU's
memory. Hypothesis generation and the oracle run on one CPU core per job, so a GPU that
one process keeps a few percent busy is shared by several. A failure in one job stops
the others at their next example; every job's failures are reported.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .runner import Report

JOBS_PER_GPU = 4  # xdist workers sharing one GPU
CAMPAIGN_JOBS_PER_GPU = 8  # ``--jobs auto``: campaign jobs sharing one GPU (H200 figures)
PROGRESS_EVERY = 0.25  # seconds between a job's progress messages


def device_for(device: str, slot: int) -> str:
    """The device of worker ``slot``: for ``cuda`` GPU ``slot mod n``; ``cuda:i`` and
    ``cpu`` as given."""
    if device != "cuda":
        return device
    import torch

    return f"cuda:{slot % max(1, torch.cuda.device_count())}"


def claim_device(device: str, slot: int, per_gpu: int = JOBS_PER_GPU) -> str:
    """``device_for(device, slot)``; a GPU is made current and capped to ``0.9 / per_gpu``
    of its memory so that ``per_gpu`` workers cannot exhaust it."""
    device = device_for(device, slot)
    if not device.startswith("cuda"):
        return device
    import torch

    torch.cuda.set_device(device)
    torch.cuda.set_per_process_memory_fraction(0.9 / per_gpu)
    return device


def auto_jobs(device: str) -> int:
    """Jobs for ``--jobs auto``: ``CAMPAIGN_JOBS_PER_GPU`` per GPU in use on cuda, one per
    CPU core on cpu; never more than the CPU cores."""
    cpus = os.cpu_count() or 1
    if not device.startswith("cuda"):
        return cpus
    import torch

    gpus = 1 if ":" in device else max(1, torch.cuda.device_count())
    return max(1, min(cpus, CAMPAIGN_JOBS_PER_GPU * gpus))


@dataclass(frozen=True)
class Job:
    """What one worker process runs (picklable: targets travel as ``MODULE:CALLABLE``)."""

    index: int
    jobs: int
    contract: str
    variant: str
    targets: tuple[str, ...]
    peers: tuple[str, ...]
    device: str
    minimize: bool
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None
    options: dict[str, Any] = field(default_factory=dict)


def _snapshot(rep: Report) -> dict[str, Any]:
    return {"examples": rep.examples, "valid_cases": rep.valid_cases,
            "broken_cases": rep.broken_cases, "checks_hit": dict(rep.checks_hit)}


def _run_job(job: Job, progress: Any, stop: Any, results: Any) -> None:
    """Worker process body: one campaign; its report (cases on the CPU) goes to ``results``."""
    try:
        import torch

        from .contracts import get_contract
        from .runner import Target, campaign, load_target

        gpus = torch.cuda.device_count() if job.device == "cuda" else 1
        device = claim_device(job.device, job.index, -(-job.jobs // max(1, gpus)))
        if not device.startswith("cuda"):
            from kernels.kda_decode import _execution

            _execution.configure_cpu()
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // job.jobs))
        contract = get_contract(job.contract)
        targets = [load_target(t) for t in job.targets]
        if job.wrap is not None:
            targets = [Target(t.name, job.wrap(t.fn)) for t in targets]
        minimize = None
        if job.minimize:
            from .minimize import minimize_with_verdict

            def minimize(case: Any, target: Any, verdict: Any, run: Any) -> Any:
                return minimize_with_verdict(contract, case, target.fn, verdict, run=run)

        last = [0.0]

        def on_example(rep: Report) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY:
                last[0] = now
                progress.put((job.index, _snapshot(rep)))

        rep = campaign(contract, job.variant, targets, device=device, minimize=minimize,
                       peers=[load_target(p) for p in job.peers], on_example=on_example,
                       stop=stop.is_set, **job.options)
        if rep.failures:
            stop.set()
        for f in rep.failures:
            f.case = f.case.on("cpu")
            f.original = f.original.on("cpu") if f.original is not None else None
        summaries = {"seconds": rep.seconds,
                     "targets": {t.name: t.fn.summary() for t in targets
                                 if hasattr(t.fn, "summary")}}
        progress.put((job.index, _snapshot(rep)))
        # Plain pickle: torch's queue pickling would share tensors through handles that
        # die with this process.
        results.put((job.index, pickle.dumps((rep, summaries)), None))
    except BaseException:  # reported by the parent as an internal error
        stop.set()
        results.put((job.index, None, traceback.format_exc()))


class JobError(RuntimeError):
    """A job of a parallel campaign died or raised (not a target failure)."""


def parallel_campaign(
    contract: str,
    variant: str,
    targets: list[str],
    jobs: int,
    *,
    device: str = "cpu",
    max_examples: int = 200,
    seed: int | None = None,
    families: int = 0,
    peers: list[str] | None = None,
    minimize: bool = True,
    on_example: Callable[[Report], None] | None = None,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    **options: Any,
) -> tuple[Report, list[dict[str, Any]]]:
    """Run one campaign's plan as ``jobs`` worker processes and merge their reports.

    Every job plans the whole campaign from the same seed (a random one when ``seed`` is
    None) and runs its dealt share of the arms (``runner.deal``): the plan is that of a
    one-job campaign, and each compile family is compiled by one job only (there are
    at least ``jobs`` families when ``families`` is set, so that every job has one).
    ``targets``/``peers`` are ``MODULE:CALLABLE`` specs; ``options`` go to every job's
    ``campaign`` (``max_seconds`` is each job's own deadline). ``wrap``, a picklable
    callable, wraps each target in the jobs. Also returns, per job, its campaign's
    ``seconds`` and ``targets``: each wrapped target's ``summary()``.
    Raises ``JobError`` when a job fails outside the campaign's oracles.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    progress, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    base = seed if seed is not None else random.randrange(2**31)
    specs = [
        Job(j, jobs, contract, variant, tuple(targets), tuple(peers or ()), device, minimize,
            wrap, {**options, "seed": base, "max_examples": max_examples,
                   "families": max(families, jobs) if families else 0, "job": (j, jobs)})
        for j in range(jobs)
    ]
    # Not daemons: a job may start its own isolated-target workers. Ended in ``finally``.
    procs = [ctx.Process(target=_run_job, args=(s, progress, stop, results)) for s in specs]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    merged = Report(contract, variant, [*targets, *(peers or ())])
    snaps: dict[int, dict[str, Any]] = {}
    done: dict[int, tuple[Report, dict[str, Any]]] = {}
    try:
        while len(done) < len(procs):
            _drain(progress, snaps, merged, on_example)
            try:
                index, payload, error = results.get(timeout=0.1)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    time.sleep(0.5)  # a result may still be in the pipe
                    if results.empty():
                        raise JobError(f"a campaign job died (exit code {dead[0].exitcode})"
                                       ) from None
                continue
            if error is not None:
                raise JobError(f"campaign job {index} failed:\n{error}")
            done[index] = pickle.loads(payload)
        _drain(progress, snaps, merged, on_example)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    report = Report(contract, variant, merged.targets)
    for index in sorted(done):
        report.absorb(done[index][0])
    report.seconds = time.monotonic() - t0
    return report, [done[i][1] for i in sorted(done)]


def _drain(progress: Any, snaps: dict[int, dict[str, Any]], merged: Report,
           on_example: Callable[[Report], None] | None) -> None:
    """Fold pending progress messages into ``merged`` and report it."""
    seen = False
    while True:
        try:
            index, snap = progress.get_nowait()
        except queue.Empty:
            break
        snaps[index], seen = snap, True
    if not seen or on_example is None:
        return
    merged.examples = sum(s["examples"] for s in snaps.values())
    merged.valid_cases = sum(s["valid_cases"] for s in snaps.values())
    merged.broken_cases = sum(s["broken_cases"] for s in snaps.values())
    merged.checks_hit.clear()
    for s in snaps.values():
        merged.checks_hit.update(s["checks_hit"])
    on_example(merged)
