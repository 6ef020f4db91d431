"""This repository's own test sessions: under xdist (``pytest -n auto``), each worker's torch
ops get the worker's share of the cores, not all of them.

Every worker (and every process a test starts: ``kda-fuzz`` commands, pytest sessions,
their campaign jobs) would otherwise run torch's intra-op pool on every core; with as many
workers as cores that is several spinning threads per core, and a default-sized campaign
took 140-200 s instead of 15-25 s on the loaded 2-core machine (two at once). An
``OMP_NUM_THREADS`` of the caller's is kept.
"""

from __future__ import annotations

import os


def _share() -> int | None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or not workers.isdigit() or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


SHARE = _share()
if SHARE is not None:
    os.environ["OMP_NUM_THREADS"] = str(SHARE)  # this worker's children, before they start


def pytest_configure(config: object) -> None:
    if SHARE is not None:
        import torch

        torch.set_num_threads(SHARE)
