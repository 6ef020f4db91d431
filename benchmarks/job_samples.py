"""Where the jobs of a plain CLI campaign spend their wall time, old tree and new side by
side, without cProfile's distortion (it slows Python-heavy compiles several times over).

Each job process of ``kda-fuzz fuzz`` (the isolated default) samples its own Python stack
every 5 ms of wall time (``SIGALRM``); the samples of all jobs are merged and printed as
shares of the jobs' sampled time: inclusive for the frames that say what a job does
(drawing, building, the target call, Helion's ``bind``, Triton's compile, judging), and
the frames with the most self time, and how many bound kernels (new specializations)
Helion made per job, of how many keys. The trees (a copy of this one, and a baseline revision
or exported tree) get one line patched in their job body (the ``rep = c.run()`` of the
job process) and run alternately with :mod:`paired`'s command, as ``paired.py`` does.

    python benchmarks/job_samples.py [--baseline REV | --baseline-dir DIR] [--rounds 1]
                                     [--seconds 40] [--device cuda] [--jobs auto]
                                     [--args '--contract helion'] [--top 25] [--every S]
                                     [--keep DIR]

The sampling has a cost of its own (on the H200 the sampled baseline ran a third of the
examples of unsampled runs on other machine starts): compare sampled runs with each
other, not with unsampled ones; ``--every S`` samples less often. Each job writes its
samples now and then and at its end, so a job killed at the deadline in the middle of an
example keeps all but the last of them.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EVERY = 0.005  # seconds of wall time between samples
JOB_BODY = "            rep = c.run()\n"
_self: collections.Counter[str] = collections.Counter()
_incl: collections.Counter[str] = collections.Counter()
_taken = [0, 0.0]  # samples, start
_job: dict[str, Any] = {}  # where this job writes its samples, and its campaign
WRITE_EVERY = 1.0  # seconds between writes (a job killed at the deadline keeps the last)
_binds: collections.Counter[str] = collections.Counter()  # Helion BoundKernels made, by key
_bind_seconds: collections.Counter[str] = collections.Counter()  # their construction time

# frames that say what a job is doing (inclusive shares): "file tail:function"
PHASES = {
    "draw (Hypothesis and the strategies)": ("control.py:prep_args_kwargs_from_strategies",),
    "build a case": ("layouts.py:build", "kda_layouts.py:build", "scale.py:build_scale",
                     "kda_scale.py:build_scale"),
    # (launch_case: run_case's body and the campaign's call; finish: a verdict read late)
    "judge (oracle: target call, reference, checks)": ("oracle.py:launch_case",
                                                       "runner.py:finish"),
    "target call": ("kda_decode/helion_kernel.py:helion_fused_recurrent_kda_packed_decode",
                    "kda_decode/triton_kernel.py:fused_recurrent_kda_packed_decode",
                    "kda_decode/reference.py:reference_kda_packed_decode"),
    "Helion bind (a new specialization)": ("runtime/kernel.py:bind",),
    "Triton compile": ("runtime/jit.py:_do_compile",),
    "compile subprocesses (ptxas, cc)": ("subprocess.py:_try_wait",),
    "batch invariance": ("runner.py:_batch_invariance",),
    "Hypothesis mutations": ("conjecture/engine.py:generate_mutations_from",),
    "in the campaign loop": ("campaign/runner.py:run",),
    "Hypothesis run (draw, build, test and its own work)": ("conjecture/engine.py:run",),
    "draw a layout": ("kda/layouts.py:layouts", "gdn/layouts.py:layouts"),
    "the example (runner._example, _settle)": ("campaign/runner.py:_example",
                                               "campaign/runner.py:_settle"),
    "expectation (the contract's checks)": ("engine/oracle.py:expectation",),
    "materialize (the call's copies)": ("engine/case.py:materialize",),
    "the contract's judge": ("packed/judge.py:judge",),
    "fused judge's read": ("packed/judge.py:_fused_read",),
    "settle (device sync after the judge)": ("campaign/supervisor.py:settle",),
    "report.record": ("campaign/results.py:record",),
}
# (a phase's keys never nest in one stack: their inclusive counts are summed)


def _key(code: Any) -> str:
    return "/".join(code.co_filename.split("/")[-2:]) + ":" + code.co_name


def _on_alarm(_sig: int, frame: Any) -> None:
    _taken[0] += 1
    if time.monotonic() - _job.get("written", 0.0) >= WRITE_EVERY:
        _write()
    if frame is None:
        return
    _self[_key(frame.f_code)] += 1
    seen: set[str] = set()
    while frame is not None:
        k = _key(frame.f_code)
        if k not in seen:
            seen.add(k)
            _incl[k] += 1
        frame = frame.f_back


def _count_binds() -> None:
    """Count every ``BoundKernel`` Helion makes (a new specialization: traced, compiled),
    by the kernel's name and its base specialization key (when Helion is imported)."""
    module = sys.modules.get("helion.runtime.kernel")
    bound = getattr(module, "BoundKernel", None)
    if bound is None or getattr(bound.__init__, "_counted", False):
        return
    made = bound.__init__
    # (not kda_fuzz.execution.patching.wrap_once: this runs in baseline trees too, which
    # may not have it)

    def counted(self: Any, kernel: Any, args: Any, *rest: Any, **kw: Any) -> None:
        try:
            key = repr(kernel._base_specialization_key(args))
        except Exception as e:  # (a Helion without it: the kernel's name alone)
            key = f"? {type(e).__name__}"
        name = f"{getattr(kernel, 'name', '?')} {key}"
        _binds[name] += 1
        t0 = time.monotonic()
        try:
            made(self, kernel, args, *rest, **kw)
        finally:
            _bind_seconds[name] += time.monotonic() - t0

    counted._counted = True  # type: ignore[attr-defined]
    bound.__init__ = counted


