# The doors of the project: make demo, make test, make lint, make bench.
# `make` installs everything into .venv; with no GPU, torch is pinned to the local CPU wheel (constraints-cpu.txt).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
CONSTRAINTS := $(if $(HAS_GPU),,-c constraints-cpu.txt)
TORCH_PIN := $(if $(HAS_GPU),torch>=2.6,torch==2.13.0)
STAMP := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: all install pyc lint test slurm-packages test-fast test-e2e test-trl test-slurm demo bench bench-freeze bench-ledger bench-digest bench-r3mini bench-probe bench-tuned bench-proof bench-startup bench-watch bench-null bench-floor bench-checkpoint bench-init-seal bench-verdict bench-trl attack mutation clean

all: test

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# one resolve: torch pinned and orch with its extras together (the extras' torch>=2.6 is then already met); the
	# bytecode compiled after it on every core instead of by pip on one. As pip does, a file that does not compile is
	# left out: torch/testing/_internal/py312_intrinsics.py is Python 3.12 syntax (docs/validation/e2e_durations.md)
	$(BIN)/pip install -q --no-compile $(CONSTRAINTS) "$(TORCH_PIN)" -e '.[workers,dev]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

install: $(STAMP)

# orch's own modules compiled once: Python reads a cached .pyc even where PYTHONDONTWRITEBYTECODE keeps it from writing
# one, and each interpreter of a launch (orch, its workers, every rank's probe) would otherwise compile what it imports
# again (docs/validation/e2e_durations.md has the figures: no change to a package's start-up was measured)
pyc: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 protocol orchestrator ledger workers manifests > /dev/null

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy protocol manifests orchestrator ledger

# lint, then the end-to-end launches and the unit tests in one session on a worker a core (at most 4 processes; a
# file's tests on one worker, so each module- or session-scoped fixture is made once; the end-to-end files heaviest
# first, then the unit files; each launch has its own home, lock directory and run id) with the Slurm acceptance subset
# beside them, on a local Slurm cluster whose Debian packages install in the background when
# ORCH_INSTALL_SYSTEM_PACKAGES=1 (.ci/run): scripts/test_suite.sh; docs/validation/e2e_durations.md has the times
test: slurm-packages lint pyc
	bash scripts/test_suite.sh

# starts the background install of Debian's Slurm packages where allowed (scripts/slurm_packages.sh); returns at once
slurm-packages:
	@bash scripts/slurm_packages.sh start

# the two suites of tests/: unit (fast) and e2e (real trainers end to end, every test `slow`)
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit --timeout=300 -n auto --maxprocesses 4

test-e2e: $(STAMP)
	$(BIN)/pytest -q tests/e2e --timeout=600

# TRL GRPO (examples/trl_grpo, docs/TRL_GRPO.md): installs the `trl` extra, then its end-to-end test (skipped by
# make test: it runs only with ORCH_TRL_TESTS=1)
test-trl: $(STAMP)
	$(BIN)/pip install $(CONSTRAINTS) -e '.[trl]'
	ORCH_TRL_TESTS=1 $(BIN)/pytest -q -p no:cacheprovider --timeout=1800 tests/e2e/test_trl_grpo.py

# all seven Slurm tests on a real local Slurm cluster, the two-node run on the shipped protocol (Debian's slurm-wlm,
# slurmdbd, mariadb-server, munge installed, as root; README "On a Slurm cluster"); installs nothing
test-slurm: $(STAMP)
	ORCH_SLURM_TESTS=1 $(BIN)/pytest -q tests/e2e/test_slurm_e2e.py --timeout=900

demo: pyc
	bash scripts/demo.sh

bench: bench-freeze bench-ledger bench-digest bench-r3mini bench-probe

bench-freeze: $(STAMP)
	$(BIN)/python bench/bench_freeze.py

bench-ledger: $(STAMP)
	$(BIN)/python bench/bench_ledger.py

# the probe's digest path against torch.sum on a 7B shard set and r3-mini's (< 3 min on one H200); --out FILE
bench-digest: $(STAMP)
	$(BIN)/python bench/bench_digest.py $(BENCH_DIGEST_ARGS)

bench-r3mini: $(STAMP)
	$(BIN)/python bench/bench_r3mini.py

bench-probe: $(STAMP)
	$(BIN)/python bench/bench_probe.py

# issue 51: each run's GPU-seconds beyond its timed A, C, B, and their share: N launches in a fresh home (the first
# primes and keeps its cache, the later ones load it); BENCH_PROOF_ARGS: --protocol P --runs N, or --home DIR; --out F
bench-proof: $(STAMP)
	$(BIN)/python bench/bench_proof.py $(or $(BENCH_PROOF_ARGS),--protocol protocol/r3_mini.yaml --runs 2)

