"""The regression corpus: bit-exact files, hostile files, concurrent writers, minimization,
pytest collection and ``kda-fuzz replay``."""

from __future__ import annotations

import base64
import json
import multiprocessing
import shutil
import threading
import tracemalloc
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

# The in-process pytester sessions below replay corpus files on these kernels. Pytester
# drops the modules a session imports when the test ends, and triton's C extension cannot
# be imported twice: importing them now, before any pytester fixture, keeps them loaded.
import kda_fuzz_kernels.kda_decode.helion_kernel
import kda_fuzz_kernels.kda_decode.triton_kernel  # noqa: F401
from kda_fuzz.campaign.minimize import minimize, minimize_with_verdict
from kda_fuzz.campaign.results import Failure
from kda_fuzz.cli import main as cli_main
from kda_fuzz.corpus import store as corpus
from kda_fuzz.corpus.store import (
    CaseTooLarge,
    CorpusError,
    case_digest,
    encode_entry,
    encoded_size,
    load_case,
    save_case,
)
from kda_fuzz.engine.case import Case, TensorArg, fingerprint
from kda_fuzz.engine.oracle import expectation, run_case
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.families import get_contract
from kda_fuzz.families.kda.layouts import KdaLayout, Values, build

pytest_plugins = ["pytester"]

KDA = get_contract("kda")
REFERENCE = "kda_fuzz_kernels.kda_decode:reference_kda_packed_decode"
ROOT = Path(__file__).resolve().parents[1]


def _case(variant: str = "triton", **kw: Any) -> Case:
    base: dict[str, Any] = dict(B=3, H=1, HV=2, K=4, V=4, spare_slots=2, padding="some",
                                qkv_row_pad=3, slot_pad=2, guard=2, values=Values(), seed=11)
    base.update(kw)
    return build(KdaLayout(**base), variant)


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def _assert_same_case(a: Case, b: Case) -> None:
    assert (a.contract, a.variant, tuple(a.intent)) == (b.contract, b.variant, tuple(b.intent))
    assert set(a.tensors) == set(b.tensors)
    for name, x in a.tensors.items():
        y = b.tensors[name]
        assert (x.dtype, x.device.type, x.shape, x.stride, x.offset) == \
            (y.dtype, y.device.type, y.shape, y.stride, y.offset), name
        assert x.base.numel() == y.base.numel(), name
        if x.device.type != "meta":
            assert torch.equal(_bits(x.base), _bits(y.base)), name
    assert a.scalars.keys() == b.scalars.keys()
    for k, v in a.scalars.items():
        assert type(v) is type(b.scalars[k]) and repr(v) == repr(b.scalars[k]), k
    assert fingerprint(a) == fingerprint(b)


def _mutant(name: str) -> Callable[..., Any]:
    from tests import mutants

    return mutants.MUTANTS[name]


# ------------------------------------------------------------------ round trip


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    case = _case(qkv_dtype=torch.bfloat16, state_dtype=torch.float16, idx_dtype=torch.int64,
                 out_dtype=torch.bfloat16, lower_bound=-0.1, scale=0.1,
                 use_qk_l2norm_in_kernel=True)
    # odd bit patterns in guard cells and data: NaN payloads, -0.0, subnormals, infinities
    st = case.tensors["initial_state"].base
    st.view(torch.int16)[0] = 0x7E01  # fp16 NaN with a payload
    st[-1] = -0.0
    qkv = case.tensors["mixed_qkv"]
    qkv.base.view(torch.int16)[0] = 0x7FC1  # bf16 NaN with a payload
    qkv.base[qkv.offset] = float("inf")
    case.tensors["a"].base[case.tensors["a"].offset] = 1e-40  # fp32 subnormal
    # a meta tensor (the "other device" of check 9) and an extra notes payload
    a = case.tensors["A_log"]
    case.tensors["A_log"] = TensorArg(a.base.to("meta"), a.shape, a.stride, a.offset)
    case.notes.update(breakages=["device:A_log"], semantic=False, odd=float("nan"))
    verdict = Verdict("contract", "accepted-broken-layout", "returned normally", check=9,
                      message="All inputs must be on the same device.", max_error=float("inf"),
                      where=[1, 2], extra={"got": "x", "nested": [float("-inf"), 1.5]})
    path = save_case(case, verdict, tmp_path, origin={"target": "t:f", "seed": 3},
                     description="round\ntrip  test")
    assert path.name == f"contract-{case_digest(case)}.json"
    loaded, got_verdict, meta = load_case(path)
    _assert_same_case(case, loaded)
    assert loaded.notes["breakages"] == ["device:A_log"] and loaded.notes["odd"] != 0
    assert got_verdict == verdict
    assert meta["description"] == "round trip test" and meta["kind"] == "contract"
    assert meta["origin"]["target"] == "t:f" and meta["versions"]["torch"] == torch.__version__
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"literal {c}"))
    # saved again (same content, new origin): still one file, same name
    again = save_case(loaded, got_verdict, tmp_path, origin={"seed": 4})
    assert again == path and len(list(tmp_path.iterdir())) == 1
    # the name is the call's content: informational notes do not count, semantics do
    loaded.notes["minimized"] = ["a step"]
    assert case_digest(loaded) == case_digest(case)
    loaded.notes["semantic"] = True
    assert case_digest(loaded) != case_digest(case)
    # and the replayed case behaves like the original on the oracle
    assert expectation(KDA, loaded) == expectation(KDA, case)


