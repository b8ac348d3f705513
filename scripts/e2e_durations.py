"""Writes tests/e2e/durations.json, the seconds by which tests/e2e/conftest.py orders `make test`'s files heaviest
first: per end-to-end test from a profile (ORCH_E2E_PROFILE=FILE) and the log of the same pytest run with
--durations=0 (the set-up of the shared fixtures, counted to the test that made them); per unit test file (its node id
is its path) from the --durations=0 lines of a log that ran the unit tests (set-up, call and teardown summed). An
entry that this run does not measure is kept as recorded.

    ORCH_E2E_PROFILE=/tmp/p.jsonl pytest ... --durations=0 tests/e2e tests/unit > /tmp/p.log
    python scripts/e2e_durations.py /tmp/p.jsonl /tmp/p.log      (or `- LOG` to re-record the unit files only)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "durations.json"
LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+)")


def main(profile: Path | None, logs: list[Path]) -> None:
    recorded: dict[str, float] = json.loads(OUT.read_text()) if OUT.exists() else {}
    tests: dict[str, float] = {}
    if profile is not None:
        for line in profile.read_text().splitlines():
            row = json.loads(line)
            tests[row["test"]] = float(row["seconds"])
    files: dict[str, float] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            m = LINE.match(line)
            if not m:
                continue
            seconds, phase, nodeid = float(m.group(1)), m.group(2), m.group(3)
            if phase == "setup" and nodeid in tests:
                tests[nodeid] += seconds
            elif nodeid.startswith("tests/unit/"):
                path = nodeid.split("::", 1)[0]
                files[path] = files.get(path, 0.0) + seconds
    if tests:  # a profile re-records every end-to-end test
        recorded = {k: v for k, v in recorded.items() if not k.startswith("tests/e2e/")}
    recorded.update(tests)
    recorded.update(files)
    OUT.write_text(json.dumps({k: round(v, 1) for k, v in sorted(recorded.items())}, indent=1) + "\n")
    print(f"{OUT.name}: {len(tests)} end-to-end tests ({sum(tests.values()):.0f} s), {len(files)} unit files "
          f"({sum(files.values()):.0f} s) re-recorded; {len(recorded)} entries")


if __name__ == "__main__":
    main(None if sys.argv[1] == "-" else Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
