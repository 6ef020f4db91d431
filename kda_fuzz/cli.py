"""The ``kda-fuzz`` command line: ``fuzz`` campaigns, corpus ``replay`` and ``merge``."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .contract import Sizing
from .oracle import EnvironmentFailure

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_CORPUS = os.path.join("corpus", "found")  # collected by the pytest plugin


class UsageError(Exception):
    """Bad command line or target: exit 2 with a one-line reason."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", metavar="MODULE:CALLABLE",
                   help="callable under test, with the contract's signature (repeatable; "
                        "default: the project's kernels for the contract)")
    p.add_argument("--contract", default=None,
                   help="contract variant (kda: helion = checks 1-22, triton = no check 14; "
                        "gdn: triton = the documented checks, helion = plus power-of-two K "
                        "and V); fuzz default: the family's first (kda: helion, gdn: "
                        "triton); replay default: each file's own variant")
    p.add_argument("--family", default="kda", help="kernel family contract (default: kda)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--json", action="store_true",
                   help="print one JSON summary object as the last line of stdout")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kda-fuzz``."""
    parser = argparse.ArgumentParser(prog="kda-fuzz", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    f = sub.add_parser("fuzz", help="run a fuzz campaign against a target")
    _common(f)
    f.add_argument("--max-examples", type=int, default=300,
                   help="examples in the campaign (default 300)")
    f.add_argument("--seed", type=int, default=None, help="seed for a reproducible campaign")
    f.add_argument("--corpus", default=None, metavar="DIR",
                   help="save each minimized failing case into DIR, where pytest replays "
                        "it; a bug DIR already holds (same target, same signature) is "
                        "counted as seen again, not saved again (default: FOLDER/found for "
                        "the first corpus folder of the project's [tool.kda-fuzz] table, "
                        "else corpus/found, relative to the current directory)")
    f.add_argument("--report", default=None, metavar="DIR",
                   help="write a self-contained HTML campaign report into DIR (checks hit, "
                        "failures, error budget, throughput)")
    f.add_argument("--no-save", action="store_true",
                   help="do not save failing cases into a corpus (an isolated target's case "
                        "in flight still goes to a temporary folder)")
    f.add_argument("--budget", type=int, default=None,
                   help="max B*HV*V*K elements per valid case (default: 2^18 on cpu, "
                        "2^13 for the project's interpreted kernels, 2^24 on cuda)")
    f.add_argument("--families", type=int, default=None,
                   help="spend valid examples family by family (fixed shapes, dtypes, "
                        "strides): fewer compiles (default: 0 on cpu, 8 on cuda)")
    f.add_argument("--max-b", type=int, default=None,
                   help="largest batch size (default: 256 on cpu, 64 for the project's "
                        "interpreted kernels, 16384 on cuda)")
    f.add_argument("--no-bucket", action="store_true",
                   help="do not round B up to powers of four with padding rows on cuda")
    f.add_argument("--valid-share", type=float, default=0.5,
                   help="share of examples spent on valid layouts (default 0.5)")
    f.add_argument("--scale-share", type=float, default=None,
                   help="share of examples in the GPU-scale stratum (B*HV past 65,535, "
                        "state pools past 2^31 elements; default 0.03 on cuda, 0 on cpu); "
                        "with --max-seconds it takes at most a tenth of the time, or its "
                        "share if larger")
    f.add_argument("--scale-budget", type=int, default=None, metavar="BYTES",
                   help="device bytes per scale case (default: 0.8 of the device's free "
                        "memory, split between the jobs)")
    f.add_argument("--shrink-seconds", type=float, default=30.0,
                   help="time allowed to minimize each distinct failure (default 30)")
    f.add_argument("--max-failures", type=int, default=20, metavar="N",
                   help="stop after N distinct failures (default 20): one per root cause "
                        "(what the target raised, with numbers masked, or which outputs it "
                        "got wrong); repeats of a known failure are counted, not kept")
    f.add_argument("--max-seconds", type=float, default=None,
                   help="stop the campaign after this many seconds (default: none)")
    f.add_argument("--messages", choices=("exact", "class"), default="exact",
                   help="exact (default): a broken layout must raise the contract's "
                        "exception with the documented message of the first failing check; "
                        "class: any message of the right exception type passes and wording "
                        "differences are only counted (check order cannot be judged then)")
    f.add_argument("--strict", action="store_true",
                   help="hold targets to the hardened contract: degenerate layouts that the "
                        "documented checks let through (HV = 0, V = 0) must raise too")
    f.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a target may take on one case before it counts as a hang")
    f.add_argument("--peer", action="append", metavar="MODULE:CALLABLE",
                   help="peer mode: also judge this implementation and compare the first "
                        "target's outputs with it on every accepted layout (repeatable)")
    f.add_argument("--no-isolate", action="store_true",
                   help="no flight record: with one job, run targets in this process; with "
                        "--jobs N, a crash or hang of a target ends the run (default: "
                        "isolated; a crash costs one restart of a job)")
    f.add_argument("--jobs", "-j", default="1", metavar="N|auto",
                   help="run the campaign's plan as N supervised processes, each with its "
                        "share of the breakage strata and compile families (auto: 8 per "
                        "GPU on cuda, one per core on cpu; default 1)")
    f.add_argument("--shard", default=None, metavar="I/N",
                   help="run shard I of N of the campaign: N shards of --max-examples each "
                        "split one campaign of N times the examples (same --seed, default "
                        "0, and options), each example run by exactly one shard")
    f.add_argument("--example-db", default=None, metavar="URL",
                   help="shared example database: redis://host:port/db or a folder "
                        "(default: example_db of [tool.kda-fuzz]); its stored failures are "
                        "replayed first, this run's new ones stored")
    r = sub.add_parser("replay", help="replay saved corpus files against a target")
    _common(r)
    r.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a target may run on a crash-, timeout- or flaky- file (each "
                        "runs in a worker) before it counts as hung (default 60)")
    r.add_argument("paths", nargs="+", metavar="PATH", help="corpus files or folders")
    from .merge import add_parser as add_merge

    add_merge(sub)
    return parser


def _prepare_device(device: str, contract: Any) -> None:
    """Check ``device`` and set up the contract's kernel execution for it before kernels
    are imported."""
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if device != "cpu" and m is None:
        raise UsageError(f"--device must be cpu or cuda[:N], not {device!r}")
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
    from .config import ConfigError, load_config

    try:
        return load_config(Path.cwd())
    except ConfigError as e:
        raise UsageError(str(e)) from e


def _targets(args: argparse.Namespace, contract: Any) -> list[Any]:
    """``--target``, else the project's configured targets for the variant, else the
    contract's own kernels."""
    return _loaded(_target_specs(args, contract)[0], contract)


