"""A stand-in for compute-sanitizer on machines without a GPU (the sanitizer tests): runs
the command after its options, passing its output through line by line, and turns each
``FAKE-SANITIZER ADDRESS BYTES`` line the target prints into a memcheck report of a 4-byte
read just past that allocation (without naming the allocation when
``FAKE_SANITIZER_LOOSE`` is set).

It emulates, by environment variable:

* ``FAKE_SANITIZER_STARTUP=SECONDS``: a slow start-up (it sleeps before starting the
  command);
* ``FAKE_SANITIZER_REPORT=N``: a report (naming no allocation) during the N-th case the
  sanitized process runs (counted by the worker's ``BEGIN`` markers, from 1);
* ``FAKE_SANITIZER_CRASH=N``: the sanitized process killed (SIGKILL) when its N-th case
  begins, after a report when ``FAKE_SANITIZER_CRASH_REPORT`` is set; with
  ``FAKE_SANITIZER_ONCE=PATH`` only the first process to get there crashes (it creates
  PATH);
* ``FAKE_SANITIZER_DIE_AFTER=N``: the tool ends the sanitized process (SIGKILL) right
  after its N-th case has ended, between cases (once, with ``FAKE_SANITIZER_ONCE``);
* ``FAKE_SANITIZER_NO_START=1``: a tool that cannot start (an error, exit status 1);
* ``FAKE_SANITIZER_STARTS=PATH``: one line appended to PATH per start (the tests count
  the sanitized processes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

VALUED = {"--tool", "--error-exitcode", "--print-limit", "--target-processes",
          "--launch-timeout", "--destroy-on-device-error"}
BEGIN = "kda-fuzz-sanitize BEGIN "
END = "kda-fuzz-sanitize END "


def report(address: int | None = None, size: int = 0, loose: bool = False) -> str:
    """A memcheck report of a 4-byte read past ``address`` (an allocation of ``size``)."""
    end = (address or 0x7F00DEAD0000) + size
    near = ("" if loose or address is None else
            f"=========     and is 4 bytes after the nearest allocation at {address:#x} of "
            f"size {size} bytes\n")
    return ("========= Invalid __global__ read of size 4 bytes\n"
            "=========     at fake_decode_kernel+0x1a0\n"
            "=========     by thread (3,0,0) in block (0,1,0)\n"
            f"=========     Address {end + 4:#x} is out of bounds\n" + near +
            "=========     Saved host backtrace up to driver entry point at kernel launch "
            "time\n"
            "=========         Host Frame: [0x2f3a1] in libcuda.so.1")


def _crashes_here() -> bool:
    once = os.environ.get("FAKE_SANITIZER_ONCE")
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main(argv: list[str]) -> int:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        opts[argv[i]] = argv[i + 1] if argv[i] in VALUED else ""
        i += 2 if argv[i] in VALUED else 1
    env = os.environ
    if env.get("FAKE_SANITIZER_STARTS"):
        with open(env["FAKE_SANITIZER_STARTS"], "a") as f:
            f.write(f"{os.getpid()}\n")
    print(f"========= COMPUTE-SANITIZER (fake, {opts.get('--tool', 'memcheck')})", flush=True)
    if env.get("FAKE_SANITIZER_NO_START"):
        print("========= Error: fake: the tool could not start (no device)", flush=True)
        return 1
    time.sleep(float(env.get("FAKE_SANITIZER_STARTUP", "0")))
    plant = int(env.get("FAKE_SANITIZER_REPORT", "0"))
    crash = int(env.get("FAKE_SANITIZER_CRASH", "0"))
    loose = bool(env.get("FAKE_SANITIZER_LOOSE"))
    die_after = int(env.get("FAKE_SANITIZER_DIE_AFTER", "0"))
    proc = subprocess.Popen(argv[i:], stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    errors = cases = 0
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith("FAKE-SANITIZER "):
            _, address, size = line.split()
            errors += 1
            print(report(int(address, 16), int(size), loose), flush=True)
            continue
        print(line, flush=True)
        if line.startswith(END) and cases == die_after and _crashes_here():
            time.sleep(0.5)  # the case's end has reached the worker
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            print(f"========= ERROR SUMMARY: {errors} error(s)", flush=True)
            return 137
        if not line.startswith(BEGIN):
            continue
        cases += 1
        if cases == plant:
            errors += 1
            print(report(loose=True), flush=True)
        if cases == crash and _crashes_here():
            if env.get("FAKE_SANITIZER_CRASH_REPORT"):
                errors += 1
                print(report(loose=True), flush=True)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            print("========= Error: process didn't terminate successfully", flush=True)
            print(f"========= ERROR SUMMARY: {errors} error(s)", flush=True)
            return 137
    proc.wait()
    print(f"========= ERROR SUMMARY: {errors} error{'s' if errors != 1 else ''}", flush=True)
    if errors:
        return int(opts.get("--error-exitcode", "0"))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
