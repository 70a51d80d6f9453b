#!/usr/bin/env bash
# The open issues' GPU steps in one time-boxed run, for a session that is lent a GPU (the device tool runs it from
# the checkout: PYTHONPATH=. python3, no project venv). Each step has its own limit, so one that hangs leaves the
# others their time; everything it prints also goes to $OUT (or ./gpu-steps) for the closing note.
#   #45: make gpu-check's kernel case (ssd, 0 workers, naive and prefetch: kernel busy against NVML, the cause
#        named), then the kernel windows' cost on CUDA (benchmarks/kernel_windows.py's CUDA part);
#   #55: one window's cost on the training thread by part, against its activities, read here, handed over and off
#        the thread (benchmarks/window_cost.py --only cuda); the paired overhead and the reported throughput against the bare loop's at
#        30, 200 and 2,000 steps (benchmarks/gpu_overhead.py: the CNN at all three, ResNet-50 at 30 and 200), with
#        the sampler process alone (windows off: item 3), and the hot path's microseconds a step and a phase on CUDA;
#   #44: the same overhead figures;
#   #57: the GPU tests (pytest -m gpu): the real-CUDA zero-code events against the script's own, the device timer,
#        a Session's window, started on its own thread, recording the training thread's kernels (its trace
#        exported there through torch's public export_chrome_trace).
# Run: bash benchmarks/gpu_steps.sh   (each step has its own limit: 7.8 minutes in all at most)
set -u
out="${OUT:-gpu-steps}"
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
py="${PYTHON:-python3}"
step() {
    local name="$1" limit="$2"; shift 2
    echo "== $name (limit ${limit} s): $*" | tee -a "$out/steps.log"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "== $name: exit $?" | tee -a "$out/steps.log"
    tail -n 25 "$out/$name.log"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
step window-cost 45 "$py" benchmarks/window_cost.py --only cuda --sizes 5000,35000 --repeats 3
step overhead-cnn 120 "$py" benchmarks/gpu_overhead.py --loops cnn --rounds 2 --steps 30,200,2000
step overhead-resnet50 100 "$py" benchmarks/gpu_overhead.py --loops resnet50 --rounds 2 --steps 30,200
step kernel-case 100 "$py" benchmarks/gpu_check.py --scenarios ssd --skip-tests --out "$out/runs"
step kernel-windows 45 "$py" benchmarks/kernel_windows.py --groups 20 --sim-runs 1 --json
step gpu-tests 60 "$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_instrument_device.py tests/test_device_timing.py tests/test_kernel_windows.py
