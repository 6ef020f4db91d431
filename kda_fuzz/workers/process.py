"""Small helpers for the worker processes kda-fuzz starts (campaign jobs, isolated targets)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

# What the fork server imports before it forks any worker: torch, Hypothesis and the
# engine (seconds of imports per worker otherwise). It runs nothing: no torch thread pool,
# no CUDA context, so its forks are as clean as spawned processes.
PRELOAD = ["kda_fuzz.workers.preloading", "kda_fuzz.campaign.supervisor"]  # (see LAST_PRELOAD)
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # torch's fork-safe CUDA check (see below)
_also: list[str] = []  # more modules the fork server imports (start_fork_server's ``also``)
# (turns the collector, off for the imports, back on; freezes the heap its forks start from)
LAST_PRELOAD = "kda_fuzz.workers.preloaded"
# A fork server started before its kernel libraries are known (``start_fork_server_early``)
# reads them from the file this variable names, once the command has written it
LATER_PRELOAD = "KDA_FUZZ_LATER_PRELOAD"
_later: list[str] = []  # that file's path while it is still to be written


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The garbage collector off for a block of imports (torch, the engine, kernel
    libraries: objects that live as long as the process, see
    :mod:`kda_fuzz.workers.preloading`), then back as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def worker_context() -> BaseContext:
    """How kda-fuzz starts its workers (campaign jobs, isolated targets): on Linux, forks
    of a fork server that has only imported ``PRELOAD`` (never of a process whose thread
    pool or CUDA context runs); spawned elsewhere (a fork without exec is not safe on
    macOS once system frameworks are loaded)."""
    ctx = _fork_server_context()
    if ctx is None:
        return mp.get_context("spawn")
    _ensure_fork_server()
    return ctx


def _fork_server_context() -> BaseContext | None:
    """The forkserver context with this process's preload list (``None`` where it is not
    used: other systems than Linux)."""
    if not sys.platform.startswith("linux") or "forkserver" not in mp.get_all_start_methods():
        return None
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *_also, LAST_PRELOAD])
    return ctx


def _ensure_fork_server(env: dict[str, str] | None = None) -> bool:
    """Start the fork server (once) with SIGTERM ignored, as it stays (an ignored signal
    stays ignored across ``exec``). A SIGTERM to the whole process group (``timeout``,
    ``docker stop``, a CI runner) would otherwise end the server, and multiprocessing then
    takes every worker it forked for dead (exit code 255) while the supervisor is still
    stopping them in order. SIGINT the server ignores itself. Only the main thread of
    the main process does it (only it may change a handler); elsewhere the server starts
    as multiprocessing starts it (False: not done here)."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread() \
            or mp.parent_process() is not None:  # a worker's own workers: as multiprocessing does
        return False
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # the server's imports ask torch whether CUDA is there through NVML, which leaves
    # CUDA uninitialised (its forks could not use it otherwise); a user's setting holds
    added = {**({NVML_CHECK: "1"} if NVML_CHECK not in os.environ else {}), **(env or {})}
    os.environ.update(added)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, old)
        for name in added:
            del os.environ[name]
    return True


def start_fork_server(also: list[str] | tuple[str, ...] = (),
                      device_free: list[str] | tuple[str, ...] = ()) -> None:
    """Start the fork server now, so that its imports overlap the caller's own; ``also``:
    modules it imports too, once for every worker it forks (the workers would each import
    them otherwise: seconds apiece), dropped where a GPU is visible: importing a kernel
    library there may initialise CUDA (helion's does), and no fork of a process that has
    done so can use CUDA. ``device_free``: modules that touch no device on import
    (``kda_fuzz.execution.device_free_imports``), imported wherever. Only modules that
    start no thread pool on import belong there."""
    wanted = [*device_free] if gpu_visible() else [*also, *device_free]
    _also[:] = [m for m in dict.fromkeys(wanted) if m not in PRELOAD]
    if _later:  # started early: it waits for this list
        _write_later(_also)
    worker_context()


def start_fork_server_early() -> None:
    """Start the fork server before the command knows its targets: it imports torch and the
    engine at once, overlapping the command's own imports, then waits (in ``LAST_PRELOAD``)
    for the modules that ``start_fork_server`` names (none if ``settle_fork_server`` comes
    first) and imports them before its first fork. Does nothing where a fork server runs
    already or none is used (see ``worker_context``)."""
    from multiprocessing import forkserver

    if _later or getattr(forkserver._forkserver, "_forkserver_pid", None) is not None \
            or _fork_server_context() is None:
        return
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"kda-fuzz-preload-{os.getpid()}-{time.time_ns()}")
    _later.append(path)
    # (whose it is: the command's pid)
    if not _ensure_fork_server({LATER_PRELOAD: f"{os.getpid()}:{path}"}):
        _later.clear()  # (not started here: multiprocessing starts it, with no such wait)


def settle_fork_server() -> None:
    """An early fork server that still waits for its modules is told there are none (the
    command ended before it chose them), so that it serves forks."""
    if _later:
        _write_later([])


