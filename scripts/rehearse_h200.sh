#!/usr/bin/env bash
# The rehearsal of unmodified upstream R3 on one lent H200 (one device call): orch rehearse, then aggregate figures.
# Needs, beside the repository: .up/ (the upstream snapshot's modeling/ train/ data/ scripts/, from
# `git archive` of sen-ye/R3 e9912ac) and .whl/ (pydantic, transformers 4.49, tokenizers 0.21, huggingface_hub 0.29,
# openai 1.60 and deps, wandb 0.19 and deps, pytz): README "rehearse before you spend eight GPUs".
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# published evidence is never rewritten: each rehearsal is published under the orch commit it ran (the device's copy
# of the tree may have no .git: then give REHEARSAL_TAG), refused here, before any device time, if that name is taken
export REHEARSAL_TAG=${REHEARSAL_TAG:-$(git rev-parse --short HEAD 2>/dev/null || date -u +%Y%m%d)}
# CARD names the lent card in the published file (h200x1 by default; h100x1 on an H100)
PUB=docs/validation/rehearsal_${CARD:-h200x1}_$REHEARSAL_TAG
if [ -e "$PUB.json" ]; then
  echo "rehearse_h200: $PUB.json exists (published evidence is never rewritten): set REHEARSAL_TAG to a new name" >&2
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/rehearsal-out}; mkdir -p "$OUT"
H=/tmp/orch-home; rm -rf "$H"; mkdir -p "$H" /tmp/trainer-logs
python3 -c "import torch, transformers, pydantic; print('torch', torch.__version__, 'transformers', transformers.__version__)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
# the trainer's own log lives in the run's scratch, which orch deletes at the end: keep copies for diagnosis only
( while sleep 2; do cp -f "$H"/scratch/*/*.trainer.log /tmp/trainer-logs/ 2>/dev/null; done ) &
KEEP=$!
t0=$(date +%s)
timeout "${REHEARSE_TIMEOUT:-520}" python3 -m orchestrator.cli.orch rehearse protocol/r3_bagel7b_8xh100.yaml \
  --upstream .up --gpus 1 --home "$H" --json ${COMPILE_CACHE:+--compile-cache "$COMPILE_CACHE"} > "$OUT/rehearse.json" 2> "$OUT/rehearse.err"
rc=$?
kill $KEEP 2>/dev/null
echo "rehearse exit $rc after $(( $(date +%s) - t0 )) s"
tail -n 40 "$OUT/rehearse.err"
for f in /tmp/trainer-logs/*.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f"): last lines"; grep -v "eval_log\|Eval_" "$f" | tail -n 25
done
python3 scripts/rehearsal_summary.py "$H" "$OUT" || true
RUN=$(ls "$H/runs" | tail -n 1)
if [ -f "$H/runs/$RUN/audit.json" ]; then
  python3 -m orchestrator.cli.orch audit "$RUN" --home "$H" > "$OUT/audit.txt" 2>&1; echo "audit exit $?"
  cp "$H/runs/$RUN/audit.md" "$OUT/audit.md"
  python3 -m orchestrator.cli.orch publish "$RUN" --to "$PUB.json" --home "$H" && cp "$PUB.json" "$OUT/"
  cp "$OUT/rehearsal_findings.json" "$OUT/$(basename "$PUB")_findings.json" 2>/dev/null
  tail -n 60 "$OUT/audit.txt"
fi
