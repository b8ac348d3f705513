"""The namespaces one package runs in, started as a script (`python -I -S ns_init.py CONFIG_JSON -- CMD...`).

A read-only root with only the package's own folders writable, a /dev of the devices a trainer needs, a fresh
/dev/shm and IPC namespace; a PID namespace whose init (this file) ends every process still running when the command
ends, naming them; the command in a user namespace below, so that it cannot undo the mounts even as root, and in a
network namespace of its own (loopback only; the host's path sockets masked; declared endpoints relayed by the init).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x08000000, 0x10000000, 0x20000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, SIOCSIFNETMASK, IFF_UP = 0x8913, 0x8914, 0x8916, 0x891C, 0x1
# the host's interfaces are not in the package's network namespace: a name of one would stop NCCL / gloo starting
NET_IFNAMES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
RUN_USER = "/run/user"  # each user's runtime folder: its bus, systemd, podman, gnupg sockets (made later, too)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
_FLAG_OF = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
            "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
SYS_MOUNT_SETATTR, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, 0x8000, 1  # one number on every architecture
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
# what a trainer opens under /dev (GPUs, RDMA); never a disk, /dev/mem or the like
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty", "log", "kfd")
DEV_PREFIXES = ("nvidia",)
DEV_DIRS = ("pts", "infiniband", "dri", "nvidia-caps", "nvidia-caps-imex-channels")
SETUP_FAILED = 125  # the namespaces could not be made: orch says so (protocol: isolation failed)
# set in the package command's environment: it runs in the package's own PID namespace, where no other process
# of the host is visible (workers/quiet_host.py reads it; the same literal there, this file runs isolated)
PID_NAMESPACE_ENV = "ORCH_PACKAGE_PID_NAMESPACE"
_RESET = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ)

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = _enc
    _check(_libc.mount(enc(src), target.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def _mount_flags(target: str) -> int:
    """The per-mount flags of the mount at `target` (kept on a remount: a user namespace may not drop them)."""
    best, flags = "", 0
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, flags = point, sum(_FLAG_OF.get(o, 0) for o in fields[5].split(","))
    return flags


def _set_read_only(path: str, read_only: bool, recursive: bool) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    rc = _libc.syscall(SYS_MOUNT_SETATTR, -100, path.encode(), AT_RECURSIVE if recursive else 0,
                       ctypes.byref(attr), ctypes.sizeof(attr))
    if rc == 0:
        return
    if ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL):
        _check(rc, f"mount_setattr {path}")
    # kernels before 5.12: remount each mount at or below the path, its own flags kept
    points = [path]
    if recursive:
        with open("/proc/self/mountinfo") as f:
            points = [ln.split()[4].replace("\\040", " ") for ln in f]
        points = [p for p in points if p == path or p.startswith(path.rstrip("/") + "/")]
    for point in points:
        _mount(None, point, None, MS_REMOUNT | MS_BIND | (MS_RDONLY if read_only else 0) | _mount_flags(point))


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _map_self(uid: int, gid: int) -> None:
    """Map root of the user namespace just made onto (uid, gid) of its parent: the one mapping allowed to itself."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1\n")
    _write("/proc/self/gid_map", f"0 {gid} 1\n")


