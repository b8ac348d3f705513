"""Deterministic judge of r3-mini standing in for the external VLM judge (upstream `train/reward_func.py`), called
in-process or through a small judge server on loopback; batching changes speed, never values."""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import subprocess
import sys
import threading
import urllib.request
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


def target_direction(color: int, obj: int, judge_seed: int, dim: int) -> np.ndarray:
    return np.random.default_rng(judge_seed * 1000 + color * 16 + obj).standard_normal(dim)


def judge_score(latent: np.ndarray, meta: dict, judge_seed: int) -> float:
    """GenEval-like score in [0, 1]: enough patches (count/4 of them) must point along the prompt's direction."""
    lat = np.asarray(latent, dtype=np.float32).astype(np.float64)
    direction = target_direction(int(meta["color"]), int(meta["object"]), judge_seed, lat.shape[-1])
    aligned = float(np.count_nonzero(lat @ direction > 0.0)) / lat.shape[0]
    return min(1.0, aligned / (int(meta["count"]) / 4.0))


def _encode(latent: np.ndarray) -> dict:
    arr = np.ascontiguousarray(latent, dtype=np.float32)
    return {"data": base64.b64encode(arr.tobytes()).decode(), "shape": list(arr.shape)}


def _decode(item: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(item["data"]), dtype=np.float32).reshape(item["shape"])


class _JudgeHandler(BaseHTTPRequestHandler):
    judge_seed = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rewards = [judge_score(_decode(it["latent"]), it["meta"], self.judge_seed) for it in body["items"]]
        payload = json.dumps({"rewards": rewards}).encode()  # repr floats: exact round trip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:  # quiet: nothing of the judge goes to stdout
        pass


def serve(judge_seed: int) -> None:
    _JudgeHandler.judge_seed = judge_seed
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeHandler)
    sys.stdout.write(f"PORT {server.server_address[1]}\n")
    sys.stdout.flush()
    # the trainer closes our stdin when it goes; then we go too
    threading.Thread(target=lambda: (sys.stdin.read(), server.shutdown()), daemon=True).start()
    server.serve_forever()


class RewardClient:
    """Scores images asynchronously (futures, like upstream's executor); reward_batch images per call."""

    def __init__(self, mode: str, reward_batch: int, judge_seed: int) -> None:
        if mode not in ("inprocess", "server") or reward_batch < 1:
            raise ValueError("reward_mode must be inprocess|server and reward_batch >= 1")
        self.mode, self.batch, self.judge_seed = mode, reward_batch, judge_seed
        self.executor = futures.ThreadPoolExecutor(max_workers=2)
        self.proc = None
        if mode == "server":
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", "--judge_seed", str(judge_seed)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline().split()[1])}/score"
            atexit.register(self.close)

    def _score_chunk(self, latents: list[np.ndarray], metas: list[dict]) -> list[float]:
        if self.mode == "inprocess":
            return [judge_score(lat, meta, self.judge_seed) for lat, meta in zip(latents, metas, strict=True)]
        body = json.dumps({"items": [{"latent": _encode(x), "meta": m} for x, m in zip(latents, metas, strict=True)]})
        request = urllib.request.Request(self.url, data=body.encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())["rewards"]

    def submit(self, latents: np.ndarray, metas: list[dict]) -> list[futures.Future]:
        """One future per image; images go to the judge in chunks of reward_batch."""
        out: list[futures.Future] = []
        for start in range(0, len(metas), self.batch):
            chunk = self.executor.submit(
                self._score_chunk,
                list(latents[start : start + self.batch]),
                metas[start : start + self.batch],
            )
            for j in range(len(metas[start : start + self.batch])):
                item: futures.Future = futures.Future()
                chunk.add_done_callback(lambda f, j=j, item=item: _resolve(item, f, j))
                out.append(item)
        return out

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.executor.shutdown(wait=False)


def _resolve(item: futures.Future, chunk: futures.Future, j: int) -> None:
    if chunk.exception() is not None:
        item.set_exception(chunk.exception())
    else:
        item.set_result(chunk.result()[j])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="r3-mini judge server on loopback")
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--judge_seed", type=int, required=True)
    serve(parser.parse_args().judge_seed)
