"""The command line's front: instant answers, honest defaults, one replay path, ``show``.

How long the answers take is printed by ``benchmarks/cli_latency.py``, not asserted here;
what is asserted is that torch is not imported before the arguments are checked."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kda_fuzz.config import AmbiguousTargets, choose_campaign, load_config
from kda_fuzz.names import BUILTINS, FAMILIES
from tests.inprocess import kda_fuzz

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "corpus" / "seed"
KDA_FILE = SEED / "mismatch-cffe627afc47f1fc.json"  # tests.mutants:pad_wrap
GDN_FILE = SEED / "mismatch-ea574dd3ae77f403.json"  # tests.gdn_mutants:padding_rows_untouched
BROKEN = SEED / "contract-aa883986dd44afc4.json"  # tests.mutants:typo_check_10
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("TRITON_INTERPRET", "KDA_FUZZ_CPU_MODE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "kda_fuzz", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------ instant answers


def test_the_light_registry_names_every_contract_and_variant() -> None:
    from kda_fuzz.families import CONTRACTS

    assert {n: c.variants for n, c in CONTRACTS.items()} == FAMILIES
    assert {n: dict(c.default_targets) for n, c in CONTRACTS.items()} \
        == {n: b.targets for n, b in BUILTINS.items()}


@pytest.mark.parametrize("argv", [["fuzz", "--contract", "foo"], ["fuzz", "--max-examples", "-1"],
                                  ["fuzz", "--family", "gdn", "--contract", "x"],
                                  ["fuzz", "--jobs", "0"], ["fuzz", "--help"], ["--help"], []])
def test_usage_answers_import_no_torch(argv: list[str]) -> None:
    code = ("import sys; from kda_fuzz.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH' if 'torch' in sys.modules else 'LIGHT', rc)")
    r = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    last = r.stdout.strip().splitlines()[-1]
    assert last == f"LIGHT {0 if '--help' in argv else 2}", (argv, r.stdout, r.stderr)


def test_usage_errors_say_what_is_wrong_in_one_line() -> None:
    r = _run("fuzz", "--max-examples", "-1")
    assert r.returncode == 2 and r.stderr.strip() == \
        "kda-fuzz: error: --max-examples must be at least 1"
    r = _run("fuzz", "--contract", "helion", "--read-every", "0")
    assert r.returncode == 2 and r.stderr.strip() == \
        "kda-fuzz: error: --read-every must be at least 1"
    r = _run("fuzz", "--contract", "foo")
    assert r.returncode == 2 and "unknown variant 'foo' (choose from" in r.stderr
    assert "helion" in r.stderr and "triton" in r.stderr


def test_help_is_grouped_lists_choices_and_ends_with_examples() -> None:
    r = _run("fuzz", "--help")
    assert r.returncode == 0
    text = r.stdout
    for group in ("targets:", "campaign:", "sizes:", "GPU:", "isolation:", "output:"):
        assert f"\n{group}\n" in text, group
    assert "kda, gdn or one of the project" in text and "{helion,triton}" in text
    assert "--compile-groups N" in text and "--families" not in text
    tail = text[text.index("examples:"):]
    assert tail.count("kda-fuzz fuzz") >= 3
    bare = _run()
    assert bare.returncode == 2 and "``" not in bare.stderr and "fuzz" in bare.stderr
    assert "glossary" in bare.stderr


def test_families_is_a_deprecated_alias_of_compile_groups(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    from kda_fuzz.cli import build_parser

    args = build_parser().parse_args(["fuzz", "--families", "3"])
    assert args.families == 3
    assert "--families is deprecated: use --compile-groups" in capsys.readouterr().err
    assert build_parser().parse_args(["fuzz", "--compile-groups", "5"]).families == 5


# ------------------------------------------------------------------ honest defaults


def _project(tmp_path: Path, targets: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "u"\nversion = "0"\n{targets}')
    (tmp_path / "mykern.py").write_text(
        f"from {REFERENCE.split(':')[0]} import {REFERENCE.split(':')[1]} as decode\n")
    return tmp_path


def _own(family: str, variant: str) -> tuple[str, ...]:
    return (f"own:{family}-{variant}",)


def test_choose_campaign_uses_the_configured_variant_and_refuses_ambiguity(tmp_path: Path
                                                                           ) -> None:
    cfg = load_config(_project(tmp_path, '[tool.kda-fuzz.targets.kda]\ntriton = ["m:k"]\n'))
    c = choose_campaign(cfg, None, None, (), FAMILIES, _own)
    assert (c.family, c.variant, c.targets.specs, c.targets.source) == \
        ("kda", "triton", ("m:k",), "config")
    c = choose_campaign(cfg, None, "helion", (), FAMILIES, _own)  # asked for: said so
    assert (c.variant, c.targets.source) == ("helion", "default")
    c = choose_campaign(cfg, None, None, ("x:y",), FAMILIES, _own)
    assert (c.family, c.variant, c.targets.specs) == ("kda", "helion", ("x:y",))
    cfg = load_config(_project(tmp_path, '[tool.kda-fuzz.targets.gdn]\nhelion = ["g:k"]\n'))
    c = choose_campaign(cfg, None, None, (), FAMILIES, _own)
    assert (c.family, c.variant, c.targets.specs) == ("gdn", "helion", ("g:k",))
    cfg = load_config(_project(tmp_path, '[tool.kda-fuzz.targets.kda]\ntriton = ["m:k"]\n'
                                         'helion = ["m:h"]\n'))
    with pytest.raises(AmbiguousTargets, match="--contract helion or --contract triton"):
        choose_campaign(cfg, None, None, (), FAMILIES, _own)
    assert choose_campaign(cfg, None, "triton", (), FAMILIES, _own).targets.specs == ("m:k",)
    cfg = load_config(_project(tmp_path, '[tool.kda-fuzz.targets.gdn]\ntriton = ["a:b"]\n'
                                         '[tool.kda-fuzz.targets.foo]\ntriton = ["c:d"]\n'))
    assert choose_campaign(cfg, None, None, (), FAMILIES, _own).family == "gdn"


def test_the_contracts_own_kernels_are_asked_for_only_where_nothing_names_targets(
        tmp_path: Path) -> None:
    """Asking a contract for its own kernels imports it (torch: seconds, before the fork
    server has been told its kernel libraries), so ``--target`` and configured targets
    never ask."""
    asked: list[tuple[str, str]] = []

    def own(family: str, variant: str) -> tuple[str, ...]:
        asked.append((family, variant))
        return _own(family, variant)

    cfg = load_config(_project(tmp_path, '[tool.kda-fuzz.targets.kda]\ntriton = ["m:k"]\n'))
    assert choose_campaign(cfg, None, None, (), FAMILIES, own).targets.specs == ("m:k",)
    assert choose_campaign(cfg, None, "helion", ("x:y",), FAMILIES, own).targets.specs \
        == ("x:y",)
    assert asked == []
    assert choose_campaign(cfg, None, "helion", (), FAMILIES, own).targets.source == "default"
    assert asked == [("kda", "helion")]


def test_the_fork_server_is_named_its_kernel_libraries_before_the_campaign_resolves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The command tells the fork server started early which kernel libraries to import as
    soon as it has chosen its targets (before it imports the engine to resolve the
    campaign), and ``--no-isolate`` starts none."""
    from kda_fuzz import cli
    from kda_fuzz.workers import process

    calls: list[object] = []
    monkeypatch.setattr(process, "start_fork_server_early", lambda: calls.append("early"))
    monkeypatch.setattr(cli, "_name_preloads",
                        lambda targets: calls.append(tuple(targets)))
    monkeypatch.setattr(cli, "_fuzz", lambda args, **_: calls.append("campaign") or 0)
    target = "kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode"
    assert cli.main(["fuzz", "--target", target, "--contract", "helion"]) == 0
    assert calls == ["early", (target,), "campaign"]
    calls.clear()
    assert cli.main(["fuzz", "--target", target, "--contract", "helion", "--no-isolate"]) == 0
    assert calls == ["campaign"]


