"""The ``kda-fuzz`` command line: fuzz campaigns, corpus replay, merge and show."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from kda_fuzz.campaign.spec import CampaignOptions, UsageError, shard_of
from kda_fuzz.names import BUILTINS, DEFAULT_FAMILY, FAMILIES, SOLE_VARIANT, VARIANTS, label
from kda_fuzz.workers.deadline import Deadline, Watchdog

# Nothing heavy (torch, the contracts, the kernels) is imported above this line or before
# the arguments are parsed and checked: a usage error or --help answers at once.


def _process_started() -> float:
    """When this process started, on the ``time.monotonic()`` clock: the interpreter's own
    start and its imports (torch: seconds) count against ``--max-seconds`` too. Linux
    only (``/proc``); elsewhere, now."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0 <= age < 3600 else now  # (a suspended machine: not the age)


EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """\
Differential fuzzing and regression tests for packed KDA/GDN decode kernels.
Run `kda-fuzz COMMAND --help` for a command's options and examples.

Exit status: 0 nothing found, 1 a failure (or a bad corpus file), 2 a usage error, an
environment error, a failure of kda-fuzz's own machinery or no example judged before
--max-seconds ran out (never a verdict on the kernel).
Terms (hole, stratum, variant, family, ...): see the glossary in docs/user-guide.md."""

FUZZ_EXAMPLES = """\
examples:
  kda-fuzz fuzz                                    # the project's configured targets
  kda-fuzz fuzz --target mypkg.decode:kernel --contract triton --max-examples 1000
  kda-fuzz fuzz --family gdn --device cuda --max-seconds 600 --report out/

terms: a *family* is a kernel contract (kda, gdn); a *variant* one of its contracts
(helion, triton); a *stratum* a share of the plan (valid layouts, each breakage, the
GPU-scale stratum of very large launches); a *hole* a broken layout the documented
checks let through. See the glossary in docs/user-guide.md."""

REPLAY_EXAMPLES = """\
examples:
  kda-fuzz replay corpus                            # each file under its own family
  kda-fuzz replay --target mypkg.decode:kernel --contract triton corpus/found
  kda-fuzz replay --verbose --json corpus/contract-aa883986dd44afc4.json"""

SHOW_EXAMPLES = """\
examples:
  kda-fuzz show corpus/contract-aa883986dd44afc4.json
  kda-fuzz show --python corpus/found/mismatch-0123456789abcdef.json > repro.py"""