def _make_dev(staging: str) -> None:
    """A tmpfs with bind mounts of the allowed device nodes and folders, and the usual links (moved onto /dev)."""
    _mount("orch-dev", staging, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755")
    for name in sorted(os.listdir("/dev")):
        src, dst = f"/dev/{name}", f"{staging}/{name}"
        if os.path.islink(src):
            continue
        if name in DEV_DIRS and os.path.isdir(src):
            os.mkdir(dst)
        elif (name in DEV_NODES or name.startswith(DEV_PREFIXES)) and not os.path.isdir(src):
            open(dst, "w").close()
        else:
            continue
        _mount(src, dst, None, MS_BIND | MS_REC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{staging}/{name}")
    os.mkdir(f"{staging}/shm")


def _setup(cfg: dict[str, object]) -> None:
    """In the new mount namespace: everything read-only, then /dev, /dev/shm, the holes and /proc."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    staging = str(cfg["dev_staging"])
    _make_dev(staging)
    _set_read_only("/", True, recursive=True)
    _mount(staging, "/dev", None, MS_MOVE)
    _mount("orch-shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    holes = sorted(map(str, cfg["holes"]), key=len)  # type: ignore[call-overload]
    for hole in holes:
        _mount(hole, hole, None, MS_BIND | MS_REC)
        _set_read_only(hole, False, recursive=False)
    if cfg.get("network", "own") == "own":  # these mounts too are locked below the worker's user namespace
        _mask_sockets([*holes, str(cfg["cwd"]), sys.prefix, sys.base_prefix])
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _bound_paths() -> list[str]:
    """Every path a Unix socket of this (the host's) network namespace is bound to; "@" names are abstract."""
    out = set()
    with open("/proc/self/net/unix", "rb") as f:
        next(f, None)
        for line in f:
            fields = line.rstrip(b"\n").split(None, 7)
            if len(fields) == 8 and fields[7].startswith(b"/"):
                out.add(os.fsdecode(fields[7]))
    return sorted(out)


def _needed(path: str, keep: list[str]) -> bool:
    """Whether a folder holds (or lies in) a path the package needs: one of its holes, its cwd, the interpreter."""
    root = path.rstrip("/") + "/"
    return any(k == path or k.startswith(root) or path.startswith(k.rstrip("/") + "/") for k in keep)


def _mask_sockets(keep: list[str]) -> int:
    """Hide the host's path sockets: an empty read-only tmpfs over each /run/user/UID that holds nothing the package
    needs, then /dev/null bound over every other bound path /proc/net/unix lists that is a socket here (pinned by an
    O_PATH descriptor, so what is checked is what is covered). Returns how many were masked."""
    bound = _bound_paths()
    masked = 0
    try:
        users = sorted(os.listdir(RUN_USER))
    except OSError:
        users = []
    for name in users:
        folder = f"{RUN_USER}/{name}"
        if os.path.isdir(folder) and not os.path.islink(folder) and not _needed(folder, keep):
            _mount("orch-mask", folder, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755,size=4k")
            masked += 1
    for path in bound:
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone, or in a folder this user cannot search: not reachable from the package either
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                _mount("/dev/null", f"/proc/self/fd/{fd}", None, MS_BIND)
                masked += 1
        finally:
            os.close(fd)
    return masked


def _ifreq(name: str, payload: bytes = b"") -> bytes:
    return name.encode().ljust(16, b"\0") + payload.ljust(24, b"\0")  # struct ifreq: IFNAMSIZ + a 24-byte union


def _sockaddr_in(host: str) -> bytes:
    return struct.pack("=H2s4s8x", socket.AF_INET, b"\0\0", socket.inet_aton(host))


def _own_network(endpoints: list[tuple[str, int]]) -> tuple[str, list[socket.socket]]:
    """In the worker, before exec: a network namespace of its own with loopback up (its ranks' rendezvous, gloo,
    NCCL), each declared endpoint's address on it and a listener there, which the init relays from the host's
    network. ("namespace", listeners), or ("host: why", []) where the kernel refuses a network namespace."""
    if _libc.unshare(CLONE_NEWNET) != 0:
        return f"host: the kernel refused a network namespace ({os.strerror(ctypes.get_errno())})", []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as ctl:
        flags = struct.unpack_from("=H", fcntl.ioctl(ctl, SIOCGIFFLAGS, _ifreq("lo")), 16)[0]
        fcntl.ioctl(ctl, SIOCSIFFLAGS, _ifreq("lo", struct.pack("=H", flags | IFF_UP)))
        hosts = sorted({h for h, _ in endpoints if ":" not in h and not ipaddress.IPv4Address(h).is_loopback})
        for i, host in enumerate(hosts):  # an external service's own address, so the package uses it unchanged
            fcntl.ioctl(ctl, SIOCSIFADDR, _ifreq(f"lo:{i}", _sockaddr_in(host)))
            fcntl.ioctl(ctl, SIOCSIFNETMASK, _ifreq(f"lo:{i}", _sockaddr_in("255.255.255.255")))
    listeners = []
    for host, port in endpoints:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"listen on {host}:{port} in the package's network: {exc.strerror}") from None
        sock.listen(128)
        listeners.append(sock)
    for var in NET_IFNAMES:
        if var in os.environ:
            os.environ[var] = "lo"
    return "namespace", listeners


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _forward(conn: socket.socket, target: tuple[str, int]) -> None:
    try:
        up = socket.create_connection(target, timeout=10)
    except OSError:
        conn.close()  # the package sees the connection end, as it would see a refused one
        return
    up.settimeout(None)
    back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    back.start()
    _pump(conn, up)
    back.join()
    conn.close()
    up.close()


def _relay(listener: socket.socket, target: tuple[str, int]) -> None:
    """In the init (the host's network): each connection the package makes to the listener, to its endpoint."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_forward, args=(conn, target), daemon=True).start()


def _alive() -> list[tuple[int, str]]:
    """Processes of this PID namespace other than its init, zombies left out: (pid, command name)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == "1":
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split(" ", 1)[0]
        if state not in ("Z", "X"):
            out.append((int(entry), name))
    return out


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _init(cfg: dict[str, object], report_fd: int, cmd: list[str]) -> int:
    """PID 1 of the package's namespace: run the command, then end (and name) whatever it left running."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the command may not ptrace or read the init (its report fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # orch signals the command's process group; the init waits for it
    try:
        _setup(cfg)
    except OSError as exc:
        sys.stderr.write(f"orch isolation: {exc}\n")
        return SETUP_FAILED
    uid, gid = os.getuid(), os.getgid()
    declared = cfg.get("endpoints") or []
    assert isinstance(declared, list)
    endpoints = [(str(host), int(port)) for host, port in declared]  # relayed in this order
    chan, worker_chan = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = os.fork()
    if worker == 0:
        try:
            chan.close()
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its /proc/self/*_map are its own again
            _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare user namespace")
            _map_self(uid, gid)  # mounts copied into a less privileged namespace are locked: no remount, no umount
            # owned by the worker's user namespace: it may bring its loopback up, and reaches no other network
            network, listeners = _own_network(endpoints) if cfg.get("network", "own") == "own" else ("host", [])
            if listeners:
                socket.send_fds(worker_chan, [network.encode()], [s.fileno() for s in listeners])
            else:
                worker_chan.send(network.encode())
            for sock in (*listeners, worker_chan):
                sock.close()
            for sig in _RESET:
                signal.signal(sig, signal.SIG_DFL)
            os.chdir(str(cfg["cwd"]))
            os.environ[PID_NAMESPACE_ENV] = "1"
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            sys.stderr.write(f"orch isolation: {exc}\n")
        os._exit(SETUP_FAILED)
    worker_chan.close()
    message, fds, _, _ = socket.recv_fds(chan, 4096, len(endpoints) + 1)  # b"" if the worker failed before
    chan.close()
    network = message.decode() or "none: the worker ended before its network was made"
    for fd, target in zip(fds, endpoints, strict=False):  # no fds: host network, or the worker failed first
        threading.Thread(target=_relay, args=(socket.socket(fileno=fd), target), daemon=True).start()
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == worker:
            break
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code
    deadline = time.monotonic() + float(cfg.get("grace_s", 1.0))  # type: ignore[arg-type]
    while True:  # what is ending anyway (a rank still exiting) is given a moment
        _reap()
        alive = _alive()
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if alive:
        os.kill(-1, signal.SIGKILL)  # every process of this namespace but its init
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    report = {"guarantee": "pid-namespace", "survivors": [{"pid": p, "name": n} for p, n in alive[:20]],
              "survivor_count": len(alive), "network": network}
    os.write(report_fd, json.dumps(report).encode())
    os.close(report_fd)
    return code


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    cmd = argv[argv.index("--") + 1 :]
    report_fd = int(cfg["report_fd"])
    os.set_inheritable(report_fd, False)  # the command never gets it
    uid, gid = os.getuid(), os.getgid()
    # its own SysV IPC and POSIX message queues too: a segment it leaves ends with it
    flags = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | (CLONE_NEWUSER if uid != 0 else 0)
    try:
        _check(_libc.unshare(flags), "unshare")
        if uid != 0:
            _map_self(uid, gid)
    except OSError as exc:
        sys.stderr.write(f"orch isolation: {exc}\n")
        return SETUP_FAILED
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # a SIGTERM to the group reaches the command; this one waits for it
    init = os.fork()
    if init == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # orch's SIGKILL of the group ends the namespace
        os._exit(_init(cfg, report_fd, cmd))
    os.close(report_fd)
    _, status = os.waitpid(init, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
