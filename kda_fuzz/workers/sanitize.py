"""Cases replayed under NVIDIA's compute-sanitizer (``memcheck``, ``racecheck``,
``initcheck``): what a differential check cannot see, such as a read past a tensor's end
whose value is masked out.

A batch of cases runs in one sanitized Python process (its start-up, a CUDA context under
the tool, is most of the cost) with PyTorch's caching allocator off, so that each tensor is
an allocation of its own and an access past its end is past an allocation. Each tensor is
rebuilt tight: its view's reach, with no guard cells around it. A batch that reports
errors is split in halves until each error is one case's; the tensor an error names is
found from the allocation addresses the worker records.

Run as ``python -m kda_fuzz.workers.sanitize BATCH RESULT`` by :func:`sanitize`, never by
hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.oracle import EnvironmentFailure
from kda_fuzz.engine.verdict import Verdict

TOOLS = ("memcheck", "racecheck", "initcheck")
ENV_TOOL = "KDA_FUZZ_COMPUTE_SANITIZER"  # which compute-sanitizer to run (a path)
ERROR_EXIT = 86  # the sanitized process's exit status when the tool reported errors
BATCH = 8  # cases per sanitized process
KEPT_ERRORS = 8  # errors of a report a corpus file keeps (all are counted)
MAX_CASE_BYTES = 1 << 20  # tensor bytes of a case sampled for the sanitizer (cost, file size)

_PREFIX = "========="
_HEADERS = re.compile(
    r"^(Invalid __\w+__ (?:read|write|atomic)\b.*|Uninitialized __\w+__ memory read\b.*|"
    r"(?:Error|Warning): Race reported\b.*|Misaligned .*|Out-of-range .*|Malloc/Free error.*|"
    r"Invalid PC .*|Hardware Exception.*|Illegal Instruction.*|Barrier error.*|"
    r"Unused memory .*)$")
_ACCESS = re.compile(r"\b(read|write|atomic)\b")
_SIZE = re.compile(r"of size (\d+) bytes?")
_AT = re.compile(r"^at (?:0x[0-9a-fA-F]+ in )?([A-Za-z_][\w$.:<>]*)")
_ADDRESS = re.compile(r"(?:Address|Access to) (0x[0-9a-fA-F]+)")
_NEAREST = re.compile(r"(\d+) bytes (after|before) the nearest allocation at "
                      r"(0x[0-9a-fA-F]+) of size (\d+) bytes")


class SanitizerMissing(EnvironmentFailure):
    """compute-sanitizer is not installed where kda-fuzz looks for it."""


def find_sanitizer() -> str:
    """The compute-sanitizer to run: ``$KDA_FUZZ_COMPUTE_SANITIZER``, else on ``PATH``, else
    under ``$CUDA_HOME/bin``; raises :class:`SanitizerMissing` naming where it looked."""
    given = os.environ.get(ENV_TOOL)
    if given:
        if not os.access(given, os.X_OK):
            raise SanitizerMissing(f"{ENV_TOOL}={given} is not an executable file")
        return given
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(Path(home, "bin", "compute-sanitizer"), os.X_OK):
            return str(Path(home, "bin", "compute-sanitizer"))
    raise SanitizerMissing(
        "--sanitize needs NVIDIA's compute-sanitizer (part of the CUDA toolkit): not on PATH, "
        f"not under $CUDA_HOME/bin or /usr/local/cuda/bin (or set {ENV_TOOL})")


@dataclass(frozen=True)
class SanitizerError:
    """One error the tool reported: its header line, the kind of access and its size, the
    kernel, and the tensor the address belongs to (or lies just past or before)."""

    header: str
    access: str | None = None
    size: int | None = None
    kernel: str | None = None
    tensor: str | None = None
    past_end: int | None = None  # bytes past the end of ``tensor``
    before_start: int | None = None  # bytes before its start
    text: str = ""

    @property
    def what(self) -> str:
        """A stable name of the error's kind (``invalid-global-read``, ...)."""
        words = re.sub(r"\bof size \d+ bytes?\b.*", "", self.header)
        words = re.sub(r"\bbetween\b.*", "", words).replace("__", " ")
        return "-".join(re.findall(r"[a-z0-9]+", words.lower()))

    def summary(self) -> str:
        where = ""
        if self.tensor is not None:
            where = (f" {self.past_end} bytes past the end of {self.tensor}"
                     if self.past_end is not None else
                     f" {self.before_start} bytes before the start of {self.tensor}"
                     if self.before_start is not None else f" in {self.tensor}")
        return self.header + (f" in kernel {self.kernel}" if self.kernel else "") + \
            (":" + where if where else "")