def test_round_trip_of_a_runner_failure(tmp_path: Path) -> None:
    from kda_fuzz.corpus.store import save_failure

    case = _case(B=4)
    outcome = run_case(KDA, case, _mutant("ignore_slot_stride"))
    assert outcome.status == "fail" and outcome.verdict is not None
    path = save_failure(Failure(case, outcome.verdict, "tests.mutants:ignore_slot_stride"),
                        tmp_path, contract=KDA, seed=7)
    assert path.name.startswith(f"{outcome.verdict.kind}-")
    loaded, verdict, meta = load_case(path)
    _assert_same_case(case, loaded)
    assert verdict == outcome.verdict and meta["origin"]["seed"] == 7
    again = run_case(KDA, loaded, _mutant("ignore_slot_stride"))
    assert outcome.verdict.same_failure(again.verdict)


# ------------------------------------------------------------------ hostile files


def _good_doc(tmp_path: Path) -> dict[str, Any]:
    case = _case(B=2, values=Values(state_kind="zeros"))  # zeros inside NaN guards
    path = save_case(case, None, tmp_path / "src", description="good")
    doc = json.loads(path.read_text())
    assert doc["schema"] == 2 and _t(doc)["encoding"] == "zlib+base64"
    assert _t(doc, "out")["encoding"] == "fill"  # NaN guards and nothing else
    return doc


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _raw(doc: dict[str, Any], name: str = "initial_state") -> bytes:
    """The little-endian bytes of a tensor's base, whatever the entry's encoding."""
    entry = _t(doc, name)
    if entry.get("encoding") == "fill":
        return bytes.fromhex(entry["fill"]) * entry["base_numel"]
    data = base64.b64decode(entry["base_bytes"])
    return zlib.decompress(data) if entry.get("encoding") == "zlib+base64" else data


def _schema_1(doc: dict[str, Any]) -> dict[str, Any]:
    """The same file in schema 1 (plain base64 of every base, no encoding fields)."""
    for name, entry in doc["case"]["tensors"].items():
        if entry["device"] != "meta":
            entry["base_bytes"] = _b64(_raw(doc, name))
        entry.pop("encoding", None)
        entry.pop("fill", None)
    doc["schema"] = 1
    return doc


