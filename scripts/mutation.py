"""`make mutation`: mutmut 3 over the core modules, each against the fast tests that cover it; a score per module.

Each module runs in its own scratch copy of the tree (.mutation/<module>/), so that mutmut's `mutants/` folder and
its per-function test selection never mix modules. Not part of CI (minutes per module on two cores).

    python scripts/mutation.py                      # every module of MODULES
    python scripts/mutation.py ledger/verdict/decide/windows.py    # some of them
    python scripts/mutation.py --timeout 900 --max-children 2 --json .mutation/scores.json
    python scripts/mutation.py --list ledger/verdict/decide/stats.py   # its mutants and named equivalents, no tests
    python scripts/mutation.py --pin ledger/verdict/decide/stats.py    # after reading --list: pin each one's diff

mutmut names a mutant by its position in its function, so code added above it renumbers the mutants after it, and a
name judged equivalent can come to mean another mutant. Each named equivalent is therefore pinned to the diff it was
judged on (scripts/mutation_equivalents.json); a name whose mutant's diff is no longer the pinned one is `moved`:
counted by its result like any other mutant, and listed, until it is judged again and re-pinned.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRATCH = REPO / ".mutation"
PINS = Path(__file__).resolve().with_name("mutation_equivalents.json")  # module -> name -> the diff judged
PACKAGES = ["protocol", "manifests", "orchestrator", "ledger", "workers"]


@dataclass(frozen=True)
class Target:
    """A module that decides a verdict or protects evidence, and the fast test files that cover it."""

    tests: tuple[str, ...]
    forkserver: bool = False  # modules whose tests import torch: fork workers from a clean server, not from pytest
    # mutants that cannot change behaviour, by mutmut name, with the reason: counted apart, never as survivors
    equivalent: dict[str, str] = field(default_factory=dict)
    # test ids (file::name) left out of the selection: tests too slow to rerun per mutant, whose rule the mutated
    # module does not hold (e.g. a cross-process lock, for the record model); each one named with its reason
    deselect: dict[str, str] = field(default_factory=dict)
    # mutmut stops a mutant after (estimated test time + 5 s) * this * 2 CPU seconds and counts it as a timeout
    # (caught); a module whose loops a mutant can make endless waits less on each with a smaller factor
    timeout_multiplier: float = 10.0


MODULES: dict[str, Target] = {
    "ledger/verdict/decide/windows.py": Target(("tests/unit/test_windows.py",), equivalent={
        **dict.fromkeys(
            ("ledger.verdict.decide.windows.x__window__mutmut_7", "ledger.verdict.decide.windows.x__window__mutmut_10",
             "ledger.verdict.decide.windows.x__window__mutmut_11"),
            "zip(ROLES, (a, c, b), strict=...): both are always three long, strictness cannot change a result"),
        "ledger.verdict.decide.windows.x__window__mutmut_53":
            "'faster' if ratio >= 1.0: the words branch runs only beyond the noise, and a ratio of exactly 1 is always "
            "within it (|1 - 1| = 0 <= noise)",
    }),
    # stats.py was rewritten for the paired verdict (issue 26, b90d406 / 6a1824b): the equivalents named for the
    # unpaired interval (_betacf, _betainc, t_cdf, speedup_interval, the old triplets_needed) are gone with it
    "ledger/verdict/decide/stats.py": Target(("tests/unit/test_stats.py", "tests/unit/test_noise.py",
                                              "tests/unit/test_verdict_positions.py"), equivalent={
        # triplets_needed as rewritten for the carried A/A mean (issue 50, 2026-12-07): the loop's start is a lower
        # bound of the answer and reached(k) is monotone, so any start between 201 and the answer gives the same K
        "ledger.verdict.decide.stats.x_triplets_needed__mutmut_8":
            "the normal quantile at 0.5 - level / 2: -z (to rounding), and only its square is read: the same room and "
            "the same start (an ulp of room at its exact 0 leaves no K either: t > z)",
        "ledger.verdict.decide.stats.x_triplets_needed__mutmut_11":
            "the normal quantile at 0.5 + level / 3: a smaller z, so a larger room (no early None where the t-based "
            "loop finds no K either, up to MAX_TRIPLETS) and a smaller start, still a lower bound",
        "ledger.verdict.decide.stats.x_triplets_needed__mutmut_13":
            "room = goal^2 + z^2 c: never the early None, but then no K passes t * sqrt(c) > goal either; a smaller "
            "start, still a lower bound",
        "ledger.verdict.decide.stats.x_triplets_needed__mutmut_14":
            "room = 2 goal - z^2 c (larger: goal < 2): the early None only later, where no K passes either; a smaller "
            "start, still a lower bound",
        "ledger.verdict.decide.stats.x_triplets_needed__mutmut_52":
            "the first loop up to K = 201 instead of 200: the stepping loop starts at K >= 201 and applies the same "
            "condition, so K = 201 is answered alike",
        "ledger.verdict.decide.stats.x_triplets_needed__mutmut_61":
            "the start z^2 sd^2 * room (tiny): max(201, ...) = 201, from which the loop steps up to the same K",
        "ledger.verdict.decide.stats.x_paired_interval__mutmut_90":
            "cal_df for every source (`or True`): the other source, the run's own SD, has df = K - 1, so spread.df - "
            "(K - 1) is 0 there as well",
    }),
    "ledger/verdict/decide/decision.py": Target(("tests/unit/test_decision.py", "tests/unit/test_stats.py",
                                                 "tests/unit/test_audit.py", "tests/unit/test_noise.py",
                                                 "tests/unit/test_sequential_ab_check.py",
                                                 "tests/unit/test_sequential_outlier_check.py",
                                                 "tests/unit/test_decision_branches.py",
                                                 "tests/unit/test_decision_positions.py"), equivalent={
        "ledger.verdict.decide.decision.x__fmt__mutmut_1":
            "f'{inf:.4f}' is 'inf' too: _fmt is given an interval's ends, exp(...) or 0.0 and inf, never -inf",
        "ledger.verdict.decide.decision.x__call__mutmut_7":
            "'faster' if low >= 1.0: an interval with low == 1 covers 1, so _call has returned None before",
    }),
    "ledger/cost/merkle.py": Target(("tests/unit/test_merkle.py",), equivalent={
        "ledger.cost.merkle.x__subproof__mutmut_27": "complete=None instead of False: only its truth is read",
        **dict.fromkeys(
            ("ledger.cost.merkle.x_prefix_roots__mutmut_16", "ledger.cost.merkle.x_prefix_roots__mutmut_29",
             "ledger.cost.merkle.x_prefix_roots__mutmut_30"),
            "prefix_roots' heights are only compared with each other for equality: starting at 1, or counting "
            "by -1 or 2, relabels every height one-to-one and merges exactly the same subtrees"),
        "ledger.cost.merkle.x_parse_head__mutmut_3": "rpartition instead of partition: the two differ only on a "
            "text with two or more colons, whose root (partition) or size (rpartition) then holds a colon; both are "
            "refused in the same words",
    }),
    "manifests/core.py": Target(("tests/unit/test_manifest_rules.py", "tests/unit/test_manifests.py"), equivalent={
        **dict.fromkeys(
            [f"manifests.core.xǁManifestǁto_json__mutmut_{n}" for n in (7, 10, 13, 14)],
            "model_dump in python mode instead of mode='json' (pydantic reads an unknown mode as python): every "
            "field of a manifest is a str, an int or a list of them, which both modes dump the same"),
        **dict.fromkeys(
            [f"manifests.core.x__walk__mutmut_{n}" for n in (12, 13, 19, 20)],
            "follow_symlinks of is_dir/is_file changed: symlinks are taken by the is_symlink() branch before, so "
            "the entries asked are never links and following changes nothing"),
        "manifests.core.x__walk__mutmut_11": "a symlink listed with is_regular_file True: select_files reads that "
                                             "flag only for entries that are not links",
        "manifests.core.x__walk__mutmut_18": "a regular file listed as a link: select_files then resolves it, finds "
                                             "it inside the root (folder links are never entered) and a file, and "
                                             "keeps it, as it keeps a regular file; a FIFO is dropped either way",
        **dict.fromkeys(
            ("manifests.core.x_select_files__mutmut_16", "manifests.core.x_select_files__mutmut_18"),
            "dict.fromkeys(include, None) instead of False: the flags are only read as `not hit`"),
        "manifests.core.x__hash_in_children__mutmut_12": "a child that fails unexpectedly exits 2 instead of 1: "
                                                         "the parent reads any non-zero status the same",
    }, timeout_multiplier=2.0),  # glob_regex's `i += n` mutants loop forever: 4x the tests' CPU time is enough
    "protocol/recipe.py": Target(("tests/unit/test_recipe.py", "tests/unit/test_protocol.py",
                                  "tests/unit/test_model_declared.py")),
    # the short form's rendering (issue 33) and the calibration's workload id are tested in their own
    # files: test_recipe_short_form.py and test_calibrate.py
    "protocol/schema.py": Target(("tests/unit/test_schema_rules.py", "tests/unit/test_protocol.py",
                                  "tests/unit/test_model_declared.py", "tests/unit/test_recipe.py",
                                  "tests/unit/test_recipe_short_form.py", "tests/unit/test_calibrate.py"), equivalent={
        **dict.fromkeys(
            [f"protocol.schema.x_canonical_json__mutmut_{n}" for n in (2, 4, 6, 7)],
            "model_dump in python mode (mode None, left out, or a word pydantic does not know): every field of a "
            "protocol is a str, number, bool, list, dict or None, which python mode gives exactly as json mode"),
        **dict.fromkeys(
            [f"protocol.schema.x_canonical_json__mutmut_{n}" for n in (13, 15, 17, 19, 21, 25, 27, 29)],
            "a default dropped from .get / .pop: model_dump always holds every section and every key of them, so "
            "no default is ever used"),
        "protocol.schema.x_canonical_json__mutmut_33": "the sequential keys popped without a default: model_dump "
                                                      "holds every field of measurement, and no earlier pop takes "
                                                      "them (they are not among _LATER_DEFAULTS)",
        "protocol.schema.x_canonical_json__mutmut_37": "ensure_ascii=None instead of False: only its truth is read",
        "protocol.schema.x_baseline_workload_id__mutmut_23": "ensure_ascii=None instead of False: only its truth is "
                                                             "read",
        **dict.fromkeys(
            ("protocol.schema.x_baseline_workload_id__mutmut_6", "protocol.schema.x_baseline_workload_id__mutmut_9"),
            "name, scorer, timeouts and arms.candidate popped without a default: the canonical JSON always holds "
            "them (canonical_json drops only the later fields model, rehearsal and recipe_file)"),
        "protocol.schema.x_json_schema__mutmut_1": "by_alias=None: pydantic's json schema then keeps its default, "
                                                   "aliases (the test sees 'schema', never 'schema_')",
    }),
    "ledger/verdict/decide/exactness.py": Target(
        ("tests/unit/test_exactness_rules.py", "tests/unit/test_exactness_run.py", "tests/unit/test_audit.py"),
        equivalent={
        "ledger.verdict.decide.exactness.x_first_digest_mismatch__mutmut_44":
            "tensor_mismatch = None instead of False: it is only read as `not tensor_mismatch`",
        **dict.fromkeys(
            [f"ledger.verdict.decide.exactness.x_replay_mismatch__mutmut_{n}" for n in (52, 55, 56)],
            "zip(labels, (train, watch), strict=...): both are always two long, strictness cannot change a result"),
    }),
    # test_audit.py and test_witness.py reach audit_run too, through whole audits (each plots, some audit 2-4 runs):
    # with them a run of the 355 mutants took over 30 minutes; test_audit_rules.py pins each rule of this module
    "ledger/verdict/documents/audit.py": Target(
        ("tests/unit/test_audit_rules.py", "tests/unit/test_audit_evidence.py", "tests/unit/test_calibrate.py",
         "tests/unit/test_verdict_positions.py"),
        equivalent={
        "ledger.verdict.documents.audit.x__append_audit_record__mutmut_20":
            "arm=None left out of ledger.append: a ledger record's arm defaults to None",
        "ledger.verdict.documents.audit.x__append_audit_record__mutmut_25":
            "gpus=0 left out of ledger.append: a ledger record's gpus defaults to 0",
        "ledger.verdict.documents.audit.x_audit_run__mutmut_35":
            "min(..., default=None) without the default: it is used only for a run without ledger records, which "
            "collect_evidence has refused before (every package needs its records)",
        **dict.fromkeys(
            ("ledger.verdict.documents.audit.x_unseal_score__mutmut_33",
             "ledger.verdict.documents.audit.x_unseal_score__mutmut_30"),
            "bytes.decode without 'utf-8', or with 'UTF-8': the default codec is UTF-8, names are case-insensitive"),
        "ledger.verdict.documents.audit.x_audit_run__mutmut_156":
            "the audit records of every run searched for this audit's digest, not only this run's: audit.json holds "
            "its run_id, so another run's audit record never has this digest",
        "ledger.verdict.documents.audit.x_audit_command__mutmut_2":
            "Console(highlight=None): rich keeps it as the console's highlight setting, and None is off, as False",
        "ledger.verdict.documents.audit.x_audit_command__mutmut_66":
            "the first reason taken even when there is none: the reasons are empty only for `accepted` (not exact: its "
            "problems; otherwise the decision's sentence), whose exit code is 0, so this line is never reached then",
    }),
    # the audit's whole-run tests (test_audit.py, test_audit_hardening.py) reach every function here too, at 1-2 s
    # each for every surviving mutant; the rules are pinned one by one in test_evidence_rules.py, the recipe copy's
    # checks in test_recipe.py and the calibration run's evidence in test_calibrate.py; the packages a recorded run is
    # read with (sequential, primed, A/A, trailing reload, recipe copy) in test_evidence_plan.py
    "ledger/verdict/decide/evidence.py": Target(
        ("tests/unit/test_evidence_rules.py", "tests/unit/test_evidence_plan.py", "tests/unit/test_audit_evidence.py",
         "tests/unit/test_integrity.py", "tests/unit/test_run_record.py", "tests/unit/test_recipe.py",
         "tests/unit/test_calibrate.py", "tests/unit/test_evidence_paths.py", "tests/unit/test_audit.py",
         "tests/unit/test_audit_rules.py"),
        equivalent={
        **dict.fromkeys(
            [f"ledger.verdict.decide.evidence.x__package_problems__mutmut_{n}" for n in (8, 9, 13, 14)],
            "the count of a package's open records starting at 1, counting by 2 or by -1, or kept at 1: it is only "
            "read for its truth, and every variant is non-zero exactly when the package has an open record"),
        **dict.fromkeys(
            ("ledger.verdict.decide.evidence.x__package_problems__mutmut_26",
             "ledger.verdict.decide.evidence.x__package_problems__mutmut_28"),
            "opens.get(name, None) / opens.get(name) for a package without an open record: None is false, as 0"),
        **dict.fromkeys(
            [f"ledger.verdict.decide.evidence.x_collect_evidence__mutmut_{n}" for n in (28, 29, 211)],
            "the value a missing piece starts with (protocol_sha '' as None or 'XXXX', n_steps 0 as 1 without a "
            "protocol): each is kept only when that piece is there, and without it the run is refused before the "
            "value is used or returned"),
        "ledger.verdict.decide.evidence.x_collect_evidence__mutmut_97":
            "the trailing reload's name read as a fixed design's (sequential None): it is read only for an A/A launch "
            "of `orch calibrate`, whose protocol is always a fixed design of one triplet (orchestrator/run/"
            "calibrate.py sets repeats 1 and drops repeats: auto's rule), so sequential is False there either way",
        "ledger.verdict.decide.evidence.x_collect_evidence__mutmut_98":
            "the trailing reload's name read without the prime (prime None): it is the plan's last name, which the "
            "prime, the plan's second, never is",
        "ledger.verdict.decide.evidence.x_collect_evidence__mutmut_250":
            "`continue` -> `break` past a launch whose reload is not in the plan: only an A/A launch drops a reload, "
            "and only its trailing one (protocol.plan), the reload of the last label of launch_labels, so the loop "
            "has no iteration left to skip",
        **dict.fromkeys(
            [f"ledger.verdict.decide.evidence.x_collect_evidence__mutmut_{n}" for n in (333, 334, 335, 336, 343)],
            "`or` -> `and` after `problems` in the refusal's condition: each later term implies a problem line (a "
            "missing run.json, protocol, result or replay adds one, and every package in `bad` has its line; 343 is "
            "the `or` inside the term of a run that is not a calibration, where a missing score or replay adds its "
            "line too), so the condition is `problems` either way; the terms narrow the types for mypy"),
    }),
    # test_audit.py's altered-evidence tests reach verify_integrity through whole audits (1-2 s each per surviving
    # mutant); test_integrity_rules.py pins each check on its own
    "ledger/verdict/decide/integrity.py": Target(("tests/unit/test_integrity_rules.py",
                                                  "tests/unit/test_integrity.py")),
    "ledger/cost/record.py": Target(("tests/unit/test_ledger_record.py", "tests/unit/test_ledger_store.py",
                                     "tests/unit/test_ledger_chain.py"), deselect={
        "tests/unit/test_ledger_store.py::test_two_processes_append_concurrently":
            "two processes append 500 records each under the ledger's flock (5,000 and about 20 s before 9748a0d): a "
            "rule of the store's lock, not of the record model, whose every function the other tests reach",
    }, equivalent={
        **dict.fromkeys(
            ("ledger.cost.record.x_record_message__mutmut_16", "ledger.cost.record.x_record_message__mutmut_17"),
            "the same 'Z' replacement in record_message: a record's times are validated to end in an upper-case 'Z', "
            "which fromisoformat reads itself on Python >= 3.11"),
        **dict.fromkeys(
            ("ledger.cost.record.x_canonical_json__mutmut_2", "ledger.cost.record.x_canonical_json__mutmut_3"),
            "ensure_ascii=None / allow_nan=None instead of False: json.dumps reads only their truth"),
    }),
    "ledger/cost/store.py": Target(("tests/unit/test_ledger_store_paths.py", "tests/unit/test_ledger_store.py",
                                    "tests/unit/test_ledger_chain.py", "tests/unit/test_ledger_accounting.py"),
                                   deselect={
        "tests/unit/test_ledger_store.py::test_two_processes_append_concurrently":
            "two processes append 500 records each (about 4 s, paid again per surviving mutant; 5,000 and 27 s before "
            "9748a0d); the lock's exclusivity is pinned in half a second by test_ledger_store_paths.py's reader-lock "
            "test",
    }, equivalent={
        **dict.fromkeys(
            ("ledger.cost.store.xǁLedgerǁtable__mutmut_12", "ledger.cost.store.xǁLedgerǁrecords__mutmut_8",
             "ledger.cost.store.xǁLedgerǁ_record_hashes_of__mutmut_3", "ledger.cost.store.xǁLedgerǁverify__mutmut_3"),
            "the framed columns (or the fast verify) also asked for an empty ledger: _columns returns None below the "
            "schema message's size, so the same fallback runs"),
        **dict.fromkeys(
            [f"ledger.cost.store.xǁLedgerǁrecords__mutmut_{n}" for n in (23, 24, 29)],
            "the run_id match's nulls filled with None or True, or zero_copy_only=None: run_id is never null, and "
            "only the truth of zero_copy_only is read"),
        "ledger.cost.store.xǁLedgerǁverify__mutmut_20": "the record hashes gathered without a head to check: they "
                                                        "are read only for that check",
        "ledger.cost.store.xǁLedgerǁappend__mutmut_40": "the version also read from an empty file: file_version of "
                                                        "no bytes is the latest, as the else branch says",
        "ledger.cost.store.xǁLedgerǁappend__mutmut_56": "fields.pop('user') without a default: append has set "
                                                        "fields['user'] just before, so the key is always there",
        "ledger.cost.store.xǁLedgerǁappend__mutmut_82": "the refusal's field path joined with 'XX.XX': a ledger "
                                                        "record's fields are flat, so the path has one part",
        "ledger.cost.store.xǁLedgerǁappend__mutmut_95": "schema_message(None) for a new file: schema_of(None) is the "
                                                        "version 2 schema, the latest, as for LATEST",
    }),
    "ledger/cost/verify.py": Target(("tests/unit/test_ledger_verify_rules.py", "tests/unit/test_ledger_store.py",
                                     "tests/unit/test_ledger_chain.py"), deselect={
        "tests/unit/test_ledger_store.py::test_two_processes_append_concurrently":
            "two processes append 500 records each (about 4 s, paid again per surviving mutant; 5,000 and 20-30 s "
            "before 9748a0d): a rule of the store's lock; of the verifier it asserts only that a good ledger "
            "verifies, which test_ledger_verify_rules.py asserts of the vectorised pass itself (checked by hand: it "
            "lets _chain_chunk 1 and verify_slow 64 through)",
        "tests/unit/test_ledger_store.py::test_two_process_verify_names_the_first_bad_seq":
            "its forked verifier children are not guarded: a mutant that sends the child back into the caller's code "
            "(_shared_chunks 46, 55) makes every child run the rest of the pytest session and fork again (about 200 "
            "processes in the fourth session's run); the same two-process rules (both take chunks, each chunk once, "
            "a bad chunk stops both, the first bad seq named) are asserted under the os._exit guard by "
            "test_ledger_verify_rules.py, with fixed values instead of random bit flips",
    }, equivalent={
        "ledger.cost.verify.x__shared_chunks__mutmut_56": "the hashing child leaves with status 1 instead of 0: _reap "
            "only waits for it and never reads its status; what it hashed comes back through the shared map",
        "ledger.cost.verify.x__shared_chunks__mutmut_59": "the stop byte set to 2 instead of 1 when `meanwhile` fails: "
            "it is only ever compared with 0",
        "ledger.cost.verify.x__shared_chunks__mutmut_84": "a chunk redone here marked 3 instead of 2 when bad: a "
            "chunk's state is only ever compared with 0 and 1",
        "ledger.cost.verify.x__reap__mutmut_1": "a grace of 61 s instead of 60 for a stuck child: the default is "
                                                "only reached when the child hangs, and then both kill it",
        "ledger.cost.verify.x__reap__mutmut_4": "`<=` for `<` at the grace deadline: differs only when "
                                                "time.monotonic() equals the deadline to the last bit",
        "ledger.cost.verify.x__reap__mutmut_12": "suppress(None) around the kill: os.kill of our own child that is "
                                                 "not yet reaped never raises ProcessLookupError (a zombie keeps its "
                                                 "pid; with SIGCHLD ignored the waitpid before raises already)",
        **dict.fromkeys(
            ("ledger.cost.verify.x__take_chunks__mutmut_25", "ledger.cost.verify.x__take_chunks__mutmut_27"),
            "a bad chunk's state written as 1 or 3 instead of 2: the same bad chunk sets the stop byte, and with it "
            "set the pass fails whatever the chunk states hold"),
        "ledger.cost.verify.x__take_chunks__mutmut_30": "the stop byte set to 2 instead of 1: it is only read as "
                                                        "`== 0`",
        **dict.fromkeys(
            ("ledger.cost.verify.x_verify_slow__mutmut_172", "ledger.cost.verify.x_verify_slow__mutmut_174"),
            "TypeError dropped from the suppress around bytes.fromhex(str(...)): it is given a str, and raises only "
            "ValueError, which is still matched first"),
        **dict.fromkeys(
            [f"ledger.cost.verify.x__chain_chunk__mutmut_{n}" for n in (69, 72, 73, 97, 100, 101)],
            "zip(c_lo, c_hi, strict=...) and zip(m_lo, m_hi, strict=...): each pair is cut from the same arrays to "
            "the same length, so strictness cannot change a result"),
        **dict.fromkeys(
            ("ledger.cost.verify.x__chain_chunk__mutmut_78", "ledger.cost.verify.x__chain_chunk__mutmut_79",
             "ledger.cost.verify.x__chain_chunk__mutmut_80"),
            "the file size appended to the message bounds always, or never: the bounds are cut to top - lo - 1 "
            "messages, which never reach that last entry (the ledger's last message is pinned by no later digest)"),
        "ledger.cost.verify.x_verify_fast__mutmut_8": "cols.part(None, 1): starts[None:1] is starts[:1]",
        "ledger.cost.verify.x__shared_chunks__mutmut_23": "one more byte in the chunk-state map: never read",
        **dict.fromkeys(
            ("ledger.cost.verify.x__shared_chunks__mutmut_29", "ledger.cost.verify.x__shared_chunks__mutmut_30"),
            "the pipe's write end blocking, or suppress(None) around the write: at most MAX_CHUNKS ids of 4 bytes "
            "(64 000) are written, which fit the pipe's 64 KiB, so the write neither blocks nor raises"),
        "ledger.cost.verify.x__shared_chunks__mutmut_43": "the OpenSSL warm-up hashes b'XXXX' instead of b'': the same "
                                                          "digest lookup",
        "ledger.cost.verify.x_verify_fast__mutmut_123": "the file size passed to a chunk as None: _chain_chunk's "
                                                        "bounds never reach it (as _chain_chunk 78-80)",
        "ledger.cost.verify.x_verify_fast__mutmut_138": "a chunk's job checking up to (i + 2) * chunk: the same "
                                                        "links and the next chunk's, a superset; the verdict is the "
                                                        "same",
        **dict.fromkeys(
            [f"ledger.cost.verify.x_verify_fast__mutmut_{n}" for n in (58, 59, 62, 63)],
            "the last record's hash gathered through part(None, n), part(n - 1, None), part(n + 1, n) or part(n - 2, "
            "n): hex64 reads the extracted value's offset from the whole map (as for the first record's digests)"),
        "ledger.cost.verify.x_verify_fast__mutmut_47": "cols.part(n - 1, None): starts[n - 1:] is starts[n - 1:n]",
        **dict.fromkeys(
            [f"ledger.cost.verify.x_verify_fast__mutmut_{n}" for n in (23, 24, 27, 28)],
            "the first record's digests gathered through part(None, 1), part(0, None), part(1, 1) or part(0, 2): hex64 "
            "reads the extracted values' offsets from the whole map, and the part's size only decides whether their "
            "64-character check runs; the words gathered are then compared byte for byte with the genesis values"),
        "ledger.cost.verify.x__chain_chunk__mutmut_7": "a chunk checked to two records past its end instead of one: "
                                                       "it checks the same links and one more, which the next chunk "
                                                       "checks too; a good ledger passes and a bad one fails either "
                                                       "way",
        "ledger.cost.verify.x_verify_slow__mutmut_23": "b'XXXX' for b'' as the bytes before the first message when "
                                                       "there is none: prev_message is read only for a message",
        "ledger.cost.verify.x_verify_slow__mutmut_39": "'XXXX' for '' as the hash to chain to after a message that "
                                                       "does not decode: a valid prev_hash is 64 hex characters, so "
                                                       "neither matches it (only a record whose own prev_hash is '', "
                                                       "already refused by its schema, would get one more line)",
    }),
    "ledger/files/hygiene.py": Target(("tests/unit/test_hygiene_rules.py", "tests/unit/test_hygiene.py"), equivalent={
        **dict.fromkeys(
            [f"ledger.files.hygiene.x__data_listing__mutmut_{n}" for n in (1, 5, 6)]
            + ["ledger.files.hygiene.x__reward_lines__mutmut_1"],
            "the first line's number and example start as None or 'XXXX': they are set at the first counted line and "
            "read only when there are 3 or 20 of them (first is tested with `not` / `or`, where None is 0)"),
        **dict.fromkeys(
            ("ledger.files.hygiene.x__git_files__mutmut_3", "ledger.files.hygiene.x__git_files__mutmut_6"),
            "subprocess.run's check=False dropped or None: False is its default, and only its truth is read"),
        "ledger.files.hygiene.x__git_files__mutmut_23": "`or` -> `and` in the work-tree test: they differ only when "
                                                        "rev-parse prints 'false' with exit 0 (inside a .git folder), "
                                                        "where check-ignore and ls-files then fail (exit 128) and "
                                                        "None is returned as before",
        "ledger.files.hygiene.x__git_files__mutmut_33": "check-ignore without -q: -q only silences its output, which "
                                                        "is captured and never read; the exit code is the same",
        **dict.fromkeys(
            ("ledger.files.hygiene.x__git_files__mutmut_37", "ledger.files.hygiene.x__git_files__mutmut_39"),
            "check-ignore also or instead asks about a file 'XX-qXX' / 'XX.XX' in the folder: a path under an "
            "ignored folder is ignored too, so the answer changes only for a .gitignore that names such a file"),
        **dict.fromkeys(
            ("ledger.files.hygiene.x__is_text__mutmut_6", "ledger.files.hygiene.x__is_text__mutmut_8"),
            "decode 8193 bytes, or as 'UTF-8': one more byte only adds an error position (8192) that counts as a cut "
            "character (>= 8188) anyway; codec names are case-insensitive"),
        "ledger.files.hygiene.x__reward_lines__mutmut_12": "`startswith('{') or endswith('}')`: the line must also "
                                                           "parse as a JSON object, which both starts and ends so",
        "ledger.files.hygiene.x__reward_lines__mutmut_58": "the header split on a pattern that never matches: 'reward' "
                                                           "holds no comma or tab, so it is in the whole line exactly "
                                                           "when it is in one of its columns",
        "ledger.files.hygiene.x_classify_bytes__mutmut_62": "the safetensors header length read signed ('<q'): a "
                                                            "length with the top bit set is refused either way (above "
                                                            "100 MiB unsigned, below 2 signed)",
        "ledger.files.hygiene.x_hygiene_command__mutmut_8": "Console(highlight=None): rich reads it as "
                                                            "`highlight or (highlight is None and self._highlight)`, "
                                                            "and self._highlight is that None: off, as with False",
        **dict.fromkeys(
            [f"ledger.files.hygiene.x_hygiene_command__mutmut_{n}" for n in (43, 45, 46)],
            "markup on for the `nothing found` line: its words hold no '[', so markup cannot change them"),
        **dict.fromkeys(
            ("ledger.files.hygiene.x_scan_bytes__mutmut_37", "ledger.files.hygiene.x_scan_bytes__mutmut_40"),
            "bytes.decode() without 'utf-8', or with 'UTF-8': the default codec is UTF-8, names are case-insensitive"),
        "ledger.files.hygiene.x_scan_bytes__mutmut_8": "65 bytes of head instead of 64: classify_bytes reads at most "
                                                       "its first 26",
        **dict.fromkeys(
            ("ledger.files.hygiene.x_scan_file__mutmut_6", "ledger.files.hygiene.x_scan_file__mutmut_12"),
            "the member names of a file that is not a zip ('' instead of None), or of a damaged zip (None instead "
            "of []): classify_bytes reads them only for a PK header, and an empty list finds no member either"),
    }),
    "workers/rank/probe_steps.py": Target(
        ("tests/unit/test_probe_steps_rules.py", "tests/unit/test_probe_timing.py"), forkserver=True, equivalent={
        **dict.fromkeys(
            [f"workers.rank.probe_steps.xǁProbeǁwrite_summary__mutmut_{n}" for n in (94, 96, 98, 99)],
            "the summary dumped in python mode (mode None, left out, or a word pydantic does not know): its fields are "
            "str, int, bool, None, lists and dicts of them and the recipe's betas tuple, which json.dumps writes as "
            "the list that json mode gives"),
        **dict.fromkeys(
            [f"workers.rank.probe_steps.xǁProbeǁwrite_summary__mutmut_{n}" for n in (106, 107, 109, 110, 111, 112)],
            "the summary file's indent and key order: the train worker reads it with model_validate_json, and "
            "whitespace and key order change no value read from it"),
        **dict.fromkeys(
            [f"workers.rank.probe_steps.xǁProbeǁ__init____mutmut_{n}" for n in (32, 33)],
            "root '' and param_names None before the first boundary: both are set by the discovery at the first "
            "boundary before anything reads them (a checkpoint is written only by the stop at the last boundary)"),
        **dict.fromkeys(
            [f"workers.rank.probe_steps.xǁProbeǁ__init____mutmut_{n}" for n in (38, 42, 43)],
            "watch_note '', final_digests '' or installed None for None / None / False: each is only read for its "
            "truth before it is set"),
        **dict.fromkeys(
            [f"workers.rank.probe_steps.xǁProbeǁ_record__mutmut_{n}" for n in (86, 88, 89)],
            "a step line's keys not sorted: lines are read with model_validate_json, and steps_sha256 is taken of the "
            "file as written, so the order changes no value read and no check"),
    }),
    "workers/rank/probe_model.py": Target(
        ("tests/unit/test_probe_model_rules.py", "tests/unit/test_probe_discovery.py"), forkserver=True, equivalent={
        "workers.rank.probe_model.x_discover__mutmut_21":
            "each covered parameter counted 2 instead of 1: the counts are only compared with each other and with 0, "
            "so the same root",
        "workers.rank.probe_model.x_save_checkpoint__mutmut_97":
            "the temporary file named '.PT.TMP' instead of '.pt.tmp': written and replaced under the same name",
        "workers.rank.probe_model.x_collapse__mutmut_17":
            "named_parameters(recurse=None): only its truth is read, as with False",
        "workers.rank.probe_model.x_discover__mutmut_65":
            "`or` for `and` in the other modules' filter: it adds modules with no frozen parameter of their own (and "
            "the root), which the loop skips as having none, so no label or count changes",
    }),
}

# mutmut's exit-code words (mutmut 3): what counts for the score
KILLED = {"killed", "caught by type check"}
SURVIVED = {"survived"}


def read_pins(path: Path = PINS) -> dict[str, dict[str, str]]:
    return json.loads(path.read_text()) if path.exists() else {}


def judged_equivalents(named: dict[str, str], diffs: dict[str, str], pinned: dict[str, str]
                       ) -> tuple[dict[str, str], dict[str, dict[str, str | None]]]:
    """(equivalent, moved) of the named equivalents whose mutant exists now (`diffs`: name -> its diff now): a name
    counts apart only while its diff is the one pinned when it was judged; the others are moved, with both diffs."""
    equivalent: dict[str, str] = {}
    moved: dict[str, dict[str, str | None]] = {}
    for name, why in named.items():
        if name not in diffs:
            continue
        if pinned.get(name) == diffs[name]:
            equivalent[name] = why
        else:
            moved[name] = {"pinned": pinned.get(name), "now": diffs[name]}
    return equivalent, moved


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def _prepare(module: str, target: Target) -> Path:
    """A fresh copy of the working tree (tracked and untracked-not-ignored files) with this module's config."""
    work = SCRATCH / module.replace("/", "__").removesuffix(".py")
    if work.exists():
        shutil.rmtree(work)
    for rel in _tracked_files():
        src = REPO / rel
        if rel.startswith(".mutation/") or not src.is_file():
            continue
        dst = work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    config = {
        "source_paths": PACKAGES,
        "only_mutate": [module],
        "also_copy": ["examples/", "scripts/", "hooks/", "bench/", "docs/", "recipes/", "README.md", "Makefile",
                      "constraints-cpu.txt"],
        # the fast suite only: `slow` tests start trainers
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-m", "not slow", "-q", "-x", "--timeout=300"],
        "pytest_add_cli_args_test_selection": [*target.tests, *(a for t in target.deselect for a in ("--deselect", t))],
        "process_isolation": "forkserver" if target.forkserver else "fork",
        "timeout_multiplier": target.timeout_multiplier,
        "timeout_constant": 5.0,
    }
    pyproject = (work / "pyproject.toml").read_text()
    pyproject += "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items())
    (work / "pyproject.toml").write_text(pyproject)
    return work