@dataclass
class SanitizerReport:
    """What the tool said about one case: ``status`` ``clean``, ``errors`` or ``failed``
    (the sanitized run itself did not complete: ``note`` says why; never a verdict);
    ``unsure`` only inside a batch, before its errors are told apart by case."""

    tool: str
    status: str
    errors: list[SanitizerError] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""  # the target raised (``raised``), or why the run failed
    text: str = ""  # the tool's own lines for this case

    def to_json(self) -> dict[str, Any]:
        """The report as a corpus file holds it (the first ``KEPT_ERRORS`` errors)."""
        return {"tool": self.tool, "status": self.status, "seconds": round(self.seconds, 3),
                "error_count": len(self.errors),
                "errors": [{**asdict(e), "text": e.text[:600]} for e in self.errors[:KEPT_ERRORS]],
                "note": self.note, "text": self.text[:3000]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SanitizerReport:
        return cls(data["tool"], data["status"],
                   [SanitizerError(**e) for e in data.get("errors", [])],
                   data.get("seconds", 0.0), data.get("note", ""), data.get("text", ""))

    def verdict(self) -> Verdict | None:
        """The finding of a case whose outputs passed but whose report has errors."""
        if self.status != "errors" or not self.errors:
            return None
        first = self.errors[0]
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        return Verdict("sanitizer", f"{self.tool}-{first.what}",
                       f"{self.tool}: {first.summary()}{more}; the outputs matched the "
                       "reference", output=first.tensor,
                       extra={"tool": self.tool, "sanitizer": self.to_json()})


def parse_report(text: str, allocations: dict[str, tuple[int, int]] | None = None
                 ) -> list[SanitizerError]:
    """The errors in compute-sanitizer's output ``text``; ``allocations`` (tensor name ->
    (address, bytes)) names the tensor each address belongs to."""
    blocks: list[list[str]] = []
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX):
            continue
        line = raw[len(_PREFIX):]
        if not line.startswith("  "):  # a top-level line: an error's header, or it ends one
            blocks.append([line.strip()] if _HEADERS.match(line.strip()) else [])
        elif blocks and blocks[-1] and len(blocks[-1]) < 40:
            blocks[-1].append(line.strip())
    errors = []
    for block in (b for b in blocks if b):
        header = block[0]
        access = _ACCESS.search(header)
        size = _SIZE.search(header)
        kernel = next((m.group(1) for m in map(_AT.match, block[1:]) if m), None)
        err: dict[str, Any] = {"header": header, "access": access.group(1) if access else None,
                               "size": int(size.group(1)) if size else None, "kernel": kernel,
                               "text": "\n".join(block)[:2000]}
        body = " ".join(block[1:])
        near = _NEAREST.search(body)
        address = _ADDRESS.search(body)
        for name, (ptr, nbytes) in (allocations or {}).items():
            if near is not None and int(near.group(3), 16) == ptr:
                err["tensor"] = name
                err["past_end" if near.group(2) == "after" else "before_start"] = int(
                    near.group(1))
                break
            if address is not None and nbytes and ptr <= int(address.group(1), 16) < ptr + nbytes:
                err["tensor"] = name
                break
        errors.append(SanitizerError(**err))
    return errors


def tight(arg: TensorArg) -> TensorArg:
    """``arg`` on a base of exactly its view's reach (no guard cells)."""
    reach = arg.footprint()
    return TensorArg(arg.base[arg.offset:reach].clone(), arg.shape, arg.stride, 0)


# ------------------------------------------------------------------ the parent


def sanitize(tool: str, target: str, cases: Sequence[Case], *, device: str = "cuda",
             timeout: float = 600.0) -> list[SanitizerReport]:
    """Run each case on ``target`` (``MODULE:CALLABLE``) under ``tool``; one report per case,
    in order. Raises :class:`SanitizerMissing` when the tool is not installed."""
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r} (one of {', '.join(TOOLS)})")
    return run(find_sanitizer(), tool, target, cases, device=device, timeout=timeout)


def run(exe: str, tool: str, target: str, cases: Sequence[Case], *, device: str = "cuda",
        timeout: float = 600.0) -> list[SanitizerReport]:
    """:func:`sanitize` with the tool's path given (:func:`find_sanitizer`)."""
    return _sanitize(exe, tool, target, list(cases), device, timeout)


_live: set[subprocess.Popen[str]] = set()
_live_lock = threading.Lock()