def _loaded(specs: list[str], contract: Any) -> list[Any]:
    """Each ``MODULE:CALLABLE`` imported and checked against the contract's signature
    (a usage error when one cannot be)."""
    from .runner import TargetError, check_signature, load_target

    try:
        targets = [load_target(t) for t in specs]
        for t in targets:
            check_signature(t, contract)
    except TargetError as e:
        raise UsageError(str(e)) from e
    return targets


def _scale_figures(report: Any) -> str:
    """`; largest B ..., ... s per case (6 % of the jobs' time)` for the scale note."""
    big = report.scale_largest
    spent = report.stratum_seconds.get("scale", 0.0)
    n = sum(report.judged.values())
    total = sum(report.stratum_seconds.values())
    out = ""
    if big:
        out += "; largest " + ", ".join(f"{k} {v:,}" for k, v in big.items())
    if spent and n and total:
        out += (f"; {spent / n:.2f} s per scale case, {100 * spent / total:.0f} % of the jobs' "
                "time")
    return out


def _target_specs(args: argparse.Namespace, contract: Any) -> tuple[list[str], list[str]]:
    """The ``MODULE:CALLABLE`` names of the targets and peers (nothing imported)."""
    configured = _config().targets_for(contract.name, args.contract) if args.contract else None
    specs = args.target or configured or list(contract.default_targets.get(args.contract, ()))
    return list(specs), list(getattr(args, "peer", None) or ())  # replay has no --peer