_RESULT = re.compile(r"^\s+(\S+__mutmut_\d+): (.+)$")


def _results(work: Path, mutmut: Path) -> dict[str, str]:
    proc = subprocess.run([str(mutmut), "results", "--all", "true"], cwd=work, capture_output=True, text=True)
    return {m.group(1): m.group(2).strip() for line in proc.stdout.splitlines() if (m := _RESULT.match(line))}


def run_module(module: str, target: Target, timeout: float, max_children: int, mutmut: Path,
               resume: bool = False) -> dict[str, Any]:
    work = SCRATCH / module.replace("/", "__").removesuffix(".py")
    if not (resume and (work / "mutants").is_dir()):
        work = _prepare(module, target)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    started = time.monotonic()
    complete = True
    log = work / "mutmut.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(mutmut), "run", "--max-children", str(max_children)], cwd=work, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            complete = False
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
    wall = time.monotonic() - started
    status = _results(work, mutmut)
    diffs = {n: _show(work, mutmut, n, None) for n in target.equivalent if n in status}
    equivalent, moved = judged_equivalents(target.equivalent, diffs, read_pins().get(module, {}))
    counted = {n: s for n, s in status.items() if n not in equivalent}
    killed = sorted(n for n, s in counted.items() if s in KILLED)
    survived = sorted(n for n, s in counted.items() if s in SURVIVED)
    timeouts = sorted(n for n, s in counted.items() if s == "timeout")
    uncovered = sorted(n for n, s in counted.items() if s == "no tests")  # no selected test reaches it: not killed
    not_run = sorted(n for n, s in counted.items() if s not in KILLED | SURVIVED | {"timeout", "no tests"})
    judged = len(killed) + len(survived) + len(timeouts) + len(uncovered)
    # a mutant that makes the tests hang is caught (the run never finishes green): mutmut's own convention
    score = (len(killed) + len(timeouts)) / judged if judged else None
    stale = sorted(set(target.equivalent) - set(status))
    # mutmut stops before any mutant when the selected tests fail on the unmutated code: say which test
    failing = [ln.strip() for ln in log.read_text(errors="replace").replace("\r", "\n").splitlines()
               if ln.startswith(("FAILED ", "ERROR ")) or "failed to collect stats" in ln or "Failed to run" in ln]
    return {
        "module": module, "tests": list(target.tests), "mutants": len(status), "killed": len(killed),
        "timeout": len(timeouts), "survived": survived, "uncovered": uncovered, "not_run": len(not_run),
        "not_run_names": not_run, "equivalent": equivalent, "moved_equivalent": moved, "stale_equivalent": stale,
        "score": score,
        "complete": complete and proc.returncode == 0, "returncode": proc.returncode, "wall_s": round(wall, 1),
        "log": str(log.relative_to(REPO)), "clean_run_problems": failing[:5] if not status else [],
    }


