"""pytest plugin of kda-fuzz (``pytest11`` entry point), scoped to projects that opt in.

pytest loads it into every session of every project where kda-fuzz is installed, so it
acts only in a project that asks for it. A session opts in when any of these holds:

* the rootdir's ``pyproject.toml`` (the first one found walking up from the rootdir)
  has a ``[tool.kda-fuzz]`` table (see :mod:`kda_fuzz.config`);
* the ini key ``kda_fuzz_corpus`` (folders; ``kda_corpus`` is an alias) is set;
* the plugin is named explicitly: ``-p kda_fuzz.plugin`` (or ``-p kda_fuzz``).

Elsewhere, loading it changes nothing: no Hypothesis profile is registered or loaded, torch
is not imported, ``TRITON_INTERPRET`` is not set, ``gpu`` tests are not deselected, no JSON
file is collected, xdist's ``-n auto`` is left alone. Only the command-line options and
ini keys below are always registered (pytest must know them to parse the command line and
to read the opt-in key); unused, they do nothing.

In a project that opts in:

* markers ``gpu``, ``slow``, ``corpus``; ``--kda-device cpu|cuda`` (``-m gpu`` implies
  cuda); without a CUDA device selected, ``gpu`` tests are deselected; ``-n auto`` on cuda
  starts a few xdist workers per GPU; on cpu the project's kernels are set up for the CPU
  (``TRITON_INTERPRET``, see ``kda_fuzz/execution/cpu.py``).
* Hypothesis profiles ``ci`` (25 examples), ``nightly`` (2000), ``gpu`` (100), all without
  deadline, database or health checks, are registered (unless the project already has
  profiles by those names). One is loaded only when asked: ``KDA_FUZZ_PROFILE=NAME`` or
  ``hypothesis_profile = "NAME"`` in ``[tool.kda-fuzz]``; Hypothesis' own
  ``--hypothesis-profile`` still wins.
* Corpus collection: every ``*.json`` below the corpus folders is one test item (id: the
  file name), marked ``corpus`` (and ``gpu`` on a cuda session). The folders are those of
  ``corpus`` in ``[tool.kda-fuzz]`` (default ``["corpus"]``, relative to pyproject.toml)
  and of the ``kda_fuzz_corpus`` ini key; with neither, ``corpus/`` in the rootdir.
  A bad file is a failing item naming the file. Each item is replayed by
  :func:`kda_fuzz.replay.replay`, as ``kda-fuzz replay`` replays a file (the item only
  formats its record; the first line of a failure, which pytest's short summary shows,
  names it: ``mismatch/out-value on mypkg:kernel``). ``crash-``, ``timeout-`` and
  ``flaky-`` files run in a worker process: a target that still aborts fails its own
  item; one that runs past ``--kda-corpus-timeout`` seconds (default 60) is a hang.

Many machines: ``--kda-shard I/N`` runs shard I of N of the session's tests (the collected
items in node-id order, every N-th from the I-th; the others are deselected), so N CI
runners split one suite without overlap. ``--kda-example-db URL`` (or ``example_db`` in
``[tool.kda-fuzz]``) gives the session's Hypothesis settings a shared example database
(``redis://host:port/db`` or a folder, see :mod:`kda_fuzz.campaign.exampledb`): a failing
example of a property-based test found on one runner is replayed first on the others'
next run (Hypothesis' reuse phase). Both act whenever they are given.

Replay targets of a corpus item, per contract family and variant: ``--kda-corpus-target``
(repeatable, overrides everything), else ``[tool.kda-fuzz.targets.FAMILY] VARIANT = [...]``.
There is no silent fallback to kda-fuzz's own kernels: with no target for the file's
variant the item fails, naming the target the file was recorded against and the lines to
add to pyproject.toml. When a file's recorded target (``origin.target``) is not among the
targets it is replayed against (a renamed kernel, a seed file found on a planted bug), the
item replays anyway and issues a :class:`CorpusOriginWarning` saying so; a project that
wants that to fail adds ``filterwarnings = ["error::kda_fuzz.plugin.CorpusOriginWarning"]``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kda_fuzz.config import (
    Config,
    ConfigError,
    choose_targets,
    load_config,
    missing_targets_message,
    origin_mismatch,
)
from kda_fuzz.names import SOLE_VARIANT, label

PROFILES = {
    "ci": {"max_examples": 25},
    "nightly": {"max_examples": 2000},
    "gpu": {"max_examples": 100},
}
PLUGIN_NAMES = ("kda_fuzz", "kda_fuzz.plugin")
INI_KEYS = ("kda_fuzz_corpus", "kda_corpus")


class CorpusOriginWarning(pytest.PytestWarning):
    """A corpus file replayed against other targets than the one it was recorded on."""


@dataclass
class State:
    """Whether the session opted in (and why), its project config and corpus folders."""

    active: bool
    config: Config
    reason: str = ""
    corpus: list[Path] = field(default_factory=list)


def _variant(case: Any) -> str:
    """``"triton variant, "``; nothing for a family that declares no variants."""
    return "" if case.variant == SOLE_VARIANT else f"{case.variant} variant, "


_STATE = pytest.StashKey[State]()
_PROFILE = pytest.StashKey[str]()  # the Hypothesis profile before this session chose one


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kda-fuzz")
    group.addoption("--kda-device", default=None,
                    help="device for kernel tests: cpu (default) or cuda; `-m gpu` implies cuda")
    group.addoption("--kda-corpus-target", action="append", default=[],
                    metavar="MODULE:CALLABLE",
                    help="replay corpus files against this callable instead of the "
                         "configured targets (repeatable)")
    group.addoption("--kda-corpus-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="seconds a target may run on a crash-, timeout- or flaky- corpus "
                         "file (each runs in a worker) before it counts as hung (default 60)")
    group.addoption("--kda-sanitize", default=None, metavar="TOOL",
                    choices=("memcheck", "racecheck", "initcheck"),
                    help="also replay each corpus file under compute-sanitizer's TOOL "
                         "(cuda; sanitizer- files always run under theirs, and skip where "
                         "they cannot)")
    group.addoption("--kda-shard", default=None, metavar="I/N",
                    help="run shard I of N of the collected tests (node-id order, every N-th "
                         "from the I-th; the rest deselected)")
    group.addoption("--kda-example-db", default=None, metavar="URL",
                    help="Hypothesis example database shared between runners: "
                         "redis://host:port/db or a folder (default: example_db of "
                         "[tool.kda-fuzz])")
    group.addoption("--kda-save-failures", default=None, metavar="DIR",
                    help="save the failing case of each test that fails in "
                         "kda_fuzz.assert_conforms (its minimal one, after Hypothesis' "
                         "shrinking) as a corpus file in DIR")
    parser.addini("kda_fuzz_corpus", "kda-fuzz: folders whose *.json corpus files are "
                  "replayed as tests (setting it opts the project in)", type="paths", default=[])
    parser.addini("kda_corpus", "kda-fuzz: alias of kda_fuzz_corpus", type="paths", default=[])


def state(config: pytest.Config) -> State:
    """The session's kda-fuzz state, resolved once (before ``pytest_configure`` when xdist
    asks for its worker count)."""
    if _STATE not in config.stash:
        config.stash[_STATE] = _resolve(config)
    return config.stash[_STATE]


def active(config: pytest.Config) -> bool:
    """Whether the session opted in to the plugin."""
    return state(config).active


def _resolve(config: pytest.Config) -> State:
    ini = [Path(p) for key in INI_KEYS for p in config.getini(key)]
    named = any(p in PLUGIN_NAMES for p in config.getoption("plugins", default=None) or [])
    try:
        cfg = load_config(config.rootpath)
    except ConfigError as e:
        raise pytest.UsageError(f"kda-fuzz: {e}") from None
    reason = ("[tool.kda-fuzz] in " + str(cfg.path) if cfg.present
              else "ini key kda_fuzz_corpus" if ini
              else "-p kda_fuzz.plugin" if named else "")
    if not reason:
        return State(False, cfg)
    corpus = [*ini, *(cfg.corpus_dirs if cfg.present else [])]
    if not corpus:
        corpus = [config.rootpath / "corpus"]
    return State(True, cfg, reason, [p.resolve() for p in corpus])


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own, so --hypothesis-profile wins
def pytest_configure(config: pytest.Config) -> None:
    _session_shard(config)  # a bad --kda-shard is a usage error, opted in or not
    if config.getoption("--kda-save-failures"):  # opted in or not: the user asked
        from kda_fuzz import conformance

        conformance.SAVE_DIR = Path(config.getoption("--kda-save-failures"))
    if config.getoption("--kda-corpus-timeout") <= 0:
        raise pytest.UsageError("kda-fuzz: --kda-corpus-timeout must be positive")
    st = state(config)
    if not st.active:
        return
    if st.config.families:  # the project's own families, here and in the workers
        from kda_fuzz.families import ENV_VAR

        have = [s for s in os.environ.get(ENV_VAR, "").split(",") if s]
        os.environ[ENV_VAR] = ",".join(dict.fromkeys([*have, *st.config.families]))
    config.addinivalue_line("markers", "gpu: needs a CUDA device; run with `-m gpu`")
    config.addinivalue_line("markers", "slow: long-running; deselect with `-m 'not slow'`")
    config.addinivalue_line("markers", "corpus: a replayed corpus file")
    _remember_profile(config)
    _hypothesis_profiles(st.config)
    if kda_device(config).startswith("cuda") or _xdist_controller(config):
        return  # (xdist's workers configure their own CPU execution: they run the tests)
    from kda_fuzz.families import CONTRACTS

    for contract in CONTRACTS.values():  # each family's kernels, before they are imported
        if contract.execution is not None:
            contract.execution.configure_cpu()


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands the tests to xdist workers and runs none itself (then it
    need not import torch and the contracts: seconds before the first worker starts)."""
    return not hasattr(config, "workerinput") and not config.getoption("collectonly") \
        and config.getoption("dist", default="no") != "no"


