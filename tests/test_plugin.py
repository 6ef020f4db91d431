"""The pytest plugin is scoped: it acts only in projects that opt in, and there it replays
corpus files against the project's configured targets. Each session runs in a subprocess
(pytester in-process sessions unload what they import; triton cannot be imported twice)."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest

from kda_fuzz.config import ConfigError, choose_targets, load_config, origin_mismatch
from kda_fuzz.corpus.store import save_case
from kda_fuzz.families.kda.layouts import KdaLayout, Values, build
from kda_fuzz.plugin import CorpusOriginWarning

pytest_plugins = ["pytester"]

REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"

# A project's own test module: it checks that the plugin left its session alone.
PROBE = """
    import os, sys
    import pytest
    from hypothesis import HealthCheck, given, settings, strategies as st

    def test_own_profile_kept():
        assert settings.get_current_profile_name() == "mine"
        assert settings.default.max_examples == 7
        assert settings.default.suppress_health_check == ()

    def test_nothing_imported_or_set():
        assert "torch" not in sys.modules
        assert "TRITON_INTERPRET" not in os.environ

    @pytest.mark.gpu
    def test_my_gpu_marked_test_runs():
        pass
"""
# Explicit health checks: Hypothesis' own "ci" profile (loaded when $CI is set) suppresses one.
CONFTEST = """
    from hypothesis import settings
    settings.register_profile("mine", max_examples=7, suppress_health_check=[])
    settings.load_profile("mine")
"""
# A user's kernel with a planted bug, and its fixed twin.
KERNEL = f"""
    from {REFERENCE.split(':')[0]} import {REFERENCE.split(':')[1]} as ref

    def buggy(*args):
        out, state = ref(*args)
        out.add_(1.0)
        return out, state

    def fixed(*args):
        return ref(*args)
"""


def _corpus_file(directory: Path, target: str = "mykernel:buggy") -> Path:
    case = build(KdaLayout(B=2, H=1, HV=2, K=4, V=4, spare_slots=1, padding="none",
                           qkv_row_pad=1, slot_pad=0, guard=1, values=Values(), seed=3),
                 "triton")
    return save_case(case, None, directory, description="valid layout",
                     origin={"target": target, "tool": "kda-fuzz fuzz"})


def _project(pytester: pytest.Pytester, pyproject: str | None = None) -> Path:
    # The session's own opt-in exported these; the subprocess must start without them.
    for var in ("TRITON_INTERPRET", "KDA_FUZZ_CPU_MODE", "KDA_FUZZ_PROFILE"):
        pytester._monkeypatch.delenv(var, raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_probe=PROBE, mykernel=KERNEL)
    if pyproject is not None:
        pytester.makefile(".toml", pyproject=textwrap.dedent(pyproject))
    return _corpus_file(pytester.path / "corpus")


def test_a_project_that_does_not_opt_in_is_left_alone(pytester: pytest.Pytester) -> None:
    _project(pytester, "[tool.black]\nline-length = 100\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=3)  # the gpu-marked test ran, no JSON was collected
    out = result.stdout.str()
    assert ".json" not in out and "kda-fuzz: active" not in out


# the configured project and the plugin named by module stay in the fast tier; the ini
# option and the entry point's name (a session each, torch imported) run in the slow tier
@pytest.mark.parametrize("how", ["pyproject", pytest.param("ini", marks=pytest.mark.slow),
                                 pytest.param("-p", marks=pytest.mark.slow), "-p no autoload"])
def test_opting_in_collects_the_corpus_and_scopes_gpu_tests(pytester: pytest.Pytester,
                                                            how: str) -> None:
    """``-p kda_fuzz`` names the installed entry point; ``-p kda_fuzz.plugin`` is for
    sessions without plugin autoloading (pluggy refuses one module under two names)."""
    pyproject = (f"[tool.kda-fuzz]\n[tool.kda-fuzz.targets.kda]\ntriton = ['{REFERENCE}']\n"
                 if how == "pyproject" else None)
    corpus = _project(pytester, pyproject)
    args = ["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestWarning",
            "--collect-only", "-q"]
    if how == "ini":
        pytester.makeini("[pytest]\nkda_fuzz_corpus = corpus\n")
    if how == "-p":
        args += ["-p", "kda_fuzz"]
    if how == "-p no autoload":
        pytester._monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        args += ["-p", "kda_fuzz.plugin"]
    out = pytester.runpytest_subprocess(*args).stdout.str()
    assert f"{corpus.name}::{corpus.name}" in out
    assert "test_my_gpu_marked_test_runs" not in out  # deselected without a GPU
    assert "1 deselected" in out


def test_corpus_replays_against_the_users_configured_kernel(pytester: pytest.Pytester) -> None:
    """The issue's scenario: a planted bug saved under corpus/ must fail under pytest (three
    sessions in this process: what differs between them is the configuration)."""
    corpus = _project(pytester, "[tool.kda-fuzz]\n")
    pytester.makepyfile(test_probe="")
    # Opted in, no target configured: fails, naming the recorded target and the fix.
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*no replay target is configured for the kda/triton variant; the file was "
        "recorded against mykernel:buggy*",
        "*[[]tool.kda-fuzz.targets.kda]*", '*triton = [[]"mykernel:buggy"]*'])
    # Configured: the configured kernel is the one replayed (here the fixed one, which
    # passes with a warning: it is not the kernel the file recorded) ...
    (pytester.path / "pyproject.toml").write_text(
        "[tool.kda-fuzz]\n[tool.kda-fuzz.targets.kda]\ntriton = ['mykernel:fixed']\n")
    with warnings.catch_warnings():  # (in this process: this repository ignores the warning)
        warnings.simplefilter("always", CorpusOriginWarning)
        result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*CorpusOriginWarning*recorded against mykernel:buggy, "
                                 "replayed against mykernel:fixed*"])
    # ... and --kda-corpus-target overrides the configuration: the planted bug fails the
    # item (a configured buggy kernel failing it: test_cli_front's short-summary test)
    result = pytester.runpytest("-p", "no:cacheprovider",
                                           "--kda-corpus-target", "mykernel:buggy")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*corpus file *{corpus.name}*",
                                 "*layout: B=2 H=1 HV=2 K=4 V=4*",
                                 "*mykernel:buggy: [[]mismatch] out-value*worst element out[[]*"])


# ------------------------------------------------------------------ config


def test_load_config_reads_the_table_upward(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.kda-fuzz]
        corpus = ["regressions", "corpus"]
        [tool.kda-fuzz.targets.kda]
        helion = ["mypkg.decode:my_kernel"]
    """))
    sub = tmp_path / "src" / "pkg"
    sub.mkdir(parents=True)
    cfg = load_config(sub)
    assert cfg.present and cfg.path == tmp_path / "pyproject.toml"
    assert cfg.corpus_dirs == [(tmp_path / "regressions").resolve(),
                               (tmp_path / "corpus").resolve()]
    assert cfg.targets_for("kda", "helion") == ["mypkg.decode:my_kernel"]
    assert cfg.targets_for("kda", "triton") is None
    choice = choose_targets(cfg, "kda", "helion")
    assert (choice.source, choice.specs) == ("config", ("mypkg.decode:my_kernel",))
    assert choose_targets(cfg, "kda", "triton").source == "none"
    assert choose_targets(cfg, "kda", "triton", defaults=["k:d"]).source == "default"
    assert choose_targets(cfg, "kda", "helion", override=["x:y"]).specs == ("x:y",)
    assert origin_mismatch({"target": "mypkg.decode:my_kernel"}, choice) is None
    assert origin_mismatch({}, choice) is None
    assert "recorded against old:k" in origin_mismatch({"target": "old:k"}, choice)
    assert origin_mismatch({"target": "a:b vs mypkg.decode:my_kernel"}, choice) is None


