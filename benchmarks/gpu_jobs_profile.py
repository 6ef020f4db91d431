"""Where the jobs of a GPU campaign spend their time when they share one device: N
processes each run their deal of the CLI's cuda plan in-process (as ``--no-isolate``
jobs do), warm up (compiles), then run under cProfile; the merged profile is printed,
with the device syncs per example (``torch.cuda.set_sync_debug_mode``) by call site.

    python benchmarks/gpu_jobs_profile.py [--jobs 8] [--warm 20] [--seconds 15] [--top 30]
                                       [--max-b N] [--flight] [--plain] [--deal N]
                                       [--hogs cpu|gpu] [--hog-count N]
                                       [--sched spin|yield|block] [--reads-every K]
                                       [--no-settle-sync] [--read-every N]

``--plain``: no profiler and no sync census, the rate alone (cProfile slows Python-heavy
code): ``--jobs 1 --deal 8`` (one job with the share of one of eight) against ``--jobs 8``
says how much the jobs slow each other down once their compiles are done. ``--hogs`` puts
``--hog-count`` processes (default: 8 less the jobs) beside the measured run that load one
side of the machine alone: ``cpu`` loops Python and touches no GPU; ``gpu`` loops what a
job's example asks of the GPU (40 tiny kernels and a read) with a sleep of 3 ms between
loops instead of host work. One job beside 7 hogs of each kind against one job alone says
whether sharing the cores or sharing the GPU slows the jobs. ``--sched`` sets how each job's
host thread waits for the device in a read (the primary context's flags, set before torch
makes it): ``spin`` (what CUDA picks while the contexts are fewer than the cores) keeps a
core busy, ``block`` sleeps until the device is done. ``--reads-every K`` (a measurement
only: verdicts are not read) leaves out the fused judge's read of the device but on every
K-th example: what a job waiting for its own launches behind the other jobs' costs.
``--read-every N`` is the campaign's option of that name: every result read, N at a time
(against ``--reads-every``, what it takes back).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import multiprocessing as mp
import os
import pstats
import tempfile
import traceback
import warnings
from typing import Any

TARGET = "kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode"


# the caching allocator's counts that cost a driver call (a free waits for the device)
ALLOCATOR = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")


def _allocator(device: str) -> dict[str, int]:
    import torch

    if device != "cuda":
        return dict.fromkeys(ALLOCATOR, 0)
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR}


SCHED = {"spin": 1, "yield": 2, "block": 4}  # CU_CTX_SCHED_*


def _set_sched(how: str) -> None:
    """The primary context's wait flags for device 0 (before torch makes the context)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    for call in (lambda: cuda.cuInit(0), lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0),
                 lambda: cuda.cuDevicePrimaryCtxSetFlags(dev, SCHED[how])):
        if call():
            raise RuntimeError(f"the driver refused the wait flags {how!r}")


def _unread(every: int) -> None:
    """The fused judge without its read of the device but every ``every``-th call (it
    passes every case it does not read: a measurement of the read's cost alone)."""
    from kda_fuzz.families.packed import fused as pf
    from kda_fuzz.families.packed import judge

    calls = [0]
    launch = judge._fused_launch

    def fused_launch(*args: Any, **kwargs: Any) -> Any:
        read = launch(*args, **kwargs)  # every launch, the read's copy included
        calls[0] += 1
        if read is None or calls[0] % every == 0:
            return read
        return lambda: [0.0] * (2 + pf.COLUMNS)  # every rule held, nothing read

    judge._fused_launch = fused_launch


def _without_settle_sync(recorder: Any) -> None:
    """The flight record's ``settle`` without its device-wide sync after the judge's read
    (a measurement: what that second wait costs a job of eight)."""
    from contextlib import contextmanager

    from kda_fuzz.campaign.supervisor import JUDGING, STATE

    @contextmanager
    def settle() -> Any:
        yield
        recorder.record[STATE] = JUDGING
        recorder._timed()

    recorder.settle = settle


