"""Killing a campaign's workers: what they started dies with them, and a killed worker that
is slow to end holds up neither the supervisor past its instant nor the process's exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kda_fuzz.campaign import supervisor
from kda_fuzz.workers.process import descendants, kill_tree, worker_context, worker_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def _starts_a_compiler(pid_file: str) -> None:
    """A worker waiting on a long child process, as a job waits on ptxas."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(pid_file).write_text(str(child.pid))
    child.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(path: Path, seconds: float = 30.0) -> int:
    end = time.monotonic() + seconds
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < end, "the worker did not start its child"
        time.sleep(0.05)
    return int(path.read_text())


def test_kill_tree_ends_what_the_worker_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child"
    proc = worker_process(worker_context(), _starts_a_compiler, (str(pid_file),))
    proc.start()
    child = _wait_for(pid_file)
    assert child in descendants(proc.pid)
    kill_tree(proc)
    proc.join(timeout=10)
    end = time.monotonic() + 10
    while _alive(child) and time.monotonic() < end:
        time.sleep(0.05)
    assert not proc.is_alive() and not _alive(child)


def test_a_plain_kill_would_leave_the_child(tmp_path: Path) -> None:
    """(What kill_tree is for: the child outlives a worker killed alone.)"""
    pid_file = tmp_path / "child"
    proc = worker_process(worker_context(), _starts_a_compiler, (str(pid_file),))
    proc.start()
    child = _wait_for(pid_file)
    proc.kill()
    proc.join(timeout=10)
    time.sleep(0.3)
    try:
        assert _alive(child)
    finally:
        os.kill(child, 9)


class _SlowToDie:
    """A process handle whose process takes a while to end once killed (a GPU job giving
    its memory back)."""

    pid = None

    def __init__(self, seconds: float) -> None:
        self.killed_at: float | None = None
        self.seconds = seconds
        self.joined = 0.0

    def is_alive(self) -> bool:
        return self.killed_at is None or time.monotonic() < self.killed_at + self.seconds

    def kill(self) -> None:
        self.killed_at = time.monotonic()

    def join(self, timeout: float | None = None) -> None:
        t = time.monotonic()
        time.sleep(min(timeout or 0.0, max(0.0, self.killed_at + self.seconds - t)))
        self.joined += time.monotonic() - t


def test_the_supervisor_waits_for_killed_jobs_only_until_its_instant(monkeypatch) -> None:
    forgotten = []
    monkeypatch.setattr(supervisor, "kill_tree", lambda p: p.kill())
    monkeypatch.setattr(supervisor, "forget", forgotten.append)
    procs = [_SlowToDie(30.0) for _ in range(3)]
    t0 = time.monotonic()
    supervisor._kill_all(procs, by=t0 + 1.5)  # (its wrap-up's half second before that)
    took = time.monotonic() - t0
    assert 0.9 <= took < 1.5, took
    assert all(p.killed_at is not None for p in procs)
    assert forgotten == procs  # not joined again at exit
    # without an instant, 5 s in all for every process together
    quick = [_SlowToDie(0.2) for _ in range(3)]
    forgotten.clear()
    supervisor._kill_all(quick)
    assert forgotten == [] and all(not p.is_alive() for p in quick)


def _sleeps() -> None:
    time.sleep(60)


def test_a_forgotten_worker_is_not_joined_at_exit() -> None:
    import multiprocessing as mp

    from kda_fuzz.workers.process import forget

    proc = worker_process(worker_context(), _sleeps, ())
    proc.start()
    try:
        assert proc in mp.active_children()
        forget(proc)
        assert proc not in mp.active_children()  # the exit handler joins these only
    finally:
        proc.kill()
        proc.join(timeout=10)


def test_the_fork_server_leaves_dynamo_inductor_and_sklearn_to_the_jobs() -> None:
    """Where a GPU is visible the fork server imports only what starts nothing a fork
    breaks: TorchDynamo, Inductor and scikit-learn are not named (helion, which imports
    them, is preloaded under torch's NVML-based CUDA check: see the next test) (see
    DEVICE_FREE_IMPORTS)."""
    from kda_fuzz.execution import DEVICE_FREE_IMPORTS

    preloaded = {m for mods in DEVICE_FREE_IMPORTS.values() for m in mods}
    assert preloaded and not {m for m in preloaded
                              if m.startswith(("torch._dynamo", "torch._inductor", "sklearn"))}


