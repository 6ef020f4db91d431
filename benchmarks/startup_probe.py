"""Where a GPU job's start-up goes: N fresh processes at once (as a campaign's jobs start),
each timing its steps in a job's order: torch, the engine (what the fork server preloads),
triton, helion, the target's module, the CUDA context, and whether CUDA was initialised
before the context step (a fork server may import only what leaves it uninitialised).

    python benchmarks/startup_probe.py [--procs 8]
                                       [--target kda_fuzz_kernels.kda_decode:helion_...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

STEPS = r"""
import json, sys, time
t = [("start", time.perf_counter())]
def step(name):
    t.append((name, time.perf_counter()))
import torch; step("torch")
import kda_fuzz.campaign.supervisor; step("engine")
import triton, triton.language; step("triton")
import helion; step("helion")
cuda_after_imports = torch.cuda.is_initialized()
from kda_fuzz.engine.targets import load_target
load_target(sys.argv[1]); step("target module")
cuda_after_target = torch.cuda.is_initialized()
torch.cuda.set_device("cuda:0"); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
step("cuda context")
print(json.dumps({"steps": [(n, b - a) for (_, a), (n, b) in zip(t, t[1:])],
                  "cuda_after_imports": cuda_after_imports,
                  "cuda_after_target": cuda_after_target}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--target",
                    default="kda_fuzz_kernels.kda_decode:helion_fused_recurrent_kda_packed_decode")
    args = ap.parse_args()
    for env_name, extra in (("plain", {}), ("PYTORCH_NVML_BASED_CUDA_CHECK=1",
                                            {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"})):
        procs = [subprocess.Popen([sys.executable, "-c", STEPS, args.target],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, **extra}) for _ in range(args.procs)]
        got = []
        for p in procs:
            out, err = p.communicate()
            try:
                got.append(json.loads(out.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                print(f"a process failed: {err[-800:]}")
        if not got:
            continue
        print(f"{env_name}: {len(got)} processes at once; per step, median (max) seconds")
        for i, (name, _) in enumerate(got[0]["steps"]):
            xs = [g["steps"][i][1] for g in got]
            print(f"  {name:14} {statistics.median(xs):6.2f} ({max(xs):.2f})")
        print(f"  CUDA initialised by the imports: {sorted({g['cuda_after_imports'] for g in got})}"
              f"; by the target's module: {sorted({g['cuda_after_target'] for g in got})}")


if __name__ == "__main__":
    main()