def _supervisor(args: argparse.Namespace, names: tuple[list[str], list[str]], jobs: int,
                options: dict[str, Any]) -> Any:
    from .parallel import Supervisor
    from .runner import CampaignOptions

    return Supervisor(args.family, args.contract, names[0], jobs, peers=names[1],
                      timeout=args.timeout, options=CampaignOptions(**options),
                      isolate=not args.no_isolate)


def _wants_example_db(args: argparse.Namespace) -> bool:
    """Whether a shared example database is named (its replay comes first)."""
    cfg = _config()
    return args.example_db is not None or bool(cfg.present and cfg.example_db)


def _contract(args: argparse.Namespace) -> Any:
    from .contracts import get_contract

    try:
        contract = get_contract(args.family)
        if args.contract is not None:
            contract.checks_for(args.contract)
    except ValueError as e:
        raise UsageError(str(e)) from e
    return contract


def _fuzz(args: argparse.Namespace) -> int:
    from .progress import Progress
    from .runner import CampaignOptions, campaign, share_of

    contract = _contract(args)
    args.contract = args.contract or contract.variants[0]
    if args.max_examples < 1:
        raise UsageError("--max-examples must be at least 1")
    if args.max_failures < 1:
        raise UsageError("--max-failures must be at least 1")
    if not 0 <= args.valid_share <= 1:
        raise UsageError("--valid-share must be between 0 and 1")
    if args.scale_share is not None and not 0 <= args.scale_share <= 1:
        raise UsageError("--scale-share must be between 0 and 1")
    if args.scale_budget is not None and args.scale_budget <= 0:
        raise UsageError("--scale-budget must be positive")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise UsageError("--max-seconds must be positive")
    shard = _shard(args)
    if not (args.no_isolate and args.jobs == "1"):
        from .process import start_fork_server

        start_fork_server()  # the workers' imports, overlapping this process's own
    _prepare_device(args.device, contract)
    jobs = _jobs(args)
    options = dict(
        device=args.device, max_examples=args.max_examples, seed=args.seed,
        valid_share=args.valid_share, max_seconds=args.max_seconds,
        max_failures=args.max_failures, messages=args.messages, strict=args.strict,
        history=bool(args.report), **_shaping(args, contract))
    if shard is not None:  # the plan of the whole campaign, this shard's share of it
        from .shard import DEFAULT_SEED

        options.update(max_examples=args.max_examples * shard.count,
                       shard=(shard.index, shard.count),
                       seed=DEFAULT_SEED if args.seed is None else args.seed)
    early = None
    specs, peer_specs = _target_specs(args, contract)
    if args.device.startswith("cuda") and not (jobs == 1 and args.no_isolate) \
            and not _wants_example_db(args):
        # cuda campaigns are not calibrated: start the jobs now, so that their imports of
        # the targets (seconds for a Helion kernel) overlap the checks here
        early = _supervisor(args, (specs, peer_specs), jobs, options)
        early.start()
    try:
        targets, peers = _loaded(specs, contract), _loaded(peer_specs, contract)
    except UsageError:
        if early is not None:
            early.abort()
        raise
    db = _example_db(args, contract, [*targets, *peers])
    report_notes = []
    if not args.device.startswith("cuda") and not (args.budget or args.max_b) \
            and not _own_kernels(targets, contract, args.contract):
        from .calibrate import apply, calibrate

        for t in [*targets, *peers]:
            sizing = calibrate(contract, args.contract, t.name, timeout=args.timeout)
            if sizing is not None:
                apply(sizing, options)
                report_notes.append(f"{t.name}: {sizing.note()}")
                print(f"kda-fuzz: {t.name}: {sizing.note()}", file=sys.stderr)
    share = None
    if shard is not None:
        share = share_of(contract, args.contract, CampaignOptions(**options), jobs)
    replay = None
    if db is not None:
        from .exampledb import replay_stored

        replay = replay_stored(db[0], db[1], db[2], contract, args.contract, [*targets, *peers],
                               device=args.device, isolate=not args.no_isolate,
                               timeout=args.timeout, messages=args.messages, strict=args.strict)
    with Progress(share["examples"] if share else args.max_examples,
                  enabled=not args.json) as progress:
        if jobs == 1 and args.no_isolate:
            minimize = _minimizer(contract, args.shrink_seconds)
            if replay is not None:  # stored minimized: not again
                from .exampledb import skip_replayed

                minimize = skip_replayed(minimize, replay.failures)
            report = campaign(contract, args.contract, targets, on_example=progress.update,
                              minimize=minimize, peers=peers, **options)
            new = _merge_replayed(report, replay)
        else:
            from .parallel import minimize_failures

            sup = early or _supervisor(args, ([t.name for t in targets],
                                              [p.name for p in peers]), jobs, options)
            sup.on_example = progress.update
            report = sup.run()
            new = _merge_replayed(report, replay)
            minimize_failures(contract, new, device=args.device,
                              timeout=args.timeout, shrink_seconds=args.shrink_seconds,
                              workers=min(jobs, 4), messages=args.messages, strict=args.strict)
    report.notes[:0] = report_notes
    if report.judged:
        report.notes.append(
            f"scale stratum: {report.judged.get('full', 0)} case(s) judged on every live row, "
            f"{report.judged.get('sampled', 0)} on a sample of rows (first and last, the one "
            "naming slot num_slots-1, those around 65,535/65,536 in B and B*HV order, the "
            "rest at random); every untouched cell checked bit-exactly" + _scale_figures(report))
    corpus = None if args.no_save else args.corpus or _default_corpus()
    if corpus and report.failures:
        _save(report, contract, corpus, args)
    if share is not None:
        from .shard import note

        report.extra["shard"] = share
        report.notes.insert(0, note(share))
    if db is not None and replay is not None:
        from .exampledb import save_failures

        replay.saved = save_failures(db[0], db[2], new, seed=report.seed,
                                     shard=str(shard) if shard else None)
        report.extra["example_db"] = replay.to_json()
        report.notes.append(replay.note())
    if args.report:
        from .html_report import write_report

        path = write_report(report, args.report)
        print(f"kda-fuzz: report written to {path}", file=sys.stderr)
    _print_report(report, args.json)
    return EXIT_FAILURE if report.failures else EXIT_OK