def test_no_table_means_not_opted_in_and_bad_tables_are_errors(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    cfg = load_config(tmp_path)
    assert not cfg.present and cfg.targets_for("kda", "triton") is None
    for bad, words in [("corpuss = ['x']", "unknown key(s) corpuss"),
                       ("corpus = 'corpus'", "list of non-empty strings"),
                       ("[tool.kda-fuzz.targets.kda]\ntriton = ['no_colon']", "MODULE:CALLABLE"),
                       ("[tool.kda-fuzz.targets]\nkda = ['a:b']", "table of variants")]:
        (tmp_path / "pyproject.toml").write_text(f"[tool.kda-fuzz]\n{bad}\n")
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_config(tmp_path)


def test_a_hanging_target_fails_its_timeout_item_within_the_users_timeout(
        pytester: pytest.Pytester) -> None:
    """timeout- items run in a worker; ``--kda-corpus-timeout`` is how long it may run."""
    from kda_fuzz.engine.verdict import Verdict

    _project(pytester, "[tool.kda-fuzz]\n[tool.kda-fuzz.targets.kda]\n"
                       "triton = ['slowkernel:hangs']\n")
    pytester.makepyfile(slowkernel="import time\n\ndef hangs(*args):\n    time.sleep(3600)\n")
    for f in (pytester.path / "corpus").glob("*.json"):
        f.unlink()
    case = build(KdaLayout(B=2, H=1, HV=2, K=4, V=4, seed=3), "triton")
    save_case(case, Verdict("timeout", "no-return", "did not return within 3 s"),
              pytester.path / "corpus")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kda-corpus-timeout",
                                           "2", "corpus")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*slowkernel:hangs: [[]timeout]*did not return within 2 s*"])
    result = pytester.runpytest("--kda-corpus-timeout", "0")  # a usage error: in-process
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kda-corpus-timeout must be positive" in result.stderr.str()


class _Config:
    """What ``_xdist_controller`` reads of a configured session."""

    def __init__(self, dist: str, collectonly: bool = False, worker: bool = False) -> None:
        self._options = {"dist": dist, "collectonly": collectonly}
        if worker:
            self.workerinput = {"workerid": "gw0"}

    def getoption(self, name: str, default: object = None) -> object:
        return self._options.get(name, default)


def test_only_xdists_controller_skips_the_cpu_set_up() -> None:
    """The process that hands tests to xdist workers runs none: it imports neither torch
    nor the contracts (seconds before the first worker starts); the workers, a session
    without xdist and ``--collect-only`` (xdist does not distribute it) set up CPU
    execution as before."""
    from kda_fuzz.plugin import _xdist_controller

    assert _xdist_controller(_Config("load"))
    assert _xdist_controller(_Config("worksteal"))
    assert not _xdist_controller(_Config("load", worker=True))
    assert not _xdist_controller(_Config("no"))
    assert not _xdist_controller(_Config("load", collectonly=True))
