"""Paired throughput: one fuzz command run on a baseline tree and on this tree alternately,
on one machine start, and the ratio of their rates with its spread.

Throughput varies up to 2x between starts of a GPU machine, so a speed claim compares
runs made side by side: round r runs the baseline, then this tree (the order flipped every
other round), each with empty Triton and Inductor caches, as a fresh machine has them.

    python benchmarks/paired.py --baseline REV | --baseline-dir DIR
                                [--rounds 2] [--seconds 60] [--device cuda]
                                [--args '--target M:F --contract helion ...'] [--keep DIR]
                                [--census]

``--baseline REV`` exports that revision of this repository (``git archive``) to a
temporary folder; ``--baseline-dir`` takes an exported tree (a machine without git). The
command is ``python -m kda_fuzz fuzz --device D --jobs auto --max-seconds S
--valid-share 1 --max-examples 10**7 --seed 1 --no-save --json`` plus ``--args``: the
default mode of ``benchmarks/gpu_throughput.py`` (``--args`` defaults to ``--contract
helion``: this repository configures both variants). Rates are over each command's wall time
(start-up, compiles and the wrap-up included); on cuda each run starts once no process of
the one before holds the GPU (up to a minute: a killed job's context takes a while to
go). Prints every run, then per round the ratio
this / baseline of examples/s and of verified rows/s, and their median and range.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def export(rev: str, into: Path) -> Path:
    """``rev`` of this repository as a plain tree under ``into``."""
    tree = into / f"baseline-{rev[:12]}"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(HERE), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def command(args: argparse.Namespace) -> list[str]:
    """The fuzz command of a paired run (``args``: device, jobs, seconds, ``--args``)."""
    return [sys.executable, "-m", "kda_fuzz", "fuzz", "--device", args.device, "--jobs",
            args.jobs, "--max-seconds", str(args.seconds), "--valid-share", "1",
            "--max-examples", str(10**7), "--seed", "1", "--no-save", "--json",
            *shlex.split(args.args)]


def fresh_caches(folder: str | Path) -> dict[str, str]:
    """The environment of a command whose Triton and Inductor caches start empty, in
    ``folder`` (as on a fresh machine)."""
    return {**os.environ, "TRITON_CACHE_DIR": f"{folder}/triton",
            "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor"}


def run(tree: Path, args: argparse.Namespace, census_into: Path | None = None
        ) -> dict[str, Any]:
    """One fuzz command in ``tree`` (its own ``kda_fuzz`` first on the path); with
    ``census_into``, the census's logs are copied there."""
    cmd = command(args)
    with tempfile.TemporaryDirectory() as cache:
        # the tree's own kernels package before any installed one (an editable install
        # of this repository maps kda_fuzz_kernels onto its own kernels/ folder)
        shim = Path(cache) / "shim"
        shim.mkdir()
        if (tree / "kernels").is_dir():
            (shim / "kda_fuzz_kernels").symlink_to(tree / "kernels")
        census = Path(cache) / "census"  # (its logs, with --census)
        env = {**fresh_caches(cache),
               "PYTHONPATH": os.pathsep.join(
                   [*([str(HERE / "benchmarks" / "census")] if args.census else []),
                    str(tree), str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])}
        if args.census:
            census.mkdir()
            env["KDA_FUZZ_CENSUS"] = str(census)
        t0, epoch = time.perf_counter(), time.time()
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        counted = count_compiles(census) if args.census else ""
        marks = timeline(census, epoch, wall) if args.census else ""
        if args.census and census_into is not None:
            shutil.copytree(census, census_into, dirs_exist_ok=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"{tree}: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    s = json.loads(r.stdout.strip().splitlines()[-1])
    return {"wall": wall, "examples": s["examples"], "rows": s.get("valid_rows", 0),
            "failures": s.get("failures", 0), "startup": s.get("startup_seconds", 0.0),
            "compiling": s.get("compiling_seconds", 0.0),
            "job_seconds": sum(s.get("stratum_seconds", {}).values()),
            "restarts": restarts(s),
            "strata": {k: (s.get("stratum_rows", {}).get(k, 0), v)
                       for k, v in s.get("stratum_seconds", {}).items()},
            "summary": s, "census": counted, "timeline": marks}


MARKS = ("python", "launch", "run")  # the census's timeline marks (not compiles)


def count_compiles(folder: Path) -> str:
    """The census of one run (``benchmarks/census/sitecustomize.py``'s logs), in words:
    per kind of compile, how many, in how many processes, their seconds, and the distinct
    signatures Helion bound per process."""
    kinds: dict[str, list[float]] = {}
    pids: dict[str, set[str]] = {}
    keys: dict[str, set[str]] = {}
    for pid, events in _events(folder).items():
        for kind, _, seconds, key in events:
            if kind in MARKS or kind.startswith("stage:"):
                continue
            kinds.setdefault(kind, []).append(seconds)
            pids.setdefault(kind, set()).add(pid)
            if kind == "bind":
                keys.setdefault(pid, set()).add(key)
    distinct = [len(k) for k in keys.values()]
    return "; ".join(
        f"{kind} {len(xs)} in {len(pids[kind])} process(es), {sum(xs):.1f} s"
        + (f" (max {max(xs):.1f} s)" if xs else "") for kind, xs in sorted(kinds.items())
    ) + (f"; distinct signatures bound per process: {sorted(distinct)}" if distinct else "")


def _events(folder: Path) -> dict[str, list[tuple[str, float, float, str]]]:
    """Each process's census events (pid -> kind, start, seconds, key)."""
    out: dict[str, list[tuple[str, float, float, str]]] = {}
    for log in folder.glob("*.log"):
        for line in log.read_text().splitlines():
            kind, t0, seconds, key = [*line.split("\t"), "", "", "", ""][:4]
            out.setdefault(log.stem, []).append((kind, float(t0 or 0), float(seconds or 0),
                                                 key))
    return out


def timeline(folder: Path, start: float, wall: float) -> str:
    """Where the wall time of one run went, in seconds from the command's start (the census's
    marks): the fork server's start, the jobs' launch, and per job (min / median / max)
    its campaign's start, first and last example, end, and its compiles' seconds before its
    first example and during its examples."""
    events = _events(folder)
    if not events:
        return ""

    def spread(xs: list[float]) -> str:
        return (f"{min(xs):.1f}/{statistics.median(xs):.1f}/{max(xs):.1f}" if xs else "-")

    server = [t for evs in events.values() for k, t, _, key in evs
              if k == "python" and "forkserver" in key]
    launch = [t for evs in events.values() for k, t, _, _ in evs if k == "launch"]
    begin, first, last, end, before, during, n = [], [], [], [], [], [], []
    for evs in events.values():
        runs = [(t, s, key.split()) for k, t, s, key in evs if k == "run"]
        if not runs:
            continue
        t, s, key = runs[-1]
        count, a, b = (int(key[0]), float(key[1]), float(key[2])) if len(key) == 3 else (0, 0, 0)
        begin.append(t - start)
        end.append(t + s - start)
        n.append(count)
        if count:
            first.append(a - start)
            last.append(b - start)
        compiles = [(t0, sec) for k, t0, sec, _ in evs if k in ("bind", "config", "triton")]
        before.append(sum(sec for t0, sec in compiles if not count or t0 < a))
        during.append(sum(sec for t0, sec in compiles if count and t0 >= a))
    stages = sorted((t - start, s, k[6:]) for evs in events.values()
                    for k, t, s, _ in evs if k.startswith("stage:"))
    return ("stages " + ", ".join(f"{k} {t:.1f}+{s:.1f}" for t, s, k in stages) + "; "
            f"server {spread([t - start for t in server])}, launch "
            f"{spread([t - start for t in launch])}; per job (min/median/max of {len(n)}): "
            f"campaign {spread(begin)}, first example {spread(first)}, last example end "
            f"{spread(last)}, campaign end {spread(end)} (command {wall:.1f}); compiles "
            f"before the first example {spread(before)} s, during the examples "
            f"{spread(during)} s; examples {spread([float(x) for x in n])}")


def restarts(summary: dict[str, Any]) -> int:
    """The job restarts of a run (after a crash or hang: each pays the imports and every
    compile again), from its summary (or, of older trees, its notes)."""
    n = summary.get("timeout", {}).get("restarts")
    if n is not None:
        return int(n)
    for note in summary.get("notes", []):
        m = re.match(r"(\d+) job restart", note)
        if m:
            return int(m.group(1))
    return 0


def _leftovers() -> tuple[int, int]:
    """Processes (other than this one) holding the GPU, and the MiB they hold
    (``nvidia-smi``; (0, 0) where there is none)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0, 0
    rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
    rows = [r for r in rows if r[0].strip() != str(os.getpid())]
    return len(rows), sum(int(r[1]) for r in rows if len(r) > 1 and r[1].strip().isdigit())


def settle(limit: float = 60.0) -> str:
    """Wait (up to ``limit`` seconds) until no process of an earlier run holds the GPU, so
    that a run's exiting jobs do not slow the next; what was waited for, in words."""
    t0 = time.monotonic()
    first = _leftovers()
    while _leftovers()[0] and time.monotonic() - t0 < limit:
        time.sleep(0.5)
    left = _leftovers()
    return (f"waited {time.monotonic() - t0:.1f} s for {first[0]} process(es) holding "
            f"{first[1]:,} MiB" + (f"; still {left[0]} ({left[1]:,} MiB)" if left[0] else "")
            if first[0] else "GPU free")


def warm_up(args: argparse.Namespace) -> None:
    """The ``--warm-up`` run: this tree's command once, its figures printed, not counted."""
    seconds = args.warm_up if args.warm_up is not None else (
        15.0 if args.device.startswith("cuda") else 0.0)
    if seconds <= 0:
        return
    try:
        got = run(HERE, argparse.Namespace(**{**vars(args), "seconds": seconds,
                                               "census": False}))
    except SystemExit as e:  # e.g. exit 2: its start-up outlasted its clock (a cold machine)
        print(f"warm-up (not counted): {str(e).splitlines()[0]}", flush=True)
        return
    print(f"warm-up (not counted): {got['examples']} examples in {got['wall']:.1f} s "
          f"({got['examples'] / got['wall']:.1f}/s)", flush=True)


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return (f"median {statistics.median(xs):.2f}x (range {min(xs):.2f}-{max(xs):.2f}, "
            f"{len(xs)} round(s))")


def arguments(doc: str | None, *, baseline_required: bool, rounds: int, seconds: float,
              keep: str) -> argparse.ArgumentParser:
    """The options of a paired run (the baseline, rounds, seconds, device, jobs, the
    command's extra ``--args``, ``--keep``), shared with the scripts built on this one."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    base = ap.add_mutually_exclusive_group(required=baseline_required)
    base.add_argument("--baseline", metavar="REV", help="a revision of this repository")
    base.add_argument("--baseline-dir", metavar="DIR", help="an exported baseline tree")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--seconds", type=float, default=seconds)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", default="auto")
    ap.add_argument("--args", default="--contract helion",
                    help="more arguments for both commands (default: --contract helion)")
    ap.add_argument("--keep", metavar="DIR", help=keep)
    ap.add_argument("--warm-up", type=float, default=None, metavar="S",
                    help="first run this tree's command for S seconds, not counted: the first "
                         "run of a GPU machine's start was the slowest of its start, 200 "
                         "against 460 examples/s once (default: 15 on cuda, 0 elsewhere)")
    ap.add_argument("--census", action="store_true",
                    help="count and time every Helion binding and config compile and every "
                         "Triton compile of each run (benchmarks/census/sitecustomize.py)")
    return ap


def bytecode_state() -> str:
    """Whether torch comes with its bytecode here, in words (without it, each process
    compiles torch's and helion's sources as it imports them, unless a tree keeps what it
    compiled: ``kda_fuzz.workers.bytecode``)."""
    from kda_fuzz.workers.bytecode import default_folder, needs_keeping

    if not needs_keeping():
        return "installed"
    return (f"none installed: a tree with kda_fuzz/workers/bytecode.py keeps what it "
            f"compiles under {default_folder()}, one without compiles torch from sources")


def main() -> None:
    args = arguments(__doc__, baseline_required=True, rounds=2, seconds=60.0,
                     keep="write each run's JSON summary there (with --census, its logs "
                          "too)").parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = (Path(args.baseline_dir).resolve() if args.baseline_dir
                    else export(args.baseline, Path(tmp)))
        trees = {"baseline": baseline, "this": HERE}
        print(f"baseline {baseline}; this tree {HERE}; {args.rounds} round(s) of "
              f"{args.seconds:g} s on {args.device}, --jobs {args.jobs} {args.args}".rstrip())
        print(f"torch's bytecode: {bytecode_state()}")
        print(f"{'round':>5} {'tree':9} {'wall s':>7} {'examples':>9} {'ex/s':>8} "
              f"{'rows/s':>11} {'start-up s':>10} {'compiling s':>11} {'job-s':>6} "
              "restarts failures")
        warm_up(args)
        results: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
        for r in range(args.rounds):
            order = ["baseline", "this"] if r % 2 == 0 else ["this", "baseline"]
            for name in order:
                before = settle() if args.device.startswith("cuda") else ""
                got = run(trees[name], args, Path(args.keep) / f"census-round{r + 1}-{name}"
                          if args.keep else None)
                results[name].append(got)
                print(f"{r + 1:5d} {name:9} {got['wall']:7.1f} {got['examples']:9d} "
                      f"{got['examples'] / got['wall']:8.1f} {got['rows'] / got['wall']:11,.0f} "
                      f"{got['startup']:10.1f} {got['compiling']:11.1f} "
                      f"{got['job_seconds']:6.0f} {got['restarts']:8d} {got['failures']}",
                      flush=True)
                if before:
                    print(f"      before it: {before}")
                if got["census"]:
                    print(f"      compiles: {got['census']}")
                if got["timeline"]:
                    print(f"      timeline (s from the command's start): {got['timeline']}")
                print("      strata (rows, job-s): " + ", ".join(
                    f"{k} {n:,} rows {sec:.0f} s" for k, (n, sec) in got["strata"].items()))
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    (Path(args.keep) / f"round{r + 1}-{name}.json").write_text(
                        json.dumps(got["summary"], indent=1, default=str))
        ex = [t["examples"] / t["wall"] / max(1e-9, b["examples"] / b["wall"])
              for b, t in zip(results["baseline"], results["this"])]
        rows = [t["rows"] / t["wall"] / max(1e-9, b["rows"] / b["wall"])
                for b, t in zip(results["baseline"], results["this"])]
        print(f"this / baseline examples/s: {_spread(ex)}")
        print(f"this / baseline verified rows/s: {_spread(rows)}")


if __name__ == "__main__":
    main()
