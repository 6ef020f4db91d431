"""``kda-fuzz show FILE [--python]``: a corpus file, told; or a script that reproduces it.

Without ``--python``: the file's family and variant, what it guards against, its layout
(sizes, dtypes, strides), what the contract prescribes for it, the recorded verdict, where
it was recorded, and the command that replays it.

With ``--python``: a standalone script (plain Python and torch) that rebuilds every
argument bit for bit (each tensor's whole base buffer, guard cells included, and the
view taken of it), imports the target and calls it on one line that a debugger can stop
at. When kda-fuzz is importable, the script then replays the same case through kda-fuzz's
oracle and exits 1 if the target still fails it (0 if it passes), printing the verdict.
"""

from __future__ import annotations

import base64
import json
import os
import zlib
from pathlib import Path
from typing import Any

from kda_fuzz.config import Config, choose_targets, recorded_targets
from kda_fuzz.corpus.replay import Entry, load_entry, replay_command_line
from kda_fuzz.corpus.store import DTYPE_NAMES, CorpusError, _le_bytes
from kda_fuzz.engine.case import Judging
from kda_fuzz.engine.oracle import expectation
from kda_fuzz.families import BUILTIN, get_contract
from kda_fuzz.names import label
from kda_fuzz.report.progress import layout_of


class ShowError(Exception):
    """A file that cannot be shown (missing, or not a corpus file)."""


def _load(path: str | os.PathLike[str]) -> Entry:
    if not Path(path).is_file():
        raise ShowError(f"no such file: {path}")
    try:
        return load_entry(path)
    except CorpusError as e:
        raise ShowError(f"{e.path}: {e.reason}") from None


def script_target(entry: Entry, target: str | None, config: Config | None) -> str:
    """The target a script calls: ``target``, else the one the file was recorded against,
    else the configured one for its variant, else the contract's own kernel."""
    if target:
        return target
    recorded = recorded_targets(entry.meta.get("origin"))
    if recorded:
        return recorded[0]
    contract = get_contract(entry.case.contract)
    own = contract.default_targets.get(entry.case.variant, ())
    if config is not None:
        chosen = choose_targets(config, entry.case.contract, entry.case.variant, (), own)
        if chosen.specs:
            return chosen.specs[0]
    if own:
        return own[0]
    raise ShowError(f"no target known for {entry.case.contract}/{entry.case.variant}: pass "
                    "--target MODULE:CALLABLE")


def describe(entry: Entry, target: str | None = None, config: Config | None = None) -> str:
    """The human-readable account of a corpus file."""
    case, meta, verdict = entry.case, entry.meta, entry.verdict
    contract = get_contract(case.contract)
    lines = [f"{entry.name}",
             f"  contract:    {label(case.contract, case.variant)} ({meta['kind']})",
             f"  guards:      {meta['description']}",
             f"  layout:      {layout_of(case)}",
             f"  intent:      {', '.join(case.intent) or '-'}"
             + (f" (breakages: {', '.join(case.notes.get('breakages', []))})"
                if case.notes.get("breakages") else ""),
             f"  contract now: it {expectation(contract, case).describe()}"]
    if verdict is not None:
        lines.append(f"  verdict:     {verdict.summary()}")
        for key in ("check", "message", "output", "max_error", "where"):
            value = getattr(verdict, key, None)
            if value is not None:
                lines.append(f"    {key}: {value}")
    else:
        lines.append("  verdict:     none recorded (a hand-made regression)")
    origin = meta.get("origin") or {}
    if origin:
        lines.append("  recorded:    " + ", ".join(f"{k} {v}" for k, v in sorted(origin.items())
                                                  if v is not None))
    versions = meta.get("versions") or {}
    if versions:
        lines.append("  versions:    " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())
                                                  if v))
    try:
        name = script_target(entry, target, config)
        line = replay_command_line(name, entry.name, variant=case.variant,
                                   family=case.contract)
        lines.append(f"  reproduce:   {line}")
    except ShowError as e:
        lines.append(f"  reproduce:   {e}")
    lines.append(f"  debug:       kda-fuzz show --python {entry.name} > repro.py && python "
                 "repro.py")
    return "\n".join(lines) + "\n"


def _tensor_literal(arg: Any) -> dict[str, Any]:
    base = arg.base
    spec: dict[str, Any] = {"dtype": DTYPE_NAMES[base.dtype], "numel": base.numel(),
                            "shape": list(arg.shape), "stride": list(arg.stride),
                            "offset": arg.offset, "meta": base.device.type == "meta"}
    if not spec["meta"]:
        spec["zlib_b64"] = base64.b64encode(zlib.compress(_le_bytes(base), 9)).decode("ascii")
    return spec


