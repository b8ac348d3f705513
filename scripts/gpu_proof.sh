#!/usr/bin/env bash
# Issue 51's GPU evidence on one GPU, as one background job that outlives a device call (the job runs from a copy in
# /tmp): upstream R3's rehearsal cold (the prime stops when compiling stops and its cache is kept in the home), then a
# second rehearsal in the same home that loads the kept cache (no prime; REHEARSALS=1 runs the cold one only),
# then, with CALIBRATE=K, `orch rehearse --calibrate K`: K A/A launches of the rehearsal on the kept cache (no prime,
# no reload after the last launch; REHEARSALS=0: the first A/A launch primes cold and keeps it); KEPT_AFTER=1 then
# runs one more rehearsal on the kept cache (the K = 1 run of bench_proof.py's decision line); with MINI=P, bench
# proof of r3-mini protocol P (two launches: cold, kept). Each run's GPU-seconds per package, its proof overhead
# beyond the timed A, C, B and its share (`orch ledger overhead`), the exactness lines of each audit, figures in
# proof.json, all in bundle.tgz under $OUT.
#   start: bash scripts/gpu_proof.sh start      poll: bash scripts/gpu_proof.sh wait SECONDS
# Issue each `wait` at once after the previous one returns (a lent machine goes back after 30 s idle, with the job).
# Device time on one H100 (from the issue's figures): cold rehearsal ~10-11 min, kept ~6-7 min, each A/A launch ~4-5
# min. Needs beside the repository .up/ (git archive of sen-ye/R3: modeling train data scripts) and .whl/ (upstream's
# needs): carry [".up", ".whl"].
set -u
W=/tmp/gpu51
case "${1:-}" in
start)
  rm -rf "$W"; mkdir -p "$W"
  cp -a . "$W/orch"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:-.whl}"/*.whl \
    || exit 1
  echo "CALIBRATE=${CALIBRATE:-0} MINI=${MINI:-} REHEARSALS=${REHEARSALS:-2} KEPT_AFTER=${KEPT_AFTER:-0}" > "$W/settings"
  setsid nohup env CALIBRATE="${CALIBRATE:-0}" MINI="${MINI:-}" REHEARSALS="${REHEARSALS:-2}" KEPT_AFTER="${KEPT_AFTER:-0}" \
    bash "$W/orch/scripts/gpu_proof.sh" job \
    > "$W/job.log" 2>&1 < /dev/null &
  echo "job started"
  ;;
job)
  cd "$W/orch" || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  H=$W/home; mkdir -p "$H"
  rehearse_one() {  # N: one rehearsal in the home (the first of its key primes and keeps the cache, later ones load it)
    local n=$1 t0; t0=$(date +%s)
    python3 -m orchestrator.cli.orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream .up --gpus 1 --home "$H" --json \
      > "$W/rehearse$n.json" 2> "$W/rehearse$n.err"
    echo "rehearsal $n exit $? after $(( $(date +%s) - t0 )) s"
    grep "^compile cache:" "$W/rehearse$n.err"
    RUN=$(ls "$H/runs" | tail -n 1)
    python3 -m orchestrator.cli.orch audit "$RUN" --home "$H" > "$W/audit$n.txt" 2>&1; echo "audit exit $?"
    grep -E "^  (digests|final digests|RNG|observed recipe|trainer numbers|forbidden dtype|watch|compile cache)" \
      "$W/audit$n.txt"
    python3 -m orchestrator.cli.orch ledger overhead "$RUN" --home "$H"
    python3 -m orchestrator.cli.orch ledger list --run "$RUN" --home "$H" --format package,status,wall_s,gpu_seconds \
      --parsable | awk -F'\t' '$2 != "open"'
    python3 -m orchestrator.cli.orch publish "$RUN" --to "docs/validation/gpu51_rehearsal$n.json" --home "$H"
    cp "docs/validation/gpu51_rehearsal$n.json" "$W/" 2>/dev/null
    cp "$H/runs/$RUN/run.json" "$W/run$n.json" 2>/dev/null
  }
  for n in $(seq 1 "${REHEARSALS:-2}"); do rehearse_one "$n"; done
  python3 -m orchestrator.cli.orch cache ls --home "$H"
  if [ "${CALIBRATE:-0}" -ge 2 ]; then
    # orch calibrate of the rehearsal's derived protocol, its judge up for every A/A launch; with REHEARSALS=0 the
    # first A/A launch primes (cold) and keeps the cache, the later ones load it
    t0=$(date +%s)
    python3 -m orchestrator.cli.orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream .up --gpus 1 --home "$H" \
      --calibrate "$CALIBRATE" > "$W/calibrate.log" 2>&1
    echo "calibrate exit $? after $(( $(date +%s) - t0 )) s"; grep -E "^compile cache:|calibration recorded" "$W/calibrate.log"
    for RUN in $(python3 -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['calibration_run_ids'] or []))" \
        "$(ls -d "$H"/rehearsals/*/ | tail -n 1)rehearsal.json" 2>/dev/null); do
      python3 -m orchestrator.cli.orch ledger overhead "$RUN" --home "$H"
    done
  fi
  # KEPT_AFTER=1: then one rehearsal on the kept cache, the K = 1 run of bench-proof's decision line (issue 51's goal)
  if [ "${KEPT_AFTER:-0}" = 1 ]; then rehearse_one k; fi
  python3 bench/bench_proof.py --home "$H" --out "$W/proof.json"
  tar -czf "$W/rehearsal_home.tgz" -C "$H" runs ledger 2>/dev/null; ls -l "$W/rehearsal_home.tgz"
  if [ -n "${MINI:-}" ]; then
    python3 bench/bench_proof.py --protocol "protocol/$MINI.yaml" --runs 2 --out "$W/proof_$MINI.json"
    echo "bench-proof $MINI exit $?"
  fi
  echo "all done"
  ;;
wait)
  end=$(( $(date +%s) + ${2:-500} ))
  while [ "$(date +%s)" -lt "$end" ] && ! grep -q "${3:-all done}" "$W/job.log" 2>/dev/null; do sleep 10; done
  cat "$W/job.log"; tail -n 3 "$W"/rehearse*.err 2>/dev/null
  ( cd "$W" && tar -czf "${OUT:-/tmp}/bundle.tgz" --exclude=orch --exclude=home --exclude='*_home.tgz' . ) 2>/dev/null
  cp "$W"/*_home.tgz "${OUT:-/tmp}/" 2>/dev/null
  cp "$W"/proof*.json "${OUT:-/tmp}/" 2>/dev/null
  ls -l "${OUT:-/tmp}"
  ;;
esac
