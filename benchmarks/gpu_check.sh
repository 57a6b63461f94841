#!/usr/bin/env bash
# The checks that need an NVIDIA GPU and cupy, in one run (`make gpu-check`, or
# `benchmarks/gpu_check.sh [OUTDIR]` with the project's python first on PATH):
#   1. tests/runtime/test_cupy.py: every kernel case on cupy against numpy (forward and
#      backward), `unity run --backend cupy --check` on one GPU, the profiler's CUDA events,
#      and NCCL between two ranks where the machine has two GPUs;
#   2. benchmarks/profile_accuracy.py on one GPU: predicted (roofline, profiled) against
#      measured step time of `unity run --backend cupy`.
# GPU_SPEC names the cluster spec of one of this machine's GPUs (default: one H200 of
# cluster_specs/h200-8.yaml). Logs and tables go to OUTDIR (default: gpu-check/).
set -u
out=${1:-gpu-check}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2
python -c "import cupy; from cupy.cuda import nccl, runtime; \
print('cupy', cupy.__version__, 'gpus', runtime.getDeviceCount(), 'nccl', nccl.get_version(), \
runtime.getDeviceProperties(0)['name'].decode())" 2>&1 | tee "$out/gpu.txt"
status=0
python -m pytest -p no:randomly -rs tests/runtime/test_cupy.py --junitxml="$out/cupy-tests.xml" \
    >"$out/cupy-tests.log" 2>&1 || status=1
tail -n 15 "$out/cupy-tests.log"
spec=${GPU_SPEC:-}
if [ -z "$spec" ]; then
    spec=$(mktemp --suffix .yaml)
    sed 's/devices: 8/devices: 1/; s/name: h200-8/name: h200-1/' cluster_specs/h200-8.yaml >"$spec"
fi
for batch in 4 64; do
    python benchmarks/profile_accuracy.py --backend cupy --ranks 1 --cluster "$spec" --batch "$batch" \
        --strategies data_parallel --models bert_tiny,convnet_tiny --max-seconds 10 --steps 10 \
        >"$out/accuracy-b$batch.md" 2>"$out/accuracy-b$batch.log" || status=1
    cat "$out/accuracy-b$batch.md"
done
exit $status
