"""The worked example of docs/extending.md, end to end: examples/rowsoftmax, a project of
its own with a non-packed family (row softmax) that declares no variants, an option of its
own and what in its messages is a value. Every command runs as a subprocess from (a copy
of) the example's folder, as its users would run them."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rowsoftmax"
GOOD, BUGGY = "rowsoftmax.kernels:softmax_rows", "rowsoftmax.kernels:softmax_rows_buggy"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("KDA_FUZZ_FAMILIES", "PYTHONPATH")}


def _run(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


def _kda_fuzz(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run(cwd, "-m", "kda_fuzz", *args)


def _out(r: subprocess.CompletedProcess[str]) -> str:
    return r.stdout[-3000:] + r.stderr[-3000:]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    dest = tmp_path / "rowsoftmax"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("corpus", "__pycache__"))
    return dest


def test_the_example_family_end_to_end(project: Path, tmp_path: Path) -> None:
    # plain `kda-fuzz fuzz`: the configured family (no variant) and its buggy kernel; each
    # planted bug is one failure (the check out of order shows on many dtype pairs)
    r = _kda_fuzz(project, "fuzz", "--max-examples", "150", "--seed", "1",
                  "--shrink-seconds", "2")
    assert r.returncode == 1, _out(r)
    assert f"fuzzing rowsoftmax on cpu: {BUGGY}" in r.stderr, r.stderr
    assert "2 distinct failure(s)" in r.stdout, r.stdout
    assert "[contract] wrong-check-order: raised check 4's message" in r.stdout
    assert "[mismatch] out-value" in r.stdout
    saved = sorted((project / "corpus" / "found").glob("*.json"))
    assert [p.name.split("-")[0] for p in saved] == ["contract", "mismatch"], saved
    printed = re.findall(r"reproduce:\s+(kda-fuzz replay .*)", r.stdout)
    assert len(printed) == 2 and all("--family rowsoftmax" in p and "--contract" not in p
                                     for p in printed), printed

    # the correct kernel: nothing found
    r = _kda_fuzz(project, "fuzz", "--target", GOOD, "--max-examples", "150", "--seed", "1",
                  "--no-save")
    assert r.returncode == 0 and "no failure found" in r.stdout, _out(r)

    for line in printed:  # replay, as printed
        words = shlex.split(line)
        r = _kda_fuzz(project, *words[1:])
        assert r.returncode == 1 and "FAIL" in r.stdout and "[rowsoftmax]" in r.stdout, \
            (line, _out(r))
    r = _kda_fuzz(project, "replay", "--target", GOOD, "corpus")  # the fix passes them
    assert r.returncode == 0 and r.stdout.count("PASS") == 2, _out(r)

    # pytest: the project's property tests pass, the corpus items fail
    r = _run(project, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
             "tests", "corpus")
    assert r.returncode == 1 and "2 failed, 2 passed" in r.stdout, _out(r)
    assert "(contract): contract/wrong-check-order" in r.stdout, r.stdout

    # show --python: a script that reproduces the finding from anywhere
    mismatch = saved[1]
    r = _kda_fuzz(project, "show", "--python", str(mismatch))
    assert r.returncode == 0, _out(r)
    script = tmp_path / "repro.py"
    script.write_text(r.stdout)
    r = _run(tmp_path, str(script))
    assert r.returncode == 1 and "REPRODUCED: [mismatch] out-value" in r.stdout, _out(r)


def test_the_example_familys_own_options(project: Path) -> None:
    r = _kda_fuzz(project, "fuzz", "--help")
    assert r.returncode == 0, _out(r)
    text = " ".join(r.stdout.split())
    assert "--max-cols N longest row of a valid case (default 48) [family rowsoftmax only]" \
        in text, text
    assert "[families kda, gdn only]" in text
    for argv, words in ((["--max-b", "4"], "family 'rowsoftmax' takes no option --max-b "
                                           "(its own: --max-cols); --max-b is of families "
                                           "kda, gdn"),
                        (["--no-bucket"], "takes no option --no-bucket"),
                        (["--contract", "triton"], "family 'rowsoftmax' declares no "
                                                   "variants: leave out --contract triton"),
                        (["--max-cols", "0"], "--max-cols must be at least 1")):
        r = _kda_fuzz(project, "fuzz", "--max-examples", "3", "--no-save", *argv)
        assert r.returncode == 2 and words in r.stderr, (argv, _out(r))
    r = _kda_fuzz(project, "fuzz", "--max-cols", "2", "--max-examples", "20", "--seed", "2",
                  "--target", GOOD, "--no-save", "--no-isolate")
    assert r.returncode == 0, _out(r)


def test_message_values_tell_one_bug_from_another(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from kda_fuzz.engine.contract import SIGNED_NUMBERS, MessageValues
    from kda_fuzz.engine.verdict import Verdict
    from kda_fuzz.families import get_contract

    monkeypatch.syspath_prepend(str(EXAMPLE))
    from rowsoftmax.contract import CONTRACT

    def raised(contract, got: str, what: str = "wrong-check-order") -> Verdict:
        return contract.valued(Verdict("contract", what, "...", check=2,
                                       extra={"got": got, "exception": "ValueError"}))

    a = raised(CONTRACT, "out must be float32 like x, got bfloat16")
    b = raised(CONTRACT, "out must be bfloat16 like x, got float16")
    assert a.extra["got_pattern"] == "out must be {x_dtype} like x, got {out_dtype}"
    assert a.signature() == b.signature()
    other = raised(CONTRACT, "expected scalar type Float but found BFloat16",
                   "rejected-valid-layout")
    assert other.extra["got_pattern"] == "expected scalar type <value> but found <value>"
    bare = dataclasses.replace(CONTRACT, message_values=None)  # digits only, as before
    assert raised(bare, a.extra["got"]).signature() != raised(bare, b.extra["got"]).signature()
    signed = dataclasses.replace(CONTRACT, message_values=MessageValues(
        fields=False, patterns=(SIGNED_NUMBERS,)))
    assert signed.message_pattern("alpha is -1.5e-3, not 2") == "alpha is <value>, not <value>"
    # a file's verdict is read in today's terms (decoded_verdict)
    assert "got_pattern" in CONTRACT.decoded_verdict(
        Verdict("contract", "wrong-message", "...", extra={"got": "x"})).extra
    kda = get_contract("kda")  # the built-in families keep their signatures
    assert kda.message_values is None and kda.valued(a) is not a
    assert "got_pattern" not in kda.valued(a).extra


def test_targets_of_a_family_without_variants_are_a_list(tmp_path: Path) -> None:
    from kda_fuzz.config import ConfigError, choose_campaign, config_snippet, load_config
    from kda_fuzz.names import FAMILIES, SOLE_VARIANT

    variants = {**FAMILIES, "rowsoftmax": (SOLE_VARIANT,), "axpy": ("plain",)}
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kda-fuzz.targets]\nrowsoftmax = ["m:k"]\n')
    c = choose_campaign(load_config(tmp_path), None, None, (), variants, lambda f, v: ())
    assert (c.family, c.variant, c.targets.specs) == ("rowsoftmax", SOLE_VARIANT, ("m:k",))
    assert config_snippet("rowsoftmax", SOLE_VARIANT, ["m:k"]) == \
        '[tool.kda-fuzz.targets]\nrowsoftmax = ["m:k"]'
    (tmp_path / "pyproject.toml").write_text('[tool.kda-fuzz.targets]\naxpy = ["m:k"]\n')
    with pytest.raises(ConfigError, match="declares variants \\(plain\\)"):
        choose_campaign(load_config(tmp_path), None, None, (), variants, lambda f, v: ())
