#!/usr/bin/env bash
# On the GPU machine: kernel checks, the gpu-marked tests, and the throughput benchmark.
# Usage: scripts/gpu_check.sh kernels|tests|bench|fuzz  (writes logs under $OUT if set)
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
  fuzz)
    for v in helion triton; do
      python3 -m kda_fuzz fuzz --device cuda --contract "$v" --max-examples "${2:-300}" \
        --seed 1 --json 2>&1 | tail -1 | tee "$out/fuzz_$v.json"
    done ;;
esac
