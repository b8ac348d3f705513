"""Writes tests/e2e/durations.json, the seconds per end-to-end test by which tests/e2e/conftest.py sends the heaviest
first: from a profile (ORCH_E2E_PROFILE=FILE) and the log of the same pytest run with --durations=0 (the set-up of
the shared fixtures, counted to the test that made them).

    ORCH_E2E_PROFILE=/tmp/p.jsonl pytest ... --durations=0 tests/e2e > /tmp/p.log; python scripts/e2e_durations.py \\
        /tmp/p.jsonl /tmp/p.log
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "durations.json"


def main(profile: Path, log: Path) -> None:
    seconds = {}
    for line in profile.read_text().splitlines():
        row = json.loads(line)
        seconds[row["test"]] = float(row["seconds"])
    for line in log.read_text().splitlines():
        m = re.match(r"^([0-9.]+)s setup\s+(\S+)", line)
        if m and m.group(2) in seconds:
            seconds[m.group(2)] += float(m.group(1))
    OUT.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())}, indent=1) + "\n")
    print(f"{OUT.name}: {len(seconds)} tests, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
