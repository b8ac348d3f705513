"""Issue 49, item 4: no way out through sockets. Real listeners outside (a path socket in a private folder, an
abstract socket, TCP on 127.0.0.1) that a real package (a checks package whose prepare command plays the candidate)
cannot reach; a declared endpoint it can, both ways; loopback inside it; as root and, through ns_init, as nobody."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.isolation.package_isolation import namespaces_work, ns_command, read_report
from orchestrator.isolation.packages import package_env, run_package
from protocol.package import ChecksSpec
from protocol.schema import Launcher, canonical_json, endpoint, protocol_id
from protocol.schema import load_protocol as load

REPO = Path(__file__).resolve().parents[2]
needs_ns = pytest.mark.skipif(not namespaces_work(), reason="this kernel or user cannot make the namespaces")

# the candidate: tries every way out it is given (argv[2]: JSON), as root in its namespace first un-mounting what
# hides the path socket; writes what happened to argv[1]
ESCAPE = """
import ctypes, json, socket, sys
to = json.loads(sys.argv[2])
def attempt(family, addr, kind=socket.SOCK_STREAM):
    s = socket.socket(family, kind)
    s.settimeout(5)
    try:
        if kind == socket.SOCK_DGRAM:
            s.sendto(b"x", addr)
        else:
            s.connect(addr)
        return "connected"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()
out = {}
if "path" in to:
    out["umount"] = ctypes.CDLL(None, use_errno=True).umount2(to["path"].encode(), 2)  # MNT_DETACH
    out["path"] = attempt(socket.AF_UNIX, to["path"])
if "abstract" in to:
    out["abstract"] = attempt(socket.AF_UNIX, "\\0" + to["abstract"])
    out["abstract_dgram"] = attempt(socket.AF_UNIX, "\\0" + to["abstract"] + "-dgram", socket.SOCK_DGRAM)
for name, port in to.get("tcp", {}).items():
    out[name] = attempt(socket.AF_INET, ("127.0.0.1", port))
if "declared" in to:  # a payload there and back: the service answers with it reversed once it has read it all
    host, port = to["declared"]
    payload = bytes(range(256)) * 4096
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            back = b"".join(iter(lambda: s.recv(65536), b""))
        out["declared"] = "relayed" if back == payload[::-1] else f"{len(back)} bytes, not the reply"
    except OSError as exc:
        out["declared"] = type(exc).__name__
open(sys.argv[1], "w").write(json.dumps(out))
"""
# two processes of one package: a server on loopback (TCP through "localhost", and an abstract socket) and a client
LOOPBACK = """
import json, socket, subprocess, sys
name = "orch-inside-" + sys.argv[2]
server = '''
import socket, sys
t = socket.create_server(("127.0.0.1", 0)); u = socket.socket(socket.AF_UNIX); u.bind("\\\\0" + sys.argv[1]); u.listen()
print(t.getsockname()[1], flush=True)
for s in (t, u):
    c, _ = s.accept(); c.sendall(c.recv(64).upper()); c.close()
'''
proc = subprocess.Popen([sys.executable, "-c", server, name], stdout=subprocess.PIPE, text=True)
port = int(proc.stdout.readline())
out = {}
with socket.create_connection(("localhost", port), timeout=10) as c:
    c.sendall(b"tcp"); out["tcp"] = c.recv(64).decode()
with socket.socket(socket.AF_UNIX) as c:
    c.connect("\\0" + name); c.sendall(b"abstract"); out["abstract"] = c.recv(64).decode()
out["server"] = proc.wait(timeout=10)
open(sys.argv[1], "w").write(json.dumps(out))
"""


def _spec(base: Path, code: str, *args: str) -> ChecksSpec:
    pkg_dir = base / "home" / "runs" / "r1" / "packages" / "checks"
    pkg_dir.mkdir(parents=True)
    scratch = base / "home" / "scratch" / "r1"
    scratch.mkdir(parents=True)
    return ChecksSpec.model_validate({
        "run_id": "r1", "name": "checks", "kind": "checks", "package_dir": str(pkg_dir),
        "sealed_dir": str(base), "scratch_dir": str(scratch), "result_path": str(pkg_dir / "result.json"),
        "device": "cpu", "precision": "fp32",
        "prepare": [{"name": "escape", "argv": [sys.executable, "-c", code, str(pkg_dir / "seen.json"), *args]}],
    })


def _seen(spec: ChecksSpec) -> dict[str, object]:
    doc = json.loads((Path(spec.package_dir) / "seen.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _env() -> dict[str, str]:
    return package_env(os.environ, {}, {}, {}, "r1")


class Outside:
    """Listeners of the host that a package must not reach: a path socket in `folder`, an abstract stream and
    datagram socket, TCP on 127.0.0.1. `reached()` names those that a connection (or a datagram) got to."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = str(folder / "service.sock")
        self.abstract = f"orch-outside-{secrets.token_hex(6)}"
        self._path = socket.socket(socket.AF_UNIX)
        self._path.bind(self.path)
        os.chmod(self.path, 0o777)  # nobody may connect to it, were it reachable
        self._abstract = socket.socket(socket.AF_UNIX)
        self._abstract.bind("\0" + self.abstract)
        self._dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._dgram.bind("\0" + self.abstract + "-dgram")
        self._tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self._tcp.getsockname()[1]
        for s in (self._path, self._abstract):
            s.listen()

    def targets(self) -> dict[str, object]:
        return {"path": self.path, "abstract": self.abstract, "tcp": {"tcp": self.port}}

    def reached(self) -> list[str]:
        out = []
        for name, s in (("path", self._path), ("abstract", self._abstract), ("tcp", self._tcp)):
            s.setblocking(False)
            try:
                s.accept()[0].close()
                out.append(name)
            except BlockingIOError:
                pass
        self._dgram.setblocking(False)
        try:
            self._dgram.recv(16)
            out.append("abstract_dgram")
        except BlockingIOError:
            pass
        return out

    def close(self) -> None:
        for s in (self._path, self._abstract, self._dgram, self._tcp):
            s.close()


