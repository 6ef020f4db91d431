"""Compile census for ``benchmarks/paired.py --census``: imported at every Python start of
the measured command (this folder first on ``PYTHONPATH``), it times each Helion binding of
a new signature (``BoundKernel.__init__``), each Helion config's code generation
(``BoundKernel.compile_config``) and each Triton compile (``JITFunction._do_compile``) and each
garbage collection of the oldest generation (or any over 5 ms), and the marks of a
timeline: each Python start (``python``, its command line), the supervisor's start of the
jobs (``launch``), each job's campaign (``run``, with its first example's start and its
last example's end); it appends one line per event to ``$KDA_FUZZ_CENSUS/<pid>.log``:
kind, start (epoch s), seconds, key. Nothing of the tree under measurement is changed."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from typing import ClassVar

OUT = os.environ.get("KDA_FUZZ_CENSUS")


def _log(kind: str, t0: float, key: str) -> None:
    with open(f"{OUT}/{os.getpid()}.log", "a") as f:
        f.write(f"{kind}\t{t0:.3f}\t{time.time() - t0:.4f}\t{key}\n")


def _wrapped(fn, after):  # type: ignore[no-untyped-def]
    """``fn``, then ``after(start, args, kwargs)`` however it ended."""
    @functools.wraps(fn)
    def wrapper(*a, **k):  # type: ignore[no-untyped-def]
        t0 = time.time()
        try:
            return fn(*a, **k)
        finally:
            after(t0, a, k)
    return wrapper


def _timed(kind: str, fn, key_of):  # type: ignore[no-untyped-def]
    def log(t0, a, k):  # type: ignore[no-untyped-def]
        try:
            _log(kind, t0, key_of(*a, **k))
        except Exception as e:  # (a census never breaks the run)
            _log(kind, t0, f"?{type(e).__name__}")
    return _wrapped(fn, log)


def _signature(args) -> str:  # type: ignore[no-untyped-def]
    out = []
    for x in args:
        shape = getattr(x, "shape", None)
        out.append(f"{tuple(shape)}:{str(x.dtype)[6:]}:{x.stride()}" if shape is not None
                   else repr(x)[:20])
    return " ".join(out)


def _helion(module) -> None:  # type: ignore[no-untyped-def]
    bk = module.BoundKernel
    bk.__init__ = _timed("bind", bk.__init__, lambda self, kernel, args: _signature(args))
    bk.compile_config = _timed("config", bk.compile_config, lambda self, *a, **k: "")


def _triton(module) -> None:  # type: ignore[no-untyped-def]
    jf = module.JITFunction
    jf._do_compile = _timed("triton", jf._do_compile,
                            lambda self, key, *a, **k: f"{self.fn.__name__} {hash(str(key))}")


_examples = [0, 0.0, 0.0]  # examples run by this process, the first's start, the last's end


def _example(fn):  # type: ignore[no-untyped-def]
    def count(t0, a, k):  # type: ignore[no-untyped-def]
        _examples[0] += 1
        _examples[1] = _examples[1] or t0
        _examples[2] = time.time()
    return _wrapped(fn, count)


def _runner(module) -> None:  # type: ignore[no-untyped-def]
    c = module.Campaign
    for name in ("_run_one", "_example"):  # (this tree's, the 2026-11-30 tree's)
        if hasattr(c, name):
            setattr(c, name, _example(getattr(c, name)))
            break
    c.run = _timed("run", c.run, lambda *a, **k: "{} {:.3f} {:.3f}".format(*_examples))


def _supervisor(module) -> None:  # type: ignore[no-untyped-def]
    module.Supervisor.start = _timed("launch", module.Supervisor.start, lambda *a, **k: "")


# the command's stages before its jobs run (where a tree has them): stage:NAME marks
STAGES = {"kda_fuzz.cli": ("_choose", "_prepare_device", "_loaded", "_calibrated"),
          "kda_fuzz.campaign.spec": ("resolve",),
          "kda_fuzz.workers.process": ("start_fork_server", "start_fork_server_early",
                                       "import_later_preloads")}


def _stages(module) -> None:  # type: ignore[no-untyped-def]
    for name in STAGES[module.__name__]:
        if callable(getattr(module, name, None)):
            setattr(module, name, _timed(f"stage:{name}", getattr(module, name),
                                         lambda *a, **k: ""))


class _Finder(importlib.abc.MetaPathFinder):
    patches: ClassVar[dict] = {"helion.runtime.kernel": _helion, "triton.runtime.jit": _triton,
                               "kda_fuzz.campaign.runner": _runner, "kda_fuzz.runner": _runner,
                               "kda_fuzz.campaign.supervisor": _supervisor,
                               "kda_fuzz.parallel": _supervisor,
                               **{m: _stages for m in STAGES}}

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module, run=run, patch=self.patches[name]):  # type: ignore[no-untyped-def]
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _collections() -> None:
    """Log every garbage collection of generation 2, and any other over 5 ms."""
    import gc

    started = [0.0]

    def callback(phase: str, info: dict) -> None:  # type: ignore[type-arg]
        if phase == "start":
            started[0] = time.time()
        elif info["generation"] == 2 or time.time() - started[0] > 0.005:
            _log(f"gc{info['generation']}", started[0], f"{info['collected']} collected")

    gc.callbacks.append(callback)


if OUT:
    _log("python", time.time(), " ".join(getattr(sys, "orig_argv", sys.argv))[:160])
    sys.meta_path.insert(0, _Finder())
    _collections()
