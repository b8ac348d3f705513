"""Issue 31 on CPU: the minimal trainer (launchutil.make_minimal_project: the tests are about orch's compile caches,
not r3-mini) with a kernel that tunes itself by timing and keeps its pick in the compile cache
(tests/fixtures/tuned_sum.py: three kernels, four block sizes, cold compiles and cold ranks pick differently, and the
pick sets the summation order). Under orch every arm and rank runs the prime's picks: an identical candidate is exact
on cold caches with 2 ranks; a candidate that writes the baseline's cache is refused, naming it; a candidate that
changes one kernel is not exact and its audit names that kernel as its own (these last launches run on 1 rank: what
they test is one arm's cache, not ranks that tune apart)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchutil import GIT, MINIMAL_PROTOCOL, REPO, env, freeze, launch_cmd, make_minimal_project, only_run

pytestmark = pytest.mark.slow

TRAIN = Path("trainer")
USE = ("        loss.backward()\n",
       "        loss = loss * tuned_scale(loss)  # the tuned kernels' sums enter every gradient\n"
       "        loss.backward()\n")
# the candidate writes its own pick of kernel 0 into every baseline cache folder it can find, and does not hide a
# failure to do so
POISON = ("    _picks[index] = best\n",
          "    _picks[index] = best\n"
          "    import glob\n"
          "    root = os.path.dirname(os.path.dirname(os.path.dirname(cache_dir())))\n"
          "    home = os.path.dirname(os.path.dirname(os.path.dirname(root)))  # the kept caches (issue 51)\n"
          "    for theirs in glob.glob(os.path.join(root, 'baseline-*', 'inductor', 'toy', '*', '*.best_config'))"
          " + glob.glob(os.path.join(home, 'compile-cache', 'baseline-*', 'inductor', 'toy', '*', '*.best_config')):\n"
          "        with open(theirs, 'w') as f:\n"
          "            json.dump({'BLOCK': 128 if best != 128 else 16}, f)\n")
# the candidate's kernel 1 tries other block sizes (its own kernel: a new source, a new cache key), whose sums differ
# from those of every block size the baseline may pick
CHANGED = ("        scale = scale * (1 + 0.1 * (blocked_sum(x, pick(k, x)).double() - x.double().sum()))\n",
           "        blocks = (24, 96) if k == 1 else BLOCKS\n"
           "        scale = scale * (1 + 0.1 * (blocked_sum(x, pick(k, x, blocks)).double() - x.double().sum()))\n")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def tuned_project(
    tmp_path: Path, candidate: tuple[str, str] | None = None, compile_mode: str = "prime", nproc: int = 2,
    prime_steps: int | None = None,
) -> tuple[Path, Path]:
    """The minimal trainer with the tuned kernels, committed as the baseline (git HEAD); the candidate is the working
    tree with `candidate` edited into tuned_sum.py (None: the identical candidate). Both commitments frozen here. The
    minimal protocol (16 steps), with the prime (`compile_mode`: what measurement.compile says), on `nproc` CPU
    ranks: 2 where ranks that tune apart are the point, 1 where the test is about what one arm's cache holds (the
    poisoned cache, a kernel of the candidate's own, tuning under compile: none)."""
    proj = make_minimal_project(tmp_path, commit=False)
    shutil.copy(REPO / "tests" / "fixtures" / "tuned_sum.py", proj / TRAIN / "tuned_sum.py")
    trainer = proj / TRAIN / "train.py"
    _edit(trainer, *USE)
    _edit(trainer, "import torch\n", "import torch\nfrom tuned_sum import tuned_scale\n")
    subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "baseline with tuned kernels"], cwd=proj, check=True)
    if candidate is not None:
        _edit(proj / TRAIN / "tuned_sum.py", *candidate)
    data: dict[str, Any] = yaml.safe_load((proj / "protocol" / MINIMAL_PROTOCOL).read_text())
    switches = dict(data["arms"]["baseline"]["switches"])
    data["arms"] = {
        "baseline": {"commitment": "manifests/tuned_base.json", "source": {"git": "HEAD"}, "switches": switches},
        "candidate": {"commitment": "manifests/tuned_cand.json", "source": "tree", "switches": dict(switches),
                      "under_evaluation": candidate is not None},
    }
    data["measurement"]["compile"] = compile_mode
    if prime_steps is not None:
        data["measurement"]["prime_steps"] = prime_steps
    data["launcher"]["nproc"] = nproc
    protocol = proj / "protocol" / "tuned.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    for arm, out in (("baseline", "manifests/tuned_base.json"), ("candidate", "manifests/tuned_cand.json")):
        freeze(proj, protocol, out, arm)
    return proj, protocol


def _launch(
    tmp_path: Path, candidate: tuple[str, str] | None, compile_mode: str = "prime", nproc: int = 1,
    prime_steps: int | None = None,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    proj, protocol = tuned_project(tmp_path, candidate, compile_mode, nproc, prime_steps)
    home = tmp_path / "home"
    done = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=900)
    return done, only_run(home)


def _audit(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "audit.json").read_text())  # type: ignore[no-any-return]


def _run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())  # type: ignore[no-any-return]


