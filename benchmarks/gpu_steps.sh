#!/usr/bin/env bash
# The open issues' GPU steps in one time-boxed run, for a session that is lent a GPU (the device tool runs it from
# the checkout: PYTHONPATH=. python3, no project venv). Each step has its own limit, so one that hangs leaves the
# others their time; everything it prints also goes to $OUT (or ./gpu-steps) for the closing note.
#   #45: make gpu-check's kernel case (ssd, 0 workers, naive and prefetch: kernel busy against NVML, the cause
#        named), then the kernel windows' cost on CUDA (benchmarks/kernel_windows.py's CUDA part);
#   #55: one window's cost on the training thread by part, against its activities (benchmarks/window_cost.py);
#   #44: the profiling overhead on the 4.5 ms CNN and resnet50 (benchmarks/gpu_overhead.py).
# Run: bash benchmarks/gpu_steps.sh [SECONDS_EACH]   (default 100; four steps: under 8 minutes in all)
set -u
each="${1:-100}"
out="${OUT:-gpu-steps}"
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
py="${PYTHON:-python3}"
step() {
    local name="$1"; shift
    echo "== $name (limit ${each} s): $*" | tee -a "$out/steps.log"
    timeout "$each" "$@" > "$out/$name.log" 2>&1
    echo "== $name: exit $?" | tee -a "$out/steps.log"
    tail -n 25 "$out/$name.log"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
step kernel-case "$py" benchmarks/gpu_check.py --scenarios ssd --skip-tests --out "$out/runs"
step kernel-windows "$py" benchmarks/kernel_windows.py --groups 20 --sim-runs 1 --json
step window-cost "$py" benchmarks/window_cost.py --repeats 3 --json
step overhead "$py" benchmarks/gpu_overhead.py --loops cnn,resnet50 --rounds 5