def test_helion_autotune_is_asked_before_the_fork_server_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--helion-autotune`` is in the environment when the fork server starts (which
    imports helion with what its autotuners use only then: Helion's default autotuner
    needs scikit-learn)."""
    from kda_fuzz import cli
    from kda_fuzz.execution.configs import AUTOTUNE_ENV
    from kda_fuzz.workers import process

    monkeypatch.setenv(AUTOTUNE_ENV, "0")  # (restored after the test)
    seen: list[str | None] = []
    monkeypatch.setattr(process, "start_fork_server_early",
                        lambda: seen.append(os.environ.get(AUTOTUNE_ENV)))
    monkeypatch.setattr(cli, "_name_preloads", lambda targets: None)
    monkeypatch.setattr(cli, "_fuzz", lambda args, **_: 0)
    target = "kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode"
    assert cli.main(["fuzz", "--target", target, "--contract", "helion",
                     "--helion-autotune"]) == 0
    assert seen == ["1"]


def test_a_campaign_naming_no_targets_names_the_fork_server_its_libraries_before_torch(
        tmp_path: Path) -> None:
    """In a project that configures no targets, the built-in contract's own kernels are
    chosen from the light registry: the fork server is told its kernel libraries before
    the command has imported torch (seconds on a GPU machine, on every job's path)."""
    code = (
        "import sys\n"
        "from kda_fuzz import cli\n"
        "from kda_fuzz.workers import process\n"
        "process.start_fork_server_early = lambda: None\n"
        "cli._name_preloads = lambda targets: print('named', list(targets),\n"
        "                                           'torch' in sys.modules)\n"
        "cli._fuzz = lambda args: 0\n"
        "cli.main(['fuzz', '--family', sys.argv[1], '--contract', 'helion'])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for family in ("kda", "gdn"):
        r = subprocess.run([sys.executable, "-c", code, family], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        named = [line for line in r.stdout.splitlines() if line.startswith("named")]
        assert named == [f"named {list(BUILTINS[family].targets['helion'])} False"], r.stdout


def test_the_command_imports_helion_lean_and_the_targets_as_they_are(tmp_path: Path) -> None:
    """The command's own helion comes without scikit-learn (only its autotuners use it),
    imported before the targets; a target module that imports scikit-learn itself gets it."""
    pytest.importorskip("helion")
    pytest.importorskip("sklearn")
    (tmp_path / "mykern.py").write_text(
        "import sklearn\n"
        "import helion\n"
        "from kda_fuzz_kernels.kda_decode import helion_fused_recurrent_kda_packed_decode\n"
        "def decode(*a, **k):\n"
        "    return helion_fused_recurrent_kda_packed_decode(*a, **k)\n")
    code = ("import sys\n"
            "from kda_fuzz import cli\n"
            "from kda_fuzz.families import get_contract\n"
            "[t] = cli._loaded(['mykern:decode'], get_contract('kda'))\n"
            "from helion.autotuner import de_surrogate_hybrid as d\n"
            "print(t.name, 'sklearn' in sys.modules, d.HAS_ML_DEPS)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("KDA_FUZZ_HELION_AUTOTUNE", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-2:] == ["True", "False"], r.stdout


def test_a_user_project_configuring_triton_fuzzes_its_triton_target(tmp_path: Path) -> None:
    project = _project(tmp_path, '[tool.kda-fuzz.targets.kda]\ntriton = ["mykern:decode"]\n')
    r = kda_fuzz("fuzz", "--max-examples", "4", "--seed", "1", "--no-save", "--json",
                 cwd=project)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert (summary["contract"], summary["variant"], summary["targets"]) == \
        ("kda", "triton", ["mykern:decode"])
    assert "fuzzing kda/triton (the variant configured)" in r.stderr
    assert "mykern:decode (configured in pyproject.toml); 1 job(s)" in r.stderr
    (project / "pyproject.toml").write_text(
        '[tool.kda-fuzz.targets.kda]\ntriton = ["mykern:decode"]\nhelion = ["mykern:decode"]\n')
    r = _run("fuzz", "--max-examples", "4", cwd=project)
    assert r.returncode == 2 and "several variants (helion, triton)" in r.stderr, r.stderr
    assert "--contract helion or --contract triton" in r.stderr


def test_jobs_default_to_auto_on_cuda_and_the_start_line_says_so() -> None:
    from kda_fuzz.cli import _start_line, build_parser, check_fuzz_args
    from kda_fuzz.config import CampaignChoice, TargetChoice

    args = build_parser().parse_args(["fuzz", "--device", "cuda"])
    check_fuzz_args(args)
    assert args.jobs == "auto"
    args.chosen = CampaignChoice("kda", "helion", TargetChoice(("m:k",), "config"), "--contract")
    line = _start_line(args, 8)
    assert "kda/helion" in line and "m:k (configured in pyproject.toml)" in line
    assert "8 job(s) (auto: 8 per GPU)" in line
    args = build_parser().parse_args(["fuzz"])
    check_fuzz_args(args)
    assert args.jobs == "1"


# ------------------------------------------------------------------ one replay path


def test_replay_follows_each_files_family_and_variant(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in (KDA_FILE, GDN_FILE):
        shutil.copy(f, corpus / f.name)
    # the repository's own pyproject.toml configures its kernels for both families
    r = kda_fuzz("replay", "--json", str(corpus))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert sorted((f["family"], f["status"], f["targets_from"]) for f in out["files"]) == \
        [("gdn", "PASS", "config"), ("kda", "PASS", "config")]


def test_replay_record_and_cut_details(tmp_path: Path) -> None:
    from kda_fuzz.corpus.replay import check_entry, replay, shorten
    from kda_fuzz.engine.targets import load_target

    rec = replay(KDA_FILE, [load_target("tests.mutants:pad_wrap")])
    assert rec.status == "FAIL" and rec.family == "kda" and rec.variant == "triton"
    (res,) = rec.failures
    assert res.same_as_recorded and res.outcome.verdict.what == "untouched-state-written"
    assert rec.headline() == "mismatch/untouched-state-written on tests.mutants:pad_wrap"
    whole = rec.failure_line()
    assert whole.endswith("changed (same failure as recorded)")
    cut = rec.failure_line(60)
    assert cut != whole and " ..." in cut and cut.split(" ...")[0] in whole
    assert shorten("alpha beta gamma", 12) == "alpha ..."  # never mid-word
    assert check_entry(GDN_FILE, family="kda").status == "ERROR"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert check_entry(bad).status == "ERROR" and "invalid JSON" in check_entry(bad).reason


def test_replay_cuts_details_at_a_word_and_verbose_prints_them_whole(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kda_fuzz.corpus import replay as replay_module
    from kda_fuzz.engine.targets import load_target

    monkeypatch.setattr(replay_module, "DETAIL_WIDTH", 60)
    target = [load_target("tests.mutants:pad_wrap")]
    assert replay_module.replay_paths([str(KDA_FILE)], target) == 1
    out = capsys.readouterr().out
    assert " ..." in out and "--verbose shows them whole" in out
    assert "changed (same failure as recorded)" not in out
    assert replay_module.replay_paths([str(KDA_FILE)], target, verbose=True) == 1
    out = capsys.readouterr().out
    assert "outside every slot named by a non-negative index, changed (same failure as " \
        "recorded)" in out and "--verbose" not in out


def test_merge_exits_1_on_bad_files(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(BROKEN, src / BROKEN.name)
    r = kda_fuzz("merge", str(tmp_path / "out"), str(src))
    assert r.returncode == 0, r.stderr
    (src / "contract-truncated.json").write_text('{"schema": 2, "kind": "contr')
    r = kda_fuzz("merge", str(tmp_path / "out"), str(src))
    assert r.returncode == 1 and "BAD" in r.stdout and "1 bad" in r.stdout
    assert (tmp_path / "out" / BROKEN.name).is_file()


def test_pytest_short_summary_names_the_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.kda-fuzz]\ncorpus = ["corpus"]\n'
                               '[tool.kda-fuzz.targets.kda]\ntriton = ["mykern:decode"]\n')
    pytester.makepyfile(mykern="""
        from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

        def decode(*args):
            out, state = reference_kda_packed_decode(*args)
            out.add_(1.0)
            return out, state
    """)
    (pytester.path / "corpus").mkdir()
    shutil.copy(SEED / "mismatch-71ad9b13ac4af176.json", pytester.path / "corpus")
    for var in ("TRITON_INTERPRET", "KDA_FUZZ_CPU_MODE", "KDA_FUZZ_PROFILE"):
        pytester._monkeypatch.delenv(var, raising=False)
    # pytest trims the line to the terminal (the node id alone is 77 characters); on CI
    # (the CI variable set) it prints it whole
    pytester._monkeypatch.setenv("COLUMNS", "200")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED corpus/mismatch-71ad9b13ac4af176.json* - "
                                 "mismatch/padding-row-not-zero on mykern:decode"])


def test_the_summary_table_does_not_cut_target_names() -> None:
    import io

    from kda_fuzz.campaign.results import Report
    from kda_fuzz.report.progress import print_summary

    name = "a_rather_long_package.with_submodules.decode:fused_recurrent_kda_packed_decode_v2"
    buf = io.StringIO()
    print_summary(Report("kda", "triton", [name]), file=buf)
    cells = "".join(line.split("│")[2].strip() for line in buf.getvalue().splitlines()
                    if line.count("│") == 3 and "examples" not in line)
    assert name in cells


# ------------------------------------------------------------------ show


def test_show_prints_layout_verdict_and_reproduction() -> None:
    r = kda_fuzz("show", str(KDA_FILE))
    assert r.returncode == 0, r.stderr
    for part in ("kda/triton (mismatch)", "layout:      B=1 H=1 HV=1 K=1 V=1",
                 "[mismatch] untouched-state-written", "contract now: it accepts the layout",
                 "kda-fuzz replay --target tests.mutants:pad_wrap --contract triton"):
        assert part in r.stdout, part
    r = _run("show", "no-such-file.json")
    assert r.returncode == 2 and "no such file" in r.stderr


@pytest.mark.parametrize("path", [KDA_FILE, pytest.param(BROKEN, marks=pytest.mark.slow)])
def test_show_python_writes_a_script_that_reproduces_the_failure(path: Path,
                                                                 tmp_path: Path) -> None:
    r = kda_fuzz("show", "--python", str(path))
    assert r.returncode == 0, r.stderr
    script = tmp_path / "repro.py"
    script.write_text(r.stdout)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 1 and "REPRODUCED: [" in ran.stdout, (ran.stdout, ran.stderr)
    # the same script against the reference: the failure is gone
    r = kda_fuzz("show", "--python", "--target", REFERENCE, str(path))
    script.write_text(r.stdout)
    ran = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0 and "not reproduced: pass" in ran.stdout, (ran.stdout, ran.stderr)


def test_show_python_rebuilds_the_arguments_bit_for_bit(tmp_path: Path) -> None:
    import torch

    from kda_fuzz.corpus.replay import load_entry
    from kda_fuzz.corpus.store import load_case
    from kda_fuzz.show import script

    entry = load_entry(BROKEN)
    text = script(entry, REFERENCE)
    ns: dict = {"__name__": "repro"}
    exec(compile(text, "repro.py", "exec"), ns)  # our own generated script
    built = ns["build"]()
    case, _, _ = load_case(BROKEN)
    for name, arg in case.tensors.items():
        got = built[name]
        assert (got.shape, got.stride(), got.storage_offset(), got.dtype) == \
            (arg.shape, arg.stride, arg.offset, arg.dtype)
        base = got.as_strided((arg.base.numel(),), (1,), 0)
        assert torch.equal(base.view(torch.uint8), arg.base.view(torch.uint8)), name
    assert {k: built[k] for k in case.scalars} == case.scalars


def test_argparse_namespace_of_old_callers_still_works() -> None:
    """``_shaping`` reads ``families`` from the namespace, as before the rename."""
    from kda_fuzz.campaign.spec import shaping as _shaping

    base = dict(device="cuda", target=None, families=None, no_bucket=False, max_b=None,
                budget=None, scale_share=None, scale_budget=None)
    assert _shaping(argparse.Namespace(**base))["families"] == 8
    assert _shaping(argparse.Namespace(**{**base, "families": 3}))["families"] == 3


def test_the_example_database_replays_through_the_replay_path(tmp_path: Path) -> None:
    from hypothesis.database import DirectoryBasedExampleDatabase

    from kda_fuzz.campaign.exampledb import campaign_key, replay_stored, secondary
    from kda_fuzz.engine.targets import load_target
    from kda_fuzz.families import get_contract

    db = DirectoryBasedExampleDatabase(str(tmp_path / "db"))
    key = campaign_key("kda", "triton", ["tests.mutants:pad_wrap"])
    db.save(key, KDA_FILE.read_bytes())
    stale = json.loads(BROKEN.read_text())
    stale["verdict"]["check"], stale["verdict"]["message"] = 11, "an older wording"
    db.save(key, json.dumps(stale).encode())
    kda = get_contract("kda")
    buggy = [load_target("tests.mutants:pad_wrap")]
    replay = replay_stored(db, "dir", key, kda, "triton", buggy, isolate=False)
    assert [f.verdict.what for f in replay.failures] == ["untouched-state-written"]
    assert len(replay.stale) == 1 and "recorded: raises check 11" in replay.stale[0]
    assert len(list(db.fetch(key))) == 1 and len(list(db.fetch(secondary(key)))) == 1
    fixed = [load_target(REFERENCE)]
    fixed[0] = type(fixed[0])("tests.mutants:pad_wrap", fixed[0].fn)
    replay = replay_stored(db, "dir", key, kda, "triton", fixed, isolate=False)
    assert (replay.passed, replay.failures) == (1, [])
    assert list(db.fetch(key)) == []