def _remember_profile(config: pytest.Config) -> None:
    """Note the Hypothesis profile in force before this session loads its own, which
    ``pytest_unconfigure`` loads again (a session run inside another process, pytester's,
    leaves that process's settings as it found them)."""
    if _PROFILE not in config.stash:
        from hypothesis import settings

        config.stash[_PROFILE] = settings.get_current_profile_name()


def pytest_unconfigure(config: pytest.Config) -> None:
    previous = config.stash.get(_PROFILE, None)
    if previous is not None:
        from hypothesis import settings

        settings.load_profile(previous)


def _hypothesis_profiles(cfg: Config) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    for name, kw in PROFILES.items():
        try:
            settings.get_profile(name)
        except InvalidArgument:  # not registered yet: the project's own ones are kept
            settings.register_profile(
                name, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                print_blob=True, **kw)
    chosen = os.environ.get("KDA_FUZZ_PROFILE") or cfg.hypothesis_profile
    if chosen:
        try:
            settings.load_profile(chosen)
        except InvalidArgument as e:
            raise pytest.UsageError(f"kda-fuzz: Hypothesis profile: {e}") from None


def _session_shard(config: pytest.Config) -> Any:
    text = config.getoption("--kda-shard", default=None)
    if text is None:
        return None
    from kda_fuzz.campaign.shard import parse_shard

    try:
        return parse_shard(text)
    except ValueError as e:
        raise pytest.UsageError(f"kda-fuzz: {str(e).replace('--shard', '--kda-shard')}"
                                ) from None