SCRIPT = '''\
#!/usr/bin/env python3
"""Reproduces {name}
({family}/{variant}, {kind}): {description}

Generated by `kda-fuzz show --python`. It rebuilds every argument bit for bit (the whole
base buffer of each tensor, guard cells included, and the view taken of it), then calls
{target} on one line: set a breakpoint there (a finding of --helion-configs is
called under the Helion configs it was found under, which needs kda-fuzz). With kda-fuzz
installed it then replays the same case through kda-fuzz's oracle and exits 1 if the
target still fails it.
"""

import base64
import contextlib
import importlib
import os
import sys
import zlib

import torch

TARGET = {target!r}
DEVICE = "cuda" if "--cuda" in sys.argv else "cpu"
SIGNATURE = {signature!r}
SCALARS = {scalars!r}
TENSORS = {tensors!r}
RECORDED = {recorded!r}
DOCUMENT = {document!r}  # the corpus file, for kda-fuzz's oracle
CONFIGS = {configs!r}  # the Helion configs the finding ran under (--helion-configs)
FAMILY = {family!r}
FAMILIES = {families!r}  # the project's own families ([tool.kda-fuzz] families)
PROJECT = {project!r}  # the project's folder: its modules
_INT = {{1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}}


def tensor(spec):
    """One argument: its base buffer, little-endian bytes as saved, and its strided view."""
    dtype = getattr(torch, spec["dtype"])
    if spec["meta"]:
        base = torch.empty(spec["numel"], dtype=dtype, device="meta")
    elif spec["numel"] == 0:
        base = torch.empty(0, dtype=dtype)
    else:
        raw = bytearray(zlib.decompress(base64.b64decode(spec["zlib_b64"])))
        words = torch.frombuffer(raw, dtype=_INT[torch.empty(0, dtype=dtype).element_size()])
        if sys.byteorder != "little":
            words = torch.from_numpy(words.numpy().byteswap().copy())
        base = words.view(dtype).clone().to(DEVICE)
    return base.as_strided(spec["shape"], spec["stride"], spec["offset"])


def build():
    """The call's arguments by name, fresh."""
    args = {{name: tensor(spec) for name, spec in TENSORS.items()}}
    args.update(SCALARS)
    return args


def contract():
    """The case's contract (needs kda-fuzz), the project's own families made known."""
    for folder in (PROJECT, os.getcwd()):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
    from kda_fuzz.families import ENV_VAR, get_contract

    if FAMILIES:
        have = [s for s in os.environ.get(ENV_VAR, "").split(",") if s]
        os.environ[ENV_VAR] = ",".join(dict.fromkeys([*have, *FAMILIES]))
    return get_contract(FAMILY)


def load_target():
    try:  # the project's kernels need kda-fuzz's CPU set-up (the Triton interpreter)
        execution = contract().execution
        if DEVICE == "cpu" and execution is not None:
            execution.configure_cpu()
    except ImportError:
        pass
    if os.getcwd() not in sys.path:  # MODULE:CALLABLE relative to where it runs, as kda-fuzz
        sys.path.insert(0, os.getcwd())
    module, _, attr = TARGET.partition(":")
    fn = importlib.import_module(module)
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn


def kernel_configs():
    """Run the call's Helion kernels under the configs the finding recorded (if any)."""
    if not CONFIGS:
        return contextlib.nullcontext()
    try:
        from kda_fuzz.execution import configs
    except ImportError:
        print("kda-fuzz is not installed: the kernels run under their own configs, "
              "not the recorded ones")
        return contextlib.nullcontext()
    print(f"under the recorded kernel configs: {{configs.describe(CONFIGS)}}")
    return configs.pinned(CONFIGS)


def main():
    fn = load_target()
    args = build()
    print(f"recorded: {{RECORDED}}")
    try:
        with kernel_configs():
            fn(*[args[name] for name in SIGNATURE])  # <- the call under test
        print("the target returned")
    except Exception as e:
        print(f"the target raised {{type(e).__name__}}: {{e}}")
    try:
        from kda_fuzz.corpus.store import parse_case
        from kda_fuzz.engine.oracle import run_case
    except ImportError:
        print("kda-fuzz is not installed: not judged")
        return 0
    family = contract()  # before the document is read: it names the family
    case, _, _ = parse_case(DOCUMENT, "repro")
    if DEVICE != "cpu":
        case = case.on(DEVICE)
    outcome = run_case(family, case, fn)
    if outcome.status == "fail":
        print(f"REPRODUCED: {{outcome.verdict.summary()}}")
        return 1
    print(f"not reproduced: {{outcome.status}}"
          + (f" ({{outcome.note}})" if outcome.note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def script(entry: Entry, target: str, config: Config | None = None) -> str:
    """A standalone Python script that rebuilds ``entry``'s case and calls ``target``
    (``config``: the project's, whose own families the script makes known to kda-fuzz
    for a case of one of them)."""
    case = entry.case
    contract = get_contract(case.contract)
    document = Path(entry.name).read_text(encoding="utf-8")
    own = config is not None and bool(config.families) and case.contract not in BUILTIN
    return SCRIPT.format(
        name=Path(entry.name).name, family=case.contract, variant=case.variant,
        kind=entry.kind, description=" ".join(str(entry.meta["description"]).split()),
        target=target, signature=tuple(contract.signature),
        scalars=dict(case.scalars),
        tensors={n: _tensor_literal(a) for n, a in case.tensors.items()},
        recorded=entry.verdict.summary() if entry.verdict is not None else "no verdict",
        document=json.dumps(json.loads(document), sort_keys=True),
        configs=Judging.of(case).configs or None,
        families=tuple(config.families) if own and config is not None else (),
        project=str(config.root) if own and config is not None else None)


def show(path: str | os.PathLike[str], *, python: bool = False, target: str | None = None,
         config: Config | None = None) -> str:
    """The text ``kda-fuzz show`` prints for ``path``."""
    entry = _load(path)
    if python:
        return script(entry, script_target(entry, target, config), config)
    return describe(entry, target, config)


__all__ = ["ShowError", "describe", "script", "show"]
