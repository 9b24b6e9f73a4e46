"""One instance per state directory and per listening address (docs/deployment.md "One instance").

* :class:`StateLock` holds an exclusive ``flock`` on ``DIR/fedsbdt.lock`` for the life of the process that
  runs a coordinator or a site on ``DIR``; the file records the holder's pid and command.  The kernel drops
  the lock when the process ends however it ends (SIGKILL, power loss), so a stale lock file never blocks a
  restart: only a *living* holder does.
* :func:`port_holder` names the process that listens on a TCP port (Linux ``/proc``), for the one-line
  refusal when a second coordinator cannot bind the address (the server binds without ``SO_REUSEPORT``,
  see ``fedsbdt.common.federation.wire.SERVER_OPTIONS``).
"""
from __future__ import annotations

import errno
import fcntl
import os
import sys
from pathlib import Path

LOCK_NAME = "fedsbdt.lock"


class InstanceError(RuntimeError):
    """Another process already runs on this state directory or address (the message names it)."""


def _describe_pid(pid: int) -> str:
    """``pid 1234 (fedsbdt coordinator --plan …)`` as far as /proc tells (just the pid elsewhere)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if len(args) >= 3 and args[1] == "-m" and args[2] in ("fedsbdt", "fedsbdt.cli"):
        args = ["fedsbdt", *args[3:]]
    elif args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    cmd = " ".join(a for a in args if not a.startswith("--log-"))
    cmd = cmd if len(cmd) <= 120 else cmd[:117] + "…"
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


class StateLock:
    """An exclusive lock on a state directory, held until :meth:`release` (or the process's end)."""

    def __init__(self, directory: str | os.PathLike, what: str = "state directory") -> None:
        self.dir = Path(directory)
        self.path = self.dir / LOCK_NAME
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> "StateLock":
        """Take the lock or raise :class:`InstanceError` naming the directory and the process holding it."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise InstanceError(f"{self.dir}: cannot create the lock file {self.path.name}: "
                                f"{e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = self._holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise InstanceError(f"{self.dir}: cannot lock {self.path.name}: {e.strerror or e}") from None
            who = _describe_pid(holder) if holder else "another process"
            raise InstanceError(f"the {self.what} {self.dir} is in use by {who}; one instance per state "
                                "directory: stop that one first, or give this one another --state") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{' '.join(sys.argv)}\n".encode())
        self._fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> int | None:
        try:
            first = os.pread(fd, 64, 0).split(b"\n", 1)[0]
            return int(first) if first.strip() else None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)  # no stale pid for a reader (the kernel releases the lock at close)
            except OSError:
                pass
            os.close(fd)

    def __enter__(self) -> "StateLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def port_holder(port: int) -> str | None:
    """``pid N (command)`` of a process listening on TCP ``port`` (IPv4 or IPv6), or None if unknown."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return _describe_pid(pid)
            except OSError:
                continue
    return "another process (not readable by this user)"


def address_in_use(listen: str) -> str | None:
    """The one-line refusal naming the process that listens on ``listen``'s port; None if none is found
    (port 0, a free port, or an address that failed for another reason)."""
    try:
        port = int(listen.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
    holder = port_holder(port) if port > 0 else None
    if holder is None:
        return None
    return (f"cannot listen on {listen}: the address is in use by {holder}; one coordinator per address: "
            "stop that one first, or pass another --listen")