def test_an_identical_candidate_is_exact_on_cold_caches_with_two_ranks_that_tune_differently(tmp_path: Path) -> None:
    done, run_dir = _launch(tmp_path, None, nproc=2)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = _audit(run_dir)
    assert doc["exact"] is True and doc["exactness"]["ranks"] == 2, doc["reasons"]
    cc = doc["compile_cache"]
    assert cc["baseline"]["tuned"] == 3  # the prime's three picks, one per kernel (the last rank's)
    assert sorted(cc["same_baseline_picks"]) == ["train-A", "train-B", "train-C", "watch-C"]
    assert cc["differing_baseline_picks"] == [] and cc["diagnosis"] == []
    for name in ("train-A", "train-C", "train-B", "watch-C"):
        use = cc["launches"][name]
        assert (use["taken_tuned"], use["made"], use["changed"], use["own_kernels"]) == (3, 0, 0, []), name
        assert use["tuned_sha256"] == cc["baseline"]["tuned_sha256"]
    prime = next(p for p in _run_json(run_dir)["packages"] if p["name"] == "prime")
    assert prime["status"] == "ok" and prime["compile_cache"]["baseline_tuned"] == 3
    sealed = json.loads((run_dir / "compile-cache.baseline.json").read_text())["files"]
    assert sum(name.endswith(".best_config") for name in sealed) == 3
    # issue 51: the prime stopped when compiling stopped (the toy tunes at step 0), both ranks at the same step
    assert json.loads((run_dir / "packages" / "prime" / "result.json").read_text())["steps"] == 2
    assert prime["compile_cache"]["prime_steps"] == 2 and cc["prime_steps"] == 2 and cc["unprimed"] == []
    # the replay watched the steps train-C did not: together every step, each once
    cover = doc["exactness"]["watch_coverage"]
    assert sorted(cover["train-C"] + cover["watch-C"]) == list(range(16)) and cover["watch-C"][0] > 0
    # a second launch of the same baseline in the same home loads the kept cache instead of priming, still exact
    proj, home = tmp_path / "proj", tmp_path / "home"
    protocol = proj / "protocol" / "tuned.yaml"
    again = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    second = sorted(p for p in (home / "runs").iterdir() if p.name != run_dir.name)[0]
    doc2 = _audit(second)
    assert doc2["exact"] is True, doc2["reasons"]
    loaded = doc2["compile_cache"]["loaded"]
    assert (loaded["reused"], loaded["sealed_by"]) == (True, run_dir.name)
    assert "prime" not in doc2["cost"]["gpu_seconds"]
    assert doc2["compile_cache"]["baseline"]["tuned_sha256"] == cc["baseline"]["tuned_sha256"]
    for name in ("train-A", "train-C", "train-B", "watch-C"):
        assert doc2["compile_cache"]["launches"][name]["taken_tuned"] == 3, name


def test_a_candidate_that_writes_the_baselines_compile_cache_is_refused_naming_it(tmp_path: Path) -> None:
    done, run_dir = _launch(tmp_path, POISON)
    assert done.returncode == 1, done.stderr[-3000:]
    packages = {p["name"]: p for p in _run_json(run_dir)["packages"]}
    assert packages["train-A"]["status"] == "ok" and packages["train-C"]["status"] == "failed"
    assert "train-B" not in packages  # B never ran on what C left
    note = packages["train-C"]["note"]
    # in the namespace the write is impossible (the trainer raises); in scan mode orch finds the changed file
    assert ("Read-only file system" in note or "Permission denied" in note
            or "the baseline's compile cache changed during train-C" in note), note
    assert not (run_dir / "audit.json").exists()


def test_a_candidate_that_changes_one_kernel_is_named_as_its_own_tuning(tmp_path: Path) -> None:
    """With a prime of one step (measurement.prime_steps: 1; the toy tunes its three kernels at step 0): the
    baseline's launches still compile nothing of their own, and only the candidate's changed kernel is its own."""
    done, run_dir = _launch(tmp_path, CHANGED, prime_steps=1)
    assert done.returncode == 1, done.stderr[-3000:]
    doc = _audit(run_dir)
    assert doc["verdict"] == "not exact"
    cc = doc["compile_cache"]
    prime = json.loads((run_dir / "packages" / "prime" / "result.json").read_text())
    assert prime["steps"] == 1 and (cc["prime_steps"], cc["unprimed"], cc["baseline"]["tuned"]) == (1, [], 3)
    own = cc["launches"]["train-C"]["own_kernels"]
    assert [k["kernel"] for k in own] == ["toy_blocked_sum_1"] and own[0]["baseline_pick"] is not None
    assert own[0]["pick"] != own[0]["baseline_pick"] and not own[0]["rewritten"]
    for name in ("train-A", "train-B"):  # the baseline's launches tuned nothing themselves
        assert cc["launches"][name]["own_kernels"] == [] and cc["launches"][name]["made"] == 0
    said = [r for r in doc["reasons"] if r.startswith("compile cache: ")]
    assert any("train-C tuned 1 kernel(s) itself" in r and "toy_blocked_sum_1" in r for r in said), doc["reasons"]


def test_a_trainer_that_tunes_under_compile_none_fails_its_first_launch_naming_the_picks(tmp_path: Path) -> None:
    """measurement.compile: none is a claim orch checks: the tuned-kernel trainer without the prime fails train-A,
    the first package that compiles, with its tuned picks named, and nothing later runs on cold picks."""
    done, run_dir = _launch(tmp_path, None, compile_mode="none")
    assert done.returncode == 1, done.stderr[-3000:]
    packages = {p["name"]: p for p in _run_json(run_dir)["packages"]}
    assert "prime" not in packages and packages["checks"]["status"] == "ok"
    assert packages["train-A"]["status"] == "failed" and "train-C" not in packages
    note = packages["train-A"]["note"]
    assert "train-A compiled 6 file(s) into its compile cache (3 tuned pick(s): " in note, note
    assert "the protocol says measurement.compile: none" in note and "set measurement.compile: prime" in note
    assert not (run_dir / "audit.json").exists()
