"""Cases replayed under NVIDIA's compute-sanitizer (``memcheck``, ``racecheck``,
``initcheck``): what a differential check cannot see, such as a read past a tensor's end
whose value is masked out.

A :class:`SanitizedWorker` is one long-lived Python process under the tool (its start-up,
imports and a CUDA context under the tool, is most of the cost: it is paid once), run with
PyTorch's caching allocator off, so that each tensor is an allocation of its own and an
access past its end is past an allocation. Cases are streamed to it one at a time (the
messages below, pickled to bytes: CPU tensors travel by value), each rebuilt tight (its
view's reach, no guard cells) and run between two marker lines on its output, its
launches synchronized before the second. The tool's lines between the markers are that
case's; an error that names an allocation is the case's whose tensor it is (the worker
keeps the last ``KEEP`` cases' buffers alive, so their addresses stay distinct), one
printed late goes to the case it names. A process that dies is started again; what the
tool reported before it died is the running case's report.

:func:`dispatch` serves one such worker to every campaign job of a GPU (see
:mod:`kda_fuzz.campaign.sanitizing`). Run as ``python -m kda_fuzz.workers.sanitize serve
...`` (the worker) or ``... dispatch ...`` by this module, never by hand.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import torch

from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.oracle import EnvironmentFailure
from kda_fuzz.engine.verdict import Verdict

TOOLS = ("memcheck", "racecheck", "initcheck")
ENV_TOOL = "KDA_FUZZ_COMPUTE_SANITIZER"  # which compute-sanitizer to run (a path)
ENV_KEY = "KDA_FUZZ_SANITIZE_KEY"  # the authkey of a worker's or dispatcher's socket (hex)
ERROR_EXIT = 86  # the sanitized process's exit status when the tool reported errors
KEPT_ERRORS = 8  # errors of a report a corpus file keeps (all are counted)
MAX_CASE_BYTES = 1 << 20  # tensor bytes of a case sampled for the sanitizer (cost, file size)
KEEP = 16  # cases whose buffers a worker keeps allocated (their addresses stay distinct)
MARK = "kda-fuzz-sanitize"  # the worker's marker lines: "MARK BEGIN id", "MARK END id"
SETTLE = 0.02  # seconds the tool's lines may lag a case's end marker
START_TIMEOUT = 600.0  # seconds a sanitized process may take to start

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
                       tool=self.tool, notes={"sanitizer": self.to_json()})


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


# ------------------------------------------------------------------ messages
# Sent pickled to bytes (``send``/``recv``): CPU tensors by value, never through the
# shared-memory handles of multiprocessing's own pickler.


@dataclass(frozen=True)
class RunCase:
    """To a worker: run ``case`` (a pickled CPU :class:`Case`) on ``target``."""

    id: int
    target: str
    case: bytes


@dataclass(frozen=True)
class Quit:
    """To a worker: end."""


@dataclass(frozen=True)
class Ready:
    """From a worker: its imports done, its targets loaded, its device context made."""

    pid: int
    seconds: float


@dataclass(frozen=True)
class Started:
    """From a worker: case ``id`` is about to be called; its tensors' (address, bytes)."""

    id: int
    tensors: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class CaseDone:
    """From a worker: case ``id`` returned and its launches ended (``raised``: what the
    call raised, only noted); ``lost``: the device context is gone, the worker ends."""

    id: int
    seconds: float
    raised: str = ""
    lost: str = ""


@dataclass(frozen=True)
class Hello:
    """A job to its dispatcher: its name (a restarted job says the same one, and is sent
    the reports not delivered to the one before)."""

    client: str


@dataclass(frozen=True)
class Submit:
    """A job to its dispatcher: sanitize ``case`` (a pickled CPU :class:`Case`) on
    ``target``; ``key`` is the job's name for it (a key given twice is run once);
    ``signature``: what the kernel specializes on (``engine.case.signature``)."""

    key: Any
    target: str
    case: bytes
    signature: str = ""