@pytest.mark.parametrize("autotune", [None, "1"])
def test_the_fork_servers_helion_import_skips_what_only_its_autotuners_use(
        autotune: str | None) -> None:
    """The fork server's helion (``DEVICE_FREE_IMPORTS``) comes without scikit-learn, which
    helion imports for its autotuners' surrogate models alone, unless autotuning is asked
    for; afterwards scikit-learn imports as usual."""
    pytest.importorskip("helion")
    pytest.importorskip("sklearn")
    from kda_fuzz.execution import DEVICE_FREE_IMPORTS

    code = ("import sys, importlib\n"
            "for m in sys.argv[1:]: importlib.import_module(m)\n"
            "print('helion' in sys.modules, 'sklearn' in sys.modules)\n"
            "import sklearn.ensemble\n"
            "print('later', 'sklearn' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("KDA_FUZZ_HELION_AUTOTUNE", "HELION_FORCE_AUTOTUNE",
                        "HELION_AUTOTUNE_EFFORT", "HELION_USE_DEFAULT_CONFIG")}
    if autotune:
        env["KDA_FUZZ_HELION_AUTOTUNE"] = autotune
    r = subprocess.run([sys.executable, "-c", code, *DEVICE_FREE_IMPORTS["helion"]], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", str(bool(autotune)), "later", "True"], r.stdout


def test_a_compile_leaves_what_it_kept_out_of_the_collectors_walks() -> None:
    """What a process holds when a kernel compile ends is frozen (``gc.freeze``: no full
    collection walks it again), and the garbage of that moment is collected first, never
    frozen (it would be kept forever)."""
    import gc
    import weakref

    from kda_fuzz.execution import compiles

    class Node:
        pass

    gc.unfreeze()
    try:
        with compiles.compiling():
            kept = [{"i": i} for i in range(5000)]  # what a compile leaves behind
            cycle = Node()
            cycle.self = cycle  # garbage only a collection finds
            gone = weakref.ref(cycle)
            del cycle
        assert gc.get_freeze_count() >= len(kept)
        assert gone() is None
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(d) in tracked for d in kept[:100])  # out of every generation
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("users", [None, "0"])
def test_the_fork_server_asks_torch_about_cuda_through_nvml(users: str | None) -> None:
    """The fork server starts with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (its imports, helion's
    among them, then leave CUDA uninitialised, so that its forks can use it), unless the
    user set it; the caller's own environment is left as it was."""
    code = (
        "import os\n"
        "from multiprocessing import forkserver\n"
        "from kda_fuzz.workers.process import NVML_CHECK, worker_context\n"
        "before = os.environ.get(NVML_CHECK)\n"
        "worker_context()\n"
        "import time\n"
        "pid = forkserver._forkserver._forkserver_pid\n"
        "t0 = time.monotonic()\n"  # (until it has exec'd: its environment is then its own)
        "while b'forkserver' not in open(f'/proc/{pid}/cmdline', 'rb').read() \\\n"
        "        and time.monotonic() - t0 < 30:\n"
        "    time.sleep(0.05)\n"
        "env = dict(e.split(b'=', 1) for e in open(f'/proc/{pid}/environ', 'rb').read()"
        ".split(b'\\0') if b'=' in e)\n"
        "print(env.get(NVML_CHECK.encode(), b'-').decode(),\n"
        "      os.environ.get(NVML_CHECK) == before)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    if users is not None:
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = users
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [users or "1", "True"]


def _freeze_count(path: str) -> None:
    import gc

    Path(path).write_text(f"{gc.get_freeze_count()} {gc.isenabled()}")


def test_the_fork_servers_forks_start_from_a_frozen_heap(tmp_path: Path) -> None:
    """The fork server freezes its heap once its imports are done (kda_fuzz.workers.
    preloaded, imported last): a worker's collections do not walk torch and the engine.
    The collector, off for the server's imports (kda_fuzz.workers.preloading), is on
    again in every fork."""
    out = tmp_path / "count"
    proc = worker_process(worker_context(), _freeze_count, (str(out),))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    frozen, collecting = out.read_text().split()
    assert int(frozen) > 100_000  # (torch's and the engine's objects)
    assert collecting == "True"


def test_collector_paused_turns_the_collector_off_then_back_as_it_was() -> None:
    import gc

    from kda_fuzz.workers.process import collector_paused

    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
        gc.enable()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("an import failed")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes are Linux's")
def test_message_pipe_buffers_a_jobs_progress_left_unread():
    """A job's progress (kilobytes, several times a second) left unread for a while (the
    command importing targets as the jobs start) does not stop the job in ``send``: 300 kB
    of messages go into the pipe with no one reading (a default pipe holds 64 KiB)."""
    import multiprocessing as mp
    import threading

    from kda_fuzz.workers.process import message_pipe

    reader, writer = message_pipe(mp.get_context("spawn"))
    message = {"examples": 1, "history": ["x" * 4000]}
    sent = threading.Event()

    def send_all() -> None:
        for _ in range(75):
            writer.send(message)
        sent.set()

    threading.Thread(target=send_all, daemon=True).start()
    finished = sent.wait(10.0)
    got = 0
    while reader.poll(0.5 if not sent.is_set() else 0):
        reader.recv()
        got += 1
    assert finished, "the writer was stopped by a full pipe"
    assert got == 75


_EARLY = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from multiprocessing import forkserver\n"
    "from kda_fuzz.workers import process as p\n"
    "p.start_fork_server_early()\n"
    "pid = forkserver._forkserver._forkserver_pid\n"
    "print(pid, flush=True)\n"
    "{then}\n")


