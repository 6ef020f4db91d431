#!/usr/bin/env bash
# On the GPU machine: kernel checks, the gpu-marked tests, and the throughput benchmark.
# Usage: scripts/gpu_check.sh kernels|tests|bench|fuzz  (writes logs under $OUT if set)
#        scripts/gpu_check.sh paired BASE [paired.py options]   (BASE: an exported tree,
#            e.g. `git archive REV | tar -x -C BASE`, carried along: no git over there)
#        scripts/gpu_check.sh launches BASE [SECONDS]   (kernels per example, both trees)
#        scripts/gpu_check.sh sharing [SECONDS]   (the cores' layout, then warm in-process
#            jobs, 1 alone, beside 7 processes loading the cores or the GPU alone, and 8:
#            what one job of eight loses to sharing the machine, and to which side of it)
#        scripts/gpu_check.sh startup   (whether torch has its bytecode here, and torch and
#            helion's import timed as a command imports them, twice: where it has none, the
#            first compiles into the kept folder, the second reads it)
#        scripts/gpu_check.sh reads [SECONDS]   (8 warm in-process jobs with the flight
#            record, twice in turn: results read at once, 8 at a time (--read-every 8), and
#            every 8th left unread (--reads-every 8, a measurement): what batching takes back)
set -uo pipefail
out=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
case "${1:-all}" in
  kernels) python3 benchmarks/gpu_kernels.py 2>&1 | tee "$out/gpu_kernels.txt" ;;
  tests)
    start=$(date +%s)
    python3 -m pytest -p kda_fuzz.plugin -n auto -m gpu -q --hypothesis-profile gpu \
      -p no:cacheprovider 2>&1 | tee "$out/pytest_gpu.txt"
    echo "wall: $(( $(date +%s) - start )) s" | tee -a "$out/pytest_gpu.txt" ;;
  bench) python3 benchmarks/gpu_throughput.py "${@:2}" 2>&1 | tee "$out/throughput.txt" ;;
  paired) python3 benchmarks/paired.py --baseline-dir "$2" "${@:3}" 2>&1 | tee "$out/paired.txt" ;;
  launches)
    for tree in "$2" "$PWD"; do
      echo "== $tree" | tee -a "$out/launches.txt"
      (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 \
        benchmarks/profile_campaign.py --kernels --families 1 --seconds "${3:-16}" --top 12) \
        2>&1 | tee -a "$out/launches.txt"
    done ;;
  sharing)
    { lscpu | grep -E '^(CPU\(s\)|Thread|Core|Socket|Model name|L3)'
      for run in 1 "1 --hogs cpu" "1 --hogs gpu" 8 1 "1 --hogs cpu" "1 --hogs gpu" 8; do
        # shellcheck disable=SC2086  # (the run's words are options)
        python3 benchmarks/gpu_jobs_profile.py --plain --jobs $run --deal 8 --warm 15 \
          --seconds "${2:-10}" 2>&1 | grep -E '^[0-9]+ jobs'
      done; } 2>&1 | tee "$out/sharing.txt" ;;
  reads)
    for round in 1 2; do
      for run in "--read-every 1" "--read-every 8" "--reads-every 8"; do
        # shellcheck disable=SC2086  # (the run's words are options)
        python3 benchmarks/gpu_jobs_profile.py --plain --flight --jobs 8 --deal 8 --warm 8 \
          --seconds "${2:-8}" $run 2>&1 | grep -E '^[0-9]+ jobs' | sed "s|^|$round $run: |"
      done
    done 2>&1 | tee "$out/reads.txt" ;;
  startup)
    { python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import paired
print(\"torch's bytecode:\", paired.bytecode_state())"
      for run in 1 2; do
        python3 -c "import time; t = time.perf_counter()
from kda_fuzz.workers.bytecode import keep_bytecode as k; kept = k()
import torch, kda_fuzz.execution.lean_helion
print(f'import $run (torch, helion): {time.perf_counter() - t:.1f} s, bytecode kept in {kept}')"
      done; } 2>&1 | tee "$out/startup.txt" ;;
  fuzz)
    for v in helion triton; do
      python3 -m kda_fuzz fuzz --device cuda --contract "$v" --max-examples "${2:-300}" \
        --seed 1 --json 2>&1 | tail -1 | tee "$out/fuzz_$v.json"
    done ;;
esac