_GENERATE = (
    "import sys\n"
    "from pathlib import Path\n"
    "from mutmut.__main__ import create_mutants_for_file\n"
    "src = Path(sys.argv[1])\n"
    "(Path('mutants') / src).parent.mkdir(parents=True, exist_ok=True)\n"
    "result = create_mutants_for_file(src, Path('mutants') / src)\n"
    "if result.error is not None:\n"
    "    raise result.error\n"
)


def list_module(module: str, target: Target, mutmut: Path) -> dict[str, Any]:
    """The module's mutants as `mutmut run` would generate them (mutmut's own generator, in the module's scratch
    copy), without running a test: their count, each named equivalent's diff, and the stale names (seconds)."""
    work = _prepare(module, target)
    proc = subprocess.run([str(mutmut.with_name("python")), "-c", _GENERATE, module], cwd=work, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"mutation: mutmut could not generate the mutants of {module}: {proc.stderr.strip()[-1500:]}")
    meta = json.loads((work / "mutants" / (module + ".meta")).read_text())
    names = set(meta["exit_code_by_key"])
    diffs = {n: _show(work, mutmut, n, None) for n in sorted(target.equivalent) if n in names}
    _, moved = judged_equivalents(target.equivalent, diffs, read_pins().get(module, {}))
    return {"module": module, "mutants": len(names), "equivalent": diffs, "moved_equivalent": moved,
            "stale_equivalent": sorted(set(target.equivalent) - names)}