# issue 31: the tuned-kernel toy's identical candidate on cold caches with 2 ranks forced to tune apart, N launches
# (~2 min each on 2 cores); BENCH_TUNED_ARGS="--runs 20 --out FILE"
bench-tuned: $(STAMP)
	$(BIN)/python bench/bench_tuned_kernels.py $(BENCH_TUNED_ARGS)

# per-package start-up phase by phase on r3-mini's 2 CPU ranks (BENCH_STARTUP_ARGS: --launches N, --floor, --out FILE)
bench-startup: $(STAMP)
	$(BIN)/python bench/bench_startup.py $(BENCH_STARTUP_ARGS)

# the probe's forbidden-dtype watch: a watched CPU step bare, under a pass-through dispatch mode, under the watch
# (BENCH_WATCH_ARGS: --root DIR for another checkout's watch, several allowed; --out FILE)
bench-watch: $(STAMP)
	$(BIN)/python bench/bench_watch.py $(BENCH_WATCH_ARGS)

# one device call (~8 min on one H200): null runs with repeats and a known 25% slowdown; figures under $$OUT
bench-null: $(STAMP)
	$(BIN)/python bench/bench_null.py $(BENCH_NULL_ARGS)

# issue 50: orch's own noise against the host's floor in one call: the GPU-bound r3-mini as plain fresh launches (no
# orch) and as orch A/A triplets (orch calibrate); both SDs of the paired d, both A/B drifts, GPU-busy; figures under
# $$OUT (~6 min on one H100/H200). BENCH_FLOOR_ARGS="--device cpu --small --plain-triplets 1 --orch-triplets 2" on CPU
bench-floor: $(STAMP)
	$(BIN)/python bench/bench_floor.py $(BENCH_FLOOR_ARGS)

# issue 51: the shared initial state's checks over a K = 1 plan and an A/A launch, hashed after every package (as
# before) and after the last package that reads it (now), alternated; BENCH_INIT_SEAL_ARGS: --gib 3.24 (r3-mini's
# GPU-bound 3.48 GB), --repeats 3, --out FILE (~3 min on 2 cores)
bench-init-seal: $(STAMP)
	$(BIN)/python bench/bench_init_seal.py $(BENCH_INIT_SEAL_ARGS)

# the probe's end-of-launch checkpoint saved with and without the zip records' CRC32, alternated, medians; the loaded
# tensors checked equal (BENCH_CHECKPOINT_ARGS: --gib 2, --repeats 3, --device cuda, --out FILE; ~1 min on 2 cores)
bench-checkpoint: $(STAMP)
	$(BIN)/python bench/bench_checkpoint.py $(BENCH_CHECKPOINT_ARGS)

# issue 28: TRL GRPO's candidate without orch (gradient checkpointing on vs off, TRL's own script on 2 CPU ranks,
# 3 alternated runs each, ~3 min); installs the trl extra. BENCH_TRL_ARGS="--device cuda --size 16x1536x256 ..." sizes
# the one-GPU recipe: per size the spread of step times between fresh launches, the generation share, the ratio
bench-trl: $(STAMP)
	$(BIN)/pip install -q $(CONSTRAINTS) -e '.[trl]'
	$(BIN)/python bench/bench_trl_gc.py $(BENCH_TRL_ARGS)

# issue 26: the verdict's false accepts and power. --sim (default, ~5 min on one core) writes
# docs/validation/verdict_simulation.json; BENCH_VERDICT_ARGS="--real --streams 8 --budget-s 520" launches r3-mini
bench-verdict: $(STAMP)
	$(BIN)/python bench/bench_verdict.py $(or $(BENCH_VERDICT_ARGS),--sim)

# issue 17's attacks re-run for real on r3-mini (CPU): cheats, faults, tampers, bad inputs; slow (~30-40 min on 2
# busy cores), not part of `make test`. ATTACK_ARGS="--only input,tamper" for some families. Writes
# docs/validation/attack_battery_cpu.json.
attack: $(STAMP)
	nice -n 5 $(BIN)/python bench/attack/battery.py $(ATTACK_ARGS)

# mutation testing of the core (docs/MUTATION.md); not in CI. MODULES="ledger/verdict/decide/windows.py ..." for some,
# MUTATION_TIMEOUT seconds per module. mutmut is installed here, not in the dev extra, so CI's install stays as it is.
MUTMUT_PIN := mutmut>=3.8,<4
MUTATION_TIMEOUT ?= 1800
mutation: $(STAMP)
	@$(BIN)/python -c "import mutmut" 2>/dev/null || $(BIN)/pip install -q $(CONSTRAINTS) "$(MUTMUT_PIN)"
	$(BIN)/python scripts/mutation.py --timeout $(MUTATION_TIMEOUT) $(MODULES)

clean:
	rm -rf $(VENV) .orch .mypy_cache .ruff_cache .pytest_cache .mutation
