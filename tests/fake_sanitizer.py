"""A stand-in for compute-sanitizer on machines without a GPU (the sanitizer tests): runs
the command after its options and turns each ``FAKE-SANITIZER ADDRESS BYTES`` line the
target prints into a memcheck report of a 4-byte read just past that allocation (without
naming the allocation when ``FAKE_SANITIZER_LOOSE`` is set)."""

from __future__ import annotations

import os
import subprocess
import sys

VALUED = {"--tool", "--error-exitcode", "--print-limit", "--target-processes",
          "--launch-timeout", "--destroy-on-device-error"}


def main(argv: list[str]) -> int:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        opts[argv[i]] = argv[i + 1] if argv[i] in VALUED else ""
        i += 2 if argv[i] in VALUED else 1
    print(f"========= COMPUTE-SANITIZER (fake, {opts.get('--tool', 'memcheck')})", flush=True)
    proc = subprocess.run(argv[i:], capture_output=True, text=True)
    errors = 0
    for line in proc.stdout.splitlines():
        if not line.startswith("FAKE-SANITIZER "):
            print(line)
            continue
        _, address, size = line.split()
        errors += 1
        end = int(address, 16) + int(size)
        near = ("" if os.environ.get("FAKE_SANITIZER_LOOSE") else
                f"=========     and is 4 bytes after the nearest allocation at {address} of "
                f"size {size} bytes\n")
        print("========= Invalid __global__ read of size 4 bytes\n"
              "=========     at fake_decode_kernel+0x1a0\n"
              "=========     by thread (3,0,0) in block (0,1,0)\n"
              f"=========     Address {end + 4:#x} is out of bounds\n" + near +
              "=========     Saved host backtrace up to driver entry point at kernel launch "
              "time\n"
              "=========         Host Frame: [0x2f3a1] in libcuda.so.1")
    sys.stderr.write(proc.stderr)
    print(f"========= ERROR SUMMARY: {errors} error{'s' if errors != 1 else ''}", flush=True)
    if errors:
        return int(opts.get("--error-exitcode", "0"))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