def _example_db_url(config: pytest.Config) -> str | None:
    url = config.getoption("--kda-example-db", default=None)
    if url:
        return str(url)
    st = state(config)
    if st.active and st.config.example_db:
        from kda_fuzz.campaign.exampledb import resolve

        return resolve(st.config.example_db, st.config.root)
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Give the current Hypothesis settings the shared example database (after every
    ``pytest_configure``, so that it holds over ``--hypothesis-profile`` too)."""
    url = _example_db_url(session.config)
    if url is None:
        return
    from hypothesis import settings

    from kda_fuzz.campaign.exampledb import ExampleDbError, open_database

    try:
        db = open_database(url)
    except ExampleDbError as e:
        raise pytest.UsageError(f"kda-fuzz: {str(e).replace('--example-db', '--kda-example-db')}"
                                ) from None
    _remember_profile(session.config)
    name = f"{settings.get_current_profile_name()}+kda-fuzz-example-db"
    settings.register_profile(name, database=db)  # the current profile, with the database
    settings.load_profile(name)


def pytest_report_header(config: pytest.Config) -> str | None:
    st = state(config)
    if not st.active:
        return None
    return f"kda-fuzz: active ({st.reason}); corpus: " + ", ".join(
        _rel(p, config.rootpath) for p in st.corpus)


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root)) or "."
    except ValueError:
        return str(path)


def kda_device(config: pytest.Config) -> str:
    """The device the session's kernel tests run on."""
    explicit = config.getoption("--kda-device", default=None)
    if explicit:
        return str(explicit)
    markexpr = config.getoption("markexpr", default="") or ""
    return "cuda" if "gpu" in markexpr and "not gpu" not in markexpr else "cpu"