@dataclass(frozen=True)
class Bye:
    """A job to its dispatcher: it sends nothing more."""


@dataclass(frozen=True)
class Result:
    """A dispatcher to a job: the report on its sample ``key``; a second one may follow
    for the same key (errors the tool printed after the case had ended)."""

    key: Any
    report: SanitizerReport


@dataclass(frozen=True)
class Unavailable:
    """A dispatcher to its jobs: the sanitizer cannot run here (``detail``); ``ran``:
    whether it ran any case before."""

    detail: str
    ran: bool


def send(conn: Connection, msg: Any) -> None:
    """Send one message (pickled here, so tensors go by value)."""
    conn.send_bytes(pickle.dumps(msg))


def recv(conn: Connection) -> Any:
    """Receive one message (raises ``EOFError`` when the other end is gone)."""
    return pickle.loads(conn.recv_bytes())


# ------------------------------------------------------------------ the parent


class StartFailed(EnvironmentFailure):
    """A sanitized process ended, or did not become ready, before its first case."""


_live: set[_Process] = set()
_live_lock = threading.Lock()


def kill_all() -> None:
    """Kill every sanitized process this process has running."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        proc.kill()


class _Process:
    """One sanitized process: its output lines (read as they come) and its messages."""

    def __init__(self, cmd: list[str], env: dict[str, str], listener: Listener,
                 folder: str) -> None:
        self.listener, self.folder = listener, folder
        self.lines: list[str] = []
        self.inbox: collections.deque[Any] = collections.deque()
        self.cond = threading.Condition()
        self.eof = self.closed = self.ready = False
        self.conn: Connection | None = None
        self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace",
                                      env=env, start_new_session=True)
        with _live_lock:
            _live.add(self)
        for fn in (self._read, self._accept):
            threading.Thread(target=fn, name="kda-fuzz-sanitized-io", daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _accept(self) -> None:
        try:
            conn = self.listener.accept()
        except (OSError, EOFError, ValueError):  # closed by ``kill``, or a failed handshake
            with self.cond:
                self.closed = True
                self.cond.notify_all()
            return
        with self.cond:
            self.conn = conn
        while True:
            try:
                msg = recv(conn)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            with self.cond:
                self.inbox.append(msg)
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def gone(self) -> bool:
        return self.closed or self.popen.poll() is not None

    def wait_lines(self, pred: Callable[[], bool], seconds: float) -> None:
        """Wait until ``pred()`` holds, the output ends or ``seconds`` pass."""
        end = time.monotonic() + seconds
        with self.cond:
            while not pred() and not self.eof and time.monotonic() < end:
                self.cond.wait(max(0.0, min(0.1, end - time.monotonic())))

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for closing in (self.conn, self.listener):
            try:
                if closing is not None:
                    closing.close()
            except OSError:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)
        with _live_lock:
            _live.discard(self)


class SanitizedWorker:
    """A long-lived sanitized Python process that runs cases one at a time (see the
    module's docstring), started again whenever it dies, reports errors or loses its
    device context. ``targets`` are loaded during its start-up."""

    def __init__(self, exe: str, tool: str, device: str, targets: Sequence[str] = ()) -> None:
        if tool not in TOOLS:
            raise ValueError(f"unknown sanitizer tool {tool!r} (one of {', '.join(TOOLS)})")
        self.exe, self.tool, self.device, self.targets = exe, tool, device, list(targets)
        self.starts = 0  # processes started
        self.ran = 0  # cases run to their end
        self.startup: float | None = None  # seconds the last process took to be ready
        self.last_id = -1  # the id of the case :meth:`run` ran last
        self._late: list[tuple[int, SanitizerError]] = []
        self._p: _Process | None = None
        self._next = 0
        self._recent: collections.deque[tuple[int, dict[str, tuple[int, int]]]] = \
            collections.deque(maxlen=KEEP)

    def __enter__(self) -> SanitizedWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Start a sanitized process now (returns at once), ending the one before."""
        self.kill()
        folder = tempfile.mkdtemp(prefix="kda-fuzz-sanitize-")
        key = secrets.token_bytes(16)
        address = str(Path(folder, "w.sock"))
        listener = Listener(address, family="AF_UNIX", authkey=key)
        cmd = [self.exe, "--tool", self.tool, "--error-exitcode", str(ERROR_EXIT),
               "--print-limit", "64", "--target-processes", "application-only",
               "--launch-timeout", "0",
               *(("--destroy-on-device-error", "kernel") if self.tool == "memcheck" else ()),
               sys.executable, "-m", "kda_fuzz.workers.sanitize", "serve", address,
               self.device, *self.targets]
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1",
               ENV_KEY: key.hex()}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH"))
                                            if p)
        self._t0 = time.monotonic()
        self._p = _Process(cmd, env, listener, folder)
        self.starts += 1
        self._recent.clear()

    def kill(self) -> None:
        """Kill the sanitized process, if one runs."""
        if self._p is not None:
            self._p.kill()
            self._p = None

    def stop(self) -> None:
        """End the sanitized process (asked first, killed after a second)."""
        p = self._p
        if p is not None and p.conn is not None and not p.gone():
            try:
                send(p.conn, Quit())
                p.popen.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def wait_ready(self, timeout: float, abort: Callable[[], bool] | None = None) -> bool:
        """Wait until the process is ready (started if none runs); False when ``timeout``
        passed or ``abort()`` held first. Raises :class:`StartFailed` when it ended first."""
        if self._p is None:
            self.start()
        p = self._p
        assert p is not None
        end = time.monotonic() + timeout
        while not p.ready:
            with p.cond:
                if p.inbox and isinstance(p.inbox[0], Ready):
                    p.ready = True
                    self.startup = time.monotonic() - self._t0
                    p.inbox.popleft()
                    break
                if not p.gone() and time.monotonic() < end and not (abort and abort()):
                    p.cond.wait(0.1)
                    continue
            if p.gone():
                p.wait_lines(lambda: False, 2.0)
                code = p.popen.poll()
                tail = _tail("\n".join(p.lines))
                self.kill()
                raise StartFailed(f"the sanitized process ended ({_how(code)}) before it was "
                                  f"ready: {tail}")
            return False
        return True

    def take_late(self) -> list[tuple[int, SanitizerError]]:
        """Errors the tool printed after their case had ended: (case id, error)."""
        late, self._late = self._late, []
        return late

    def run(self, target: str, case: Case | bytes, timeout: float = 600.0,
            abort: Callable[[], bool] | None = None) -> SanitizerReport | None:
        """Run ``case`` on ``target`` under the tool; its report, or None when ``abort()``
        held first (the process is killed). Raises :class:`StartFailed` when the process
        could not start. A process that dies before the case began in it (after the end
        of the case before, as the tool ends it) is the case before's: the case runs again
        in a fresh one."""
        if self._p is not None and self._p.ready and self._p.gone():
            self.kill()  # it died between cases: a fresh one
        report, began = self._run(target, case, timeout, abort)
        if began or report is None or report.status != "failed" or report.errors:
            return report
        self.kill()
        return self._run(target, case, timeout, abort)[0]

    def _run(self, target: str, case: Case | bytes, timeout: float,
             abort: Callable[[], bool] | None) -> tuple[SanitizerReport | None, bool]:
        """:meth:`run` once: the report, and whether the case began in the process (its
        ``Started`` came)."""
        if not self.wait_ready(START_TIMEOUT, abort):
            if abort is not None and abort():
                self.kill()
                return None, False
            self.kill()
            raise StartFailed(f"the sanitized process was not ready within {START_TIMEOUT:g} s")
        p = self._p
        assert p is not None and p.conn is not None
        blob = case if isinstance(case, bytes) else pickle.dumps(case.on("cpu"))
        cid = self.last_id = self._next
        self._next += 1
        with p.cond:
            cursor = len(p.lines)
        t0 = time.monotonic()
        started: Started | None = None
        done: CaseDone | None = None
        try:
            send(p.conn, RunCase(cid, target, blob))
        except OSError:
            pass
        while done is None:
            with p.cond:
                while p.inbox:
                    msg = p.inbox.popleft()
                    if isinstance(msg, Started) and msg.id == cid:
                        started = msg
                    elif isinstance(msg, CaseDone) and msg.id == cid:
                        done = msg
                if done is not None:
                    break
                if not p.gone() and time.monotonic() - t0 < timeout and not (abort and abort()):
                    p.cond.wait(0.05)
                    continue
            if abort is not None and abort():
                self.kill()
                return None, started is not None
            if p.gone():
                break
            self.kill()
            return SanitizerReport(self.tool, "failed", seconds=timeout,
                                   note=f"the case did not end within {timeout:g} s under the "
                                   "tool (the sanitized process was killed)"), True
        seconds = time.monotonic() - t0
        end = f"{MARK} END {cid}"
        if done is not None:
            p.wait_lines(lambda: end in p.lines[cursor:], 2.0)
            time.sleep(SETTLE)
        else:
            p.wait_lines(lambda: False, 2.0)  # the rest of what the tool said
            try:
                p.popen.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
        with p.cond:
            window = list(p.lines[cursor:])
        own = started.tensors if started is not None else {}
        allocations = {f"{i}/{name}": v for i, tensors in [*self._recent, (cid, own)]
                       for name, v in tensors.items()}
        mine: list[SanitizerError] = []
        for e in parse_report("\n".join(window), allocations):
            owner, _, name = (e.tensor or "").partition("/")
            if e.tensor is None or int(owner) == cid:
                mine.append(replace(e, tensor=name or None))
            else:
                self._late.append((int(owner), replace(e, tensor=name)))
        code = p.popen.poll() if done is None else None
        if not mine and code == ERROR_EXIT:  # errors in words we do not know
            mine = [SanitizerError(_first_error_line("\n".join(window)),
                                   text=_tool_lines("\n".join(window))[:2000])]
        if started is not None:
            self._recent.append((cid, own))
        raised = done.raised if done is not None else ""
        died = "" if done is not None else (
            f"the sanitized process died ({_how(code)}) while running the case: "
            f"{_tail(chr(10).join(w for w in window if not w.startswith(MARK)))}")
        text = _tool_lines("\n".join(window))
        if mine:
            report = SanitizerReport(self.tool, "errors", mine, seconds,
                                     "; ".join(n for n in (raised, died) if n), text)
        elif died:
            report = SanitizerReport(self.tool, "failed", [], seconds, died, text)
        else:
            report = SanitizerReport(self.tool, "clean", [], seconds, raised)
        if done is not None:
            self.ran += 1
        if died or (done is not None and done.lost) or (mine and self.device != "cpu"):
            self.kill()  # a fresh process (and device context) for the next case
        return report, started is not None


