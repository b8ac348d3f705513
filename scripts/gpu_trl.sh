#!/usr/bin/env bash
# Issue 33 part 4: TRL GRPO on one lent H200, the whole plan as one background job that outlives a device call (each
# call re-lays the tree: the job runs from a copy in /tmp): the trl extra's pins from wheels, freeze (the commitment
# must be unchanged), the null at K = 1, orch calibrate (A/A launches), then the candidate with --until-decided.
#   start: bash scripts/gpu_trl.sh start        poll (copies what is done to $OUT): bash scripts/gpu_trl.sh wait SECONDS
#   one call, if it fits: bash scripts/gpu_trl.sh all
#   sizing without orch (bench/bench_trl_gc.py --device cuda; SIZES="16x1536x256 16x1536x1024", RUNS per arm,
#   default 2): bash scripts/gpu_trl.sh size, then wait SECONDS; the table ends job.log (with the GPU-busy share of
#   steps 10-15: a size for a verdict keeps it at least 80%), figures in bench_trl_size.json; DETERMINISM=algorithms
#   and PROFILE=1 pass --determinism algorithms and --profile (one step before the timed ones, torch.profiler)
# Needs beside the repository .whl/ (carried; or the folder WHEELS names, e.g. WHEELS=.whl-trl when .whl holds
# upstream R3's): trl 1.16.0, transformers 5.24.0, accelerate 1.16.0, datasets 5.2.0,
# dill, multiprocess, pydantic (+ core, annotated-types, typing-inspection, typing_extensions); the image has torch.
# CALIBRATE_REPEATS (default 3) and MAX_REPEATS (default 6) size the plan; NULL=0 leaves the null launch out.
# Device time on one H200, from the null's 453.7 GPU-s launch: the null about 8 min, each A/A launch about 5 min
# (it ends after its triplet: no watch-C, 66.9 s, and no score, 83.7 s), the candidate's first triplet about 8 min.
set -u
W=/tmp/gpu33
case "${1:-}" in
start|all|size)
  rm -rf "$W"; mkdir -p "$W"
  cp -a . "$W/orch"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl \
    || exit 1
  if [ "$1" = size ]; then
    setsid nohup bash "$W/orch/scripts/gpu_trl.sh" sizejob > "$W/job.log" 2>&1 < /dev/null &
    echo "sizing started: ${SIZES:-16x1536x256}, ${RUNS:-2} runs per arm"; exit 0
  fi
  if [ "$1" = all ]; then bash "$W/orch/scripts/gpu_trl.sh" job > "$W/job.log" 2>&1; cat "$W/job.log"
    bash "$W/orch/scripts/gpu_trl.sh" wait 0 > /dev/null; exit 0; fi
  setsid nohup bash "$W/orch/scripts/gpu_trl.sh" job > "$W/job.log" 2>&1 < /dev/null &
  echo "job started"
  ;;
job)
  cd "$W/orch" || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1 GPU_RUN_LOCK_DIR=/tmp/gpu-run-locks
  ORCH="python3 -m orchestrator.cli.orch"
  python3 -c "import torch, trl, transformers, accelerate, datasets, pyarrow, pydantic; print('torch', torch.__version__, \
'trl', trl.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'datasets', \
datasets.__version__, 'pyarrow', pyarrow.__version__, 'gpus', torch.cuda.device_count())" || exit 1
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  H=$W/home; mkdir -p "$H"
  t0=$(date +%s)
  $ORCH freeze --protocol protocol/trl_grpo_cuda1.yaml -o "$W/trl_grpo.json" --json > "$W/freeze.json" \
    && python3 -c "import json,sys; a=json.load(open('manifests/trl_grpo.json')); b=json.load(open('$W/trl_grpo.json')); \
print('freeze: root', b['root'], 'unchanged' if a['root']==b['root'] else 'CHANGED')"
  step() {  # NAME ARGS...: one orch command, its run's run.json and audit under $W/NAME.*
    local name=$1; shift; local t=$(date +%s)
    $ORCH "$@" --home "$H" --json > "$W/$name.launch.json" 2> "$W/$name.err"
    echo "$name: exit $? after $(( $(date +%s) - t )) s"; grep -E "^(run |lock|orch:)" "$W/$name.err" | tail -3
    local run; run=$(python3 -c "import json; print(json.load(open('$W/$name.launch.json')).get('run_id',''))" \
      2>/dev/null)
    [ -n "$run" ] || return 0
    $ORCH audit "$run" --home "$H" > "$W/$name.audit.txt" 2>&1; echo "$name: audit exit $?"
    grep -E "verdict|speedup|exact|interval" "$W/$name.audit.txt" | head -8
    cp "$H/runs/$run/run.json" "$W/$name.run.json"; cp "$H/runs/$run/audit.json" "$W/$name.audit.json" 2>/dev/null
    $ORCH publish "$run" --home "$H" --to "$W/$name.evidence.json" > /dev/null 2>&1 || echo "$name: publish failed"
  }
  # NULL=0 leaves the null out (it was run and published before: docs/validation/trl_grpo_h200x1_null.json)
  if [ "${NULL:-1}" != 0 ]; then step null launch protocol/trl_grpo_cuda1_null.yaml; fi
  t=$(date +%s)
  $ORCH calibrate protocol/trl_grpo_cuda1.yaml --repeats "${CALIBRATE_REPEATS:-3}" --home "$H" --json \
    > "$W/calibrate.json" 2> "$W/calibrate.err"
  echo "calibrate: exit $? after $(( $(date +%s) - t )) s"; tail -3 "$W/calibrate.err"
  step candidate launch protocol/trl_grpo_cuda1.yaml --until-decided --max-repeats "${MAX_REPEATS:-6}"
  $ORCH ledger head --home "$H" > "$W/ledger_head.txt" 2>&1
  echo "all done after $(( $(date +%s) - t0 )) s"
  ;;
sizejob)
  cd "$W/orch" || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  sizes=(); for s in ${SIZES:-16x1536x256}; do sizes+=(--size "$s"); done
  nvidia-smi --query-gpu=name --format=csv,noheader
  python3 bench/bench_trl_gc.py --device cuda --runs "${RUNS:-2}" "${sizes[@]}" --determinism "${DETERMINISM:-full}" \
    ${PROFILE:+--profile} --out "$W/bench_trl_size.json"
  echo "bench exit $?"; echo "all done"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  out=${OUT:-/tmp/gpu33-out}; mkdir -p "$out"
  # what comes back: the evidence and audits of the null and the candidate, calibration, the log, the sizing. They are
  # copied on every tick, so that a call cut short by the device's time limit still brings back what was done
  keep() { for f in null.evidence.json null.audit.json candidate.evidence.json candidate.audit.json calibrate.json \
    candidate.run.json job.log ledger_head.txt bench_trl_size.json; do [ -f "$W/$f" ] && cp "$W/$f" "$out/"; done; }
  while [ "$(date +%s)" -lt "$end" ] && ! grep -q "all done" "$W/job.log" 2>/dev/null; do keep; sleep 10; done
  keep; cat "$W/job.log"
  ;;
*)
  echo "usage: bash scripts/gpu_trl.sh start | wait SECONDS | all | size" >&2; exit 2
  ;;
esac