def device_name(config: pytest.Config) -> str:
    """``cpu`` or ``cuda[:i]``: under xdist, worker i uses GPU i mod n."""
    from kda_fuzz.campaign.supervisor import device_for

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return device_for(kda_device(config), int(worker[2:]) if worker[2:].isdigit() else 0)


@pytest.fixture(scope="session")
def kda_device_name(request: pytest.FixtureRequest) -> str:
    """``cpu`` or ``cuda[:i]``: under xdist, worker i uses GPU i mod n.

    On a GPU each worker may use its share of the device's memory and no more, so that
    workers sharing one GPU cannot exhaust it."""
    from kda_fuzz.campaign.supervisor import claim_device

    return claim_device(device_name(request.config), 0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on a GPU session: a few workers per GPU (compiles and memory are
    shared per device), not one per CPU core."""
    if not active(config) or not kda_device(config).startswith("cuda"):
        return None
    import torch

    from kda_fuzz.campaign.supervisor import JOBS_PER_GPU

    cpus = os.cpu_count() or 1
    return max(1, min(cpus, JOBS_PER_GPU * max(1, torch.cuda.device_count())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a GPU device selected, GPU tests are deselected (not skipped); with
    ``--kda-shard I/N``, the other shards' tests too."""
    if active(config) and not kda_device(config).startswith("cuda"):
        keep = [it for it in items if "gpu" not in it.keywords]
        if len(keep) != len(items):
            config.hook.pytest_deselected(items=[it for it in items if "gpu" in it.keywords])
            items[:] = keep
    shard = _session_shard(config)
    if shard is not None:
        order = sorted(range(len(items)), key=lambda i: items[i].nodeid)
        mine = {i for k, i in enumerate(order) if k % shard.count == shard.index}
        if len(mine) != len(items):
            config.hook.pytest_deselected(items=[it for i, it in enumerate(items)
                                                 if i not in mine])
            items[:] = [it for i, it in enumerate(items) if i in mine]


# ------------------------------------------------------------------ corpus files


def is_corpus_file(config: pytest.Config, path: Path) -> bool:
    """A ``*.json`` below one of the session's corpus folders (only when opted in)."""
    st = state(config)
    if not st.active or path.suffix != ".json" or path.name.startswith("."):
        return False
    path = path.resolve()
    return any(path.is_relative_to(root) for root in st.corpus)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if is_corpus_file(parent.config, file_path):
        return CorpusFile.from_parent(parent, path=file_path)
    return None


class CorpusReplayFailure(Exception):
    """A corpus case on which a target still does not do what the contract prescribes."""


class StaleCorpusEntry(Exception):
    """A corpus file recorded under another contract: the outcome the contract prescribes
    for its case has changed since (the item fails saying so, and the report carries the
    user property ``kda_corpus_stale``)."""


class CorpusFile(pytest.File):
    """One corpus JSON file; it yields exactly one item (loading happens when it runs)."""

    def collect(self) -> Iterator[pytest.Item]:
        item = CorpusItem.from_parent(self, name=self.path.name)
        item.add_marker(pytest.mark.corpus)
        if kda_device(self.config).startswith("cuda"):
            item.add_marker(pytest.mark.gpu)
        yield item


class CorpusItem(pytest.Item):
    """Replays one corpus file against the configured targets (or ``--kda-corpus-target``)."""

    def runtest(self) -> None:
        from kda_fuzz.corpus.replay import check_entry, replay, replay_command_line
        from kda_fuzz.corpus.store import CorpusError
        from kda_fuzz.report.progress import layout_of

        st = state(self.config)
        override = self.config.getoption("--kda-corpus-target", default=[]) or []
        root = str(st.config.root)
        if root not in sys.path:  # MODULE:CALLABLE relative to the project, like the CLI
            sys.path.insert(0, root)
        device = device_name(self.config)
        timeout = self.config.getoption("--kda-corpus-timeout")
        first = check_entry(self.path)
        if first.status == "READY":  # the targets of the file's family and variant, or none
            rec = replay(first.entry, lambda family, variant: choose_targets(
                st.config, family, variant, override), device=device, timeout=timeout,
                sanitize=self.config.getoption("--kda-sanitize", default=None))
        else:
            rec = first
        entry = rec.entry
        if entry is None:
            raise CorpusError(self.path, rec.reason)
        case, meta = entry.case, entry.meta
        if rec.status == "SKIP":  # not replayable in this environment: never a verdict
            pytest.skip(f"{self.path.name}: {rec.reason}")
        if rec.status == "STALE":
            self.user_properties.append(("kda_corpus_stale", rec.reason))
            raise StaleCorpusEntry(f"STALE corpus file {self.path} ({_variant(case)}"
                                   f"{meta['kind']}): {rec.reason}")
        head = (f"corpus file {self.path} ({_variant(case)}{meta['kind']}): "
                f"{meta['description']}")
        if rec.status == "ERROR" and rec.choice is not None and not rec.choice.specs:
            where = st.config.path or self.config.rootpath / "pyproject.toml"
            raise CorpusReplayFailure(
                f"no replay target for {label(case.contract, case.variant)}\n{head}\n  "
                + missing_targets_message(case.contract, case.variant, meta["origin"], where,
                                          "--kda-corpus-target"))
        if rec.status == "ERROR":
            raise CorpusReplayFailure(f"{self.path}: {rec.reason}")
        note = origin_mismatch(meta["origin"], rec.choice) if rec.choice else None
        if note:
            warnings.warn_explicit(CorpusOriginWarning(f"{self.path.name}: {note}"),
                                   category=None, filename=str(self.path), lineno=1)
        if rec.status == "FAIL":  # the first line is pytest's short summary: the failure
            lines = [f"  {r.target}: {r.summary()}\n    reproduce: "
                     + replay_command_line(r.target, self.path, device=device, timeout=timeout,
                                           family=case.contract)
                     for r in rec.failures]
            raise CorpusReplayFailure(
                f"{rec.headline()}\n{head}\n  layout: {layout_of(case)}\n"
                + (f"  note: {note}\n" if note else "") + "\n".join(lines))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        from kda_fuzz.corpus.store import CorpusError

        if isinstance(excinfo.value, CorpusError | CorpusReplayFailure | StaleCorpusEntry):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"corpus file {self.path.name}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """With ``--kda-save-failures``: a test that failed in ``assert_conforms`` saves its
    last failing case (Hypothesis runs the minimal one last) and says where."""
    outcome = yield
    if call.when != "call" or not item.config.getoption("--kda-save-failures"):
        return
    from kda_fuzz import conformance

    report = outcome.get_result()
    if not report.failed:
        conformance.PENDING.clear()
        return
    saved = conformance.save_pending(conformance.SAVE_DIR or Path("."), item.nodeid)
    if saved is not None:
        from kda_fuzz.corpus.replay import replay_command_line

        path, target, variant, family = saved
        line = replay_command_line(target, path, variant=variant, family=family)
        report.sections.append(("kda-fuzz", f"saved the failing case: {path}\nreproduce: "
                                f"{line}"))