def _how(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def sanitize(tool: str, target: str, cases: Sequence[Case], *, device: str = "cuda",
             timeout: float = 600.0) -> list[SanitizerReport]:
    """Run each case on ``target`` (``MODULE:CALLABLE``) under ``tool``; one report per case,
    in order. Raises :class:`SanitizerMissing` when the tool is not installed."""
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r} (one of {', '.join(TOOLS)})")
    return run(find_sanitizer(), tool, target, cases, device=device, timeout=timeout)


def run(exe: str, tool: str, target: str, cases: Sequence[Case], *, device: str = "cuda",
        timeout: float = 600.0) -> list[SanitizerReport]:
    """:func:`sanitize` with the tool's path given (:func:`find_sanitizer`): the cases in
    one sanitized process (another after one that dies or reports errors)."""
    reports: list[SanitizerReport] = []
    index: dict[int, int] = {}
    cannot = ""
    with SanitizedWorker(exe, tool, device, [target]) as worker:
        for case in cases:
            report: SanitizerReport | None = None
            if not cannot:
                try:
                    report = worker.run(target, case, timeout)
                    index[worker.last_id] = len(reports)
                except StartFailed as e:
                    cannot = str(e)
            reports.append(report or SanitizerReport(tool, "failed", note=cannot))
            for cid, err in worker.take_late():
                i = index.get(cid)
                if i is not None:
                    reports[i] = replace(reports[i], status="errors",
                                         errors=[*reports[i].errors, err])
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


