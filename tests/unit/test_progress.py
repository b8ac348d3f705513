"""orchestrator/run/progress.py without a terminal: one plain line per event, the step only when it moves."""

from __future__ import annotations

from orchestrator.run.progress import Progress


def test_plain_progress_says_each_event_once() -> None:
    said: list[str] = []
    with Progress(live=False, say=said.append) as p:
        p.start("train-A", "train", 16)
        p.tick(1.0, 0, 2)
        p.tick(2.04, 3, 2)
        p.tick(2.5, 3, 2)  # the same step again: nothing new to say
        p.finish("train-A", "ok", 12.25, 24.5, None)
        p.start("checks", "checks", None)
        p.tick(0.5, 0, 2)  # no step count: ticks say nothing
        p.finish("checks", "failed", 0.5, 1.0, "exit 2: boom")
        p.tick(9.0, 9, 2)  # after finish: no current package
    assert said == ["train-A: started", "train-A: step 3/16 (2.0 s)",  # step 0/16 is where it started
                    "train-A: ok in 12.2 s", "checks: started", "checks: failed in 0.5 s (exit 2: boom)"]
    assert p.rows["train-A"] == {"status": "ok", "elapsed": 12.25, "gpu_s": 24.5, "steps": 16, "step": "16/16"}
    assert p.rows["checks"]["step"] == "" and p.rows["checks"]["gpu_s"] == 1.0


def test_a_failed_train_keeps_the_last_step_it_reached() -> None:
    p = Progress(live=False, say=lambda _: None)
    p.start("train-C", "train", 16)
    p.tick(3.0, 7, 1)
    assert p.rows["train-C"]["gpu_s"] == 3.0
    p.finish("train-C", "timeout", 3.5, 3.5, None)
    assert p.rows["train-C"]["step"] == "7/16"