def _job(i: int, n: int, args: argparse.Namespace, out: str, start: Any, census: Any
         ) -> None:
    if args.sched:
        _set_sched(args.sched)
    import torch
    from profile_campaign import shaping  # (this script's folder is on sys.path)

    from kda_fuzz.campaign.runner import Campaign, Recorder
    from kda_fuzz.campaign.spec import CampaignOptions
    from kda_fuzz.campaign.supervisor import CALIBRATION, _SharedRecorder, claim_device
    from kda_fuzz.campaign.timeouts import store_size
    from kda_fuzz.engine.targets import load_target
    from kda_fuzz.families import get_contract

    # as the CLI's jobs do: no job's torch ops spread over every core
    deal = args.deal or n  # (with --deal, one job of that many: its threads too)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // deal)))
    if args.device == "cuda":  # and its share of the GPU's memory
        claim_device("cuda", 0, per_gpu=deal)
    target = load_target(args.target)
    # the isolated default's per-example bookkeeping (a flight record; its progress
    # messages go nowhere here), or none as with --no-isolate
    record = mp.RawArray("d", CALIBRATION + store_size(1))  # the supervisor's layout
    recorder = (_SharedRecorder(record, lambda pos: None, args.device)
                if args.flight else Recorder())
    if args.flight and args.no_settle_sync:
        _without_settle_sync(recorder)

    def run(seconds: float, seed: int) -> Any:
        options = CampaignOptions.of(device=args.device, max_examples=10**7, seed=seed,
                                     valid_share=args.valid_share, max_seconds=seconds,
                                     job=(i, deal), read_every=args.read_every,
                                     **shaping(args.device, args.max_b))
        return Campaign(get_contract("kda"), args.contract, [target], options=options,
                        recorder=recorder).run()

    run(args.warm, 1)
    if args.reads_every:
        _unread(args.reads_every)
    start.wait()
    prof = cProfile.Profile()
    if not args.plain:
        prof.enable()
    mem0 = _allocator(args.device)
    rep = run(args.seconds, 1)  # the warm-up's draws again: compiled already
    mem = {k: v - mem0[k] for k, v in _allocator(args.device).items()}
    if not args.plain:
        prof.disable()
        prof.dump_stats(f"{out}/job{i}.prof")
    sites: collections.Counter[str] = collections.Counter()
    syncs = 0
    # the sync census: job 0 alone, after the others
    if i == 0 and args.device == "cuda" and not args.plain:
        census.wait()

        def note(*_: Any, **__: Any) -> None:
            nonlocal syncs
            syncs += 1
            frames = [f for f in traceback.extract_stack()
                      if "kda_fuzz" in f.filename or "kernels" in f.filename
                      or "helion" in f.filename]
            sites[" < ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                             for f in frames[-3:][::-1])] += 1

        warnings.showwarning = note
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        counted = run(args.seconds / 3, 1)
        torch.cuda.set_sync_debug_mode(0)
        with open(f"{out}/syncs.txt", "w") as f:
            f.write(f"{counted.examples} examples, {syncs} syncs "
                    f"({syncs / max(1, counted.examples):.2f} per example)\n")
            for site, k in sites.most_common(25):
                f.write(f"{k / max(1, counted.examples):8.2f}/ex  {site}\n")
    with open(f"{out}/job{i}.txt", "w") as f:
        f.write(f"{rep.examples} {rep.facts['rows']} {rep.seconds} "
                f"{' '.join(str(mem[k]) for k in ALLOCATOR)}\n")


def _hog(kind: str, stop: Any, start: Any) -> None:
    import time

    if kind == "gpu":
        import torch

        x = torch.randn(64, 128, device="cuda")
        x.sum().item()
    start.wait()
    while not stop.is_set():
        if kind == "cpu":
            sum(i * i for i in range(2000))
            continue
        y = x
        for _ in range(40):
            y = y * 1.0001
        y.sum().item()
        time.sleep(0.003)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--contract", default="helion")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    ap.add_argument("--warm", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--valid-share", type=float, default=1.0)
    ap.add_argument("--max-b", type=int, default=None,
                    help="largest batch size (default: the contract's cuda default)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--flight", action="store_true",
                    help="keep a flight record per example, as the isolated default does")
    ap.add_argument("--deal", type=int, default=None,
                    help="each job runs the share of one of this many jobs (default: --jobs)")
    ap.add_argument("--plain", action="store_true",
                    help="no profiler and no sync census: the rate alone")
    ap.add_argument("--hogs", choices=("cpu", "gpu"), default=None,
                    help="processes beside the jobs that load the cores alone (cpu) or the "
                         "GPU alone (gpu)")
    ap.add_argument("--hog-count", type=int, default=None,
                    help="how many hogs (default: 8 less --jobs)")
    ap.add_argument("--sched", choices=tuple(SCHED), default=None,
                    help="how a job's thread waits for the device (default: CUDA's choice)")
    ap.add_argument("--no-settle-sync", action="store_true",
                    help="with --flight: the flight record's settle without its device-wide "
                         "sync after the judge's read (a measurement)")
    ap.add_argument("--read-every", type=int, default=1, metavar="N",
                    help="the campaign option --read-every: the judge's results read once "
                         "per N valid examples (default 1)")
    ap.add_argument("--reads-every", type=int, default=None, metavar="K",
                    help="read the fused judge's verdict on every K-th example only (a "
                         "measurement: the others pass unread)")
    args = ap.parse_args()
    if args.deal is not None and args.deal < args.jobs:
        ap.error("--deal must be at least --jobs")
    ctx = mp.get_context("spawn")
    out = tempfile.mkdtemp()
    hogs = 0 if args.hogs is None else (
        args.hog_count if args.hog_count is not None else max(0, 8 - args.jobs))
    start = ctx.Barrier(args.jobs + hogs + 1)
    census, stop = ctx.Barrier(2), ctx.Event()
    procs = [ctx.Process(target=_job, args=(i, args.jobs, args, out, start, census))
             for i in range(args.jobs)]
    hogged = [ctx.Process(target=_hog, args=(args.hogs, stop, start)) for _ in range(hogs)]
    for p in procs + hogged:
        p.start()
    start.wait()
    for p in procs[1:]:
        p.join()
    if args.device == "cuda" and not args.plain:
        census.wait()  # job 0 runs the census alone
    procs[0].join()
    stop.set()
    for p in hogged:
        p.join()
    examples = rows = 0
    allocator: collections.Counter[str] = collections.Counter()
    wall = 0.0  # the longest of the jobs' measured runs (they start together)
    for i in range(args.jobs):
        e, r, sec, *counts = open(f"{out}/job{i}.txt").read().split()
        examples, rows, wall = examples + int(e), rows + int(r), max(wall, float(sec))
        for k, c in zip(ALLOCATOR, counts, strict=True):
            allocator[k] += int(c)
    per = args.jobs * wall / max(1, examples) * 1e3
    beside = (f" beside {hogs} {args.hogs} hogs" if hogs else "") + (
        f" ({args.sched} waits)" if args.sched else "") + (
        f" (reads every {args.reads_every})" if args.reads_every else "") + (
        " (flight record)" if args.flight else "") + (
        " (no settle sync)" if args.no_settle_sync else "")
    print(f"{args.jobs} jobs{beside}, {wall:.1f} s: {examples} examples ({examples / wall:.0f}/s), "
          f"{rows} rows ({rows / wall:.0f}/s); {per:.1f} ms per example per job")
    if args.device == "cuda":  # what the caching allocator asked of the driver meanwhile
        print("  allocator, summed over the jobs: " + ", ".join(
            f"{k} {allocator[k]}" for k in ALLOCATOR))
    if os.path.exists(f"{out}/syncs.txt"):
        print(open(f"{out}/syncs.txt").read())
    if args.plain:
        return
    stats = pstats.Stats(*[f"{out}/job{i}.prof" for i in range(args.jobs)])
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