# ------------------------------------------------------------------ the dispatcher

IDLE_SECONDS = 5.0  # a dispatcher with no job connected and nothing to run this long ends


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PASSED_OVER = 3  # samples of compiled signatures run, at most, before the oldest waiting


class _Dispatcher:
    """Serves one :class:`SanitizedWorker` to the jobs that connect (see :func:`dispatch`)."""

    def __init__(self, address: str, exe: str, tool: str, device: str,
                 targets: Sequence[str], deadline: float | None, anchor: int) -> None:
        self.address, self.deadline, self.anchor = address, deadline, anchor
        self.tool = tool
        self.worker = SanitizedWorker(exe, tool, device, targets)
        self.lock = threading.Condition()
        self.queue: collections.deque[tuple[str, Any, str, bytes, str]] = collections.deque()
        self.compiled: set[tuple[str, str]] = set()  # (target, signature) run already
        self.passed_over = 0  # picks since the oldest sample was last taken
        self.clients: dict[str, Connection] = {}
        self.pending: dict[str, list[Any]] = {}
        self.keys: dict[tuple[str, Any], Result | None] = {}  # None: queued
        self.ids: dict[int, tuple[str, Any]] = {}  # worker case id -> (client, key)
        self.unavailable: Unavailable | None = None
        self.quiet_since = time.monotonic()
        self.listener = Listener(address, family="AF_UNIX",
                                 authkey=bytes.fromhex(os.environ.pop(ENV_KEY)))

    def over(self) -> bool:
        """Whether to end: past the deadline, the campaign gone, or idle."""
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline:
            return True
        if not _alive(self.anchor):
            return True
        with self.lock:
            idle = not self.clients and not self.queue
        return idle and now - self.quiet_since > IDLE_SECONDS

    def serve(self) -> None:
        threading.Thread(target=self._accept, name="kda-fuzz-dispatch-accept",
                         daemon=True).start()
        self.worker.start()  # its start-up overlaps the campaign's first examples
        failures = 0
        try:
            while not self.over():
                with self.lock:
                    if not self.queue:
                        self.lock.wait(0.1)
                    item = self._next()
                try:
                    if item is None:
                        if self.unavailable is None:
                            self.worker.wait_ready(0.0)  # a process that died: told now
                        continue
                    if self.unavailable is not None:
                        self._deliver(item[0], Result(item[1], SanitizerReport(
                            self.tool, "failed", note=self.unavailable.detail)))
                        continue
                    report = self.worker.run(item[2], item[3], self._timeout(), self.over)
                except StartFailed as e:
                    failures += 1
                    if item is not None:
                        with self.lock:
                            self.queue.appendleft(item)
                    if failures >= 2:  # twice in a row: the sanitizer cannot run here
                        self._unavailable(str(e))
                    else:
                        self.worker.start()
                    continue
                if report is None:
                    break  # past the deadline: the rest is not run
                failures = 0
                self.compiled.add((item[2], item[4]))
                self.ids[self.worker.last_id] = (item[0], item[1])
                self._deliver(item[0], Result(item[1], report))
                for cid, err in self.worker.take_late():
                    owner = self.ids.get(cid)
                    if owner is not None:
                        self._deliver(owner[0], Result(owner[1], SanitizerReport(
                            self.tool, "errors", [err],
                            note="the tool reported it after the case had ended")))
                if self.worker._p is None:
                    self.worker.start()  # ready by the next sample, if it can
        finally:
            self.worker.kill()
            self.listener.close()

    def _next(self) -> tuple[str, Any, str, bytes, str] | None:
        """The next sample to run (under the lock): the oldest of a signature the worker
        has run already (nothing to compile under the tool, which makes a compile many
        times slower), else the oldest; the oldest at the latest once it has been passed
        over ``PASSED_OVER`` times (a new signature is not starved)."""
        if not self.queue:
            return None
        if self.passed_over < PASSED_OVER:
            for i, item in enumerate(self.queue):
                if item[4] and (item[2], item[4]) in self.compiled:
                    del self.queue[i]
                    self.passed_over = self.passed_over + 1 if i else 0
                    return item
        self.passed_over = 0
        return self.queue.popleft()

    def _timeout(self) -> float:
        if self.deadline is None:
            return 600.0
        return max(0.1, min(600.0, self.deadline - time.monotonic()))

    def _unavailable(self, detail: str) -> None:
        msg = Unavailable(f"the sanitizer cannot start: {detail}", self.worker.ran > 0)
        with self.lock:
            self.unavailable = msg
            for name, conn in list(self.clients.items()):
                self._send(name, conn, msg)

    def _send(self, name: str, conn: Connection, msg: Any) -> None:
        try:
            send(conn, msg)
        except OSError:
            self.pending.setdefault(name, []).append(msg)

    def _deliver(self, name: str, result: Result) -> None:
        with self.lock:
            self.keys[(name, result.key)] = result
            conn = self.clients.get(name)
            if conn is None:
                self.pending.setdefault(name, []).append(result)
            else:
                self._send(name, conn, result)

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except (OSError, EOFError):
                if self.listener._listener is None:  # closed  # type: ignore[attr-defined]
                    return
                continue
            except Exception:  # a client that failed its handshake
                continue
            threading.Thread(target=self._client, args=(conn,), name="kda-fuzz-dispatch",
                             daemon=True).start()

    def _client(self, conn: Connection) -> None:
        name = ""
        try:
            while True:
                msg = recv(conn)
                if isinstance(msg, Hello):
                    with self.lock:
                        name = msg.client
                        self.clients[name] = conn
                        for m in self.pending.pop(name, []):
                            self._send(name, conn, m)
                        if self.unavailable is not None:
                            self._send(name, conn, self.unavailable)
                elif isinstance(msg, Submit):
                    with self.lock:
                        k = (name, msg.key)
                        if k not in self.keys:
                            self.keys[k] = None
                            self.queue.append((name, msg.key, msg.target, msg.case,
                                               msg.signature))
                            self.lock.notify_all()
                        elif self.keys[k] is not None:
                            self._send(name, conn, self.keys[k])
                elif isinstance(msg, Bye):
                    break
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        finally:
            with self.lock:
                if self.clients.get(name) is conn:
                    del self.clients[name]
                self.quiet_since = time.monotonic()
            conn.close()


