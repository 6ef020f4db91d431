"""How processes sharing one GPU slow each other down: each runs loops of host work,
tiny kernel launches, copies from the host and host syncs; prints the loops/s of 1, 8 and
16 processes.

A campaign job's example is such a loop (Hypothesis and Python, building the case, the
judge's launches, its device reads); this separates what the host, the launches, the
copies and the syncs cost. The host work is a timed loop: what sharing the cores costs
(hyperthreads, caches) does not show here.

    python benchmarks/gpu_contention.py [--seconds 4] [--procs 1,8,16]
                                        [--mixes HOST_MS:KERNELS:SYNCS[:COPIES[:pin]],...]
                                        [--hog-mib M]

A mix's COPIES are non-blocking copies of 1 kB from pinned host memory before the kernels:
from one buffer pinned at the start, or with ``pin``, each from a tensor pinned for it
(``pin_memory()``, as a case built on the host was sent). With ``--hog-mib M`` one more
process, not counted, runs beside each measurement, looping a kernel over M MiB and a
sync, as a job in the scale stratum does with its large cases.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

import torch

# host milliseconds : kernels : syncs per loop (copies from the host none)
MIXES = "5:0:0,5:250:3,5:250:1,5:250:0,5:120:2"


def _busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += sum(i * i for i in range(200))


def _worker(host_ms: float, kernels: int, syncs: int, copies: int, pin: bool,
            seconds: float, out: Any, start: Any) -> None:
    x = torch.randn(64, 128, device="cuda", dtype=torch.float64)
    host = torch.randn(128, dtype=torch.float64).pin_memory()
    dst = [torch.empty(128, dtype=torch.float64, device="cuda") for _ in range(copies)]
    for _ in range(20):  # warm up the context and the kernels
        (x * 1.0).sum().item()
    start.wait()
    t0, loops = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        _busy(host_ms)
        for d in dst:
            d.copy_(torch.randn(128, dtype=torch.float64).pin_memory() if pin else host,
                    non_blocking=True)
        y = x
        for _ in range(kernels):
            y = y * 1.0001
        for _ in range(syncs):
            y.sum().item()
        loops += 1
    out.put(loops / (time.perf_counter() - t0))


def _hog(mib: int, stop: Any, start: Any) -> None:
    big = torch.ones(mib << 18, device="cuda")  # float32: M MiB
    (big * 1.0).sum().item()
    start.wait()
    while not stop.is_set():
        (big * 1.0001).sum().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--procs", default="1,8,16")
    ap.add_argument("--mixes", default=MIXES,
                    help="HOST_MS:KERNELS:SYNCS[:COPIES[:pin]] per loop, comma-separated")
    ap.add_argument("--hog-mib", type=int, default=0,
                    help="one more process looping a kernel over this many MiB (default 0: "
                         "none)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    print(f"{torch.cuda.get_device_name()}; loops/s summed over the processes"
          + (f"; beside them a process looping a kernel over {args.hog_mib} MiB"
             if args.hog_mib else ""))
    for mix in args.mixes.split(","):
        f = mix.split(":")
        host_ms, kernels, syncs = float(f[0]), int(f[1]), int(f[2])
        copies, pin = int(f[3]) if len(f) > 3 else 0, f[4:] == ["pin"]
        for n in map(int, args.procs.split(",")):
            hogs = 1 if args.hog_mib else 0
            out, start, stop = ctx.Queue(), ctx.Barrier(n + hogs + 1), ctx.Event()
            procs = [ctx.Process(target=_worker, args=(host_ms, kernels, syncs, copies, pin,
                                                       args.seconds, out, start))
                     for _ in range(n)]
            procs += [ctx.Process(target=_hog, args=(args.hog_mib, stop, start))
                      for _ in range(hogs)]
            for p in procs:
                p.start()
            start.wait()
            total = sum(out.get() for _ in range(n))
            stop.set()
            for p in procs:
                p.join()
            print(f"host {host_ms:g} ms, {kernels:3d} kernels, {syncs} syncs, {copies} copies"
                  f"{' (pinned each)' if pin else ''}, {n:2d} processes: "
                  f"{total:7.0f} loops/s ({1000 * n / total:6.2f} ms per loop and process)")


if __name__ == "__main__":
    main()
