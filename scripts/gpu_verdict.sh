#!/usr/bin/env bash
# The verdict's evidence on a lent one-GPU machine (16 cores), across device calls:
#   start: installs the wheels in .whl/, copies the tree to /tmp/orch-w (a job left running must not run from the
#          tree a later call re-lays), then starts two detached jobs: bench/gpu_verdict.py on cores 0-3 (orch
#          calibrate + K = 1 launches of r3-mini's candidate, null and a 25% slowdown on the GPU) and
#          bench/bench_verdict.py --real on cores 4-15 (six CPU streams of r3-mini); then waits as `wait` does;
#   wait:  prints progress until both jobs end or WAIT_S seconds pass, and copies the figures to $OUT.
set -u
phase=${1:-wait}
WAIT_S=${WAIT_S:-540}
RES=/tmp/orch-res
OUT=${OUT:-/tmp/orch-out}
mkdir -p "$OUT" "$RES"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
if [ "$phase" = start ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  rm -rf /tmp/orch-w && mkdir -p /tmp/orch-w && cp -a . /tmp/orch-w/ && rm -rf /tmp/orch-w/.whl
  nvidia-smi -L; nproc
  cd /tmp/orch-w
  setsid nohup bash -c "taskset -c 0-3 python3 bench/gpu_verdict.py --device cuda --calibration-repeats 3 \
    --out $RES/gpu_verdict_h200.json > $RES/gpu.log 2>&1; echo done > $RES/gpu.done" >/dev/null 2>&1 &
  setsid nohup bash -c "taskset -c 4-15 python3 bench/bench_verdict.py --real --device cpu --streams 6 \
    --cores-per-stream 2 --small --calibration-repeats 2 --budget-s ${CPU_BUDGET_S:-900} \
    --kinds null,slow10,null,slow25,null,slow10 --out $RES/verdict_real_cpu12.json > $RES/cpu.log 2>&1; \
    echo done > $RES/cpu.done" >/dev/null 2>&1 &
  cd - >/dev/null
fi
t0=$(date +%s)
while :; do
  sleep 30
  el=$(( $(date +%s) - t0 ))
  echo "--- ${el}s: gpu $(tail -1 $RES/gpu.log 2>/dev/null | cut -c1-150)"
  echo "    cpu $(tail -1 $RES/cpu.log 2>/dev/null | cut -c1-150)"
  [ -f $RES/gpu.done ] && [ -f $RES/cpu.done ] && break
  [ $el -ge "$WAIT_S" ] && break
done
echo "=== gpu.log"; tail -40 $RES/gpu.log 2>/dev/null
echo "=== cpu.log"; tail -40 $RES/cpu.log 2>/dev/null
cp $RES/*.json $RES/*.log "$OUT"/ 2>/dev/null
ls $RES
