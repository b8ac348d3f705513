#!/usr/bin/env bash
# `make test` after the install and lint (Makefile): the unit and end-to-end tests in one pytest session on a worker a
# core (at most 4), with the Slurm acceptance subset beside them. The session sends whole test files to the workers
# (`--dist loadfile`: each module- or session-scoped fixture made once), the end-to-end files heaviest first by
# tests/e2e/durations.json, then the unit files, which fill the cores that the last launches leave idle: run apart,
# the two suites each ended with one core idle while the other finished its last file (e2e_durations.md has the
# figures). The Slurm subset (a local Slurm cluster: daemons that mostly wait) starts once Debian's packages are in
# (scripts/slurm_packages.sh, in the background since make test began) and runs on what the tests leave idle; its
# output goes to a log printed, whole, after theirs. Exit 0 when both passed, else 1.
set -u
cd "$(dirname "$0")/.."
BIN=.venv/bin
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/orch-make-test.XXXXXX")"
trap 'rm -rf "$LOGS"' EXIT

( bash scripts/slurm_packages.sh wait \
    && ORCH_SLURM_TESTS=ci "$BIN/pytest" -q -p no:cacheprovider --timeout=900 -m slurm_ci tests/e2e/test_slurm_e2e.py
) > "$LOGS/slurm.log" 2>&1 &
slurm=$!
rc=0
"$BIN/pytest" -q -p no:cacheprovider --timeout=600 -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder \
    --durations=20 tests/e2e tests/unit --ignore=tests/e2e/test_slurm_e2e.py || rc=1
slurm_rc=0
wait "$slurm" || slurm_rc=$?
echo "---- Slurm acceptance subset (run beside the tests above; exit $slurm_rc) ----"
cat "$LOGS/slurm.log"
[ "$slurm_rc" -eq 0 ] || rc=1
exit "$rc"
