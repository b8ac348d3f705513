#!/usr/bin/env bash
# GPU evidence on a lent H200 machine: one call per phase does everything and leaves figures under $OUT.
#   phase "smoke": CUDA tests, the fused-kernel diagnostic, the static graph digest of this stack, bench-digest,
#                  bench-r3mini, bench-probe;
#   phase "runs":  orch launch + audit + publish of the committed CUDA protocols (1 GPU, 1 GPU null, 2 GPUs).
# The machine has torch/triton in its image (no registry); pydantic travels as wheels in .whl/ (see README).
set -u
phase=${1:-smoke}
OUT=${OUT:-/tmp/orch-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# never NVLink multicast on a shared host
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPU_RUN_LOCK_DIR=/tmp/gpu-run-locks
ORCH="python3 -m orchestrator.cli.orch"
HOME_DIR=/tmp/orch-home
banner() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

banner "host"
nvidia-smi -L
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"

if [ "$phase" = smoke ]; then
  banner "static graph digest on this stack"
  (cd examples/r3_mini && python3 train/graph_diag.py | sha256sum)
  grep -h expect_sha256 protocol/r3_mini_cuda1.yaml
  banner "fused-kernel exactness diagnostic"
  (cd examples/r3_mini && timeout 300 python3 -m train.diagnostics)
  banner "CUDA tests"
  timeout 420 python3 -m pytest -q -x -p no:cacheprovider -m cuda tests/unit/test_digest.py tests/unit/test_workers.py \
    tests/e2e/test_r3_mini.py 2>&1 | tail -25
  banner "bench-digest"
  timeout 300 python3 bench/bench_digest.py --out "$OUT/digest.json" 2>&1 | tail -45
  banner "bench-r3mini (1 GPU)"
  timeout 400 python3 bench/bench_r3mini.py --device cuda --nproc 1 --out "$OUT/r3mini_cuda1.json" 2>&1 | tail -20
  banner "bench-probe (1 GPU)"
  timeout 400 python3 bench/bench_probe.py --device cuda --nproc 1 --reps 2 --out "$OUT/probe_cuda1.json" 2>&1 | tail -12
fi

if [ "$phase" = runs ]; then
  for p in ${PROTOCOLS:-r3_mini_cuda1 r3_mini_cuda1_null r3_mini_cuda2}; do
    banner "orch launch protocol/$p.yaml"
    timeout 900 $ORCH launch "protocol/$p.yaml" --home "$HOME_DIR" --json > "/tmp/$p.launch.json" 2> "/tmp/$p.launch.err"
    echo "launch exit $?"; grep -v "step " "/tmp/$p.launch.err" | tail -15; tail -1 "/tmp/$p.launch.json"
    run_id=$(python3 -c "import json,sys; print(json.loads(open('/tmp/$p.launch.json').read().splitlines()[-1]).get('run_id',''))" 2>/dev/null)
    [ -n "$run_id" ] || continue
    banner "orch audit $run_id"
    COLUMNS=140 $ORCH audit "$run_id" --home "$HOME_DIR" 2>&1 | grep -v "DEV score" | head -80
    # publish writes only into the repository's docs/validation/ (this copy's); the figures come back from $OUT
    $ORCH publish "$run_id" --home "$HOME_DIR" --to "docs/validation/$p.$run_id.json"; echo "publish exit $?"
    cp "docs/validation/$p.$run_id.json" "$OUT/$p.json" 2>/dev/null
    cp "$HOME_DIR/runs/$run_id/audit.md" "$OUT/$p.audit.md" 2>/dev/null
  done
  banner "ledger"
  $ORCH ledger summary --by run --home "$HOME_DIR"
  $ORCH ledger head --home "$HOME_DIR"
fi