def _shard(args: argparse.Namespace) -> Any:
    """``--shard I/N`` as a :class:`~kda_fuzz.shard.Shard` (``None`` without it)."""
    if args.shard is None:
        return None
    from .shard import parse_shard

    try:
        return parse_shard(args.shard)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _example_db(args: argparse.Namespace, contract: Any, targets: list[Any]
                ) -> tuple[Any, str, bytes] | None:
    """The example database (``--example-db``, else the project's ``example_db``), its
    URL and the key of this campaign's failures; ``None`` without one."""
    from .exampledb import ExampleDbError, campaign_key, open_database, resolve

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
    return db, url, campaign_key(contract.name, args.contract, [t.name for t in targets])


def _merge_replayed(report: Any, replay: Any) -> list[Any]:
    """The campaign's new failures; replayed ones (if any) go first in ``report``."""
    if replay is None:
        return list(report.failures)
    from .exampledb import merge_replayed

    return merge_replayed(report, replay.failures)


def _default_corpus() -> str:
    cfg = _config()
    if cfg.present and cfg.corpus_dirs:
        return str(cfg.corpus_dirs[0] / "found")
    return DEFAULT_CORPUS


def _save(report: Any, contract: Any, corpus: str, args: argparse.Namespace) -> None:
    """Save each distinct failure; one too large for a corpus file is described instead.
    Outside a project that opted in, say how pytest would replay the files."""
    from .config import config_snippet
    from .corpus import SEEN_AGAIN, CaseTooLarge, replay_command_line, save_failure

    for f in report.failures:
        try:
            f.saved = str(save_failure(f, corpus, contract=contract, seed=report.seed))
            f.reproduce = replay_command_line(f.target, f.saved, variant=report.variant,
                                              device=args.device, timeout=args.timeout)
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
              + config_snippet(contract.name, args.contract, args.target) + "\n",
              file=sys.stderr)


