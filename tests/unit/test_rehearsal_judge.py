"""The loopback reward judge as a rehearsal runs it: a real subprocess on free ports, real HTTP requests in the
shape upstream R3's reward clients send, real signals.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from protocol.rehearsal_inputs import JudgeCounts, JudgeReady

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PROMPT = "You are a strict judge of whether an image matches its description."


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_judge(ports: list[int], tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "workers.rehearsal.judge", "--ports", ",".join(map(str, ports)),
         "--ready", str(tmp / "judge.ready"), "--counts", str(tmp / "judge.counts")],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_ready(proc: subprocess.Popen[str], ready: Path, timeout: float = 15.0) -> JudgeReady:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists():
            return JudgeReady.model_validate_json(ready.read_text())
        if proc.poll() is not None:
            raise AssertionError(f"judge exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    raise AssertionError("judge did not become ready")


@pytest.fixture
def judge(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[int], Path]]:
    ports = free_ports(2)
    proc = start_judge(ports, tmp_path)
    try:
        wait_ready(proc, tmp_path / "judge.ready")
        yield proc, ports, tmp_path
    finally:
        if proc.poll() is None:
            proc.kill()  # the test's own child
            proc.wait(5)


def chat_request(image: bytes, prompt: str) -> dict[str, Any]:
    """What upstream's GeneralLLMServer sends through the OpenAI client for geneval_plus."""
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    return {
        "model": "Qwen2.5-VL-72B-Instruct-AWQ", "temperature": 0.0, "max_tokens": 4096, "top_p": 0.9,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": [{"type": "text", "text": f"Instruction: {prompt}\n\nExplanation: ..."},
                                         {"type": "image_url", "image_url": {"url": url}}]},
        ],
    }  # fmt: skip


def post(port: int, path: str, body: bytes, ctype: str = "application/json") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return resp.status, json.loads(resp.read())


def correct_of(answer: bytes) -> int:
    doc = json.loads(answer)
    assert doc["object"] == "chat.completion" and doc["choices"][0]["message"]["role"] == "assistant"
    assert doc["choices"][0]["finish_reason"] == "stop"
    parsed = json.loads(doc["choices"][0]["message"]["content"])  # what upstream's extract_json_from_response reads
    assert set(parsed) == {"correct"} and parsed["correct"] in (0, 1)
    return int(parsed["correct"])


def stop(proc: subprocess.Popen[str], tmp: Path, sig: int = signal.SIGTERM) -> JudgeCounts:
    proc.send_signal(sig)
    assert proc.wait(10) == 0
    return JudgeCounts.model_validate_json((tmp / "judge.counts").read_text())


def test_chat_rewards_are_deterministic_per_content_and_counted_per_port(
    judge: tuple[subprocess.Popen[str], list[int], Path],
) -> None:
    proc, (p1, p2), tmp = judge
    images = [hashlib.sha256(str(i).encode()).digest() * 8 for i in range(16)]
    first = [correct_of(post(p1, "/v1/chat/completions", json.dumps(chat_request(im, "a red bus")).encode())[1])
             for im in images]  # fmt: skip
    again = [correct_of(post(p2, "/v1/chat/completions", json.dumps(chat_request(im, "a red bus")).encode())[1])
             for im in images]  # fmt: skip
    assert first == again  # same content, same reward, whichever server answers
    assert set(first) == {0, 1}  # the reward depends on the content
    canonical = [json.dumps(chat_request(im, "a red bus")["messages"], sort_keys=True, separators=(",", ":"))
                 for im in images]  # fmt: skip
    assert first == [hashlib.sha256(c.encode()).digest()[0] & 1 for c in canonical]
    status, _ = post(p1, "/v1/chat/completions", json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "no image here"}]}).encode())  # fmt: skip
    assert status == 400
    assert get(p1, "/health") == (200, {"status": "ok", "port": p1})
    assert get(p2, "/v1/models")[1]["data"][0]["object"] == "model"
    counts = stop(proc, tmp)
    assert counts.ports[str(p1)].chat_completions == 16 and counts.ports[str(p1)].rejected == 1
    assert counts.ports[str(p1)].health == 1 and counts.ports[str(p1)].total == 18
    assert counts.ports[str(p2)].chat_completions == 16 and counts.ports[str(p2)].models == 1


def test_listens_on_loopback_only_and_ends_on_sigint(judge: tuple[subprocess.Popen[str], list[int], Path]) -> None:
    proc, ports, tmp = judge
    listening = [c.laddr for c in psutil.Process(proc.pid).net_connections(kind="inet") if c.status == "LISTEN"]
    assert sorted(a.port for a in listening) == sorted(ports)
    assert {a.ip for a in listening} == {"127.0.0.1"}
    counts = stop(proc, tmp, signal.SIGINT)
    assert all(c.total == 0 for c in counts.ports.values())


def test_geneval_pickle_protocol_and_refused_globals(judge: tuple[subprocess.Popen[str], list[int], Path]) -> None:
    proc, (p1, _), tmp = judge
    metas = [{"tag": "counting", "prompt": "two cats"}, {"tag": "colors", "prompt": "a red bus"}]
    batch = {"images": [b"\xff\xd8jpeg-one", b"\xff\xd8jpeg-two"], "only_strict": False, "meta_datas": metas}
    status, body = post(p1, "/v1", pickle.dumps(batch), "application/octet-stream")
    assert status == 200
    answer = pickle.loads(body)  # the test's own judge on loopback
    assert len(answer["scores"]) == 2 and set(answer["group_rewards"]) == {"counting", "colors"}
    assert answer == pickle.loads(post(p1, "/v1", pickle.dumps(batch), "application/octet-stream")[1])
    marker = tmp / "unpickled"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    status, body = post(p1, "/v1", pickle.dumps({"images": [Evil()]}), "application/octet-stream")
    assert status == 400 and b"refused" in body and not marker.exists()
    counts = stop(proc, tmp)
    assert counts.ports[str(p1)].geneval_pickle == 2 and counts.ports[str(p1)].rejected == 1


def test_port_taken_is_refused_in_one_line(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        proc = start_judge([*free_ports(1), taken], tmp_path)
        _, err = proc.communicate(timeout=15)
    finally:
        holder.close()
    assert proc.returncode == 1
    assert err.count("\n") == 1 and f"port {taken} on 127.0.0.1 is taken" in err
    assert not (tmp_path / "judge.ready").exists() and not (tmp_path / "judge.counts").exists()


def test_bad_ports_are_a_usage_error(tmp_path: Path) -> None:
    distinct = "give distinct ports in 1-65535, e.g. 8008,8009"
    expected = {"8008,8008": distinct, "x": "give comma-separated numbers, e.g. 8008,8009", "70000": distinct}
    for ports, advice in expected.items():
        proc = subprocess.run([sys.executable, "-m", "workers.rehearsal.judge", "--ports", ports], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=15, check=False)  # fmt: skip
        # the judge's own reason, not argparse's usage line (which names --ports whatever went wrong)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1] == (
            f"python -m workers.rehearsal.judge: error: argument --ports: --ports {ports!r}: {advice}")
