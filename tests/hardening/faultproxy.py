"""A fault-injecting TCP proxy for the network-fault tests (``tc netem`` is not available here).

One proxy stands between one site and the coordinator: the site connects to
``127.0.0.1:<proxy.port>`` and every connection is relayed to the target.  It
relays opaque bytes (mutual TLS passes through untouched) and can, at any
moment:

* ``delay(s)``   — hold every chunk for ``s`` seconds in each direction (latency, not throughput: a
  timestamped queue per direction);
* ``stall()`` / ``resume()`` — stop relaying without closing anything (a black hole: the peers'
  TCP buffers fill and their keepalives and deadlines must notice);
* ``reset()``    — abort every open connection with an RST (SO_LINGER 0);
* ``refuse()`` / ``restore()`` — reset everything and refuse new connections until restored
  (the link is cut);
* counters: connections accepted, bytes relayed per direction.

All threads are daemons; :meth:`close` stops the listener and resets every connection.
"""
from __future__ import annotations

import heapq
import socket
import struct
import threading
import time


def _rst(sock: socket.socket) -> None:
    """Abort with an RST.  SHUT_RD first: it wakes a thread blocked in recv() on this socket (a bare
    close() would not, and the kernel would keep the connection open until the next byte arrives)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pipe:
    """One direction of one connection: a reader thread fills a timestamped queue, a writer drains it."""

    def __init__(self, proxy: "FaultProxy", src: socket.socket, dst: socket.socket, direction: str) -> None:
        self.proxy, self.src, self.dst, self.direction = proxy, src, dst, direction
        self.queue: list[tuple[float, int, bytes]] = []
        self.cv = threading.Condition()
        self.closed = False
        self._n = 0
        threading.Thread(target=self._read, daemon=True, name=f"proxy-read-{direction}").start()
        threading.Thread(target=self._write, daemon=True, name=f"proxy-write-{direction}").start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(65536)
                if not data:
                    break
                with self.cv:
                    self._n += 1
                    heapq.heappush(self.queue, (time.monotonic() + self.proxy.latency, self._n, data))
                    self.cv.notify_all()
        except OSError:
            pass
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def _write(self) -> None:
        try:
            while True:
                with self.cv:
                    while True:
                        if self.proxy.stalled.is_set() or not self.queue:
                            if self.closed and not self.queue:
                                raise EOFError
                            self.cv.wait(timeout=0.05)
                            continue
                        due = self.queue[0][0] - time.monotonic()
                        if due > 0:
                            self.cv.wait(timeout=due)
                            continue
                        _, _, data = heapq.heappop(self.queue)
                        break
                self.dst.sendall(data)
                self.proxy.count(self.direction, len(data))
        except (OSError, EOFError):
            pass
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class FaultProxy:
    def __init__(self, target: tuple[str, int], listen_host: str = "127.0.0.1") -> None:
        self.target = target
        self.listen_host = listen_host
        self.latency = 0.0
        self.stalled = threading.Event()
        self.refusing = False
        self.connections = 0
        self.bytes = {"up": 0, "down": 0}  # up: site → coordinator
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._srv = socket.socket()
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind((listen_host, 0))
        self._srv.listen(64)
        self.port = self._srv.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def count(self, direction: str, n: int) -> None:
        with self._lock:
            self.bytes[direction] += n

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            if self.refusing:
                _rst(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _rst(client)
                continue
            with self._lock:
                self.connections += 1
                self._socks += [client, upstream]
            _Pipe(self, client, upstream, "up")
            _Pipe(self, upstream, client, "down")

    # ------------------------------------------------------------------ faults

    def delay(self, seconds: float) -> None:
        self.latency = float(seconds)

    def stall(self) -> None:
        self.stalled.set()

    def resume(self) -> None:
        self.stalled.clear()

    def reset(self) -> None:
        """RST every open connection (new ones are accepted)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            _rst(s)

    def refuse(self) -> None:
        """Cut the link: reset everything and refuse new connections until :meth:`restore`."""
        self.refusing = True
        self.reset()

    def restore(self) -> None:
        self.refusing = False
        self.resume()

    def close(self) -> None:
        self._closing = True
        try:
            self._srv.close()
        except OSError:
            pass
        self.reset()