def _own_kernels(targets: list[Any], contract: Any, variant: str) -> bool:
    """Whether ``targets`` are the contract's own kernels for ``variant``."""
    own = contract.default_targets.get(variant, ())
    return bool(targets) and all(t.name in own for t in targets)


def _shaping(args: argparse.Namespace, contract: Any = None) -> dict[str, Any]:
    """Layout sizes: compile-aware defaults on cuda (families, bucketed batches), small
    layouts for the interpreted default kernels on cpu (other targets on cpu are measured
    first, see ``calibrate``); the numbers are the contract's ``sizing``."""
    sz = contract.sizing if contract is not None else Sizing()
    cuda = args.device.startswith("cuda")
    interpreted = not cuda and not args.target
    out: dict[str, Any] = {
        "families": args.families if args.families is not None else (8 if cuda else 0),
        "bucket": cuda and not args.no_bucket,
        "max_b": args.max_b or (sz.cuda_max_b if cuda else sz.interpreted_max_b if interpreted
                                else None),
        "budget": args.budget or (sz.cuda_budget if cuda else sz.interpreted_budget
                                  if interpreted else None),
        "max_bhv": sz.interpreted_max_bhv if interpreted and not args.budget else None,
        "scale_share": (args.scale_share if getattr(args, "scale_share", None) is not None
                        else 0.03 if cuda else 0.0),
        "scale_budget": getattr(args, "scale_budget", None),
    }
    return out


def _jobs(args: argparse.Namespace) -> int:
    if args.jobs == "auto":
        from .parallel import auto_jobs

        return auto_jobs(args.device)
    try:
        jobs = int(args.jobs)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise UsageError(f"--jobs must be a positive integer or auto, not {args.jobs!r}")
    return jobs


def _minimizer(contract: Any, seconds: float = 30.0) -> Any:
    from .minimize import minimize_with_verdict

    return lambda case, target, verdict, run: minimize_with_verdict(
        contract, case, target.fn, verdict, run=run, seconds=seconds)


def _print_report(report: Any, as_json: bool) -> None:
    from .progress import print_summary

    if as_json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        print_summary(report)


def _replay(args: argparse.Namespace) -> int:
    from .corpus import replay_command
    from .runner import default_targets

    contract = _contract(args)
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    _prepare_device(args.device, contract)
    # No --target: each file is replayed on the project's configured targets for its
    # variant, else on kda-fuzz's own kernels.
    targets: Any = _targets(args, contract) if args.target else None
    cfg = _config()
    if targets is None and cfg.present:
        from .runner import load_target

        def targets(variant: str) -> list[Any]:
            specs = cfg.targets_for(contract.name, variant)
            return ([load_target(t) for t in specs] if specs
                    else default_targets(contract, variant))
    return replay_command(contract, args.contract, targets, args.paths, device=args.device,
                          as_json=args.json, timeout=args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kda-fuzz`` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if args.command is None:  # no subcommand: list them
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "fuzz":
            return _fuzz(args)
        if args.command == "merge":
            from .merge import merge_command

            return merge_command(args)
        return _replay(args)
    except UsageError as e:
        print(f"kda-fuzz: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentFailure as e:  # the machinery that runs targets, not a target
        print(f"kda-fuzz: environment error (not a verdict on the target): {e}",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a bug of kda-fuzz itself: never reported as a target failure
        import traceback

        traceback.print_exc()
        print(f"kda-fuzz: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kda-fuzz: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
