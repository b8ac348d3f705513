"""A deterministic loopback reward judge for rehearsing upstream R3: same request content, same reward.

`python -m workers.rehearsal.judge --ports 8008,8009 [--ready FILE] [--counts FILE]`; stdlib only, 127.0.0.1 only.

One ThreadingHTTPServer per port answers what upstream's reward clients send (`train/reward_func.py`):

- `POST /v1/chat/completions` (`--reward_fn geneval_plus`, the OpenAI client; the image is a base64 data URL):
  a ChatCompletion whose `choices[0].message.content` is `{"correct": 0|1}`, the bit = low bit of the first byte
  of SHA256(canonical JSON of `messages`). Both arms thus get the same reward for the same image and prompt.
- `POST /v1` (`--reward_fn geneval`, pickled `{"images": [jpeg bytes], "meta_datas": [...], "only_strict"}`):
  a pickle of scores / rewards / strict_rewards / group_rewards / group_strict_rewards / reasons, each image's
  score decided by SHA256(image bytes + canonical JSON of its metadata). The request is unpickled with a
  loader that refuses every global (plain containers, strings, bytes and numbers only), and only loopback
  can reach it.
- `GET /v1/models`, `GET /health`: what a client or a readiness check asks.

The ready file (`orch.rehearsal-judge-ready/1`) is written once every port listens; the counts file
(`orch.rehearsal-judge-counts/1`, requests per port and route) when the judge ends on SIGTERM or SIGINT
(exit 0). A port already taken is refused with one line (exit 1), before anything is written.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import io
import json
import os
import pickle
import signal
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from protocol.hashing import canonical_json as dumps_canonical

HOST = "127.0.0.1"
READY_SCHEMA = "orch.rehearsal-judge-ready/1"
COUNTS_SCHEMA = "orch.rehearsal-judge-counts/1"
ROUTES = ("chat_completions", "geneval_pickle", "models", "health", "rejected")
MODEL_ID = "orch-loopback-judge"
MAX_BODY = 64 << 20  # a 512x512 JPEG as base64 is well under 1 MiB; refuse anything absurd


def canonical_json(doc: Any) -> bytes:
    return dumps_canonical(doc, ensure_ascii=False).encode()


def chat_verdict(messages: Any) -> tuple[int, str]:
    """The reward bit and the digest it comes from: SHA256 of the canonical JSON of the messages."""
    digest = hashlib.sha256(canonical_json(messages)).hexdigest()
    return int(digest[:2], 16) & 1, digest


def image_urls(messages: list[Any]) -> list[str]:
    urls: list[str] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url", {}).get("url") if isinstance(part.get("image_url"), dict) else None
                if isinstance(url, str):
                    urls.append(url)
    return urls


def chat_completion(request: dict[str, Any]) -> dict[str, Any]:
    """A valid OpenAI ChatCompletion for one request; raises ValueError with the reason for a bad one."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    urls = image_urls(messages)
    if not urls:
        raise ValueError("no image_url part in the messages: upstream's reward client always sends the image")
    if not all(u.startswith("data:image/") and ";base64," in u for u in urls):
        raise ValueError("image_url must be a base64 data URL (data:image/...;base64,...)")
    correct, digest = chat_verdict(messages)
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": 0,
        "model": str(request.get("model", MODEL_ID)),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps({"correct": correct})},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


class _PlainUnpickler(pickle.Unpickler):
    """Loads containers, strings, bytes and numbers; any global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused: the judge accepts plain data only")


def geneval_scores(request: Any) -> dict[str, Any]:
    """upstream's geneval server answer for one pickled batch; raises ValueError for a bad request."""
    if not isinstance(request, dict) or not isinstance(request.get("images"), list):
        raise ValueError("the pickle must be a dict with an 'images' list")
    images: list[Any] = request["images"]
    metas: list[Any] = request.get("meta_datas", [{} for _ in images])
    if not isinstance(metas, list) or len(metas) != len(images):
        raise ValueError("'meta_datas' must be a list as long as 'images'")
    scores: list[float] = []
    groups: dict[str, list[float]] = {}
    for image, meta in zip(images, metas, strict=True):
        if not isinstance(image, bytes | bytearray):
            raise ValueError("each image must be JPEG bytes")
        digest = hashlib.sha256(bytes(image) + canonical_json(meta)).digest()
        score = float(digest[0] & 1)
        scores.append(score)
        tag = str(meta.get("tag", "all")) if isinstance(meta, dict) else "all"
        groups.setdefault(tag, []).append(score)
    return {
        "scores": scores,
        "rewards": list(scores),
        "strict_rewards": list(scores),
        "group_rewards": {k: list(v) for k, v in groups.items()},
        "group_strict_rewards": {k: list(v) for k, v in groups.items()},
        "reasons": ["loopback judge" for _ in scores],
    }