class _Deprecated(argparse.Action):
    """An old option name: stores into the new one's destination and says so."""

    def __init__(self, *args: Any, new: str = "", **kw: Any) -> None:
        self.new = new
        super().__init__(*args, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"kda-fuzz: {option_string} is deprecated: use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _targets_group(p: argparse.ArgumentParser, replay: bool) -> argparse._ArgumentGroup:
    g = p.add_argument_group("targets")
    g.add_argument("--target", action="append", metavar="MODULE:CALLABLE",
                   help="callable under test, with the contract's signature (repeatable; "
                        "default: the targets of [tool.kda-fuzz.targets.FAMILY] in the "
                        "project's pyproject.toml, else kda-fuzz's own kernels)")
    g.add_argument("--family", default=None, metavar="FAMILY",
                   help=f"kernel family: {', '.join(FAMILIES)} or one of the project's "
                        "[tool.kda-fuzz] families (default: "
                        + ("each file's own" if replay else
                           "[tool.kda-fuzz] family, else the one the project configures "
                           f"targets for, else {DEFAULT_FAMILY}") + ")")
    g.add_argument("--contract", default=None, metavar="VARIANT",
                   help="contract variant, {" + ",".join(VARIANTS) + "} (kda: helion = "
                        "checks 1-22, triton = no check 14; gdn: triton = the documented "
                        "checks, helion = plus power-of-two K and V), or one a project's "
                        "family declares (one that declares none takes no --contract); "
                        "default: "
                        + ("each file's own variant" if replay else
                           "the one the project configures targets for (several: say "
                           "which), else the family's first (kda: helion, gdn: triton)"))
    return g


def _output_group(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true",
                   help="print one JSON summary object as the last line of stdout")
    return g


def _device(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--device", default="cpu", metavar="cpu|cuda[:N]",
                   help="device the cases run on (default: cpu)")


def _family_knobs(given: Sequence[Any] | None = None) -> list[Any]:
    """Each option the families declare (:class:`~kda_fuzz.engine.knobs.Knob`; one per
    flag, the first declaration's): the built-in families', then the project's
    ``family_options`` and the ``kda_fuzz.family_options`` entry points (``given``: these
    ``Knobs`` instead). Imports no contract."""
    from kda_fuzz.families import family_options

    if given is None:
        try:
            extra = _config().family_options
        except UsageError:  # a bad configuration: said by the command that reads it
            extra = ()
        try:
            given = family_options(extra)
        except ValueError as e:
            raise UsageError(str(e)) from None
    out: dict[str, Any] = {}
    for knobs in given:
        for k in knobs.options:
            out.setdefault(k.flag, k)
    return list(out.values())


def _option_owners() -> dict[str, tuple[str, ...]]:
    """Flag -> the families that take it (the built-in ones', and those of the project's
    ``family_options`` table); imports no contract."""
    from kda_fuzz.families import option_owners

    try:
        named = _config().options_of
    except UsageError:  # a bad configuration: said by the command that reads it
        named = {}
    try:
        return option_owners(named)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _whose(owners: Sequence[str]) -> str:
    return f"family {owners[0]}" if len(owners) == 1 else f"families {', '.join(owners)}"


def _add_knobs(group: argparse._ArgumentGroup, knobs: Sequence[Any], name: str,
               owners: dict[str, tuple[str, ...]]) -> None:
    """The options of ``knobs`` in the group ``name``, each saying the families that take
    it; a value not given is left out of the namespace (so that one given to a family
    that does not take it can be told: :func:`_check_family_options`)."""
    for k in knobs:
        if k.group != name:
            continue
        whose = owners.get(k.flag)
        text = f"{k.help} [{_whose(whose)} only]" if whose else f"{k.help} [a project family's]"
        if k.type is None:  # a switch
            group.add_argument(k.flag, dest=k.dest, action="store_true",
                               default=argparse.SUPPRESS, help=text)
        else:
            group.add_argument(k.flag, dest=k.dest, type=k.type, default=argparse.SUPPRESS,
                               metavar=k.metavar, help=text)


def _check_family_options(args: argparse.Namespace) -> None:
    """A usage error for a family option given that the chosen family does not take."""
    from kda_fuzz.families import knobs_of

    try:
        mine = {k.flag for k in knobs_of(args.family).options}
    except ValueError as e:
        raise UsageError(str(e)) from None
    given = [k.flag for k in _family_knobs() if k.flag not in mine and hasattr(args, k.dest)]
    if given:
        whose = _option_owners().get(given[0])
        raise UsageError(f"family {args.family!r} takes no option {given[0]} (its own: "
                         f"{', '.join(sorted(mine)) or 'none'})"
                         + (f"; {given[0]} is of {_whose(whose)}" if whose else ""))


def _fuzz_parser(sub: Any, knobs: Sequence[Any] | None = None) -> None:
    f = sub.add_parser("fuzz", help="run a fuzz campaign against a target",
                       description="Run a fuzz campaign: valid layouts held to the reference,\n"
                                   "broken layouts held to the contract's checks.",
                       epilog=FUZZ_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    t = _targets_group(f, replay=False)
    t.add_argument("--peer", action="append", metavar="MODULE:CALLABLE",
                   help="peer mode: also judge this implementation and compare the first "
                        "target's outputs with it on every accepted layout (repeatable)")
    t.add_argument("--messages", choices=("exact", "class"), default="exact",
                   help="exact (default): a broken layout must raise the contract's "
                        "exception with the documented message of the first failing check; "
                        "class: any message of the right exception type passes and wording "
                        "differences are only counted (check order cannot be judged then)")
    t.add_argument("--strict", action="store_true",
                   help="hold targets to the hardened contract: degenerate layouts that the "
                        "documented checks let through (holes: HV = 0, V = 0) must raise too")
    t.add_argument("--invariance", choices=("tolerance", "bitwise", "off"), default="tolerance",
                   help="batch invariance: one valid example in 16 re-runs its rows in "
                        "another batch of the same shapes (kda, gdn: a row among padding "
                        "rows, or the rows reversed, in turn), judged against the reference "
                        "(tolerance, the default); bitwise: all of them and a batch of one "
                        "row too, each of which must equal the "
                        "whole batch's rows bit for bit (what deterministic serving asks; the "
                        "contract does not)")
    c = f.add_argument_group("campaign")
    c.add_argument("--max-examples", type=int, metavar="N", default=300,
                   help="examples in the campaign (default 300); every stratum takes "
                        "its turns from the start, in proportion to its share; with "
                        "--max-seconds, the plan whose rounds repeat until the time is up")
    c.add_argument("--seed", type=int, metavar="N", default=None,
                   help="seed for a reproducible campaign")
    c.add_argument("--max-seconds", type=float, metavar="S", default=None,
                   help="the command's wall time from the process's start (start-up, "
                        "campaign, minimization and saving share it): it ends within "
                        "max(5 s, 5 %%) of it, every "
                        "confirmed failure saved (unminimized, and marked so, where "
                        "minimization was cut short; default: none)")
    c.add_argument("--max-failures", type=int, default=20, metavar="N",
                   help="stop after N distinct failures (default 20): one per root cause "
                        "(what the target raised, with numbers masked, or which outputs it "
                        "got wrong); repeats of a known failure are counted, not kept")
    c.add_argument("--valid-share", type=float, metavar="X", default=0.5,
                   help="share of examples spent on valid layouts (default 0.5); the rest "
                        "go to the breakage strata")
    c.add_argument("--shrink-seconds", type=float, metavar="S", default=30.0,
                   help="time allowed to minimize each distinct failure (default 30)")
    c.add_argument("--shard", default=None, metavar="I/N",
                   help="run shard I of N of the campaign: N shards of --max-examples each "
                        "split one campaign of N times the examples (same --seed, default "
                        "0, and options), each example run by exactly one shard")
    c.add_argument("--example-db", default=None, metavar="URL",
                   help="shared example database: redis://host:port/db or a folder "
                        "(default: example_db of [tool.kda-fuzz]); its stored failures are "
                        "replayed first, this run's new ones stored")
    c.add_argument("--layout", action="append", default=[], metavar="SPEC|NAME",
                   help="pin a layout the deployment serves, e.g. 'H=16,HV=32,K=128,V=128,"
                        "state=bfloat16' ('|' lists values: 'B=1|8|64'), or the NAME of a "
                        "preset in [tool.kda-fuzz.layouts] (repeatable); --layout-share of "
                        "the valid examples go to the pins (all else drawn around them), "
                        "the rest to the whole space")
    c.add_argument("--layout-share", type=float, metavar="X", default=0.75,
                   help="share of the valid examples spent on --layout pins (default 0.75)")
    c.add_argument("--seed-layouts", action="append", default=[], metavar="DIR|FILE",
                   help="corpus files (a folder's *.json, recursively) whose cases run first, "
                        "as they are, before any draw (a seed corpus: e.g. your corpus "
                        "folder); files of another family are left out; repeatable")
    t.add_argument("--unsupported", action="append", default=[],
                   metavar="FEATURE|FIELD=VALUE",
                   help="what the targets do not support, never drawn for them: a feature "
                        "(kda: the gate's lower bound, strides, padding, l2norm) or one "
                        "value (state=float16, "
                        "indices=int64, l2norm=False); repeatable; also from a target's "
                        "kda_fuzz_unsupported attribute and [tool.kda-fuzz.unsupported]")
    knobs = _family_knobs(knobs)
    owners = _option_owners()
    groups = {"sizes": f.add_argument_group("sizes")}  # the families' own options
    _add_knobs(groups["sizes"], knobs, "sizes", owners)
    g = groups["GPU"] = f.add_argument_group("GPU")
    _device(g)
    g.add_argument("--compile-groups", dest="families", type=int, default=None, metavar="N",
                   help="spend valid examples in N groups of one fixed shape, dtype and "
                        "strides each, so a kernel compiles once per group (default: 8 on "
                        "cuda, 0 = every example drawn freely on cpu)")
    g.add_argument("--families", dest="families", type=int, action=_Deprecated,
                   new="--compile-groups", help=argparse.SUPPRESS)
    _add_knobs(g, knobs, "GPU", owners)
    g.add_argument("--helion-configs", type=int, default=0, metavar="N",
                   help="also run each valid case that passes under N other valid configs of "
                        "each Helion kernel its target launches (drawn from the kernel's "
                        "config space, deterministic per seed and layout) and of each "
                        "@triton.autotune kernel (its other declared configs, in order), each "
                        "judged against the reference; configs that do not compile or run are "
                        "skipped (default: 0)")
    g.add_argument("--helion-autotune", action="store_true",
                   help="let a Helion kernel that gives no config of its own autotune on its "
                        "first call of each shape, as Helion would (default: it runs "
                        "Helion's default config; autotuning takes minutes per shape and job)")
    g.add_argument("--cuda-graphs", action="store_true",
                   help="also capture one valid example in 4 in a CUDA graph and judge its "
                        "replay on other values of the same buffers, as serving engines run "
                        "decode (the contract does not ask it: opt-in)")
    g.add_argument("--extra-share", type=float, default=CampaignOptions.extra_share,
                   metavar="F",
                   help="the most share of each job's time that each extra check of passing "
                        "cases takes (--invariance, --cuda-graphs, --helion-configs): a turn "
                        "that would take it past F at its mean cost waits, and the summary "
                        "counts those turns (default %(default)s, which kept each check "
                        "within 15 %% of the plain rate on an H100; 1: every turn runs)")
    g.add_argument("--read-every", type=int, default=1, metavar="N",
                   help="read the judge's results from the device once per N valid examples "
                        "instead of after each (fewer waits on a GPU shared by jobs); a "
                        "device fault or hang seen with several unread is traced to its "
                        "example by running them again one at a time (default 1)")
    _sanitize_option(g)
    g.add_argument("--sanitize-every", type=int, default=8, metavar="N",
                   help="with --sanitize: one passing valid example in N (of at most 1 MiB "
                        "of tensors) is replayed under the tool in the background (default 8)")
    i = f.add_argument_group("isolation")
    i.add_argument("--jobs", "-j", default=None, metavar="N|auto",
                   help="run the campaign's plan as N supervised processes, each with its "
                        "share of the breakage strata and compile groups (auto: 8 per GPU "
                        "on cuda, one per core on cpu; default: auto on cuda, 1 on cpu)")
    i.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="the most seconds a target may take on one case before it counts as "
                        "a hang (default 60; isolated campaigns run a target's first such "
                        "call again in a fresh process: a hang only if it does not return "
                        "there either); once a target has hung, its later calls are cut at a "
                        "calibrated limit: 10x the slowest call of its size class seen (of a "
                        "first call for a new shape or process), at least 2 s (10 s where it "
                        "may compile)")
    i.add_argument("--no-isolate", action="store_true",
                   help="no flight record: with one job, run targets in this process; with "
                        "--jobs N, a crash or hang of a target ends the run (default: "
                        "isolated; a crash costs one restart of a job, and layouts like it "
                        "get less of the budget)")
    for k in knobs:  # a group of a project's family's own
        if k.group not in groups:
            groups[k.group] = f.add_argument_group(k.group)
            _add_knobs(groups[k.group], knobs, k.group, owners)
    o = _output_group(f)
    o.add_argument("--corpus", default=None, metavar="DIR",
                   help="save each minimized failing case into DIR as soon as it is "
                        "confirmed (also on SIGINT/SIGTERM, which end the campaign with a "
                        "partial summary, exit 130/143), where pytest replays it; a bug DIR "
                        "already holds (same target, same signature) is counted as seen "
                        "again, not saved again (default: FOLDER/found for the first "
                        "corpus folder of the project's [tool.kda-fuzz] table, else "
                        "corpus/found, relative to the current directory)")
    o.add_argument("--no-save", action="store_true",
                   help="do not save failing cases into a corpus (an isolated target's case "
                        "in flight still goes to a temporary folder)")
    o.add_argument("--report", default=None, metavar="DIR",
                   help="write a self-contained HTML campaign report into DIR (checks hit, "
                        "failures, error budget, throughput)")


def _replay_parser(sub: Any) -> None:
    r = sub.add_parser("replay", help="replay saved corpus files against a target",
                       description="Replay corpus files, each under its own family and variant,\n"
                                   "against the project's configured targets for it (else\n"
                                   "kda-fuzz's own kernels) unless told otherwise.",
                       epilog=REPLAY_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _targets_group(r, replay=True)
    g = r.add_argument_group("isolation")
    _device(g)
    g.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds a target may run on a crash-, timeout- or flaky- file (each "
                        "runs in a worker) before it counts as hung (default 60)")
    _sanitize_option(g)
    o = _output_group(r)
    o.add_argument("--verbose", "-v", action="store_true",
                   help="print each failure's whole detail (default: cut at a word "
                        "boundary after 240 characters)")
    r.add_argument("paths", nargs="+", metavar="PATH", help="corpus files or folders")


def _merge_parser(sub: Any) -> None:
    m = sub.add_parser("merge", help="merge corpus folders of many runners into one, one "
                                     "file per distinct failure",
                       description="Merge corpus folders into OUT_DIR, one file per distinct "
                                   "failure; exit 1 when bad or stale files were found.")
    m.add_argument("out", metavar="OUT_DIR",
                   help="the merged corpus (created if missing; its files take part)")
    m.add_argument("inputs", nargs="+", metavar="IN_DIR",
                   help="corpus folders (or files) to merge in")
    m.add_argument("--json", action="store_true",
                   help="print one JSON summary object as the last line of stdout")


def _show_parser(sub: Any) -> None:
    s = sub.add_parser("show", help="print a corpus file's layout, verdict and reproduction",
                       description="Print a corpus file's layout, verdict and how to reproduce\n"
                                   "it; --python prints a standalone script that builds the\n"
                                   "case and calls the target.",
                       epilog=SHOW_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("file", metavar="FILE", help="a corpus file")
    s.add_argument("--python", action="store_true",
                   help="print a standalone Python script that rebuilds the case bit for "
                        "bit, calls the target and reports what the contract says of it")
    s.add_argument("--target", default=None, metavar="MODULE:CALLABLE",
                   help="target the script calls (default: the one the file was recorded "
                        "against, else the configured one, else kda-fuzz's own kernel)")


def build_parser(knobs: Sequence[Any] | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``kda-fuzz`` (imports nothing heavy); ``fuzz`` takes the
    options the families declare (``knobs``: these ``Knobs`` instead)."""
    parser = argparse.ArgumentParser(prog="kda-fuzz", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _fuzz_parser(sub, knobs)
    _replay_parser(sub)
    _merge_parser(sub)
    _show_parser(sub)
    return parser


def _sanitize_option(group: Any) -> None:
    group.add_argument("--sanitize", choices=("memcheck", "racecheck", "initcheck"),
                       default=None, metavar="memcheck|racecheck|initcheck",
                       help="also run cases under NVIDIA compute-sanitizer's tool (cuda, "
                            "caching allocator off, tensors without guard cells): an error "
                            "it reports on a case whose outputs are right is a finding of "
                            "its own kind (sanitizer), and each finding carries its report")


def _check_sanitize(args: argparse.Namespace) -> None:
    """--sanitize needs cuda and compute-sanitizer (exit 2 naming it)."""
    if getattr(args, "sanitize", None) is None:
        return
    if not str(args.device).startswith("cuda"):
        raise UsageError(f"--sanitize {args.sanitize} needs --device cuda")
    from kda_fuzz.workers.sanitize import SanitizerMissing, find_sanitizer

    try:
        find_sanitizer()
    except SanitizerMissing as e:
        raise UsageError(str(e)) from None


def check_fuzz_args(args: argparse.Namespace) -> None:
    """The fuzz options' values, checked before anything heavy is imported."""
    if args.max_examples < 1:
        raise UsageError("--max-examples must be at least 1")
    if args.max_failures < 1:
        raise UsageError("--max-failures must be at least 1")
    if args.helion_configs < 0:
        raise UsageError("--helion-configs must be 0 or more")
    if args.cuda_graphs and not str(args.device).startswith("cuda"):
        raise UsageError("--cuda-graphs needs --device cuda")
    if not 0 <= args.valid_share <= 1:
        raise UsageError("--valid-share must be between 0 and 1")
    for knob in _family_knobs():  # the families' own options
        value = getattr(args, knob.dest, None)
        why = knob.check(value) if knob.check is not None and value is not None else None
        if why:
            raise UsageError(why)
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise UsageError("--max-seconds must be positive")
    if args.families is not None and args.families < 0:
        raise UsageError("--compile-groups must be 0 or more")
    if args.sanitize_every < 1:
        raise UsageError("--sanitize-every must be at least 1")
    if args.read_every < 1:
        raise UsageError("--read-every must be at least 1")
    if not 0 < args.extra_share <= 1:
        raise UsageError("--extra-share must be more than 0 and at most 1")
    _check_device(args.device)
    _check_sanitize(args)
    if args.jobs is None:
        args.jobs = "auto" if args.device.startswith("cuda") else "1"
    if args.jobs != "auto":
        try:
            ok = int(args.jobs) >= 1
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"--jobs must be a positive integer or auto, not {args.jobs!r}")
    if args.shard is not None:
        shard_of(args)
    if args.family is not None:
        _check_variant(args.family, args.contract)
    elif args.contract is not None and args.contract not in VARIANTS \
            and not _config().families:
        raise UsageError(f"unknown variant {args.contract!r} (choose from "
                         f"{', '.join(VARIANTS)})")


def _check_device(device: str) -> re.Match[str] | None:
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device != "cpu" and m is None:
        raise UsageError(f"--device must be cpu or cuda[:N], not {device!r}")
    return m


def _prepare_device(device: str, contract: Any) -> None:
    """Check ``device`` and set up the contract's kernel execution for it before kernels
    are imported."""
    m = _check_device(device)
    if m is None:
        if contract.execution is not None:
            contract.execution.configure_cpu()
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is available here (torch "
                         f"{torch.__version__}, CUDA {torch.version.cuda or 'not built in'})")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} "
                         "CUDA device(s)")


def _config() -> Any:
    from kda_fuzz.config import ConfigError, load_config

    try:
        return load_config(Path.cwd())
    except ConfigError as e:
        raise UsageError(str(e)) from e


def _loaded(specs: list[str], contract: Any) -> list[Any]:
    """Each ``MODULE:CALLABLE`` imported and checked against the contract's signature
    (a usage error when one cannot be)."""
    from kda_fuzz.engine.targets import TargetError, check_signature, load_target
    from kda_fuzz.execution import kernel_libraries
    from kda_fuzz.execution.lean import import_lean

    for library in kernel_libraries(specs):  # (without what they import to autotune)
        if library not in sys.modules:
            try:
                import_lean(library)  # (the targets' own imports are theirs: as usual)
            except Exception:
                pass  # (load_target says what is wrong)
    try:
        targets = [load_target(t) for t in specs]
        for t in targets:
            check_signature(t, contract)
    except TargetError as e:
        raise UsageError(str(e)) from e
    return targets


def _target_specs(args: argparse.Namespace, contract: Any) -> tuple[list[str], list[str]]:
    """The ``MODULE:CALLABLE`` names of the targets and peers (nothing imported), as
    :func:`_choose` chose them."""
    chosen = getattr(args, "chosen", None) or _choose(args)
    specs = chosen.targets.specs
    return list(specs), list(getattr(args, "peer", None) or ())  # replay has no --peer


def _families(family: str | None) -> dict[str, tuple[str, ...]]:
    """Family -> variants: the built-in ones (no import), plus the project's own when
    ``family`` is none of those or not named (importing them: they are only known by
    their contracts)."""
    if family in FAMILIES or not _config().families:
        return FAMILIES
    _project_families()
    from kda_fuzz.families import family_names, get_contract

    return {**FAMILIES, **{n: get_contract(n).variants for n in family_names()}}


def _check_variant(family: str, variant: str | None) -> None:
    """A usage error unless ``family`` (and ``variant``, when given) are known."""
    families = _families(family)
    if family not in families:
        raise UsageError(f"unknown contract family {family!r} (known: "
                         f"{', '.join(families)})")
    if variant is not None and tuple(families[family]) == (SOLE_VARIANT,) \
            and variant != SOLE_VARIANT:
        raise UsageError(f"family {family!r} declares no variants: leave out --contract "
                         f"{variant}")
    if variant is not None and variant not in families[family]:
        raise UsageError(f"contract {family!r} has no variant {variant!r} (choose from "
                         f"{', '.join(families[family])})")


def _name_preloads(targets: Sequence[str]) -> None:
    """Start the fork server with the workers' imports, overlapping this process's own, or
    name them to one started early (:func:`kda_fuzz.workers.process.start_fork_server`):
    the engine's and the kernel libraries of ``targets``, imported once, not once per job
    and restart (what of them touches no device, which on a CPU is all of them:
    :data:`kda_fuzz.execution.DEVICE_FREE_IMPORTS`). Nothing heavy is imported here."""
    from kda_fuzz.execution import device_free_imports, kernel_libraries
    from kda_fuzz.workers.process import start_fork_server

    start_fork_server((), device_free_imports(kernel_libraries(list(targets))))


def _choose(args: argparse.Namespace) -> Any:
    """The campaign's family, variant and targets (:func:`kda_fuzz.config.choose_campaign`);
    sets ``args.family`` and ``args.contract`` to them."""
    from kda_fuzz.config import ConfigError, choose_campaign

    def defaults(family: str, variant: str) -> tuple[str, ...]:
        if family in BUILTINS:  # declared light: no torch before the fork server is named
            return BUILTINS[family].targets.get(variant, ())
        from kda_fuzz.families import get_contract

        return tuple(get_contract(family).default_targets.get(variant, ()))

    try:
        chosen = choose_campaign(_config(), args.family, args.contract, args.target or (),
                                 _families(args.family), defaults)
        _check_variant(chosen.family, chosen.variant)
    except (ConfigError, ValueError) as e:
        raise UsageError(str(e)) from None
    args.family, args.contract, args.chosen = chosen.family, chosen.variant, chosen
    if getattr(args, "command", None) == "fuzz":
        _check_family_options(args)
    return chosen


def _start_line(args: argparse.Namespace, jobs: int) -> str:
    """What the campaign chose: family, variant, targets and where they come from, jobs."""
    from kda_fuzz.config import SOURCES

    c = args.chosen
    auto = (" (auto: 8 per GPU)" if args.device.startswith("cuda") else " (auto: one per "
            "core)") if args.jobs == "auto" else ""
    why = "" if c.variant == SOLE_VARIANT else f" ({c.why})"  # (no variant to choose)
    line = (f"kda-fuzz: fuzzing {label(c.family, c.variant)}{why} on {args.device}: "
            f"{', '.join(c.targets.specs)} ({SOURCES[c.targets.source]}); "
            f"{jobs} job(s){auto}")
    if "helion" in sys.modules:  # a target imported it
        from kda_fuzz.execution.configs import policy_note

        line += f"; {policy_note(args.device)}"
    return line


def _held(report: Any, mode: str, share: float) -> str:
    """The note's words for the turns of an extra check that waited for its share of the
    jobs' time (``--extra-share``); none: nothing."""
    n = report.mode_held.get(mode, 0)
    return (f"; {n} more turn(s) waited: the check would have taken more than its "
            f"{100 * share:g} % of the job's time (--extra-share)" if n else "")


def _ask_autotuning(args: argparse.Namespace) -> None:
    """``--helion-autotune``: this process and every process it starts let Helion autotune
    (asked before the first is started: a fork server imports helion, with what its
    autotuners use only then)."""
    if getattr(args, "helion_autotune", False):
        from kda_fuzz.execution.configs import ask_autotuning

        ask_autotuning()


def _wants_example_db(args: argparse.Namespace) -> bool:
    """Whether a shared example database is named (its replay comes first)."""
    cfg = _config()
    return args.example_db is not None or bool(cfg.present and cfg.example_db)


class _StartGuard:
    """The ``--max-seconds`` clock before the campaign has begun: the command's imports
    (torch and the kernel libraries, from sources on a loaded machine: tens of seconds),
    a calibration, the jobs' start (their fork server still importing) cannot be cut
    where they stand. A campaign that has not begun by the clock's ``kill`` instant ends
    the command there: no example was judged, so it exits 2, not a verdict on any
    target. Once begun, the campaign's own machinery keeps the clock."""

    def __init__(self, clock: Deadline) -> None:
        self.clock = clock
        self.early: Any = None  # a Supervisor whose jobs started before the campaign began
        self._watch = Watchdog(clock.kill, clock.kill, lambda: None, self._end).start()

    def begun(self) -> None:
        """From here on the campaign keeps the clock (or the command has ended); where the
        guard has fired already, this thread waits for the process to end."""
        if not self._watch.claim():
            threading.Event().wait()

    def _end(self) -> None:
        from kda_fuzz.workers.process import exit_from_thread

        try:
            if self.early is not None:
                self.early.abort()
            print(f"kda-fuzz: --max-seconds {self.clock.seconds:g}: the campaign had not "
                  f"begun {time.monotonic() - self.clock.started:.1f} s after the command "
                  "started (its imports, a calibration, the jobs' start-up), so no example "
                  "was judged: not a verdict on the target; give it more seconds",
                  file=sys.stderr)
        finally:
            exit_from_thread(EXIT_USAGE)


def _fuzz(args: argparse.Namespace, signals: Any = None,
          guard: _StartGuard | None = None) -> int:
    """``kda-fuzz fuzz``; SIGINT and SIGTERM handled by ``signals`` (an entered
    :class:`~kda_fuzz.campaign.interrupt.Signals`; ``None``: its own, for the whole command);
    ``guard``: the clock until the campaign begins (``None``: no clock, or the caller's)."""
    from kda_fuzz.campaign.interrupt import Signals
    from kda_fuzz.campaign.plan import share_of
    from kda_fuzz.campaign.spec import resolve
    from kda_fuzz.report.progress import Progress

    if getattr(args, "chosen", None) is None:  # main did so already; other callers may not
        check_fuzz_args(args)
        _ask_autotuning(args)
        _choose(args)
    if signals is None:  # from here on: a signal before the campaign ends the command
        with Signals() as own:
            return _fuzz(args, own, guard)

    spec = resolve(args, _config())  # the one campaign every phase below runs
    if not (not spec.isolate and spec.jobs == 1):
        _name_preloads(spec.targets)  # (once named, the server has them)
    _prepare_device(spec.device, spec.contract)
    early = None
    if spec.device.startswith("cuda") and not (spec.jobs == 1 and not spec.isolate) \
            and not _wants_example_db(args):
        # cuda campaigns are not calibrated: start the jobs now, so that their imports of
        # the targets (seconds for a Helion kernel) overlap the checks here
        from kda_fuzz.campaign.supervisor import Supervisor

        early = Supervisor(spec)
        if guard is not None:
            guard.early = early
        early.start()
    try:
        from kda_fuzz.workers.process import collector_paused

        with collector_paused():  # (the kernel libraries' imports)
            targets = _loaded(list(spec.targets), spec.contract)
            peers = _loaded(list(spec.peers), spec.contract)
        db = _example_db(args, spec, [*targets, *peers])
        spec, calibration_notes = _calibrated(args, spec, [*targets, *peers])
        report_notes = [*_pin_notes(spec, [*targets, *peers]), *spec.notes,
                        *calibration_notes]
        share = None if spec.shard is None else share_of(spec.contract, spec.variant,
                                                         spec.options, spec.jobs)
        replay = None
        if db is not None:
            from kda_fuzz.campaign.exampledb import replay_stored

            replay = replay_stored(db[0], db[1], db[2], spec.contract, spec.variant,
                                   [*targets, *peers], device=spec.device,
                                   isolate=spec.isolate, timeout=spec.budget.timeout,
                                   messages=spec.options.messages, strict=spec.options.strict,
                                   deadline=spec.budget.replay)
    except BaseException:  # a usage error, an interrupt: the jobs started go too
        if early is not None:
            early.abort()
        raise
    print(_start_line(args, spec.jobs), file=sys.stderr)
    sup = None
    if not (spec.jobs == 1 and not spec.isolate):
        from kda_fuzz.campaign.supervisor import Supervisor

        sup = early or Supervisor(spec)
        if guard is not None:
            guard.early = sup
        try:
            sup.start()  # (waits while the fork server still imports)
        except BaseException:
            sup.abort()
            raise
        if guard is not None:  # the jobs started: the supervisor keeps the clock
            guard.begun()
    run = _Run(args, spec, report_notes, share, db, replay, signals, guard)
    # from here on a first signal is remembered (the phases below act on it): the command
    # wraps up, saves and summarizes, then exits 128 + the signal
    with signals.stopping(lambda stop: None):
        with Progress(share["examples"] if share else args.max_examples,
                      enabled=not args.json, clock=spec.budget.clock) as progress:
            run.saver = saver = _saver(spec, replay, progress)
            if spec.jobs == 1 and not spec.isolate:
                with signals.stopping(saver.request):
                    if signals.stop is not None:  # one came in since the campaign phase began
                        saver.request(signals.stop)
                    report = _in_process(run, targets, peers, progress)
                    new = _merge_replayed(report, replay)
            else:
                assert sup is not None
                sup.on_example, sup.on_found = progress.update, saver.found

                def on_signal(stop: Any) -> None:
                    sup.interrupt(stop)
                    saver.request(stop)

                with signals.stopping(on_signal):
                    if signals.stop is not None:  # one came in since the campaign phase began
                        on_signal(signals.stop)
                    report = sup.run()
                    new = _merge_replayed(report, replay)
                    saver.finish()
        if saver.stopped is not None and report.stopped is None:  # minimization was cut
            from kda_fuzz.campaign.channel import ExitReason, Stop

            report.stopped = Stop(ExitReason.DEADLINE)
        if saver.stopped is not None and signals.received is None:
            report.notes.append(f"--max-seconds {args.max_seconds:g}: the deadline cut "
                                "minimization short")
        return run.wrap_up(report, new)


def _saver(spec: Any, replay: Any, progress: Any) -> Any:
    """The campaign's finding saver: each new distinct failure minimized and saved as it
    comes (those the example database replayed are its own)."""
    from kda_fuzz.campaign.findings import FindingSaver
    from kda_fuzz.corpus.replay import replay_command_line

    return FindingSaver(
        spec, skip=frozenset(f.signature for f in replay.failures) if replay else frozenset(),
        on_found=progress.found, on_saved=progress.saved,
        reproduce=lambda f: replay_command_line(f.target, f.saved, variant=spec.variant,
                                                device=spec.device,
                                                timeout=spec.budget.timeout,
                                                family=spec.family))


@dataclass
class _Run:
    """One ``kda-fuzz fuzz`` command past its start: the spec and what its wrap-up needs."""

    args: argparse.Namespace
    spec: Any
    notes: list[str]
    share: Any
    db: Any
    replay: Any
    signals: Any
    guard: _StartGuard | None = None
    saver: Any = None

    def wrap_up(self, report: Any, new: list[Any]) -> int:
        return _wrap_up(self, report, new)


def _in_process(run: _Run, targets: list[Any], peers: list[Any], progress: Any) -> Any:
    """The campaign of ``--jobs 1 --no-isolate``: its targets called in this process, each
    new failure minimized and saved right there; its report. A call no one can stop (a
    hang, or a call slower than the time left) does not outlive the budget's clock: at
    its ``draw`` instant the campaign is asked to stop, and if it has not returned by its
    ``kill`` instant, a watchdog thread wraps the command up with what was found so far
    (every failure saved, as found where it was not minimized, and the exit code) and
    ends the process; the call is left where it is."""
    from kda_fuzz.campaign.channel import ExitReason, Stop
    from kda_fuzz.campaign.runner import Campaign
    from kda_fuzz.engine.oracle import EnvironmentFailure

    spec, signals, saver = run.spec, run.signals, run.saver
    by_name = {t.name: t for t in [*targets, *peers]}
    watch: Watchdog | None = None
    c = Campaign(spec.contract, spec.variant, targets, peers=peers, options=spec.options,
                 on_example=progress.update,
                 stop=lambda: signals.received is not None or (watch is not None and watch.fired),
                 on_failure=lambda f, new: saver.found_inline(f, by_name.get(f.target))
                 if new else None)

    def take_over() -> None:
        from kda_fuzz.workers.process import exit_from_thread

        code = EXIT_USAGE
        try:
            report = c.report
            report.notes.append(
                f"--max-seconds {spec.budget.max_seconds:g}: the example in flight in this "
                "process (--no-isolate: a target call cannot be stopped) had not ended by "
                "the deadline and was left running: these are the results until then, every "
                "confirmed failure saved (as found if it was being minimized)")
            report.stopped = Stop(ExitReason.DEADLINE)
            progress.__exit__(None, None, None)
            code = run.wrap_up(report, _merge_replayed(report, run.replay))
        except EnvironmentFailure as e:  # (none of the valid layouts could run by then)
            code = _environment_error(e)
        except BaseException as e:  # ours: said, and the process ends all the same
            print(f"kda-fuzz: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        exit_from_thread(code)

    if spec.budget.clock is not None:
        # (the minimization in this thread ends by itself at the budget's settle instant)
        if run.guard is not None:  # this watchdog keeps the clock from here
            run.guard.begun()
        watch = Watchdog(spec.budget.draw, spec.budget.kill, lambda: None, take_over).start()
    try:
        report = c.run()
    except BaseException:
        if watch is not None and not watch.claim():
            threading.Event().wait()
        raise
    if c.stopped is not None and c.stopped.noteworthy:
        report.notes.append(f"stopped: {c.stopped}")
    if watch is not None and not watch.claim():  # the watchdog wraps up and ends the process
        threading.Event().wait()
    return report


def _calibrated(args: argparse.Namespace, spec: Any, targets: list[Any]
                ) -> tuple[Any, list[str]]:
    """Measure foreign targets on cpu and size the campaign's layouts to them: the spec
    with those sizes, and the notes it adds to the summary. The measurement ends by the
    budget's ``calibrate`` instant: a target that hangs leaves the campaign its time."""
    notes = []
    contract = spec.contract
    given = any(getattr(args, k.dest, None) for k in contract.knobs.options if k.calibrated)
    if not spec.device.startswith("cuda") and not given \
            and not _own_kernels(targets[:len(spec.targets)], contract, spec.variant):
        from kda_fuzz.campaign.calibrate import apply, calibrate

        for t in targets:
            sizing = calibrate(contract, spec.variant, t.name, timeout=spec.budget.timeout,
                               deadline=spec.budget.calibrate)
            if sizing is not None:
                spec = apply(sizing, spec)
                notes.append(f"{t.name}: {sizing.note()}")
                print(f"kda-fuzz: {t.name}: {sizing.note()}", file=sys.stderr)
    return spec, notes


def _wrap_up(run: _Run, report: Any, new: list[Any]) -> int:
    """Save what is not saved yet, the example database, the report and the summary; the
    exit code."""
    from kda_fuzz.campaign.results import require_executed

    args, spec, signals, replay = run.args, run.spec, run.signals, run.replay
    contract = spec.contract
    report.notes[:0] = run.notes
    stop = signals.stop
    if stop is not None:
        report.notes.insert(0, f"{stop}: the campaign stopped drawing; these are partial "
                               "results, every confirmed failure saved")
        report.stopped = stop
    if args.jobs == "auto":
        report.notes.insert(0, f"--jobs auto: {spec.jobs} job(s)")
    require_executed(report)
    if contract.report_notes is not None:
        report.notes += contract.report_notes(report)
    o = spec.options
    if o.sanitize:
        from kda_fuzz.campaign.sanitizing import sanitizer_note

        report.notes.append(sanitizer_note(report, o.sanitize, o.sanitize_every))
    if report.pinned:
        report.notes.append(pinned_note(report.pinned))
    if report.graph_checks:
        report.notes.append(f"CUDA graphs: {report.graph_checks} valid case(s) also captured "
                            "once and replayed on other values of the same buffers"
                            + _held(report, "CUDA graphs", o.extra_share))
    if report.batch_checks:
        report.notes.append(
            f"batch invariance (--invariance {o.invariance}): {report.batch_checks} valid "
            "case(s) re-run in other batches" + (
                ", judged like any case and compared bit for bit with the whole batch's rows"
                if o.invariance == "bitwise" else
                " of the same shapes (one each, in turn; no compile), judged like any case")
            + _held(report, "batch invariance", o.extra_share))
    if o.kernel_configs:
        skipped = sum(report.config_skips.values())
        report.notes.append(
            f"--helion-configs {o.kernel_configs}: {report.config_checks} valid case(s) "
            f"also run under other configs of their Helion and autotuned Triton kernels: "
            f"{report.config_runs} "
            f"run(s) judged, {skipped} config(s) skipped (they do not compile or run here)"
            + ("".join(f"; {n} x {c}" for c, n in report.config_skips.most_common(3)))
            + _held(report, "other kernel configs", o.extra_share))
        if report.config_adjusted:
            report.notes.append(
                f"--helion-configs: {report.config_adjusted} run(s) used pointer indexing where "
                "the drawn config had tensor descriptors: the call's tensors were not 16-byte "
                "aligned, and Helion does not check a descriptor's base address (a kernel "
                "autotuned to such a config faults on such calls, whatever its code)")
    if spec.corpus and report.failures:
        _save(report, spec, args, done=run.saver.settled)
    if run.share is not None:
        from kda_fuzz.campaign.shard import note

        report.extra["shard"] = run.share
        report.notes.insert(0, note(run.share))
    if run.db is not None and replay is not None:
        from kda_fuzz.campaign.exampledb import save_failures

        replay.saved = save_failures(run.db[0], run.db[2], new, seed=report.seed,
                                     shard=str(spec.shard) if spec.shard else None)
        report.extra["example_db"] = replay.to_json()
        report.notes.append(replay.note())
    if args.report:
        from kda_fuzz.report.html import write_report

        path = write_report(report, args.report)
        print(f"kda-fuzz: report written to {path}", file=sys.stderr)
    _print_report(report, args.json)
    if signals.received is not None:
        return 128 + signals.received
    # a crash or hang whose case its restarted job could not regenerate before the clock's
    # end is a finding all the same (said in the notes; no file holds it)
    if report.failures or report.extra.get("unrecorded_faults"):
        return EXIT_FAILURE
    from kda_fuzz.campaign.channel import ExitReason

    # the clock stopped it before any example (not a plan that ran out first, such as a
    # shard's empty share): no pass either
    if report.examples == 0 and report.stopped is not None \
            and report.stopped.reason is ExitReason.DEADLINE:
        print(f"kda-fuzz: no example was judged before the --max-seconds "
              f"{spec.budget.max_seconds:g} clock ran out (the start-up, or a first call "
              "still running at the end, took it): not a verdict on the target",
              file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _environment_error(e: BaseException) -> int:
    """Say that the machinery that runs targets failed (never a verdict); exit 2."""
    print(f"kda-fuzz: environment error (not a verdict on the target): {e}", file=sys.stderr)
    return EXIT_USAGE



def _pin_notes(spec: Any, targets: list[Any]) -> list[str]:
    """What the summary says of pinned layouts and of what was left out."""
    notes = []
    options, contract, variant = spec.options, spec.contract, spec.variant
    if options.layouts:
        names = "; ".join(n for n, _ in options.layouts)
        notes.append(f"pinned layouts: {options.layout_share:.0%} of the valid examples "
                     f"on {names} (the unpinned fields drawn around them), the rest over "
                     "the whole space")
    declared = [u for t in targets for u in getattr(t.fn, "kda_fuzz_unsupported", ())]
    left = tuple(dict.fromkeys([*options.unsupported, *declared]))
    if left and contract.restrict is not None:
        from kda_fuzz.engine.pins import describe

        try:
            pins = contract.restrict(left, variant)
        except ValueError as e:
            raise UsageError(f"a target's kda_fuzz_unsupported: {e}") from None
        notes.append(f"left out (the targets do not support them): {', '.join(left)} "
                     f"(drawn only with {describe(pins)})")
    return notes


def pinned_note(pinned: dict[str, int]) -> str:
    """``examples at the pinned layouts: qwen: 6 scale (the GPU limits at its heads), 120
    valid; ...``."""
    by: dict[str, list[str]] = {}
    for key, n in sorted(pinned.items()):
        stratum, name = key.split(":", 1)
        by.setdefault(name, []).append(
            f"{n} {stratum}" + (" (the GPU limits at its heads)" if stratum == "scale" else ""))
    return "examples at the pinned layouts: " + "; ".join(
        f"{name}: {', '.join(parts)}" for name, parts in sorted(by.items()))


def _example_db(args: argparse.Namespace, spec: Any, targets: list[Any]
                ) -> tuple[Any, str, bytes] | None:
    """The example database (``--example-db``, else the project's ``example_db``), its
    URL and the key of this campaign's failures; ``None`` without one."""
    from kda_fuzz.campaign.exampledb import ExampleDbError, campaign_key, open_database, resolve

    url = args.example_db
    if url is None:
        cfg = _config()
        if not (cfg.present and cfg.example_db):
            return None
        url = resolve(cfg.example_db, cfg.root)
    try:
        db = open_database(url)
    except ExampleDbError as e:
        raise UsageError(str(e)) from None
    return db, url, campaign_key(spec.family, spec.variant, [t.name for t in targets])


def _merge_replayed(report: Any, replay: Any) -> list[Any]:
    """The campaign's new failures; replayed ones (if any) go first in ``report``."""
    if replay is None:
        return list(report.failures)
    from kda_fuzz.campaign.exampledb import merge_replayed

    return merge_replayed(report, replay.failures)


def _save(report: Any, spec: Any, args: argparse.Namespace,
          done: Sequence[Any] = ()) -> None:
    """Save each distinct failure not in ``done`` (saved as found); one too large for a
    corpus file is described instead. Outside a project that opted in, say how pytest
    would replay the files."""
    from kda_fuzz.config import config_snippet
    from kda_fuzz.corpus.replay import replay_command_line
    from kda_fuzz.corpus.store import SEEN_AGAIN, CaseTooLarge, save_failure

    settled = {id(f) for f in done}
    for f in report.failures:
        if id(f) in settled:  # settled as confirmed: saved, or known to the corpus already
            if f.saved and f.note.startswith(SEEN_AGAIN):
                print(f"kda-fuzz: {f.verdict.kind}/{f.verdict.what} on {f.target}: {f.note}",
                      file=sys.stderr)
            elif f.saved:
                report.saved.append(f.saved)
            continue
        try:
            f.saved = str(save_failure(f, spec.corpus, contract=spec.contract,
                                       seed=report.seed))
            f.reproduce = replay_command_line(f.target, f.saved, variant=spec.variant,
                                              device=spec.device, timeout=spec.budget.timeout,
                                              family=spec.family)
            if f.note.startswith(SEEN_AGAIN):  # a bug the corpus already holds
                print(f"kda-fuzz: {f.verdict.kind}/{f.verdict.what} on {f.target}: {f.note}",
                      file=sys.stderr)
                continue
        except CaseTooLarge as e:
            f.note = f"{e}"
            print(f"kda-fuzz: {f.verdict.kind}/{f.verdict.what} on {f.target}: {e}",
                  file=sys.stderr)
            continue
        report.saved.append(f.saved)
    if report.saved and args.target and not _config().present:
        print("kda-fuzz: to replay the saved cases with pytest against your kernel, add to "
              "your pyproject.toml:\n\n[tool.kda-fuzz]\ncorpus = [\"corpus\"]\n"
              + config_snippet(spec.family, spec.variant, args.target) + "\n",
              file=sys.stderr)


def _own_kernels(targets: list[Any], contract: Any, variant: str) -> bool:
    """Whether ``targets`` are the contract's own kernels for ``variant``."""
    own = contract.default_targets.get(variant, ())
    return bool(targets) and all(t.name in own for t in targets)


def _print_report(report: Any, as_json: bool) -> None:
    from kda_fuzz.report.progress import print_summary

    if as_json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        print_summary(report)


def _replay(args: argparse.Namespace) -> int:
    """``kda-fuzz replay``: each file under its own family and variant unless ``--family``
    or ``--contract`` says otherwise, against ``--target``, else the project's configured
    targets for the file's family and variant, else kda-fuzz's own kernels."""
    from kda_fuzz.config import choose_targets
    from kda_fuzz.corpus.replay import replay_paths

    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.family is not None:
        _check_variant(args.family, args.contract)
    elif args.contract is not None and args.contract not in VARIANTS \
            and not _config().families:
        raise UsageError(f"unknown variant {args.contract!r} (choose from "
                         f"{', '.join(VARIANTS)})")
    m = _check_device(args.device)
    _check_sanitize(args)
    from kda_fuzz.families import CONTRACTS

    named = [args.family] if args.family is not None else _file_families(args.paths)
    for contract in CONTRACTS.values():  # every family a file may name
        _prepare_device(args.device, contract)
        if m is not None:
            break
    if args.target:  # checked at once: a bad --target is a usage error, not N bad files
        for name in named or [DEFAULT_FAMILY]:
            try:
                _loaded(args.target, CONTRACTS[name])
            except UsageError as e:
                raise UsageError(f"{e}" + (f" (the files are of the families "
                                           f"{', '.join(named)}: name one with --family)"
                                           if len(named) > 1 else "")) from None
        if len(named) > 1:
            print(f"note: --target replays files of {len(named)} families "
                  f"({', '.join(named)}), each under its own; --family keeps one",
                  file=sys.stderr)
    family = args.family
    cfg = _config()

    def targets(family: str, variant: str) -> Any:
        return choose_targets(cfg, family, variant, args.target or (),
                              CONTRACTS[family].default_targets.get(variant, ()))

    return replay_paths(args.paths, targets, family=family, variant=args.contract,
                          device=args.device, as_json=args.json, timeout=args.timeout,
                          verbose=args.verbose, sanitize=args.sanitize)


def _file_families(paths: Sequence[str]) -> list[str]:
    """The known families the corpus files under ``paths`` record (their ``contract``
    field; each loaded here), in order; files that cannot be read, or of a family not
    known here, are left to the replay to report."""
    from kda_fuzz.corpus.store import corpus_files
    from kda_fuzz.families import get_contract

    try:
        files = corpus_files(paths)
    except FileNotFoundError:
        return []
    names: dict[str, None] = {}
    for path in files:
        try:
            name = json.loads(path.read_text(encoding="utf-8"))["contract"]["family"]
            get_contract(name)
        except Exception:  # not a corpus file, or another project's family
            continue
        names[name] = None
    return list(names)


def _show(args: argparse.Namespace) -> int:
    from kda_fuzz.show import ShowError, show

    try:
        print(show(args.file, python=args.python, target=args.target, config=_config()),
              end="")
    except ShowError as e:
        raise UsageError(str(e)) from None
    return EXIT_OK


def _project_families() -> None:
    """Make the project's own families (``[tool.kda-fuzz] families``) known here and in
    every worker (through the environment they inherit)."""
    cfg = _config()
    if cfg.families:
        from kda_fuzz.families import ENV_VAR

        have = [s for s in os.environ.get(ENV_VAR, "").split(",") if s]
        os.environ[ENV_VAR] = ",".join(dict.fromkeys([*have, *cfg.families]))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line on ``argv`` (``None``: the process's own): its exit code."""
    from kda_fuzz.workers.process import settle_fork_server

    try:
        return _main(argv)
    finally:
        settle_fork_server()  # (one started early serves forks, whatever happened)


def _main(argv: Sequence[str] | None) -> int:
    try:
        parser = build_parser()
    except UsageError as e:  # a project's family options that cannot be loaded
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    # the console command counts --max-seconds from the process's start; a call from
    # Python (tests, scripts) from the call
    started = _process_started() if argv is None else time.monotonic()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    args.started = started
    if args.command is None:  # no subcommand: list them
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    guard = None
    try:
        _project_families()
        if args.command == "fuzz":
            check_fuzz_args(args)  # before anything heavy is imported
            if args.max_seconds is not None:
                args.clock = Deadline(started, args.max_seconds)  # (the campaign's one clock)
                if argv is None:  # the command's own process (it may end it)
                    guard = _StartGuard(args.clock)
            _ask_autotuning(args)  # (before the fork server: it imports helion for it)
            if not args.no_isolate:  # (its workers: forks of the fork server)
                from kda_fuzz.workers.process import start_fork_server_early

                # torch and the engine imported there while this process imports its own;
                # the kernel libraries once the targets are known (just below)
                start_fork_server_early()
            from kda_fuzz.workers.process import collector_paused

            with collector_paused():  # (torch's and the engine's imports)
                _choose(args)  # imports the contracts only to name their own kernels
            if not args.no_isolate:
                # the server imports the targets' kernel libraries as soon as its own
                # imports are done, not once this process has imported the engine too
                _name_preloads(args.chosen.targets.specs)
        from kda_fuzz.engine.oracle import EnvironmentFailure
    except UsageError as e:
        if guard is not None:  # (the command ends here, not the guard)
            guard.begun()
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "fuzz":
            try:
                return _fuzz(args, guard=guard)
            finally:
                if guard is not None:  # (ended before its campaign began: a usage error)
                    guard.begun()
        if args.command == "merge":
            from kda_fuzz.corpus.merge import merge_command

            return merge_command(args)
        if args.command == "show":
            return _show(args)
        return _replay(args)
    except UsageError as e:
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentFailure as e:  # the machinery that runs targets, not a target
        return _environment_error(e)
    except Exception as e:  # a bug of kda-fuzz itself: never reported as a target failure
        import traceback

        traceback.print_exc()
        print(f"kda-fuzz: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # a second signal, or one before the campaign began
        print("kda-fuzz: interrupted", file=sys.stderr)
        return int(getattr(e, "exit_code", 130))


def console() -> NoReturn:
    """The ``kda-fuzz`` command: :func:`main`, its exit code the process's (the
    interpreter's teardown skipped: :func:`kda_fuzz.workers.process.exit_now`); an install
    without bytecode has its bytecode kept (:mod:`kda_fuzz.workers.bytecode`)."""
    from kda_fuzz.workers.bytecode import keep_bytecode

    keep_bytecode(write=False)  # (before torch is imported; the fork server writes it)
    code = main()
    from kda_fuzz.workers.process import exit_now

    exit_now(code)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    console()