def _bomb(size: int) -> str:
    """A zlib stream of ``size`` zero bytes, made without holding them."""
    z = zlib.compressobj()
    chunk = bytes(1 << 20)
    parts = [z.compress(chunk) for _ in range(size // len(chunk))]
    return _b64(b"".join(parts) + z.flush())


def _t(doc: dict[str, Any], name: str = "initial_state") -> dict[str, Any]:
    return doc["case"]["tensors"][name]


def _set(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(doc: dict[str, Any]) -> dict[str, Any]:
        fn(doc)
        return doc

    return apply


HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "truncated": (lambda d: json.dumps(d)[: len(json.dumps(d)) // 2], "invalid JSON"),
    "not-json": (lambda d: "this is not json", "invalid JSON"),
    "nan-literal": (lambda d: json.dumps(d).replace('"lower_bound": null',
                                                    '"lower_bound": NaN'), "NaN"),
    "not-an-object": (lambda d: [d], "not a JSON object"),
    "schema-3": (_set(lambda d: d.update(schema=3)), "schema version 3"),
    "schema-missing": (_set(lambda d: d.pop("schema")), "missing field file.schema"),
    "schema-bool": (_set(lambda d: d.update(schema=True)), "wrong type"),
    "unknown-kind": (_set(lambda d: d.update(kind="segfault")), "unknown kind"),
    "kind-vs-verdict": (_set(lambda d: d.update(kind="crash", verdict={
        "kind": "mismatch", "what": "x", "detail": "y"})), "does not match"),
    "bad-verdict": (_set(lambda d: d.update(verdict={"kind": "mismatch", "bogus": 1})),
                    "verdict"),
    "unknown-family": (_set(lambda d: d["contract"].update(family="gdn2")), "family"),
    "unknown-variant": (_set(lambda d: d["contract"].update(variant="cuda")), "variant"),
    "unknown-dtype": (_set(lambda d: _t(d).update(dtype="complex64")), "unknown dtype"),
    "unknown-device": (_set(lambda d: _t(d).update(device="cuda")), "unknown device"),
    "bytes-short": (_set(lambda d: _t(d).update(base_bytes=base64.b64encode(
        base64.b64decode(_t(d)["base_bytes"])[:-4]).decode())), "bytes"),
    "bad-base64": (_set(lambda d: _t(d).update(base_bytes="@@@@")), "base64"),
    "view-beyond-base": (_set(lambda d: _t(d, "out").update(
        storage_offset=_t(d, "out")["base_numel"])), "reaches element"),
    "stride-beyond-base": (_set(lambda d: _t(d, "mixed_qkv").update(stride=[10**6, 1])),
                           "reaches element"),
    "absurd-size": (_set(lambda d: _t(d, "out").update(base_numel=2**40)), "absurd size"),
    "absurd-view": (_set(lambda d: _t(d, "out").update(shape=[2**20, 1, 2**10, 4],
                                                         stride=[0, 0, 0, 0])), "absurd"),
    "negative-shape": (_set(lambda d: _t(d, "out").update(shape=[-1, 1, 2, 4])), "negative"),
    "negative-stride": (_set(lambda d: _t(d, "a").update(stride=[-8, 1])), "negative"),
    "rank-mismatch": (_set(lambda d: _t(d, "a").update(stride=[8])), "differ in rank"),
    "nan-scale": (_set(lambda d: d["case"]["scalars"].update(scale={"$float": "nan"})),
                  "finite"),
    "inf-lower-bound": (_set(lambda d: d["case"]["scalars"].update(
        lower_bound={"$float": "-inf"})), "finite"),
    "string-scale": (_set(lambda d: d["case"]["scalars"].update(scale="0.5")), "number"),
    "flag-not-bool": (_set(lambda d: d["case"]["scalars"].update(use_qk_l2norm_in_kernel=1)),
                      "true or false"),
    "semantic-not-bool": (_set(lambda d: d["case"]["notes"].update(semantic="yes")),
                          "semantic"),
    "breakages-not-strings": (_set(lambda d: d["case"]["notes"].update(breakages=[1])),
                              "breakages"),
    "missing-tensor": (_set(lambda d: d["case"]["tensors"].pop("out")), "missing argument"),
    "missing-bytes": (_set(lambda d: _t(d).pop("base_bytes")), "missing field"),
    # schema 2 encodings
    "zip-bomb": (_set(lambda d: _t(d).update(base_bytes=_bomb(64 << 20))), "more than"),
    "zlib-corrupt": (_set(lambda d: _t(d).update(base_bytes=_b64(b"not a zlib stream"))),
                     "invalid zlib"),
    "zlib-short": (_set(lambda d: _t(d).update(base_bytes=_b64(zlib.compress(
        _raw(d)[:-4])))), "bytes"),
    "zlib-trailing": (_set(lambda d: _t(d).update(base_bytes=_b64(zlib.compress(_raw(d))
                                                                 + b"xx"))), "after the end"),
    "unknown-encoding": (_set(lambda d: _t(d).update(encoding="lzma")), "unknown encoding"),
    "encoding-missing": (_set(lambda d: _t(d).pop("encoding")), "missing field"),
    "fill-not-hex": (_set(lambda d: _t(d).update(encoding="fill", base_bytes=None,
                                                 fill="zzzzzzzz")), "hex digits"),
    "fill-wrong-width": (_set(lambda d: _t(d).update(encoding="fill", base_bytes=None,
                                                     fill="00")), "hex digits"),
    "fill-and-bytes": (_set(lambda d: _t(d).update(encoding="fill", fill="00000000")),
                       "no base_bytes"),
    "bytes-and-fill": (_set(lambda d: _t(d).update(fill="00000000")), "only the fill"),
    "bool-fill": (_set(lambda d: _t(d, "out").update(dtype="bool", encoding="fill",
                                                      fill="02")), "bool"),
    "meta-with-fill": (_set(lambda d: _t(d, "out").update(device="meta")), "no bytes"),
    "fill-absurd": (_set(lambda d: _t(d, "out").update(base_numel=2**40)), "absurd size"),
    # schema 1 files are still read, with their own checks
    "schema-1-bytes-short": (_set(lambda d: _schema_1(d) and _t(d).update(
        base_bytes=_b64(_raw(d)[:-4]))), "bytes"),
    "schema-1-zlib-payload": (_set(lambda d: _schema_1(d) and _t(d).update(
        base_bytes=_b64(zlib.compress(_raw(d))))), "bytes"),
    "extra-argument": (_set(lambda d: d["case"]["scalars"].update(evil="__import__('os')")),
                       "unknown argument"),
    "scalar-as-tensor": (_set(lambda d: d["case"]["tensors"].update(
        scale=d["case"]["tensors"].pop("out"), out=d["case"]["scalars"].pop("scale"))),
        "must be scalars"),
}


def _write_hostile(tmp_path: Path, name: str) -> Path:
    make, _ = HOSTILE[name]
    out = make(_good_doc(tmp_path))
    path = tmp_path / "corpus" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out if isinstance(out, str) else json.dumps(out))
    return path


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_gives_corpus_error_naming_it(tmp_path: Path, name: str) -> None:
    path = _write_hostile(tmp_path, name)
    with pytest.raises(CorpusError) as info:
        load_case(path)
    msg = str(info.value)
    assert str(path) in msg and info.value.path == path
    assert HOSTILE[name][1].lower() in msg.lower(), msg


def test_zip_bomb_is_refused_without_inflating_it(tmp_path: Path) -> None:
    path = _write_hostile(tmp_path, "zip-bomb")  # 64 MiB of zeros for a ~2 KiB base
    tracemalloc.start()
    try:
        with pytest.raises(CorpusError, match="inflates to more than"):
            load_case(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def _kda_seeds() -> list[Path]:
    """The KDA family's seed files (GDN's, of schema 2, sit beside them)."""
    return [p for p in sorted((ROOT / "corpus" / "seed").glob("*.json"))
            if json.loads(p.read_text())["contract"]["family"] == "kda"]


def test_schema_1_files_still_load_and_keep_their_names(tmp_path: Path) -> None:
    seeds = _kda_seeds()
    assert seeds and all(json.loads(p.read_text())["schema"] == 1 for p in seeds)
    for path in seeds:
        case, verdict, meta = load_case(path)
        assert meta["schema"] == 1 and path.stem.endswith(case_digest(case)), path
        # saved again (schema 2, compressed): same name, same case, bit for bit
        again = save_case(case, verdict, tmp_path, description=meta["description"])
        assert again.name == path.name
        loaded, _, meta2 = load_case(again)
        assert meta2["schema"] == 2
        _assert_same_case(case, loaded)
    # and a schema-1 rendering of a schema-2 file is the same case
    doc = _good_doc(tmp_path)
    (tmp_path / "one.json").write_text(json.dumps(_schema_1(json.loads(json.dumps(doc)))))
    (tmp_path / "two.json").write_text(json.dumps(doc))
    one, two = load_case(tmp_path / "one.json")[0], load_case(tmp_path / "two.json")[0]
    _assert_same_case(one, two)
    assert case_digest(one) == case_digest(two)


def test_fills_and_compression_are_bit_exact(tmp_path: Path) -> None:
    case = _case(qkv_dtype=torch.bfloat16, state_dtype=torch.float16, idx_dtype=torch.int64)
    t = case.tensors
    t["initial_state"].base.view(torch.int16).fill_(0x7E01)  # one fp16 NaN payload: a fill
    t["mixed_qkv"].base.fill_(-0.0)  # -0.0 everywhere, guards included: a fill
    t["a"].base.view(torch.int32)[2:].fill_(0)  # zeros after two payload-NaN guards: zlib
    t["a"].base.view(torch.int32)[:2] = 0x7FC00001
    t["ssm_state_indices"].base.fill_(-1)
    path = save_case(case, None, tmp_path)
    doc = json.loads(path.read_text())
    enc = {n: e["encoding"] for n, e in doc["case"]["tensors"].items()}
    assert enc["initial_state"] == "fill" and _t(doc)["fill"] == "017e"
    assert enc["mixed_qkv"] == "fill" and _t(doc, "mixed_qkv")["fill"] == "0080"
    assert enc["a"] == "zlib+base64" and enc["ssm_state_indices"] == "fill"
    assert _t(doc, "ssm_state_indices")["fill"] == "ff" * 8
    loaded, _, _ = load_case(path)
    _assert_same_case(case, loaded)
    assert torch.equal(_bits(loaded.tensors["mixed_qkv"].base),
                       _bits(torch.full((t["mixed_qkv"].base.numel(),), -0.0,
                                        dtype=torch.bfloat16)))
    assert path.name.endswith(f"{case_digest(case)}.json")
    assert abs(encoded_size(case) - path.stat().st_size) < 400  # no verdict, description


def test_save_never_writes_a_file_over_the_cap(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    case = _case(B=64, HV=4, K=16, V=16)
    size = len(encode_entry(case, None)[1].encode())
    monkeypatch.setattr(corpus, "MAX_SAVED_BYTES", size - 1)
    with pytest.raises(CaseTooLarge) as info:
        save_case(case, None, tmp_path)
    assert info.value.size == size and info.value.limit == size - 1
    assert info.value.description == case.describe()
    assert str(info.value).startswith("not saved: ") and "MiB over the" in str(info.value)
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(corpus, "MAX_SAVED_BYTES", size)
    assert save_case(case, None, tmp_path).stat().st_size == size


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="cannot read"):
        load_case(tmp_path / "nope.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(CorpusError, match=r"empty\.json.*invalid JSON"):
        load_case(tmp_path / "empty.json")


def test_bad_files_do_not_stop_the_others_from_replaying(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["truncated", "unknown-dtype", "view-beyond-base", "nan-scale", "missing-tensor"]
    for name in names:
        _write_hostile(tmp_path, name)
    good = save_case(_case(B=2), None, tmp_path / "corpus", description="good")
    code = cli_main(["replay", "--target", REFERENCE, "--contract", "triton", "--json",
                     str(tmp_path / "corpus")])
    assert code == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    status = {Path(f["path"]).name: f["status"] for f in report["files"]}
    assert status.pop(good.name) == "PASS"
    assert status == {f"{n}.json": "ERROR" for n in names}
    assert (report["passed"], report["errors"], report["exit_code"]) == (1, len(names), 1)


# ------------------------------------------------------------------ concurrency


def _writer_cases(worker: int) -> list[Case]:
    """One case every writer saves, one shared by a quarter of them, one of its own."""
    return [_case(B=2, seed=0), _case(B=2, seed=100 + worker % 4),
            _case(B=1, spare_slots=0, seed=1000 + worker)]


def _check_written(directory: Path, n: int) -> None:
    files = sorted(directory.iterdir())
    assert all(f.suffix == ".json" and not f.name.startswith(".") for f in files), files
    expected = {case_digest(c) for i in range(n) for c in _writer_cases(i)}
    assert len(expected) == 1 + 4 + n
    assert {f.stem.split("-", 1)[1] for f in files} == expected
    for f in files:
        case, _, meta = load_case(f)
        assert case_digest(case) == f.stem.split("-", 1)[1]
        assert meta["kind"] in ("mismatch", "contract")


def test_sixteen_concurrent_writer_processes_lose_and_corrupt_nothing(tmp_path: Path) -> None:
    from kda_fuzz.corpus.store import encode_entry
    from tests import corpus_writer

    n = 16
    entries = [[encode_entry(c, None, origin={"worker": i}, description=f"w{i}")
                for c in _writer_cases(i)] for i in range(n)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=corpus_writer.write, args=(str(tmp_path), entries[i], barrier))
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * n
    _check_written(tmp_path, n)


def test_sixteen_concurrent_save_case_threads(tmp_path: Path) -> None:
    n = 16
    barrier = threading.Barrier(n)
    cases = [_writer_cases(i) for i in range(n)]

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            for c in cases[i]:
                save_case(c, None, tmp_path, origin={"worker": i}, description=f"w{i}")

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(work, range(n)))
    _check_written(tmp_path, n)


# ------------------------------------------------------------------ minimization


def test_minimize_shrinks_a_failing_batch_and_keeps_the_failure() -> None:
    case = _case(B=24, H=2, HV=4, K=8, V=4, spare_slots=9, padding="some",
                 qkv_dtype=torch.float16, use_qk_l2norm_in_kernel=True, seed=5)
    bug = _mutant("k_major_state")
    first = run_case(KDA, case, bug)
    assert first.status == "fail" and first.verdict is not None
    small, final = minimize_with_verdict(KDA, case, bug, first.verdict, seconds=20)
    assert small.tensors["mixed_qkv"].shape[0] <= 2
    assert small.tensors["initial_state"].shape[0] <= 2
    again = run_case(KDA, small, bug)
    assert first.verdict.same_failure(again.verdict) and again.verdict == final
    assert small.tensors["mixed_qkv"].dtype == torch.float32
    assert small.scalars["use_qk_l2norm_in_kernel"] is False
    assert small.notes["minimized"] and "original_layout" in small.notes
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    assert run_case(KDA, small, reference_kda_packed_decode).status == "pass"


def test_minimize_padding_bug_to_one_row_and_respects_keep() -> None:
    case = _case(B=16, padding="some", spare_slots=5, seed=9)
    idx = case.tensors["ssm_state_indices"]
    vals = idx.view().clone()
    vals[3] = -1
    idx.view().copy_(vals)
    bug = _mutant("pad_wrap")
    first = run_case(KDA, case, bug)
    assert first.status == "fail" and first.verdict is not None
    small = minimize(KDA, case, bug, first.verdict, seconds=20)
    assert small.tensors["mixed_qkv"].shape[0] == 1
    assert first.verdict.same_failure(run_case(KDA, small, bug).verdict)
    calls: list[int] = []

    def run(c: Case) -> Any:  # a custom judge (an isolated worker's ``run`` in the CLI)
        calls.append(1)
        return run_case(KDA, c, bug)

    kept = minimize(KDA, case, bug, first.verdict, seconds=20, run=run,
                    keep=lambda c: c.tensors["mixed_qkv"].shape[0] >= 3)
    assert kept.tensors["mixed_qkv"].shape[0] == 3 and calls


def test_minimize_a_contract_failure_keeps_its_check() -> None:
    case = _case(B=6)
    seven = _case(B=7).tensors["a"]  # one batch row too many: check 10
    broken = Case(case.contract, case.variant, {**case.tensors, "a": seven},
                  dict(case.scalars), ("a-batch",), {"breakages": ["batch:a"],
                                                     "semantic": False})
    bug = _mutant("typo_check_10")
    first = run_case(KDA, broken, bug)
    assert first.verdict is not None and first.verdict.check == 10
    small = minimize(KDA, broken, bug, first.verdict, seconds=10)
    got = run_case(KDA, small, bug).verdict
    assert first.verdict.same_failure(got) and got is not None and got.check == 10
    assert small.tensors["mixed_qkv"].shape[0] < 6


def test_minimize_returns_the_case_when_nothing_reproduces() -> None:
    case = _case(B=4)
    fake = Verdict("mismatch", "out-value", "never happens")
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    assert minimize(KDA, case, reference_kda_packed_decode, fake, seconds=5) is case


def _grid_target(limit: int) -> Callable[..., Any]:
    """A target whose launch grid has ``B * HV`` blocks on an axis holding ``limit - 1``:
    it raises as CUDA does (``invalid argument``) from ``limit`` on, else it is correct."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    def decode(*args: Any) -> Any:
        b = args[2]
        if b.shape[0] * b.shape[1] >= limit:
            raise RuntimeError("Triton Error [CUDA]: invalid argument")
        return reference_kda_packed_decode(*args)

    return decode


def _only_with(test: Callable[[torch.Tensor], bool]) -> Callable[..., Any]:
    """A target that raises when ``test(initial_state)`` holds, else is correct."""
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    def decode(*args: Any) -> Any:
        if test(args[6]):
            raise RuntimeError("Triton Error [CUDA]: invalid argument")
        return reference_kda_packed_decode(*args)

    return decode


def test_minimize_by_bytes_keeps_the_product_the_failure_needs(tmp_path: Path) -> None:
    # The layout: ~200 MB of tensors; the failure needs B * HV >= 2000 only.
    case = build(KdaLayout(B=4096, H=4, HV=32, K=96, V=2), "triton")
    assert encoded_size(case) > 150 << 20
    target = _grid_target(2000)
    first = run_case(KDA, case, target)
    assert first.verdict is not None and first.verdict.what == "rejected-valid-layout"
    # seconds is a ceiling (it stops when no move helps): generous for a loaded machine
    small, final = minimize_with_verdict(KDA, case, target, first.verdict, seconds=180)
    B, HV = small.tensors["b"].shape
    V, K = small.tensors["initial_state"].shape[2:]
    assert B * HV >= 2000 and B * HV < 2100 and (K, V) == (1, 1), small.describe()
    assert small.notes["minimized_bytes"][1] < 4096, small.notes
    again = run_case(KDA, small, target)
    assert first.verdict.same_failure(again.verdict)
    path = save_case(small, final, tmp_path)
    assert path.stat().st_size < 16 << 10
    loaded, _, _ = load_case(path)
    assert first.verdict.same_failure(run_case(KDA, loaded, target).verdict)


def test_minimize_keeps_the_k_the_failure_needs() -> None:
    case = _case(B=16, H=2, HV=4, K=96, V=8, spare_slots=3)
    target = _only_with(lambda st: st.shape[-1] == 96)
    first = run_case(KDA, case, target)
    assert first.verdict is not None
    small = minimize(KDA, case, target, first.verdict, seconds=30)
    assert small.tensors["initial_state"].shape[1:] == (1, 1, 96), small.describe()
    assert small.tensors["b"].shape == (1, 1)


@pytest.mark.parametrize(("variant", "V"), [("triton", 3), ("helion", 4)])
def test_minimize_channel_counts_follow_the_variant(variant: str, V: int) -> None:
    # helion has check 14 (powers of two only); triton takes any count
    case = _case(variant, B=2, HV=2, K=8, V=16)
    target = _only_with(lambda st: st.shape[-2] >= 3)
    first = run_case(KDA, case, target)
    assert first.verdict is not None
    small = minimize(KDA, case, target, first.verdict, seconds=30)
    assert small.tensors["initial_state"].shape[-2:] == (V, 1), small.describe()


def test_trading_rows_for_heads_keeps_every_row_heads_numbers() -> None:
    from kda_fuzz.engine.oracle import call_args
    from kda_fuzz.families.packed.shrink import _merge_rows, _sizes, _split_heads
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    def outputs(c: Case) -> tuple[torch.Tensor, torch.Tensor]:
        kwargs, _ = c.materialize()
        out, state = reference_kda_packed_decode(*call_args(KDA, kwargs))
        idx = kwargs["ssm_state_indices"].long()
        return out[:, 0], state[idx.clamp(min=0)]  # [B, HV, V], [B, HV, V, K]

    case = _case(B=4, H=2, HV=4, K=4, V=2, spare_slots=1, padding="first")
    for name in ("A_log", "dt_bias"):  # the halves share these in the split layout
        arg = case.tensors[name]
        half = arg.view().reshape(4, -1)[:2]
        arg.view().copy_(torch.cat([half, half]).reshape(-1))
    sz = _sizes(case)
    assert sz is not None
    out, state = outputs(case)
    live = case.tensors["ssm_state_indices"].view() >= 0

    split = _split_heads(case, sz)
    assert expectation(KDA, split).ok and _sizes(split) == replace(sz, B=8, H=1, HV=2, slots=10)
    s_out, s_state = outputs(split)
    assert torch.equal(torch.cat([s_out[:4], s_out[4:]], 1), out)
    both = torch.cat([s_state[:4], s_state[4:]], 1)
    assert torch.equal(both[live], state[live])

    merged = _merge_rows(case, sz)
    assert expectation(KDA, merged).ok and _sizes(merged) == replace(sz, B=2, H=4, HV=8,
                                                                       slots=2)
    m_out, m_state = outputs(merged)  # row 0 is padding: its half now runs on zeros
    assert torch.equal(m_out[:, 4:], out[2:]) and torch.equal(m_out[1, :4], out[1])
    assert torch.equal(m_state[:, 4:], state[2:]) and torch.equal(m_state[1, :4], state[1])


# ------------------------------------------------------------------ pytest collection


def _seed_files(directory: Path) -> list[Path]:
    """Two small cases that pass on correct kernels: one valid, one broken."""
    valid = _case(B=2, K=4, V=4, HV=2, guard=1)
    bad_a = _case(B=2)
    a = bad_a.tensors["a"]
    broken = Case(bad_a.contract, bad_a.variant, {**bad_a.tensors, "a": TensorArg(
        torch.zeros(a.base.numel() + 8), (a.shape[0] + 1, a.shape[1]), a.stride, 0)},
        dict(bad_a.scalars), ("a-batch",), {"breakages": ["batch:a"], "semantic": False})
    return [save_case(valid, None, directory, description="valid"),
            save_case(broken, None, directory, description="check 10")]


def test_pytest_collects_corpus_files(pytester: pytest.Pytester, tmp_path: Path) -> None:
    good = _seed_files(pytester.path / "corpus" / "seed")
    (pytester.path / "corpus" / "broken.json").write_text('{"schema": 1, "kind": ')
    extra = pytester.path / "regressions"
    extra.mkdir()
    shutil.copy(good[0], extra / "from-ini.json")
    (pytester.path / "notcorpus").mkdir()
    (pytester.path / "notcorpus" / "data.json").write_text("{}")
    pytester.makeini("[pytest]\nkda_corpus = regressions\n")
    # replay targets: the project's kernels (the plugin has no silent default)
    triton = KDA.default_targets["triton"]
    (pytester.path / "pyproject.toml").write_text(
        f"[tool.kda-fuzz.targets.kda]\ntriton = {list(triton)!r}\n".replace("'", '"'))

    collected = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    out = collected.stdout.str()
    for p in good:
        assert f"{p.name}::{p.name}" in out
    assert "broken.json::broken.json" in out and "from-ini.json::from-ini.json" in out
    assert "data.json" not in out and "4 tests collected" in out

    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "corpus", "-rf")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*bad corpus file *broken.json: invalid JSON*"])
    assert "Traceback" not in result.stdout.str()

    # a buggy target: the failure names the file and the verdict
    pytester.makepyfile(buggy="""
        from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

        def decode(*args):
            out, state = reference_kda_packed_decode(*args)
            out.add_(1.0)
            return out, state
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kda-corpus-target", "buggy:decode",
                                str(good[0]))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*corpus file *{good[0].name}*", "*buggy:decode: [[]mismatch]*"])

    # CPU sessions: not gpu-marked, so `-m "not gpu"` keeps them and nothing is deselected
    cpu = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not gpu")
    assert "4 tests collected" in cpu.stdout.str()
    # GPU sessions: gpu-marked, so `-m gpu` selects them
    gpu = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-m", "gpu")
    assert "4 tests collected" in gpu.stdout.str()


# ------------------------------------------------------------------ kda-fuzz replay


def test_replay_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus"
    case = _case(B=3, padding="none", spare_slots=1)
    bug = _mutant("ignore_slot_stride")
    verdict = run_case(KDA, case, bug).verdict
    assert verdict is not None
    save_case(case, verdict, corpus, description="slot stride")

    assert cli_main(["replay", "--target", REFERENCE, "--contract", "triton", str(corpus)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert cli_main(["replay", "--target", "tests.mutants:ignore_slot_stride",
                     str(corpus)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "same failure as recorded" in out
    assert cli_main(["replay", "--target", REFERENCE, str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert cli_main(["replay", "--target", REFERENCE, str(tmp_path / "empty")]) == 2
    assert cli_main(["replay", "--target", "no_such_module_q:f", str(corpus)]) == 2
    assert cli_main(["replay", "--contract", "cuda", str(corpus)]) == 2
    capsys.readouterr()
    # hidden entries (the fuzzer's .inflight folder, temporary files) are not corpus files
    (corpus / ".inflight").mkdir()
    (corpus / ".inflight" / "junk.json").write_text("{")
    (corpus / ".x.json.abc.tmp").write_text("{")
    assert cli_main(["replay", "--target", REFERENCE, "--json", str(corpus)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["passed"] == 1 and report["exit_code"] == 0 and len(report["files"]) == 1


def test_replay_timeout_is_how_long_a_worker_target_may_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kda_fuzz.engine.verdict import Verdict

    path = save_case(_case(B=2, padding="none"),
                     Verdict("timeout", "no-return", "did not return within 3 s"), tmp_path)
    assert cli_main(["replay", "--target", "tests.hostile_targets:hangs", "--timeout", "2",
                     str(path)]) == 1
    assert "did not return within 2 s" in capsys.readouterr().out
    assert cli_main(["replay", "--target", REFERENCE, "--timeout", "0", str(path)]) == 2
    assert "--timeout must be positive" in capsys.readouterr().err


def test_replay_variant_file_wins_unless_contract_is_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A helion-variant file with K = 6: the helion contract prescribes check 14, which the
    # reference (a triton-variant implementation) does not do.
    case = _case("helion", K=6, V=4)
    exp = expectation(KDA, case)
    assert exp.check == 14
    save_case(case, None, tmp_path, description="non-pow2 under helion")
    assert cli_main(["replay", "--target", REFERENCE, str(tmp_path)]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert cli_main(["replay", "--target", REFERENCE, "--contract", "triton",
                     str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "recorded for the helion variant" in err and "under triton" in err


def test_fuzz_saves_a_minimized_failure_that_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "found"
    code = cli_main(["fuzz", "--target", "tests.mutants:typo_check_10", "--contract", "triton",
                     "--seed", "3", "--max-examples", "300", "--shrink-seconds", "5",
                     "--budget", "4096",  # small valid layouts: the bug is a message
                     "--corpus", str(corpus), "--json"])
    assert code == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = [Path(p) for p in report["saved"]]
    assert len(saved) == 1 and saved[0].exists() and saved[0].parent == corpus
    _, verdict, meta = load_case(saved[0])
    assert verdict is not None and verdict.what == "wrong-message" and verdict.check == 10
    assert meta["origin"]["target"] == "tests.mutants:typo_check_10"
    assert cli_main(["replay", "--target", "tests.mutants:typo_check_10", str(corpus)]) == 1
    assert cli_main(["replay", "--target", REFERENCE, "--contract", "triton",
                     str(corpus)]) == 0


def test_seed_corpus_passes_on_the_reference_and_fails_on_its_mutants() -> None:
    from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

    files = _kda_seeds()
    assert len(files) >= 8
    for path in files:
        case, _, meta = load_case(path)
        assert case.variant == "triton" and meta["description"], path
        assert run_case(KDA, case, reference_kda_packed_decode).status in ("pass", "gap"), path
        for name in case.notes.get("mutants", []):
            if name in _mutants():
                got = run_case(KDA, case, _mutant(name))
                assert got.status == "fail", (path, name)


def _mutants() -> dict[str, Any]:
    from tests import mutants

    return mutants.MUTANTS


def test_a_file_written_before_outputs_were_recorded_is_the_same_bug(tmp_path: Path) -> None:
    """A file whose verdict said that the state was out of tolerance too only by
    ``state_out_of_tolerance`` (before ``extra["outputs"]``) is read, and deduplicated,
    as out and state wrong together, the way the family upgrades it."""
    case = _case()
    legacy = Verdict("mismatch", "out-value", "...", output="out",
                     extra={"state_out_of_tolerance": 7})
    path = save_case(case, legacy, tmp_path, origin={"target": "t:f", "seed": 3})
    _, got, _ = load_case(path)
    assert got is not None and got.outputs() == ["initial_state", "out"]
    now = Verdict("mismatch", "out-value", "...", output="out",
                  extra={"outputs": ["out", "initial_state"]})
    assert corpus.known_failure(Failure(_case(seed=12), now, "t:f"), tmp_path) == path
    alone = Verdict("mismatch", "out-value", "...", output="out")
    assert corpus.known_failure(Failure(_case(seed=12), alone, "t:f"), tmp_path) is None
