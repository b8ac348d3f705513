#!/usr/bin/env bash
# `make demo`: the main job on the embedded default: launch r3-mini (CPU when there is no GPU; three triplets, so that
# the paired interval decides without a calibration: df 2, t = 4.30; two give df 1, t = 12.7: too wide here), then the
# audit of that run, then the ledger's accounting. Everything goes to ./.orch (or $ORCH_HOME). `accepted` also needs a
# quiet host: a foreign process on the ranks' cores during a window (the host watch) keeps it `no difference shown`.
# The owner's one triplet needs this host's A/A calibration (3 A/A triplets for df 2: dearer than a third triplet):
#   orch calibrate protocol/r3_mini.yaml && orch launch protocol/r3_mini.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
ORCH=.venv/bin/orch
default=protocol/r3_mini_demo.yaml
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then default=protocol/r3_mini_cuda1.yaml; fi
PROTOCOL=${PROTOCOL:-$default}
echo "== orch verify: the working tree against the published commitment"
$ORCH verify manifests/r3_mini.json --root examples/r3_mini
echo "== orch launch $PROTOCOL"
# launch and audit exit alike: 1 for the verdict "not exact" ("accepted" and "no difference shown" exit 0) or a
# failed package; the demo shows a recorded verdict; any other failure stops the demo
home=${ORCH_HOME:-.orch}
verdict_only() {  # exit status $1 of run $2 is a recorded verdict (not exact)
  [ "$1" -eq 1 ] && [ -f "$home/runs/$2/audit.json" ]
}
rc=0; run_id=$($ORCH launch "$PROTOCOL" | tail -n 1) || rc=$?
if [ "$rc" -ne 0 ] && ! verdict_only "$rc" "$run_id"; then exit "$rc"; fi
echo "== orch audit $run_id"
rc=0; $ORCH audit "$run_id" || rc=$?
if [ "$rc" -ne 0 ] && ! verdict_only "$rc" "$run_id"; then exit "$rc"; fi
echo "== orch ledger (GPU-seconds by package kind)"
$ORCH ledger summary --by kind
$ORCH ledger verify