@dataclass(frozen=True)
class DispatchSpec:
    """What a dispatcher process serves, given on its command line as JSON (``to_json``,
    ``from_json``): where jobs connect, the sanitizer and its tool, the device, the
    targets, until when (``deadline``, ``time.monotonic()``), the process it outlives
    none of (``anchor``) and its lock file."""

    address: str
    exe: str
    tool: str
    device: str
    targets: tuple[str, ...]
    deadline: float | None
    anchor: int
    lock: str = ""

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "targets": list(self.targets)})

    @classmethod
    def from_json(cls, text: str) -> DispatchSpec:
        raw = json.loads(text)
        return cls(**{**raw, "targets": tuple(raw["targets"])})


def dispatch(address: str, exe: str, tool: str, device: str, targets: Sequence[str], *,
             deadline: float | None, anchor: int, lock: str = "") -> int:
    """Serve a sanitized worker to the campaign jobs that connect to ``address`` (the
    messages above; the authkey in ``$KDA_FUZZ_SANITIZE_KEY``) until ``deadline``
    (``time.monotonic()``), until process ``anchor`` is gone, or until no job has been
    connected for ``IDLE_SECONDS``; removes ``address`` and ``lock`` when it ends."""
    d = _Dispatcher(address, exe, tool, device, targets, deadline, anchor)
    try:
        d.serve()
    finally:
        for path in (address, lock):
            try:
                if path and (path == address or Path(path).read_text().strip()
                             == str(os.getpid())):
                    os.unlink(path)
            except OSError:
                pass
        log = Path(lock).with_suffix(".log") if lock else None
        try:
            if log is not None and log.stat().st_size == 0:  # nothing said: not kept
                log.unlink()
        except OSError:
            pass
    return 0