def _report_modules(path: str, names: list[str]) -> None:
    import gc

    Path(path).write_text(" ".join([*(str(n in sys.modules) for n in names),
                                    str(gc.get_freeze_count() > 0), str(gc.isenabled())]))


def _early(then: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _EARLY.format(then=then)],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])


def test_a_fork_server_started_early_imports_what_it_is_told_later(tmp_path: Path) -> None:
    """``start_fork_server_early`` (the command, before it knows its targets) starts the
    server at once; the modules ``start_fork_server`` names later are imported there before
    the first fork, the heap is frozen after them, and the collector is on in the fork."""
    out = tmp_path / "modules"
    r = _early(
        "time.sleep(0.5)\n"  # (the command choosing its targets)
        "p.start_fork_server(('xml.dom.minidom',), ('wave',))\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_worker_processes import _report_modules\n"
        f"w = p.worker_process(p.worker_context(), _report_modules, ({str(out)!r}, "
        "['xml.dom.minidom', 'wave', 'kda_fuzz.campaign.supervisor']))\n"
        "w.start(); w.join(120); print(w.exitcode)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "0"
    gpu = Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists()
    # where a GPU is visible, only the device-free modules (the second list) are imported
    assert out.read_text().split() == [str(not gpu), "True", "True", "True", "True"]


def test_an_early_fork_server_told_nothing_still_serves(tmp_path: Path) -> None:
    """A command that ends before naming its modules (a usage error) settles the server
    (``settle_fork_server``): it forks without them rather than wait."""
    out = tmp_path / "modules"
    r = _early(
        "p.settle_fork_server()\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_worker_processes import _report_modules\n"
        f"w = p.worker_process(p.worker_context(), _report_modules, ({str(out)!r}, "
        "['xml.dom.minidom']))\n"
        "t = time.monotonic(); w.start(); w.join(120); print(w.exitcode, time.monotonic() - t)")
    assert r.returncode == 0, r.stderr[-2000:]
    code, seconds = r.stdout.split()[-2:]
    assert code == "0" and float(seconds) < 60
    assert out.read_text().split() == ["False", "True", "True"]


def test_an_early_fork_server_whose_command_died_does_not_stay() -> None:
    """A server still waiting for its modules ends once the command that started it is
    gone (it is never left behind importing or waiting)."""
    r = _early("import os; os._exit(0)")
    pid = int(r.stdout.split()[0])
    end = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _alive(pid)


_SERVE_ONE = (
    "from kda_fuzz.workers import process as p\n"
    "p.start_fork_server((), ('tests.loud_teardown',))\n"
    "w = p.worker_process(p.worker_context(), print, ('worker ran',))\n"
    "w.start(); w.join(120)\n"
    "assert w.exitcode == 0, w.exitcode\n")


def test_the_fork_server_leaves_without_the_interpreters_teardown() -> None:
    """The fork server outlives the command by a moment; what a library it imported writes
    as the interpreter tears it down would come after the command's last line. The server
    leaves by ``os._exit`` once its last client is gone: nothing of that teardown shows,
    while the same module in a process that ends normally writes it."""
    root = Path(__file__).resolve().parents[1]
    plain = subprocess.run([sys.executable, "-c", "import tests.loud_teardown"],
                           capture_output=True, text=True, timeout=60, cwd=root)
    assert "torn down" in plain.stderr  # (the module does write when torn down)
    # (the captured pipes close only when the server, which inherits them, has exited)
    served = subprocess.run([sys.executable, "-c", _SERVE_ONE], capture_output=True,
                            text=True, timeout=180, cwd=root)
    assert served.returncode == 0, served.stderr
    assert "worker ran" in served.stdout
    assert "torn down" not in served.stderr, served.stderr
