#!/usr/bin/env bash
# Issue 50 on one lent H100/H200, in ONE device call of under 9 minutes: bench/gpu_bound.py checks GPU-busy and the
# floor of the GPU-bound r3-mini (plain fresh launches, no orch), runs `orch calibrate` with 3 A/A launches, then K = 1
# launches of the null and of a known 5% slowdown (extra GPU work, no bits changed) and, while time remains, the 2%
# slowdown under the sequential stop and r3-mini's candidate. Every step is skipped once it would pass the deadline.
#   bash scripts/gpu_bound.sh            (from the repository root; .whl/ carried: pydantic and its needs, see README)
# DEADLINE_S: seconds from this script's start by which the last step must end (default 500: the call's 600 s limit
# leaves room for the copy-out); PLAIN_TRIPLETS (2), CAL_REPEATS (3), MAX_REPEATS (4), FLOOR_AFTER (0: plain triplets
# added after the 5% decision), DEADLINE_FILE (a Unix time that a later call may write to move the deadline),
# DECISIONS (null,5pct,2pct,candidate: which K = 1 decisions, in that order), AA_LAUNCH_S (320: one A/A launch, with no plain one). Figures and the run records
# (runs/ and ledger/ as one .tgz, no scratch) land in $OUT/gpu_bound/.
set -u
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-500}
OUT=${OUT:-/tmp/orch-out}
mkdir -p "$OUT/gpu_bound"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed (carry .whl: pydantic, pydantic-core, annotated-types, typing-inspection)"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
export GPU_RUN_LOCK_DIR=/tmp/gpu-run-locks
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, pydantic; print('torch', torch.__version__, 'pydantic', pydantic.VERSION, 'gpus', \
torch.cuda.device_count())" || exit 1
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /'
BUDGET=$(( DEADLINE_S - ($(date +%s) - T0) ))
echo "budget for the experiment: ${BUDGET} s"
python3 bench/gpu_bound.py --device cuda --budget-s "$BUDGET" --plain-triplets "${PLAIN_TRIPLETS:-2}" \
  --calibration-repeats "${CAL_REPEATS:-3}" --max-repeats "${MAX_REPEATS:-4}" --out "$OUT/gpu_bound" \
  --floor-after "${FLOOR_AFTER:-0}" ${DEADLINE_FILE:+--deadline-file "$DEADLINE_FILE"} \
  --decisions "${DECISIONS:-null,5pct,2pct,candidate}" --aa-launch-s "${AA_LAUNCH_S:-320}" \
  2>&1 | tee "$OUT/gpu_bound/log.txt"
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "gpu_bound exit $rc after $(( $(date +%s) - T0 )) s"
exit "$rc"
