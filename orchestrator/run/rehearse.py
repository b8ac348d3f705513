"""`orch rehearse PROTOCOL --upstream DIR`: the protocol on the unmodified upstream trainer at tiny size, audited.

Generates tiny seeded inputs, starts the loopback judge, derives a null rehearsal protocol, launches and audits it.
With `--calibrate K` the derived protocol is calibrated instead of launched (`orch calibrate`: K A/A launches, the
judge up for all of them): the spread between launches and the GPU cost of the upstream trainer on this host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ledger.verdict.decide.calibration import Calibration
from manifests.core import diff_manifests, hash_tree, load_manifest
from orchestrator.run.calibrate import calibrate, launches_asked
from orchestrator.run.launch import LaunchResult, launch
from protocol.errors import FailedError, RefusedError
from protocol.home import resolve_home
from protocol.recipe_rules import overridable
from protocol.rehearsal_inputs import JudgeCounts, JudgeReady, RehearsalInputs
from protocol.schema import load_protocol

ORCH_ROOT = Path(__file__).resolve().parents[2]
SHIM = ORCH_ROOT / "workers" / "rehearsal" / "shim"  # flash_attn stand-in (and the torch compatibility shim)
JUDGE_WAIT_S = 30.0
# flags that size the rehearsal to one device call; none of them is a recipe value (protocol/recipe.py), none
# changes which code paths run: fewer text tokens, a smaller image, a 1-line validation file
TINY_FLAGS = {"--max_output_token_n_gen": "32", "--max_output_token_n_edit": "32", "--image_size": "256"}


@dataclass
class Rehearsal:
    work: Path
    protocol_path: Path
    inputs: RehearsalInputs
    launch: LaunchResult | None = None
    judge: dict[str, Any] = field(default_factory=dict)
    calibration: Calibration | None = None


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def check_upstream(protocol_path: Path, upstream: Path) -> str:
    """The upstream tree must be the snapshot the protocol's baseline commitment names; returns its root."""
    loaded = load_protocol(protocol_path)
    commitment = loaded.resolve(loaded.protocol.arms.baseline.commitment)
    if not commitment.is_file():
        raise RefusedError(f"{commitment.name}: the baseline commitment is missing; run `orch freeze` on upstream")
    expected = load_manifest(commitment)
    actual = hash_tree(upstream, list(loaded.protocol.sources.include))
    diff = diff_manifests(expected, actual)
    if not diff.equal:
        raise RefusedError(
            f"--upstream sources differ from {commitment.name}: {diff.summary()}; "
            "rehearse the unmodified upstream snapshot the protocol commits to"
        )
    return actual.root


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    if flag in args:
        i = args.index(flag)
        return [*args[: i + 1], value, *args[i + 2 :]]
    return [*args, flag, value]


def derive_protocol(
    source: Path, upstream: Path, inputs_dir: Path, inputs: RehearsalInputs, gpus: int, ports: Sequence[int],
    root: str, scorer: list[str], compile_cache: Path | None = None,
) -> dict[str, Any]:
    """The rehearsal protocol: the source's recipe, flags and measurement on tiny inputs; candidate = baseline."""
    loaded = load_protocol(source)
    data = loaded.protocol.model_dump(mode="json", by_alias=True)
    data.pop("model", None)
    data.pop("rehearsal", None)
    commitment = str(loaded.resolve(loaded.protocol.arms.baseline.commitment))
    arm = {"commitment": commitment, "source": "tree", "switches": {}, "config": {}, "under_evaluation": False}
    data["name"] = f"{loaded.protocol.name}-rehearsal-{gpus}gpu"
    data["base"] = "/"
    data["sources"] = {"root": str(upstream.resolve()), "include": list(loaded.protocol.sources.include)}
    data["arms"] = {"baseline": dict(arm), "candidate": dict(arm)}
    args = list(loaded.protocol.launcher.args)
    for i in range(0, len(inputs.trainer_args) - 1, 2):
        flag, value = inputs.trainer_args[i], inputs.trainer_args[i + 1]
        is_path = (inputs_dir / value).exists()
        args = _set_flag(args, flag, str(inputs_dir / value) if is_path else value)
    for flag, value in TINY_FLAGS.items():
        args = _set_flag(args, flag, value)
    overrides: dict[str, int] = {}
    recipe = loaded.frozen_recipe().recipe
    for key in overridable(recipe):  # keys the recipe file lets fewer ranks lower to a divisor of the ranks
        size, carried = int(loaded.protocol.recipe[key]), recipe.keys[key].flag
        if gpus % size:
            overrides[key] = gpus if size % gpus == 0 else 1
            data["recipe"][key] = overrides[key]
            if carried is not None:
                args = _set_flag(args, carried, str(overrides[key]))
    if loaded.protocol.recipe_file is not None:
        data["recipe_file"]["path"] = str(loaded.resolve(loaded.protocol.recipe_file.path))
    args = _set_flag(args, "--num_shard", str(gpus))
    args = _set_flag(args, "--reward_server_urls", "127.0.0.1")
    args = _set_flag(args, "--reward_server_port", ",".join(map(str, ports)))
    # the judge runs outside the packages: their network namespace reaches it as a declared endpoint
    endpoints = [*data["launcher"].get("endpoints", []), *(f"127.0.0.1:{p}" for p in ports)]
    data["launcher"] = {**data["launcher"], "nproc": gpus, "args": args, "endpoints": endpoints}
    env = dict(data["launcher"].get("env") or {})
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), *[p for p in env.get("PYTHONPATH", ".").split(os.pathsep) if p]])
    env.setdefault("WANDB_MODE", "offline")
    # orch owns the compile caches (orchestrator/isolation/compile_cache.py: the prime fills the baseline's, every
    # package compiles in a copy of it); --compile-cache DIR only says where they are made, and keeps them after the run
    if compile_cache is not None:
        cache = str(compile_cache.resolve())
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", cache)
        env.setdefault("TRITON_CACHE_DIR", f"{cache}/triton")
    # named so that the derived protocol shows it; the shim folder's sitecustomize applies it (values unchanged)
    env.setdefault("ORCH_TORCH_COMPAT", "fsdp_unshard_outside_inference_mode")
    data["launcher"]["env"] = env
    data["scorer"] = {"command": scorer}
    data["checks"] = {"prepare": [], "diagnostics": [], "static_graph": None}
    data["model"] = {"layers": inputs.model.layers, "layer_prefix": "language_model.model.layers",
                     "min_params": None}
    data["rehearsal"] = {
        "upstream": root, "recipe_overrides": overrides,
        "reason": f"{gpus} GPU(s): {', '.join(overrides)} must divide the ranks" if overrides else "",
    }
    return data