def _write_later(modules: list[str]) -> None:
    path = _later.pop()
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(modules))
    os.replace(tmp, path)  # (whole, or not there: the server reads it once it exists)


def import_later_preloads(timeout: float = 600.0) -> None:
    """In the fork server (``LAST_PRELOAD``): import the modules the command names in the
    file ``LATER_PRELOAD`` points to, waiting for it; gives up when the command is gone or
    after ``timeout`` seconds. Modules that fail to import are skipped, as the fork
    server's own preload does."""
    parent, _, path = os.environ.pop(LATER_PRELOAD, "").partition(":")
    if not path:
        return
    until = time.monotonic() + timeout
    while not os.path.exists(path):
        if str(os.getppid()) != parent or time.monotonic() > until:
            return
        time.sleep(0.01)
    try:
        with open(path) as f:
            modules = [m for m in f.read().split() if m]
        os.unlink(path)
    except OSError:
        return
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            pass


def exit_quietly_from_the_fork_server() -> None:
    """In the fork server (``LAST_PRELOAD``): when the last client is gone, the server
    leaves without the interpreter's teardown (``os._exit``), as the command does. It
    outlives the command by a moment, and a kernel library's teardown written to the
    terminal then (triton 3.9's nanobind: some fifty lines of leaked types) would come
    after the command's last line, or inside the next command's. Does nothing in any
    other process (a process that imports the module without being the server)."""
    from multiprocessing import forkserver

    frame = sys._getframe()
    while frame is not None and frame.f_code is not forkserver.main.__code__:
        frame = frame.f_back
    if frame is None:
        return
    server = os.getpid()

    def leave() -> None:
        if os.getpid() == server:  # (a fork ends by os._exit: never here, but be sure)
            _flush()
            os._exit(0)

    atexit.register(leave)


PIPE_BYTES = 1 << 20  # a job's messages buffered unread: about a minute of its progress


def message_pipe(ctx: BaseContext) -> tuple[Any, Any]:
    """``ctx.Pipe(duplex=False)`` (reader, writer) whose buffer holds ``PIPE_BYTES`` where
    the system allows (Linux; up to ``/proc/sys/fs/pipe-max-size``): a job writes its
    progress several times a second (kilobytes each), and a default 64 KiB pipe that its
    reader leaves unread for some seconds (the command still importing the targets as the
    jobs start) would stop the job in ``send``."""
    reader, writer = ctx.Pipe(duplex=False)
    try:
        import fcntl

        fcntl.fcntl(writer.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # (elsewhere, or over the limit: the default buffer)
    return reader, writer


def gpu_visible() -> bool:
    """Whether this machine shows a GPU driver's device files (NVIDIA's or AMD's); cheap:
    nothing is imported."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def worker_process(ctx: BaseContext, fn: Callable[..., Any], args: tuple[Any, ...], *,
                   daemon: bool = False) -> BaseProcess:
    """A process of ``ctx`` (see ``worker_context``) that runs ``fn(*args)`` in the
    caller's environment as it is now (a fork server's children would otherwise inherit
    the server's, from when it started)."""
    return ctx.Process(target=_in_environment, args=(dict(os.environ), fn, args),
                       daemon=daemon)


def _in_environment(env: dict[str, str], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if env != dict(os.environ):
        os.environ.clear()
        os.environ.update(env)
    fn(*args)


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux ``/proc``; none elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: BaseProcess) -> None:
    """Kill a worker and what it started (a compiler it waits for, ``ptxas``, would
    outlive it by seconds, and the command with it)."""
    if proc.pid is None or not proc.is_alive():
        return
    below = descendants(proc.pid)
    proc.kill()
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass


def forget(proc: BaseProcess) -> None:
    """Leave a killed worker that has not ended yet to end on its own: multiprocessing's
    exit handler would otherwise wait for it (a GPU process's teardown takes seconds)."""
    children = getattr(mp.process, "_children", None)  # (its set of children to join)
    if isinstance(children, set):
        children.discard(proc)


def exit_with_parent() -> None:
    """End this process soon after the process that started it is gone (killed, crashed)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="kda-fuzz-orphan-watch", daemon=True).start()


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` once its exit handlers (``atexit``: multiprocessing's
    clean-up of its children among them) have run, skipping the interpreter's teardown.

    There, before Python 3.14, a daemon thread that is inside a torch op (the GIL released)
    when the interpreter goes aborts the whole process ("terminate called without an active
    exception", pytorch issue 38228): a campaign's verdict would end as SIGABRT, a failure
    of the environment. Where a non-daemon thread still runs, the interpreter's own exit is
    kept (it waits for the thread)."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.current_thread()):
        sys.exit(code)
    _flush()
    atexit._run_exitfuncs()
    _flush()
    os._exit(code)


def exit_from_thread(code: int) -> NoReturn:
    """End the whole process with ``code`` from a thread other than the main one (which
    may be stuck in a call that cannot be stopped): the exit handlers run (multiprocessing's
    clean-up of its children among them), the interpreter's teardown is skipped."""
    _flush()
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to write
            pass


def how_it_ended(code: int | None) -> str:
    """A process exit code in words: ``signal SIGABRT`` or ``exit code 70``."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
