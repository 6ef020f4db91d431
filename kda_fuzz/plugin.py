"""pytest plugin of kda-fuzz (``pytest11`` entry point): markers, options, profiles, corpus.

Hypothesis profiles: ``ci`` (default; bounded for CPU CI), ``nightly`` (long), ``gpu``.
Choose one with Hypothesis' own ``--hypothesis-profile``.

Corpus collection: every ``*.json`` below a folder named ``corpus`` (relative to the
rootdir), and every ``*.json`` below the folders of the ``kda_corpus`` ini option, is one
test item (id: the file name), marked ``corpus``. It replays the file against the
project's kernels for the file's contract variant (the contract's ``default_targets``),
or against ``--kda-corpus-target`` callables, on the session's device: CPU by default;
on CUDA under ``-m gpu`` / ``--kda-device cuda``, where the items are also marked ``gpu``
so that ``-m gpu`` selects them. A bad file is a failing item naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

PROFILES = {
    "ci": {"max_examples": 25},
    "nightly": {"max_examples": 2000},
    "gpu": {"max_examples": 100},
}
for _name, _kw in PROFILES.items():
    settings.register_profile(
        _name, deadline=None, database=None, suppress_health_check=list(HealthCheck),
        print_blob=True, **_kw,
    )
settings.load_profile(os.environ.get("KDA_FUZZ_PROFILE", "ci"))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kda-fuzz")
    group.addoption("--kda-device", default=None,
                    help="device for kernel tests: cpu (default) or cuda; `-m gpu` implies cuda")
    group.addoption("--kda-corpus-target", action="append", default=[],
                    metavar="MODULE:CALLABLE",
                    help="replay corpus files against this callable instead of the project's "
                         "kernels for the file's variant (repeatable)")
    parser.addini("kda_corpus", "folders whose *.json files are replayed as tests",
                  type="paths", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; run with `-m gpu`")
    config.addinivalue_line("markers", "slow: long-running; deselect with `-m 'not slow'`")
    config.addinivalue_line("markers", "corpus: a replayed corpus file")
    if kda_device(config).startswith("cuda"):
        return
    from kernels.kda_decode import _execution

    _execution.configure_cpu()


def kda_device(config: pytest.Config) -> str:
    """The device the session's kernel tests run on."""
    explicit = config.getoption("--kda-device", default=None)
    if explicit:
        return str(explicit)
    markexpr = config.getoption("markexpr", default="") or ""
    return "cuda" if "gpu" in markexpr and "not gpu" not in markexpr else "cpu"


def device_name(config: pytest.Config) -> str:
    """``cpu`` or ``cuda[:i]``: under xdist, worker i uses GPU i mod n."""
    from .parallel import device_for

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return device_for(kda_device(config), int(worker[2:]) if worker[2:].isdigit() else 0)


@pytest.fixture(scope="session")
def kda_device_name(request: pytest.FixtureRequest) -> str:
    """``cpu`` or ``cuda[:i]``: under xdist, worker i uses GPU i mod n.

    On a GPU each worker may use its share of the device's memory and no more, so that
    workers sharing one GPU cannot exhaust it."""
    from .parallel import claim_device

    return claim_device(device_name(request.config), 0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on a GPU session: a few workers per GPU (compiles and memory are
    shared per device), not one per CPU core."""
    if not kda_device(config).startswith("cuda"):
        return None
    import torch

    from .parallel import JOBS_PER_GPU

    cpus = os.cpu_count() or 1
    return max(1, min(cpus, JOBS_PER_GPU * max(1, torch.cuda.device_count())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without a GPU device selected, GPU tests are deselected (not skipped)."""
    if kda_device(config).startswith("cuda"):
        return
    keep = [it for it in items if "gpu" not in it.keywords]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[it for it in items if "gpu" in it.keywords])
        items[:] = keep


# ------------------------------------------------------------------ corpus files


def is_corpus_file(config: pytest.Config, path: Path) -> bool:
    """A ``*.json`` below a ``corpus`` folder (relative to the rootdir) or a kda_corpus path."""
    if path.suffix != ".json" or path.name.startswith("."):
        return False
    for root in config.getini("kda_corpus"):
        if path.is_relative_to(Path(root)):
            return True
    try:
        rel = path.relative_to(config.rootpath)
    except ValueError:
        rel = path
    return "corpus" in rel.parts[:-1]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if is_corpus_file(parent.config, file_path):
        return CorpusFile.from_parent(parent, path=file_path)
    return None


class CorpusReplayFailure(Exception):
    """A corpus case on which a target still does not do what the contract prescribes."""


class CorpusFile(pytest.File):
    """One corpus JSON file; it yields exactly one item (loading happens when it runs)."""

    def collect(self) -> Iterator[pytest.Item]:
        item = CorpusItem.from_parent(self, name=self.path.name)
        item.add_marker(pytest.mark.corpus)
        if kda_device(self.config).startswith("cuda"):
            item.add_marker(pytest.mark.gpu)
        yield item


class CorpusItem(pytest.Item):
    """Replays one corpus file against the project's kernels (or ``--kda-corpus-target``)."""

    def runtest(self) -> None:
        from .contracts import get_contract
        from .corpus import CorpusError, load_case, passed, replay_case
        from .runner import TargetError, default_targets, load_target

        case, _verdict, meta = load_case(self.path)
        try:
            contract = get_contract(case.contract)
        except ValueError as e:
            raise CorpusError(self.path, str(e)) from None
        specs = self.config.getoption("--kda-corpus-target", default=[]) or []
        try:
            targets = ([load_target(s) for s in specs] if specs
                       else default_targets(contract, case.variant))
        except TargetError as e:
            raise CorpusReplayFailure(f"{self.path}: cannot load a target: {e}") from None
        if not targets:
            raise CorpusReplayFailure(f"{self.path}: no target for the {case.variant} variant")
        device = device_name(self.config)
        if device != "cpu":
            case = case.on(device)
        lines = []
        for name, outcome in replay_case(contract, case, targets):
            if not passed(outcome):
                assert outcome.verdict is not None
                lines.append(f"  {name}: {outcome.verdict.summary()}\n"
                             f"    reproduce: kda-fuzz replay --target {name} "
                             f"--device {device} {self.path}")
        if lines:
            raise CorpusReplayFailure(
                f"corpus file {self.path} ({case.variant} variant, {meta['kind']}): "
                f"{meta['description']}\n" + "\n".join(lines))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | Any:
        from .corpus import CorpusError

        if isinstance(excinfo.value, CorpusError | CorpusReplayFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"corpus file {self.path.name}"
