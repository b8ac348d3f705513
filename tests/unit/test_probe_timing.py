"""The probe's step time: from the end of the previous boundary to this one, its own work excluded (DESIGN.md 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from workers.rank.probe_steps import Probe  # noqa: E402


def test_a_step_excludes_the_probe_time_of_the_boundary_before_it(tmp_path: Path) -> None:
    # a scripted clock: each boundary reads it three times (boundary, after the probe's work, end of boundary)
    reads: Iterator[float] = iter([
        103.0, 107.0, 107.5,  # step 0: 3 s from the probe's start; 4 s of probe work, then 0.5 s more at the boundary
        108.5, 112.5, 113.0,  # step 1: the trainer worked 1 s after the previous boundary ended
        114.0, 118.0, 118.5,  # step 2: again 1 s
    ])
    probe = Probe(tmp_path, steps=10, digest_steps={1}, watch_steps=set(), ckpt_dir=None)
    probe.t_end = 100.0
    probe._now = lambda: next(reads)  # type: ignore[method-assign]
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        probe._on_step(optimizer, (), {})  # what the optimizer's step post-hook calls
    probe.steps_file.close()
    lines = [json.loads(line) for line in probe.steps_path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert [line["duration_s"] for line in lines] == [3.0, 1.0, 1.0]
    assert [line["probe_s"] for line in lines] == [4.0, 4.0, 4.0]
    # the whole boundary (probe_s, the record's write, the clock's restart) is carried by the next step's line
    assert [line["prev_boundary_s"] for line in lines] == [None, 4.5, 4.5]
    # the digest's own part of probe_s, on the probe's unscripted clock: at the digest step only
    assert lines[0]["digest_s"] is None and lines[2]["digest_s"] is None
    assert lines[1]["digests"] and 0.0 <= lines[1]["digest_s"] < 1.0