def _start_judge(work: Path, ports: Sequence[int]) -> subprocess.Popen[bytes]:
    ready = work / "judge.ready.json"
    cmd = [sys.executable, "-m", "workers.rehearsal.judge", "--ports", ",".join(map(str, ports)),
           "--ready", str(ready), "--counts", str(work / "judge.counts.json")]
    log = (work / "judge.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ORCH_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + JUDGE_WAIT_S
    while time.monotonic() < deadline:
        if ready.is_file():
            doc = JudgeReady.model_validate_json(ready.read_text())
            if sorted(doc.ports) == sorted(ports):
                return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    tail = (work / "judge.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    raise FailedError(f"the loopback judge did not come up on ports {list(ports)}: {tail[0]}")


def _stop_judge(proc: subprocess.Popen[bytes], work: Path) -> dict[str, Any]:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    counts = work / "judge.counts.json"
    if not counts.is_file():
        return {"exit": proc.returncode, "counts": None}
    doc = JudgeCounts.model_validate_json(counts.read_text())
    return {"exit": proc.returncode, "counts": {p: c.model_dump() for p, c in doc.ports.items()}}


def make_inputs(upstream: Path, out: Path, size_args: Sequence[str] = ()) -> RehearsalInputs:
    cmd = [sys.executable, "-m", "workers.rehearsal.make_inputs", "--upstream", str(upstream), "--out", str(out),
           *size_args]
    proc = subprocess.run(cmd, cwd=ORCH_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FailedError(f"generating the tiny inputs failed: {last}")
    return RehearsalInputs.model_validate_json((out / "inputs.json").read_text())


def rehearse(
    protocol_path: Path, upstream: Path, gpus: int = 1, home_dir: Path | None = None,
    say: Callable[[str], None] = print, size_args: Sequence[str] = (), lock_timeout: float | None = None,
    compile_cache: Path | None = None, calibrate_repeats: int | None = None,
) -> Rehearsal:
    """Inputs -> judge -> derived protocol -> launch (checks, A, C, B, reloads, score) -> audit; with
    calibrate_repeats K: `orch calibrate` of the derived protocol instead of the launch (K A/A launches, audited)."""
    if gpus < 1:
        raise RefusedError(f"--gpus {gpus}: give at least 1")
    if calibrate_repeats is not None:
        launches_asked(calibrate_repeats, "--calibrate")  # fewer than 2 is refused before anything is made
    upstream = upstream.resolve()
    if not (upstream / "train" / "online_rl.py").is_file():
        raise RefusedError(f"{upstream.name}: no train/online_rl.py; pass the upstream R3 source tree as --upstream")
    root = check_upstream(protocol_path, upstream)
    home = resolve_home(home_dir)
    (home.root / "rehearsals").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%SZ-", time.gmtime()), dir=home.root / "rehearsals"))
    say(f"rehearsal {work.name}: upstream {root[:16]}, {gpus} GPU(s)")
    inputs = make_inputs(upstream, work / "inputs", size_args)
    say(f"inputs: {inputs.model.layers} layers x {inputs.model.hidden}, {inputs.model.bagel_parameters:,} parameters")
    ports = _free_ports(2)
    scorer = [sys.executable, "-m", "workers.rehearsal.dev_score", "--ckpt", "{ckpt}", "--out", "{out}"]
    data = derive_protocol(protocol_path, upstream, work / "inputs", inputs, gpus, ports, root, scorer, compile_cache)
    path = work / "protocol.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=200))
    result = Rehearsal(work, path, inputs)
    judge = _start_judge(work, ports)
    say(f"judge: 127.0.0.1 ports {','.join(map(str, ports))}")
    try:
        if calibrate_repeats is None:
            result.launch = launch(path, home_dir=home.root, say=say, lock_timeout=lock_timeout)
        else:
            result.launch, result.calibration = calibrate(path, calibrate_repeats, home.root, say=say,
                                                          lock_timeout=lock_timeout)  # fmt: skip
    finally:
        result.judge = _stop_judge(judge, work)
        cal = result.calibration
        (work / "rehearsal.json").write_text(json.dumps(
            {"schema": "orch.rehearsal/1", "protocol": path.name, "upstream_root": root, "gpus": gpus,
             "run_id": result.launch.run_id if result.launch else None, "judge": result.judge,
             "calibration_run_ids": None if cal is None else cal.run_ids,
             "model": inputs.model.model_dump()}, indent=1, sort_keys=True) + "\n")
    return result
