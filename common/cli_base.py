"""What every command module of the ``fedsbdt`` command line shares: the expected failure (:class:`CliError`,
exit status 2 and one line), the output of ``--json`` (:func:`emit`), progress on stderr (:class:`Progress`), the
state directory's lock and the records ``--data`` names.

The lowest module of the command line: the command modules (``common/cli*.py``, ``common/ledger_cli.py``,
``server/cli.py``, ``client/cli.py``) import it, it imports none of them, so they form no import circle; the
parser is composed above them all, in :mod:`fedsbdt.cli`.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

#: exit status of an expected failure (bad input, impossible privacy parameters)
EXIT_USAGE = 2


class CliError(Exception):
    """An expected, user-facing failure."""


def with_state_lock(state, what: str, run):
    """``run()`` while holding the exclusive lock on the state directory ``state`` (one instance per state
    directory, :mod:`fedsbdt.common.instance`); a directory in use is a one-line CliError naming the holder."""
    from .instance import InstanceError, StateLock

    try:
        lock = StateLock(state, what).acquire()
    except InstanceError as e:
        raise CliError(str(e)) from None
    try:
        return run()
    finally:
        lock.release()


def emit(args: argparse.Namespace, result: dict[str, Any], human: str) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    else:
        sys.stdout.write(human.rstrip() + "\n")


class Progress:
    """Progress on stderr: a rich bar on a terminal, otherwise a log record (logger ``fedsbdt.<label>``)
    every 10% carrying ``round``, ``total``, ``elapsed``, ``eta`` and the given ``fields`` (e.g. ``epsilon``).

    The ETA extrapolates the rate *since the first reported round*, so start-up (process launch, kernel
    compilation, key agreement) does not inflate it; before a second report it is unknown (``None``)."""

    def __init__(self, label: str, total: int, quiet: bool = False, extra: str = "",
                 fields: dict[str, Any] | None = None, clock=time.perf_counter):
        self.label, self.total, self.extra = label, total, extra
        self.fields = dict(fields or {})
        self.quiet = quiet
        self._clock = clock
        self.t0 = clock()
        self._first: tuple[float, int] | None = None
        self._bar = None
        self._next_log = 0.1
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, TextColumn, TimeRemainingColumn

            self._bar = RP(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[extra]}"), TimeRemainingColumn(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, extra=extra)

    def eta(self, done: int, total: int, now: float) -> float | None:
        """Seconds left at the rate observed since the first reported round (None while unknown)."""
        if done >= total:
            return 0.0
        if self._first is None or done <= self._first[1]:
            return None
        t1, d1 = self._first
        return (now - t1) / (done - d1) * (total - done)

    def __call__(self, done: int, total: int) -> None:
        if self.quiet:
            return
        now = self._clock()
        if self._first is None and done > 0:
            self._first = (now, done)
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
        elif done / max(total, 1) >= self._next_log or done == total:
            el = now - self.t0
            eta = self.eta(done, total, now)
            left = f"eta {eta:.1f}s" if eta is not None else "eta unknown"
            msg = f"{self.label}: round {done}/{total} {self.extra} elapsed {el:.1f}s {left}"
            log = logging.getLogger(f"fedsbdt.{self.label}")
            if log.hasHandlers():  # configured by main() (--log-format / --log-level)
                log.info(msg, extra={"round": done, "total": total, **self.fields, "elapsed": round(el, 3),
                                     "eta": None if eta is None else round(eta, 3)})
            else:  # used as a library without logging set up: plain line, as before
                print(msg, file=sys.stderr)
            self._next_log = (int(done / max(total, 1) * 10) + 1) / 10

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def load_data(args: argparse.Namespace, schema, labels: bool = True):
    """The records ``--data`` names (a file, or a database with ``--query``), validated against ``schema``."""
    from .records import load
    from .sources import source_from_args

    return load(source_from_args(args), schema, labels=labels)