def start(path: str, campaign: Any) -> None:
    """Sample this process's main thread from now on, written to ``path`` (JSON) now and
    then and at ``stop`` (called by the patched job body, ``campaign`` the job's)."""
    _job.update(path=path, campaign=campaign)
    _count_binds()
    _taken[1] = time.monotonic()
    signal.signal(signal.SIGALRM, _on_alarm)
    every = float(os.environ.get("KDA_FUZZ_SAMPLE_EVERY") or EVERY)
    signal.setitimer(signal.ITIMER_REAL, every, every)


def stop() -> None:
    """Stop sampling; write what was taken."""
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    _write()


def _write() -> None:
    _job["written"] = time.monotonic()
    examples = _job["campaign"].report.examples
    tmp = Path(_job["path"] + ".part")
    tmp.write_text(json.dumps({
        "samples": _taken[0], "seconds": time.monotonic() - _taken[1], "examples": examples,
        "binds": sum(_binds.values()), "bind_keys": len(_binds),
        "bind_repeats": sum(n - 1 for n in _binds.values()),
        "bind_seconds": sum(_bind_seconds.values()),
        "keys": [(k, n, round(_bind_seconds[k], 3)) for k, n in _binds.most_common(100)],
        "self": _self.most_common(500), "incl": _incl.most_common(3000)}))
    tmp.replace(_job["path"])  # (a job killed while writing leaves the last whole file)


def patched_copy(tree: Path, into: Path) -> Path:
    """A copy of ``tree`` whose job body samples itself into ``$KDA_FUZZ_SAMPLES``."""
    out = into / tree.name
    shutil.copytree(tree, out, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".whl", ".tox", "__pycache__", ".hypothesis", "fuzz-out"))
    bodies = [p for p in (out / "kda_fuzz").rglob("*.py") if JOB_BODY in p.read_text()]
    if len(bodies) != 1:
        raise SystemExit(f"{tree}: {len(bodies)} job bodies ({JOB_BODY.strip()!r}) found, "
                         "expected one")
    hook = ("            import os as _o, sys as _s\n"
            "            _s.path.insert(0, _o.environ['KDA_FUZZ_SAMPLER'])\n"
            "            import job_samples as _js\n"
            "            _js.start(f\"{_o.environ['KDA_FUZZ_SAMPLES']}/job{job.index}-"
            "{_o.getpid()}.json\", c)\n"
            "            try:\n"
            "                rep = c.run()\n"
            "            finally:\n"
            "                _js.stop()\n")
    bodies[0].write_text(bodies[0].read_text().replace(JOB_BODY, hook))
    return out