# ------------------------------------------------------------------ the worker


def _serve(address: str, device: str, targets: Sequence[str]) -> int:
    """The sanitized process: run the cases it is sent (see the module's docstring)."""
    t0 = time.monotonic()
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(ENV_KEY)))
    from kda_fuzz.engine.oracle import call_args, device_error
    from kda_fuzz.engine.targets import load_target
    from kda_fuzz.families import get_contract

    fns = {t: load_target(t).fn for t in targets}
    if device.startswith("cuda"):  # the context is made under the tool: part of start-up
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    send(conn, Ready(os.getpid(), time.monotonic() - t0))
    alive: collections.deque[dict[str, TensorArg]] = collections.deque(maxlen=KEEP)
    while True:
        try:
            msg = recv(conn)
        except (EOFError, OSError):
            return 0
        if not isinstance(msg, RunCase):
            return 0
        case: Case = pickle.loads(msg.case)
        tensors = {n: tight(t).on(device) for n, t in case.tensors.items()}
        kwargs: dict[str, Any] = {n: t.view() for n, t in tensors.items()}
        kwargs.update(case.scalars)
        send(conn, Started(msg.id, {n: (t.base.data_ptr(),
                                        t.base.numel() * t.base.element_size())
                                    for n, t in tensors.items()}))
        print(f"{MARK} BEGIN {msg.id}", flush=True)
        t = time.monotonic()
        raised = lost = ""
        try:
            fn = fns.get(msg.target) or fns.setdefault(msg.target, load_target(msg.target).fn)
            fn(*call_args(get_contract(case.contract), kwargs))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as e:  # the outcome was judged by the campaign: only noted here
            raised = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if device_error(e):
                lost = raised
        print(f"{MARK} END {msg.id}", flush=True)
        alive.append(tensors)  # kept allocated: the addresses of recent cases stay distinct
        send(conn, CaseDone(msg.id, time.monotonic() - t, raised, lost))
        if lost:
            return 0


def _main(argv: list[str]) -> int:
    if argv[0] == "serve":
        return _serve(argv[1], argv[2], argv[3:])
    if argv[0] == "dispatch":
        spec = DispatchSpec.from_json(argv[1])
        return dispatch(spec.address, spec.exe, spec.tool, spec.device, spec.targets,
                        deadline=spec.deadline, anchor=spec.anchor, lock=spec.lock)
    raise SystemExit(f"usage: python -m kda_fuzz.workers.sanitize serve|dispatch ...: {argv}")


if __name__ == "__main__":
    # through the module's own name: the messages must unpickle as its classes
    from kda_fuzz.workers import sanitize as _module

    sys.exit(_module._main(sys.argv[1:]))


__all__ = ["KEEP", "MAX_CASE_BYTES", "TOOLS", "Bye", "CaseDone", "DispatchSpec", "Hello",
           "Quit", "Ready", "Result", "RunCase", "SanitizedWorker", "SanitizerError",
           "SanitizerMissing",
           "SanitizerReport", "StartFailed", "Started", "Submit", "Unavailable", "dispatch",
           "find_sanitizer", "kill_all", "parse_report", "recv", "run", "sanitize", "send",
           "tight"]