class Service:
    """A TCP service outside the package (a reward server, a judge): reads a request to its end, answers it
    reversed; `got` holds what each connection sent."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock = socket.create_server((host, 0))
        self.port = self._sock.getsockname()[1]
        self.got: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                chunks = []
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
                self.got.append(b"".join(chunks))
                conn.sendall(self.got[-1][::-1])

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Outside]:
    listeners = Outside(tmp_path / "private")
    yield listeners
    listeners.close()


@needs_ns
def test_a_package_reaches_no_unix_socket_and_no_tcp_service_outside_it(tmp_path: Path, outside: Outside) -> None:
    spec = _spec(tmp_path, ESCAPE, json.dumps(outside.targets()))
    outcome = run_package(spec, _env(), 120)
    assert outcome.status == "ok", outcome.note
    assert outcome.extra["isolation"] == "namespace" and outcome.extra["network"] == "namespace"
    seen = _seen(spec)
    # the path socket is covered by /dev/null, locked below the package's user namespace (no umount as root)
    assert seen["umount"] == -1 and seen["path"] == "ConnectionRefusedError"
    # abstract names and 127.0.0.1 are the package's own network namespace's: nothing listens there
    assert seen["abstract"] == "ConnectionRefusedError" and seen["abstract_dgram"] == "ConnectionRefusedError"
    assert seen["tcp"] == "ConnectionRefusedError"
    assert outside.reached() == []


@needs_ns
def test_a_declared_endpoint_is_relayed_both_ways_and_no_other_port(tmp_path: Path, outside: Outside) -> None:
    service = Service()
    try:
        to = {"declared": ["127.0.0.1", service.port], "tcp": {"undeclared": outside.port}}
        spec = _spec(tmp_path, ESCAPE, json.dumps(to))
        outcome = run_package(spec, _env(), 120, endpoints=[f"127.0.0.1:{service.port}"])
        assert outcome.status == "ok", outcome.note
        seen = _seen(spec)
        assert seen["declared"] == "relayed"  # 1 MiB there, its reverse back, the half-close passed on
        assert service.got == [bytes(range(256)) * 4096]
        assert seen["undeclared"] == "ConnectionRefusedError" and outside.reached() == []
    finally:
        service.close()


def _host_address() -> str | None:
    """A non-loopback IPv4 address of this host (the route to a documentation address; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@needs_ns
def test_an_external_services_address_is_reached_unchanged_from_inside(tmp_path: Path) -> None:
    """A reward server the owner keeps on another address: the package connects to that very HOST:PORT."""
    host = _host_address()
    if host is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    service = Service(host)
    try:
        spec = _spec(tmp_path, ESCAPE, json.dumps({"declared": [host, service.port]}))
        outcome = run_package(spec, _env(), 120, endpoints=[f"{host}:{service.port}"])
        assert outcome.status == "ok", outcome.note
        assert _seen(spec)["declared"] == "relayed" and len(service.got) == 1
    finally:
        service.close()


@needs_ns
def test_loopback_between_two_processes_of_one_package_works(tmp_path: Path) -> None:
    spec = _spec(tmp_path, LOOPBACK, secrets.token_hex(6))
    outcome = run_package(spec, _env(), 120)
    assert outcome.status == "ok", outcome.note
    assert _seen(spec) == {"tcp": "TCP", "abstract": "ABSTRACT", "server": 0}


LIMIT_NET = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
assert libc.unshare(0x10000000) == 0, os.strerror(ctypes.get_errno())  # a user namespace of this test's own
for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
    open(f"/proc/self/{name}", "w").write(text)
open("/proc/sys/user/max_net_namespaces", "w").write("0")  # its limit only: the host's is untouched
os.execv(sys.argv[1], sys.argv[1:])
"""


@needs_ns
def test_where_the_kernel_refuses_a_network_namespace_the_report_says_so(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "hole").mkdir()
    read_fd, write_fd = os.pipe()
    argv = ns_command([str(tmp_path / "hole")], str(tmp_path / "dev"), write_fd, str(tmp_path),
                      ["sh", "-c", f"echo ran > {tmp_path}/hole/ran"])
    proc = subprocess.run([sys.executable, "-c", LIMIT_NET, *argv], capture_output=True, timeout=60,
                          pass_fds=(write_fd,), check=False)
    os.close(write_fd)
    report = read_report(read_fd)
    if proc.returncode != 0 and b"max_net_namespaces" in proc.stderr:
        pytest.skip(f"cannot limit network namespaces in a user namespace here: {proc.stderr.decode()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hole" / "ran").read_text() == "ran\n"
    assert report is not None
    assert report["network"] == "host: the kernel refused a network namespace (No space left on device)"


# the system's interpreter: the one running the tests may lie in a folder that nobody may not search
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.mark.skipif(not namespaces_work() or shutil.which("setpriv") is None or SYSTEM_PYTHON is None,
                    reason="no namespaces, no setpriv or no /usr/bin/python3")
def test_as_an_unprivileged_user_no_socket_outside_is_reached_but_the_declared_one() -> None:
    """ns_init itself as user nobody (its init in a user namespace of its own relays the endpoint)."""
    assert SYSTEM_PYTHON is not None
    base = Path(tempfile.mkdtemp(prefix="orch-nobody-"))  # pytest's tmp_path is private to root
    os.chmod(base, 0o755)
    for sub in ("dev", "hole"):
        (base / sub).mkdir()
        shutil.chown(base / sub, 65534, 65534)
    listeners, service = Outside(base / "private"), Service()
    os.chmod(base / "private", 0o755)
    try:
        to = {**listeners.targets(), "declared": ["127.0.0.1", service.port]}
        read_fd, write_fd = os.pipe()
        argv = ns_command([str(base / "hole")], str(base / "dev"), write_fd, str(base),
                          [SYSTEM_PYTHON, "-c", ESCAPE, str(base / "hole" / "seen.json"), json.dumps(to)],
                          endpoints=[("127.0.0.1", service.port)])
        proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *argv],
                              capture_output=True, timeout=60, pass_fds=(write_fd,), check=False)
        os.close(write_fd)
        report = read_report(read_fd)
        if proc.returncode == 125 and b"unshare" in proc.stderr:
            pytest.skip(f"unprivileged user namespaces are not allowed here: {proc.stderr.decode().strip()}")
        assert proc.returncode == 0, proc.stderr
        assert report is not None and report["network"] == "namespace"
        seen = json.loads((base / "hole" / "seen.json").read_text())
        assert seen["umount"] == -1 and seen["path"] == "ConnectionRefusedError"
        assert seen["abstract"] == seen["abstract_dgram"] == seen["tcp"] == "ConnectionRefusedError"
        assert seen["declared"] == "relayed" and listeners.reached() == []
    finally:
        listeners.close()
        service.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_declared_endpoint_is_host_port_and_nothing_else() -> None:
    assert endpoint("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert endpoint("localhost:80") == ("127.0.0.1", 80) and endpoint("[::1]:9") == ("::1", 9)
    assert endpoint("10.0.0.5:65535") == ("10.0.0.5", 65535)
    for bad in ("reward.internal:80", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:080",
                "0.0.0.0:80", "224.0.0.1:80", "[fe80::1]:80", "127.1:80", ":80", "127.0.0.1: 80"):
        with pytest.raises(ValueError) as err:
            endpoint(bad)
        assert repr(bad) in str(err.value) and "\n" not in str(err.value)
    launcher = {"nproc": 1, "backend": "gloo", "device": "cpu", "script": "train.py"}
    with pytest.raises(ValueError, match=r"item 2: 'judge:1' is not HOST:PORT"):
        Launcher.model_validate({**launcher, "endpoints": ["127.0.0.1:1", "judge:1"]})
    with pytest.raises(ValueError, match="twice"):
        Launcher.model_validate({**launcher, "endpoints": ["127.0.0.1:1", "127.0.0.1:1"]})


def test_no_endpoints_leaves_a_protocols_id_as_it_was() -> None:
    """Left out of the canonical JSON while empty (every published protocol id stands); part of it once declared."""
    protocol = load(REPO / "protocol" / "r3_mini.yaml").protocol
    assert protocol.launcher.endpoints == [] and b'"endpoints"' not in canonical_json(protocol)
    declared = protocol.model_copy(update={"launcher": protocol.launcher.model_copy(
        update={"endpoints": ["127.0.0.1:8000"]})})
    assert b'"endpoints":["127.0.0.1:8000"]' in canonical_json(declared)
    assert protocol_id(declared) != protocol_id(protocol)