def _function_source(text: str, name: str) -> list[str] | None:
    """The lines of `def name(` in mutmut's trampolined module text (a function or a method), or None; the def line
    without the name."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith(f"def {name}(")), None)
    if start is None:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    # a signature over several lines closes with `) -> ...:` at the def's own indent: part of the function
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
                                or lines[end][indent:].startswith(")")):
        end += 1
    # the def line too, its name left out (the mutant's and the original's differ): a default's mutant is there
    head = "def (" + lines[start].split("(", 1)[1]
    return [head.strip()] + [ln.strip() for ln in lines[start + 1:end] if ln.strip()]


def _show(work: Path, mutmut: Path, name: str, limit: int | None = 200) -> str:
    """The changed lines of one mutant, read from mutants/ against the original function (one `mutmut show`
    process per mutant took about 2 s on the shared host); `mutmut show` where the source cannot be read so. `limit`:
    characters kept (None: all, as pinned: two mutants of one long line can differ only past 200)."""
    module, _, function = name.rpartition(".")
    source = work / "mutants" / (module.replace(".", "/") + ".py")
    with contextlib.suppress(OSError):
        text = source.read_text()
        mutant, orig = _function_source(text, function), _function_source(text, function.split("__mutmut_")[0]
                                                                          + "__mutmut_orig")
        if mutant is not None and orig is not None:
            diff = [ln for ln in difflib.unified_diff(orig, mutant, lineterm="", n=0)
                    if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))]
            return " | ".join(diff)[:limit]
    proc = subprocess.run([str(mutmut), "show", name], cwd=work, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))]
    return " | ".join(ln.strip() for ln in lines)[:limit]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help=f"modules to mutate (default: all of {len(MODULES)})")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per module before it is stopped")
    ap.add_argument("--max-children", type=int, default=2, help="mutants tested at once")
    ap.add_argument("--json", type=Path, default=SCRATCH / "scores.json", help="where the figures are written")
    ap.add_argument("--resume", action="store_true",
                    help="continue a run stopped by --timeout in its scratch copy (mutmut keeps the mutants it judged; "
                         "the wall time is then the continuation's only)")
    ap.add_argument("--list", action="store_true",
                    help="generate each module's mutants without running a test: print their count, the diff of "
                         "each mutant named equivalent, the names that match no mutant now and those whose diff is "
                         "not the pinned one (exit 1 if any)")
    ap.add_argument("--pin", action="store_true",
                    help="as --list, then pin each named equivalent's diff now in scripts/mutation_equivalents.json "
                         "(only after reading each diff against its reason)")
    args = ap.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"mutation: not a configured module: {', '.join(unknown)}; choose from {', '.join(MODULES)}",
              file=sys.stderr)
        return 2
    mutmut = Path(sys.executable).with_name("mutmut")
    if not mutmut.exists():
        print("mutation: mutmut is not installed in this environment; run `make mutation`", file=sys.stderr)
        return 2
    if args.list or args.pin:
        stale = 0
        pins = read_pins()
        for module in args.modules or list(MODULES):
            got = list_module(module, MODULES[module], mutmut)
            print(f"{module}: {got['mutants']} mutants, {len(got['equivalent'])} named equivalent, "
                  f"{len(got['stale_equivalent'])} stale, {len(got['moved_equivalent'])} moved")
            for name, diff in got["equivalent"].items():
                print(f"  equivalent: {name}: {diff}\n    why: {MODULES[module].equivalent[name]}")
            for name, both in got["moved_equivalent"].items():
                print(f"  moved (the diff is not the pinned one): {name}: pinned {both['pinned']!r}")
            for name in got["stale_equivalent"]:
                print(f"  stale equivalent-mutant entry (no such mutant now): {name}")
            stale += len(got["stale_equivalent"]) + (0 if args.pin else len(got["moved_equivalent"]))
            if args.pin:
                pins[module] = dict(sorted(got["equivalent"].items()))
        if args.pin:
            PINS.write_text(json.dumps(dict(sorted(pins.items())), indent=1) + "\n")
            print(f"pinned: {PINS.relative_to(REPO)}")
        return 1 if stale else 0
    rows = []
    for module in args.modules or list(MODULES):
        print(f"mutation: {module} against {' '.join(MODULES[module].tests)} ...", flush=True)
        row = run_module(module, MODULES[module], args.timeout, args.max_children, mutmut, args.resume)
        work = SCRATCH / module.replace("/", "__").removesuffix(".py")
        row["survivor_diffs"] = {n: _show(work, mutmut, n)
                                 for n in [*row["survived"], *row["uncovered"]]}
        rows.append(row)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print()
    print(f"{'module':<24} {'mutants':>7} {'killed':>6} {'timeout':>7} {'survived':>8} {'no test':>7} {'equiv':>5} "
          f"{'not run':>7} {'score':>6} {'wall s':>7}  run")
    for r in rows:
        score = "-" if r["score"] is None else f"{100 * r['score']:.1f}%"
        print(f"{r['module']:<24} {r['mutants']:>7} {r['killed']:>6} {r['timeout']:>7} {len(r['survived']):>8} "
              f"{len(r['uncovered']):>7} "
              f"{len(r['equivalent']):>5} {r['not_run']:>7} {score:>6} {r['wall_s']:>7}  "
              f"{'complete' if r['complete'] else 'PARTIAL (rc ' + str(r['returncode']) + ')'}")
    for r in rows:
        for name in r["survived"]:
            print(f"survived: {name}: {r['survivor_diffs'][name]}")
        for name, both in r["moved_equivalent"].items():
            print(f"moved equivalent (counted by its result; judge it and --pin): {name}: {both['now']}")
        for name in r["uncovered"]:
            print(f"no test: {name}: {r['survivor_diffs'][name]}")
        for line in r["clean_run_problems"]:
            print(f"{r['module']}: no mutant was judged: {line} (see {r['log']})")
        for name in r["stale_equivalent"]:
            print(f"stale equivalent-mutant entry (no such mutant now): {name}")
    print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
