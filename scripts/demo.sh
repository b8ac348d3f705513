#!/usr/bin/env bash
# `make demo`: the main job on the embedded default: launch the r3-mini protocol (CPU when there is no GPU),
# then the audit of that run, then the ledger's accounting. Everything goes to ./.orch (or $ORCH_HOME).
set -euo pipefail
cd "$(dirname "$0")/.."
ORCH=.venv/bin/orch
PROTOCOL=${PROTOCOL:-protocol/r3_mini.yaml}
echo "== orch verify: the working tree against the published commitment"
$ORCH verify manifests/r3_mini.json --root examples/r3_mini
echo "== orch launch $PROTOCOL"
run_id=$($ORCH launch "$PROTOCOL" | tail -n 1)
echo "== orch audit $run_id"
$ORCH audit "$run_id"
echo "== orch ledger (GPU-seconds by package kind)"
$ORCH ledger summary --by kind
$ORCH ledger verify
