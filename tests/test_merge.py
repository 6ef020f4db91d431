"""`kda-fuzz merge`: many runners' corpora merged, one file per distinct failure."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kda_fuzz.campaign.runner import campaign
from kda_fuzz.corpus.merge import merge, stale_reason
from kda_fuzz.corpus.store import load_case, save_failure
from kda_fuzz.engine.targets import Target
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import get_contract
from tests import mutants
from tests.inprocess import kda_fuzz

KDA = get_contract("kda")
ROOT = Path(__file__).resolve().parents[1]
SEED_CORPUS = ROOT / "corpus" / "seed"
# six wrong messages, each its own root cause (one distinct failure each); and zeroing
# `out` before validating, one more whichever check the layout trips
TYPOS = {f"typo_check_{n}" for n in (3, 10, 12, 16, 18, 20)}
MUTANT = "tests.test_merge:typos_and_zero_out_first"
typos_and_zero_out_first = mutants.make(TYPOS | {"zero_out_first"})


def _signature(path: Path) -> tuple:
    case, verdict, meta = load_case(path)
    return (meta["origin"]["target"], *verdict.signature(case.variant))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], set[tuple]]:
    """The corpora of 8 shards of one campaign against a planted bug (cases as found, not
    minimized: the same failure is a different file in each shard that saw it), and the
    distinct failures the 8 found."""
    base = tmp_path_factory.mktemp("shards")
    found: set[tuple] = set()
    dirs = []
    for i in range(8):
        report = campaign(KDA, "triton", [Target(MUTANT, typos_and_zero_out_first)],
                          max_examples=8 * 12, seed=2, max_failures=100, shard=(i, 8),
                          valid_share=0.1, budget=1 << 12)  # small: the bugs are messages
        d = base / f"shard{i + 1}" / "corpus" / "found"
        d.mkdir(parents=True)
        for f in report.failures:
            save_failure(f, d, contract=KDA, seed=2)
            found.add(f.signature)
        dirs.append(d)
    return dirs, found


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.json"))}


def test_eight_shards_merge_into_one_file_per_distinct_failure(
        shards: tuple[list[Path], set[tuple]], tmp_path: Path) -> None:
    dirs, found = shards
    inputs = [p for d in dirs for p in d.glob("*.json")]
    assert len(inputs) > len(found) > 5  # the shards found failures more than once
    out = tmp_path / "merged"
    result = merge(out, dirs)
    kept = sorted(out.glob("*.json"))
    assert {_signature(p) for p in kept} == found
    assert len(kept) == len(found) == len(result.kept) == len(result.written)
    # the smallest file of each failure was kept; the others are reported as duplicates
    for p in kept:
        sizes = [q.stat().st_size for q in inputs if _signature(q) == _signature(p)]
        assert p.stat().st_size == min(sizes)
    assert len(result.duplicates) == len(inputs) - len(found)
    assert not result.bad and not result.stale and result.files == len(inputs)


def test_merging_twice_is_a_no_op(shards: tuple[list[Path], set[tuple]], tmp_path: Path
                                  ) -> None:
    dirs, _ = shards
    out = tmp_path / "merged"
    merge(out, dirs)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.json")}
    again = merge(out, [*dirs, out])  # OUT_DIR named as an input too
    assert again.written == [] and again.removed == []
    assert again.unchanged == len(before)
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.json")} == before
    assert not list(out.glob(".*"))  # no temporary file left behind


def test_a_smaller_file_of_the_same_failure_replaces_the_one_in_out(
        shards: tuple[list[Path], set[tuple]], tmp_path: Path) -> None:
    dirs, _ = shards
    inputs = [p for d in dirs for p in d.glob("*.json")]
    by_sig: dict[tuple, list[Path]] = {}
    for p in inputs:
        by_sig.setdefault(_signature(p), []).append(p)
    paths = next(ps for ps in by_sig.values()
                 if len({p.stat().st_size for p in ps}) > 1)
    paths.sort(key=lambda p: p.stat().st_size)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(paths[-1], out)  # the largest is in OUT_DIR already
    result = merge(out, [paths[0]])
    assert _files(out) == {paths[0].name: paths[0].read_bytes()}
    assert result.removed == [str((out / paths[-1].name).resolve())]


def test_bad_and_stale_files_are_reported_and_not_copied(tmp_path: Path) -> None:
    src = tmp_path / "in"
    shutil.copytree(SEED_CORPUS, src)
    (src / "contract-truncated.json").write_text('{"schema": 2, "kind": "contr')
    doc = json.loads((src / "contract-aa883986dd44afc4.json").read_text())
    doc["verdict"]["check"], doc["verdict"]["message"] = 11, "an older wording"
    (src / "contract-0000000000000000.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    result = merge(out, [src])
    assert [b["path"] for b in result.bad] == [str((src / "contract-truncated.json").resolve())]
    assert [s["path"] for s in result.stale] == [
        str((src / "contract-0000000000000000.json").resolve())]
    assert "recorded: raises check 11: an older wording; the contract now: it raises " \
           "ValueError from check 10" in result.stale[0]["reason"]
    assert _files(out) == _files(SEED_CORPUS)  # the ten good files, byte for byte


def test_stale_when_the_contract_now_prescribes_another_outcome() -> None:
    broken, _, _ = load_case(SEED_CORPUS / "contract-aa883986dd44afc4.json")
    valid, recorded, _ = load_case(SEED_CORPUS / "mismatch-71ad9b13ac4af176.json")
    assert stale_reason(KDA, valid, "mismatch", recorded) is None
    assert "recorded as a valid layout; the contract now: it raises ValueError from " \
           "check 10" in stale_reason(KDA, broken, "mismatch", recorded)
    says = Verdict("contract", "wrong-message", "", check=3, message="x")
    assert "the contract now accepts it" in stale_reason(KDA, valid, "contract", says)
    assert stale_reason(KDA, valid, "crash", Verdict("crash", "process-died", "")) is None
    assert "the contract now accepts it" in stale_reason(KDA, valid, "contract", None)


def _run(*args: str) -> subprocess.CompletedProcess:
    return kda_fuzz(*args)  # in this process (tests/inprocess.py)


def test_merge_command(shards: tuple[list[Path], set[tuple]], tmp_path: Path) -> None:
    dirs, found = shards
    out = tmp_path / "merged"
    r = _run("merge", str(out), *map(str, dirs))
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("merged ") and f"{len(found)} distinct failure(s), " \
        f"{len(found)} written" in last
    assert "DUPLICATE" in r.stdout
    r = _run("merge", str(out), *map(str, dirs), "--json")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert (summary["failures"], summary["written"], summary["unchanged"]) == \
        (len(found), [], len(found))
    for args in (["merge", str(out), str(tmp_path / "missing")], ["merge", str(out)],
                 ["merge", str(dirs[0] / next(iter(_files(dirs[0])))), str(dirs[0])]):
        r = _run(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 or "usage:" in r.stderr, r.stderr