def kill_all() -> None:
    """Kill every sanitized process running (a job that stops does not wait for them)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


def _sanitize(exe: str, tool: str, target: str, cases: list[Case], device: str,
              timeout: float) -> list[SanitizerReport]:
    if not cases:
        return []
    reports = _run_batch(exe, tool, target, cases, device, timeout)
    unsure = [i for i, r in enumerate(reports) if r.status == "unsure"]
    if not unsure:
        return reports
    if len(unsure) == 1:  # the only case the errors can be of
        reports[unsure[0]] = _run_batch(exe, tool, target, [cases[unsure[0]]], device,
                                        timeout)[0]
        return reports
    half = len(unsure) // 2  # errors that name no case's tensor: split the cases
    for part in (unsure[:half], unsure[half:]):
        for i, r in zip(part, _sanitize(exe, tool, target, [cases[i] for i in part], device,
                                        timeout)):
            reports[i] = r
    return reports


def _run_batch(exe: str, tool: str, target: str, cases: list[Case], device: str,
               timeout: float) -> list[SanitizerReport]:
    """One sanitized process for ``cases``. A report is ``unsure`` when the tool reported
    errors that no single case's tensors account for (several cases ran)."""
    with tempfile.TemporaryDirectory(prefix="kda-fuzz-sanitize-") as tmp:
        batch, result = Path(tmp, "batch.pt"), Path(tmp, "result.json")
        torch.save({"target": target, "device": device,
                    "cases": [c.on("cpu") for c in cases]}, batch)
        cmd = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "64",
               "--target-processes", "application-only", "--launch-timeout", "0",
               *(("--destroy-on-device-error", "kernel") if tool == "memcheck" else ()),
               sys.executable, "-m", "kda_fuzz.workers.sanitize", str(batch), str(result)]
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH"))
                                            if p)
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True, errors="replace")
        with _live_lock:
            _live.add(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [SanitizerReport(tool, "failed", note=f"the sanitized run took over "
                                    f"{timeout:g} s") for _ in cases]
        finally:
            with _live_lock:
                _live.discard(proc)
        seconds = (time.monotonic() - started) / len(cases)
        try:
            records = json.loads(result.read_text())
        except (OSError, ValueError):
            records = None
        complete = records is not None and len(records) == len(cases) \
            and all(r.get("done") for r in records)
        allocations = {f"{i}/{name}": (int(v[0]), int(v[1]))
                       for i, rec in enumerate(records or [])
                       for name, v in rec["tensors"].items()}
        errors = parse_report(out, allocations)
        if not errors and proc.returncode == ERROR_EXIT:  # errors in words we do not know
            errors = [SanitizerError(_first_error_line(out), text=_tool_lines(out)[:2000])]
        if not complete and not errors:
            why = (f"the sanitized process ended with status {proc.returncode} before it "
                   f"ran every case: {_tail(out)}")
            return [SanitizerReport(tool, "failed", seconds=seconds, note=why) for _ in cases]
        loose = [e for e in errors if e.tensor is None]
        owners = [int(e.tensor.split("/", 1)[0]) for e in errors if e.tensor is not None]
        reports = []
        for i in range(len(cases)):
            mine = [replace(e, tensor=e.tensor.split("/", 1)[1]) for e in errors
                    if e.tensor is not None and e.tensor.split("/", 1)[0] == str(i)]
            rec = (records or [])[i] if i < len(records or []) else {}
            raised = rec.get("raised", "")
            # after a case's error the process's later launches may not run: those cases,
            # like every case of a batch whose errors name no tensor, are run again
            after = bool(owners) and i > min(owners) and not mine
            if len(cases) > 1 and (loose or after or not rec.get("done")):
                reports.append(SanitizerReport(tool, "unsure", mine, seconds, raised))
            elif mine or loose:
                reports.append(SanitizerReport(tool, "errors", mine + loose, seconds, raised,
                                               _tool_lines(out)))
            else:
                reports.append(SanitizerReport(tool, "clean", [], seconds, raised))
        return reports


def _first_error_line(text: str) -> str:
    skip = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY",
            "Target application returned", "Error: process didn")
    for line in text.splitlines():
        if line.startswith(_PREFIX + " ") and not line.startswith(_PREFIX + "  "):
            body = line[len(_PREFIX):].strip()
            if body and not body.startswith(skip):
                return body
    return "the tool reported errors"


def _tool_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith(_PREFIX))[-8000:]


def _tail(text: str, n: int = 400) -> str:
    return " ".join(text.split())[-n:] or "no output"


# ------------------------------------------------------------------ the worker


def _main(batch: str, result: str) -> int:
    from kda_fuzz.engine.oracle import call_args
    from kda_fuzz.engine.targets import load_target
    from kda_fuzz.families import get_contract

    spec = torch.load(batch, weights_only=False)
    device = spec["device"]
    fn = load_target(spec["target"]).fn
    records, alive = [], []
    for case in spec["cases"]:
        tensors = {n: tight(t).on(device) for n, t in case.tensors.items()}
        kwargs: dict[str, Any] = {n: t.view() for n, t in tensors.items()}
        kwargs.update(case.scalars)
        rec: dict[str, Any] = {"tensors": {n: [t.base.data_ptr(), t.base.numel()
                                               * t.base.element_size()]
                                           for n, t in tensors.items()}}
        records.append(rec)
        _write(result, records)  # before the call: a process the call ends has said where
        try:
            fn(*call_args(get_contract(case.contract), kwargs))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as e:  # the outcome was judged by the campaign: only noted here
            rec["raised"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rec["done"] = True
        _write(result, records)
        alive.append(tensors)  # every case's buffers stay allocated: addresses stay distinct
    return 0


def _write(path: str, records: list[dict[str, Any]]) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(records))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2]))


__all__ = ["BATCH", "MAX_CASE_BYTES", "TOOLS", "SanitizerError", "SanitizerMissing",
           "SanitizerReport", "find_sanitizer", "kill_all", "parse_report", "run", "sanitize",
           "tight"]