class Counts:
    """Requests per port and route, shared by all server threads."""

    def __init__(self, ports: Sequence[int]) -> None:
        self._lock = threading.Lock()
        self._counts = {p: dict.fromkeys(ROUTES, 0) for p in ports}

    def add(self, port: int, route: str) -> None:
        with self._lock:
            self._counts[port][route] += 1

    def document(self) -> dict[str, Any]:
        with self._lock:
            ports = {str(p): {**c, "total": sum(c.values())} for p, c in sorted(self._counts.items())}
        return {"schema": COUNTS_SCHEMA, "host": HOST, "ports": ports}


class JudgeHandler(BaseHTTPRequestHandler):
    server_version = "orch-judge/1"
    protocol_version = "HTTP/1.1"  # keep-alive, as the OpenAI client (httpx) expects
    counts: Counts  # set on the per-server subclass

    def log_message(self, format: str, *args: Any) -> None:  # the trainer's log is loud enough
        return

    def _port(self) -> int:
        return int(self.server.server_address[1])

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _reject(self, status: int, message: str) -> None:
        self.counts.add(self._port(), "rejected")
        self._json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reject(411, "Content-Length required")
            return None
        if length < 0 or length > MAX_BODY:
            self._reject(413, f"body of {length} bytes refused (limit {MAX_BODY})")
            return None
        return self.rfile.read(length)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            self.counts.add(self._port(), "models")
            self._json(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0,
                                                         "owned_by": "orch"}]})  # fmt: skip
        elif path in ("/health", "/v1/health"):
            self.counts.add(self._port(), "health")
            self._json(200, {"status": "ok", "port": self._port()})
        else:
            self._reject(404, f"no route GET {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/v1"):
            self._reject(404, f"no route POST {path}")
            return
        body = self._body()
        if body is None:
            return
        if path == "/v1/chat/completions":
            try:
                request = json.loads(body)
                if not isinstance(request, dict):
                    raise ValueError("the body must be a JSON object")
                answer = chat_completion(request)
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                self._reject(400, str(exc))
                return
            self.counts.add(self._port(), "chat_completions")
            self._json(200, answer)
            return
        try:
            scores = geneval_scores(_PlainUnpickler(io.BytesIO(body)).load())
        except (pickle.UnpicklingError, ValueError, EOFError, TypeError, AttributeError, IndexError) as exc:
            self._reject(400, f"geneval request refused: {exc}")
            return
        self.counts.add(self._port(), "geneval_pickle")
        self._send(200, pickle.dumps(scores), "application/octet-stream")


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class PortRefused(Exception):
    """A port cannot be listened on: the message is the one line the judge prints."""


def parse_ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ports {text!r}: give comma-separated numbers, e.g. 8008,8009") from None
    if not ports or any(not 0 < p < 65536 for p in ports) or len(set(ports)) != len(ports):
        raise argparse.ArgumentTypeError(f"--ports {text!r}: give distinct ports in 1-65535, e.g. 8008,8009")
    return ports


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def bind_all(ports: Sequence[int], counts: Counts) -> list[_Server]:
    servers: list[_Server] = []
    handler = type("BoundJudgeHandler", (JudgeHandler,), {"counts": counts})
    for port in ports:
        try:
            servers.append(_Server((HOST, port), handler))
        except OSError as exc:
            for s in servers:
                s.server_close()
            if exc.errno == errno.EADDRINUSE:
                why = f"port {port} on {HOST} is taken; stop what listens there or choose other --ports"
            else:
                why = f"cannot listen on {HOST}:{port} ({exc.strerror}); choose other --ports"
            raise PortRefused(f"judge: {why}") from None
    return servers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m workers.rehearsal.judge",
        description="Deterministic loopback reward judge for rehearsing upstream R3 (127.0.0.1 only).",
        epilog="example: python -m workers.rehearsal.judge --ports 8008,8009 --ready judge.ready --counts judge.counts",
    )
    ap.add_argument("--ports", type=parse_ports, required=True, help="comma-separated ports, one server each")
    ap.add_argument("--ready", type=Path, help="written (JSON) once every port listens")
    ap.add_argument("--counts", type=Path, help="requests per port and route, written at exit")
    opts = ap.parse_args(argv)

    counts = Counts(opts.ports)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        servers = bind_all(opts.ports, counts)
    except PortRefused as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    threads = [threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True) for s in servers]
    for t in threads:
        t.start()
    if opts.ready is not None:
        write_json_atomic(opts.ready, {"schema": READY_SCHEMA, "host": HOST, "ports": list(opts.ports),
                                       "pid": os.getpid()})  # fmt: skip
    while not stop.wait(0.5):
        pass
    for s in servers:
        s.shutdown()
        s.server_close()
    if opts.counts is not None:
        write_json_atomic(opts.counts, counts.document())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
