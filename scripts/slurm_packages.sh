#!/usr/bin/env bash
# Debian's Slurm packages for the Slurm acceptance tests of `make test` (README "On a Slurm cluster").
#   scripts/slurm_packages.sh start   returns at once; when they are missing and installing is allowed
#                                     (ORCH_INSTALL_SYSTEM_PACKAGES=1, which .ci/run sets; root; apt-get), installs
#                                     them with apt-get in the background (~70 s, behind lint and the unit tests)
#   scripts/slurm_packages.sh wait    waits for that and prints one line: the packages are there, or why the Slurm
#                                     tests will skip (they then skip, naming what is missing)
# Never installs anything unless ORCH_INSTALL_SYSTEM_PACKAGES=1. State and apt's log: .slurm-packages/ (git-ignored).
set -u
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."
STATE=.slurm-packages
PACKAGES="slurm-wlm slurmdbd munge mariadb-server"
# what tests/e2e/slurm_cluster.py's missing() needs (the commands, and slurmdbd's MySQL plugin)
COMMANDS="munged mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sacctmgr srun sacct salloc sbatch scontrol"
PLUGIN=/usr/lib/x86_64-linux-gnu/slurm-wlm/accounting_storage_mysql.so

present() {
    local c
    for c in $COMMANDS; do
        command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || return 1
    done
    [ -e "$PLUGIN" ]
}

say() { echo "$*" > "$STATE/status"; }

install() {  # in the background: its outcome as one line in $STATE/status
    local t0 rc policy=""
    t0=$(date +%s)
    if [ ! -e /usr/sbin/policy-rc.d ]; then  # no daemon of the packages started by their install scripts
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local opts=(-q -y -o Acquire::Retries=2 -o Acquire::http::Timeout=30 -o DPkg::Lock::Timeout=300)
    timeout 300 apt-get "${opts[@]}" update > "$STATE/apt.log" 2>&1
    local updated=$?
    timeout 900 apt-get "${opts[@]}" install --no-install-recommends $PACKAGES >> "$STATE/apt.log" 2>&1
    rc=$?
    [ -n "$policy" ] && rm -f /usr/sbin/policy-rc.d
    if [ $rc -eq 0 ] && present; then
        say "slurm: installed $PACKAGES with apt-get in $(( $(date +%s) - t0 )) s: the Slurm acceptance tests run"
    else
        local last
        last=$(grep -E '^(E:|W:|Err)' "$STATE/apt.log" | tail -1 | cut -c1-160)
        say "slurm: apt-get install failed (exit $rc, update exit $updated${last:+: $last}): the Slurm tests skip" \
            "(log: $STATE/apt.log)"
    fi
}

start() {
    mkdir -p "$STATE"
    rm -f "$STATE/status" "$STATE/pid"
    if present; then
        say "slurm: Debian's Slurm packages are installed: the Slurm acceptance tests run"
    elif [ "${ORCH_INSTALL_SYSTEM_PACKAGES:-0}" != 1 ]; then
        say "slurm: Debian's Slurm packages are not installed (ORCH_INSTALL_SYSTEM_PACKAGES=1, as in .ci/run, lets" \
            "make test install them): the Slurm tests skip"
    elif [ "$(id -u)" != 0 ]; then
        say "slurm: Debian's Slurm packages are not installed and this is not root: the Slurm tests skip"
    elif ! command -v apt-get >/dev/null 2>&1; then
        say "slurm: Debian's Slurm packages are not installed and there is no apt-get: the Slurm tests skip"
    else
        nice -n 10 bash "$SELF" install < /dev/null > /dev/null 2>&1 &
        echo $! > "$STATE/pid"
        echo "slurm: installing $PACKAGES with apt-get in the background (log: $STATE/apt.log)"
    fi
}

wait_done() {
    if [ -s "$STATE/pid" ]; then
        local pid
        pid=$(cat "$STATE/pid")
        while kill -0 "$pid" 2>/dev/null && [ ! -s "$STATE/status" ]; do
            sleep 1
        done
    fi
    if [ -s "$STATE/status" ]; then
        cat "$STATE/status"
    elif present; then
        echo "slurm: Debian's Slurm packages are installed: the Slurm acceptance tests run"
    else
        echo "slurm: Debian's Slurm packages are not installed (no install was started: make test starts it): the" \
             "Slurm tests skip"
    fi
}

case "${1:-}" in
    start) start ;;
    install) mkdir -p "$STATE"; install ;;
    wait) wait_done ;;
    *) echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
