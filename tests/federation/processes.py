"""Real ``fedsbdt`` child processes whose JSON log lines become events (federation and hardening tests).

Every process is ``python -m fedsbdt.cli --log-format json …``; a reader
thread per process turns its stderr lines into events (and its exit into an
``_exit`` event) posted to an :class:`EventLog`, so tests wait for *events*
with a deadline instead of sleeping.  A line ``fedsbdt-testhook: …`` (printed
by :mod:`fedsbdt.common.testhooks` just before a test-only SIGKILL) becomes a
``testhook_kill`` event.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin_plan(plan_path: Path, extra) -> list[str]:
    """``--plan PLAN`` (every site pins the plan it takes part in), unless ``extra`` pins one itself."""
    return [] if {"--plan", "--plan-hash"} & set(extra) else ["--plan", str(plan_path)]


class EventLog:
    """The events of a group of processes (``events`` list and ``cond`` condition, set by the subclass)."""

    events: list[dict]
    cond: threading.Condition

    def post(self, proc: "Proc", rec: dict) -> None:
        rec["_proc"] = proc.name
        rec["_inc"] = proc.incarnation
        rec["_t"] = time.monotonic()
        with self.cond:
            self.events.append(rec)
            self.cond.notify_all()

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def wait_event(self, pred, timeout: float = 120.0, after: int = 0) -> dict:
        """Block until an event with index ≥ ``after`` satisfies ``pred``; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            i = after
            while True:
                while i < len(self.events):
                    ev = self.events[i]
                    i += 1
                    if pred(ev):
                        ev["_i"] = i - 1
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:g} s waiting for an event\n{self.diagnosis()}")
                self.cond.wait(timeout=left)

    def wait_count(self, pred, n: int, timeout: float = 60.0, after: int = 0) -> list[dict]:
        """Block until ``n`` events with index ≥ ``after`` satisfy ``pred`` (a process writes its log lines
        asynchronously: count them only once they are all there); returns them.  AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [e for e in self.events[after:] if pred(e)]
                if len(found) >= n:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:g} s waiting for {n} events (saw {len(found)})"
                                         f"\n{self.diagnosis()}")
                self.cond.wait(timeout=left)

    def diagnosis(self, n: int = 25) -> str:
        """What a timeout reports: the last ``n`` events."""
        return "last events:\n" + "\n".join(
            f"{e.get('_proc')}#{e.get('_inc')} {e.get('event')}: {str(e.get('msg', e.get('rc', '')))[:200]}"
            for e in self.events[-n:])

    def write_events(self, path: Path) -> None:
        """The event log as JSON lines, for reading after a failure."""
        try:
            with open(path, "w") as fh:
                for e in self.events:
                    fh.write(json.dumps(e, default=str) + "\n")
        except OSError:
            pass


class Proc:
    """One incarnation of a party: a ``fedsbdt`` child process whose JSON log lines become events."""

    def __init__(self, log: EventLog, name: str, argv: list[str], env: dict[str, str] | None = None,
                 prefix: tuple[str, ...] = (), log_level: str = "info", incarnation: int = 0) -> None:
        self.log, self.name, self.incarnation = log, name, incarnation
        e = dict(os.environ)
        e.pop("FEDSBDT_TEST_KILL_AT", None)
        e["FEDSBDT_TEST_FAULTHANDLER"] = "1"  # SIGUSR1 dumps stacks (diagnosis of a hung process)
        e.update(env or {})
        self.kill_at = (env or {}).get("FEDSBDT_TEST_KILL_AT")
        cmd = [*prefix, sys.executable, "-m", "fedsbdt.cli", "--log-format", "json", "--log-level", log_level, *argv]
        self.started = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=e)
        self.lines: list[str] = []
        self.stdout = ""
        self.hooked: str | None = None  # the testhook line, if the process killed itself
        self.rc: int | None = None
        self._t_out = threading.Thread(target=self._read_out, daemon=True)
        self._t_err = threading.Thread(target=self._read_err, daemon=True)
        self._t_out.start()
        self._t_err.start()

    def _read_out(self) -> None:
        self.stdout = self.p.stdout.read()

    def _read_err(self) -> None:
        for line in self.p.stderr:
            self.lines.append(line)
            if line.startswith("fedsbdt-testhook:"):
                self.hooked = line.strip()
                rec = {"event": "testhook_kill", "msg": line.strip()}
            else:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    rec = {"event": "raw", "msg": line.rstrip()}
                if not isinstance(rec, dict):
                    rec = {"event": "raw", "msg": line.rstrip()}
            self.log.post(self, rec)
        self._t_out.join(timeout=30)
        self.rc = self.p.wait()
        self.log.post(self, {"event": "_exit", "rc": self.rc})

    @property
    def alive(self) -> bool:
        return self.p.poll() is None

    def kill(self) -> None:
        """SIGKILL this process (by its pid) and reap it."""
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait(timeout=30)

    def wait(self, timeout: float = 120.0) -> int:
        rc = self.p.wait(timeout=timeout)
        self._t_err.join(timeout=30)
        return rc

    def result(self) -> dict:
        return json.loads(self.stdout)

    @property
    def errors(self) -> str:
        out = []
        for ln in self.lines:
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError:
                out.append(ln.rstrip())
                continue
            if isinstance(rec, dict) and rec.get("level") in ("ERROR", "WARNING", "CRITICAL"):
                out.append(rec.get("msg", ""))
        return "\n".join(out)
