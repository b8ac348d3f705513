#!/usr/bin/env bash
# Issue 31's GPU evidence on one lent H200, as one background job that outlives a device call (each call re-lays the
# tree: the job runs from a copy in /tmp): the cold rehearsal of unmodified upstream R3 (the identical candidate must
# be exact with every arm on the prime's tuned kernels), then r3-mini's CUDA candidate and null at K = 1.
#   start: bash scripts/gpu_tuned_kernels.sh start     poll: bash scripts/gpu_tuned_kernels.sh wait SECONDS
# PRIME_STEPS=N rehearses with `measurement.prime_steps: N` (a copy of the protocol in the job's tree; the shipped
# file is not changed); MINI names the r3-mini protocols launched after the rehearsal ("" for none).
# The job lives only as long as the machine: a lent machine goes back after 30 s idle and takes the job with it, so
# issue each `wait` call at once after the previous one returns (nothing else in between). Device time: the rehearsal
# about 20 min, each of the two tools about 8 cold compiles of 2 min, each r3-mini launch about 5 min.
# Needs beside the repository .up/ (git archive of sen-ye/R3 e9912ac: modeling train data scripts), .whl/ (upstream's
# needs: docs/REFERENCE.md "Rehearse before you spend eight GPUs") and, for the two cache tables, TOOLS (a
# folder holding compile_cache_determinism.py and compile_cache_ranks.py; default .whl-tools): they run beside the
# rehearsal's untimed prime, once orch holds the GPU lock. Everything small comes back as one bundle.tgz.
set -u
W=/tmp/gpu31
case "${1:-}" in
start)
  rm -rf "$W"; mkdir -p "$W"
  cp -a . "$W/orch"
  if [ -n "${PRIME_STEPS:-}" ]; then
    sed "s/^measurement: {steps: 16,/measurement: {prime_steps: $PRIME_STEPS, steps: 16,/" \
      protocol/r3_bagel7b_8xh100.yaml > "$W/orch/protocol/r3_bagel7b_8xh100.yaml"
    grep -q "prime_steps: $PRIME_STEPS," "$W/orch/protocol/r3_bagel7b_8xh100.yaml" || { echo "no prime_steps set"; exit 1; }
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl \
    || exit 1
  setsid nohup bash "$W/orch/scripts/gpu_tuned_kernels.sh" job > "$W/job.log" 2>&1 < /dev/null &
  echo "job started"
  ;;
job)
  cd "$W/orch" || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1
  python3 -c "import torch, triton, transformers, pydantic, scipy; print('torch', torch.__version__, 'triton', \
triton.__version__, 'transformers', transformers.__version__)"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  H=$W/home; mkdir -p "$H"
  t0=$(date +%s)
  python3 -m orchestrator.cli.orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream .up --gpus 1 --home "$H" --json \
    > "$W/rehearse.json" 2> "$W/rehearse.err" &
  REH=$!
  T=${TOOLS:-.whl-tools}
  if [ -f "$T/compile_cache_determinism.py" ]; then
    # the tables' tools start once the run is under way (the lock is taken before the first package's folder exists)
    until ls "$H"/runs/*/packages/prime >/dev/null 2>&1 || ! kill -0 $REH 2>/dev/null; do sleep 2; done
    echo "tools start at $(( $(date +%s) - t0 )) s"
    mkdir -p "$W/tools"
    ( python3 "$T/compile_cache_determinism.py" "$W/tools" > "$W/tools/determinism.log" 2>&1
      echo "determinism exit $? at $(( $(date +%s) - t0 )) s" ) &
    ( python3 "$T/compile_cache_ranks.py" "$W/tools" > "$W/tools/ranks.log" 2>&1
      echo "ranks exit $? at $(( $(date +%s) - t0 )) s" ) &
  fi
  wait $REH
  echo "rehearse exit $? after $(( $(date +%s) - t0 )) s"
  RUN=$(ls "$H/runs" | tail -n 1)
  python3 -m orchestrator.cli.orch audit "$RUN" --home "$H" > "$W/rehearsal_audit.txt" 2>&1; echo "audit exit $?"
  # orch publishes only inside the repository's docs/validation/: publish in the job's copy, then bring it out
  python3 -m orchestrator.cli.orch publish "$RUN" --to docs/validation/gpu31_rehearsal.json --home "$H"
  echo "publish exit $?"; cp docs/validation/gpu31_rehearsal.json "$W/rehearsal.json" 2>/dev/null
  cp "$H/runs/$RUN/run.json" "$W/rehearsal_run.json" 2>/dev/null
  # the run's record (its run folder, sealed arms included, and the ledger; no scratch, no generated inputs): `orch
  # audit RUN --home DIR` of the unpacked copy recomputes the audit at a later commit (the audit re-hashes the sealed
  # arms, so they must come along); the device returns files up to 16 MiB
  tar -czf "$W/rehearsal_home.tgz" -C "$H" runs ledger 2>/dev/null; ls -l "$W/rehearsal_home.tgz"
  wait  # the tools, if still running (orch's lock would wait for them anyway)
  echo "rehearsal done"
  for p in ${MINI-r3_mini_cuda1 r3_mini_cuda1_null}; do  # MINI (as TOOLS) comes from start's environment
    t0=$(date +%s)
    python3 -m orchestrator.cli.orch launch "protocol/$p.yaml" --home "$W/home-$p" > "$W/$p.log" 2>&1
    echo "$p exit $? after $(( $(date +%s) - t0 )) s"
    RUN=$(ls "$W/home-$p/runs" | tail -n 1)
    python3 -m orchestrator.cli.orch audit "$RUN" --home "$W/home-$p" > "$W/${p}_audit.txt" 2>&1; echo "audit exit $?"
    python3 -m orchestrator.cli.orch publish "$RUN" --to "docs/validation/gpu31_$p.json" --home "$W/home-$p"
    cp "docs/validation/gpu31_$p.json" "$W/$p.json" 2>/dev/null
    tar -czf "$W/${p}_home.tgz" -C "$W/home-$p" runs ledger 2>/dev/null
  done
  echo "all done"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ "$(date +%s)" -lt "$end" ] && ! grep -q "${3:-all done}" "$W/job.log" 2>/dev/null; do sleep 10; done
  cat "$W/job.log"; tail -n 3 "$W/rehearse.err" 2>/dev/null; tail -n 2 "$W"/tools/*.log 2>/dev/null
  ( cd "$W" && tar -czf "${OUT:-/tmp}/bundle.tgz" --exclude=orch --exclude=home --exclude='home-*' \
      --exclude='*_home.tgz' . ) 2>/dev/null
  cp "$W"/*_home.tgz "${OUT:-/tmp}/" 2>/dev/null
  ls -l "${OUT:-/tmp}"/*.tgz
  ;;
esac