def merged(folder: Path) -> dict[str, Any]:
    """The samples of every job that wrote them."""
    s: collections.Counter[str] = collections.Counter()
    i: collections.Counter[str] = collections.Counter()
    out = {"jobs": 0, "samples": 0, "seconds": 0.0, "examples": 0, "binds": 0,
           "bind_keys": 0, "bind_repeats": 0, "bind_seconds": 0.0}
    per_job: list[dict[str, Any]] = []
    for p in sorted(folder.glob("*.json")):
        j = json.loads(p.read_text())
        out["jobs"] += 1
        for k in out.keys() - {"jobs"}:
            out[k] += j.get(k, 0)
        per_job.append({"job": p.stem, **{k: j.get(k) for k in (
            "seconds", "examples", "binds", "bind_seconds", "keys")}})
        s.update(dict(j["self"]))
        i.update(dict(j["incl"]))
    return {**out, "per_job": per_job, "self": s, "incl": i}


def phases(m: dict[str, Any]) -> dict[str, float]:
    """Inclusive share of the sampled time per phase."""
    n = max(1, m["samples"])
    return {name: sum(v for k, v in m["incl"].items() if k.endswith(keys)) / n
            for name, keys in PHASES.items()}


def main() -> None:
    import paired  # (this script's folder is on sys.path)

    ap = paired.arguments(__doc__, baseline_required=False, rounds=1, seconds=40.0,
                          keep="write each run's merged samples there")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--every", type=float, default=EVERY, metavar="S",
                    help=f"seconds of wall time between samples (default {EVERY:g})")
    args = ap.parse_args()
    os.environ["KDA_FUZZ_SAMPLE_EVERY"] = str(args.every)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        trees = {"this": patched_copy(paired.HERE, t / "this")}
        if args.baseline or args.baseline_dir:
            src = (Path(args.baseline_dir).resolve() if args.baseline_dir
                   else paired.export(args.baseline, t / "export"))
            trees = {"baseline": patched_copy(src, t / "baseline"), **trees}
        os.environ["KDA_FUZZ_SAMPLER"] = str(Path(__file__).resolve().parent)
        paired.warm_up(args)  # (unsampled)
        table: dict[str, list[dict[str, float]]] = {n: [] for n in trees}
        for r in range(args.rounds):
            names = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in names:
                folder = t / f"samples-{r}-{name}"
                folder.mkdir()
                os.environ["KDA_FUZZ_SAMPLES"] = str(folder)
                if args.device.startswith("cuda"):
                    paired.settle()
                got = paired.run(trees[name], args)
                m = merged(folder)
                share = phases(m)
                table[name].append(share)
                per = m["seconds"] / max(1, m["examples"]) * 1e3
                print(f"round {r + 1} {name}: {got['examples']} examples in {got['wall']:.1f} s "
                      f"wall; {m['jobs']} job(s) sampled: {m['examples']} examples in "
                      f"{m['seconds']:.0f} job-s ({per:.1f} ms per example per job); "
                      f"Helion made {m['binds']} bound kernel(s) of {m['bind_keys']} key(s) "
                      f"per job summed ({m['bind_repeats']} again for a key it had), "
                      f"{m['bind_seconds']:.0f} job-s making them")
                for j in m["per_job"]:
                    print(f"   {j['job']}: {j['examples']} examples in {j['seconds'] or 0:.0f} s, "
                          f"{j['binds']} bound kernel(s) in {j['bind_seconds'] or 0:.1f} s")
                for phase, x in share.items():
                    print(f"   {x * 100:5.1f} %  {phase}")
                print("   most self time:")
                for k, v in m["self"].most_common(args.top):
                    print(f"   {v / max(1, m['samples']) * 100:5.1f} %  {k}")
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    (Path(args.keep) / f"round{r + 1}-{name}.json").write_text(json.dumps(
                        {**{k: v for k, v in m.items() if k not in ("self", "incl")},
                         "self": m["self"].most_common(500),
                         "incl": m["incl"].most_common(3000)}))
        if len(trees) > 1:
            print("median share per phase, " + " / ".join(trees) + ":")
            for phase in PHASES:
                cells = [sorted(s[phase] for s in table[n])[len(table[n]) // 2] * 100
                         for n in trees]
                print(f"   {phase}: " + " / ".join(f"{c:.1f} %" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
