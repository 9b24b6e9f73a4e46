"""Leaf-noise shares, drawn ahead of use in a background thread.

DP noise does not depend on the data, so a site can draw the next rounds'
shares while it waits for the coordinator; the exact samplers release the
GIL.  Each vector is handed out exactly once (:meth:`NoiseShares.take`)
and never reused; vectors still queued when the process exits are simply
lost, which costs no privacy.  The deterministic test source is drawn inline,
in order, so that a federated test run stays in step with a centralised one.

A round's share variance depends on its noise divisor k_r (the plan's
``noise_divisor``), known only when its RoundStart arrives.  ``scales`` is
therefore either one scale vector or a mapping ``k → scale vector``; the
thread fills the buffer of the divisor most recently asked for (initially
``expect``: every site taking part), and a share for another divisor is drawn
inline the first time it is needed (after a dropout).

``chunk`` vectors are drawn at a time, whenever fewer than ``low`` (default
``ahead·chunk``) of the expected divisor's are ready; ``initial`` maps
divisors to vectors drawn beforehand (e.g. by the same child process as the
initial-score share, :mod:`fedsbdt.client.isolated_noise`).

Used by a site for its shares (:mod:`fedsbdt.client.noise`) and by the coordinator for central noise
(:mod:`fedsbdt.server.session`), so it lives below both.  A randomness source whose class sets
``draws_in_children`` (the site's isolated sampler, :mod:`fedsbdt.client.isolated_noise`) draws each block
with its ``draw`` in a child process.
"""
from __future__ import annotations

import os
import threading
from collections import deque

import numpy as np


def _draws_in_children(randomness) -> bool:
    """Whether ``randomness`` draws blocks in child processes (``draw``): declared by its class, so that a
    wrapper forwarding attributes to an inner source (the audit's ScaledNoise) is never mistaken for one."""
    return bool(getattr(type(randomness), "draws_in_children", False))


class NoiseShares:
    """Leaf-noise vectors of ``scales`` (one scale vector, or a mapping divisor → scale vector) drawn ahead from
    ``randomness`` in a background thread, each handed out once by :meth:`take` (module docstring)."""

    def __init__(self, randomness, scales, chunk: int = 8, ahead: int = 4, expect=None, *, low: int | None = None,
                 initial: dict | None = None) -> None:
        self.randomness = randomness
        if isinstance(scales, dict):
            self.scales = {k: np.asarray(v, dtype=np.float64) for k, v in scales.items()}
            self._expect = expect if expect is not None else max(self.scales)
        else:
            self.scales = {None: np.asarray(scales, dtype=np.float64)}
            self._expect = None
        if self._expect not in self.scales:
            raise KeyError(f"no noise scales for the expected divisor {self._expect!r}")
        self.chunk = chunk
        self.ahead = ahead
        self.low = ahead * chunk if low is None else low
        self._inline = bool(getattr(randomness, "insecure", False))
        self._ready: dict = {k: deque() for k in self.scales}
        for k, rows in (initial or {}).items():
            self._ready[k].extend(np.asarray(rows, dtype=np.int64).reshape(-1, self.scales[k].size))
        self._drawing = None  # the key the thread is drawing a block for
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = None
        if not self._inline:
            self._thread = threading.Thread(target=self._run, name="dp-noise-shares", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            # Lower this thread's priority (Linux: per-thread nice): the rounds' critical path goes first,
            # the sampler fills idle time.  Best effort: not every platform allows it.
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        try:
            while True:
                with self._cv:
                    while not self._stop.is_set() and len(self._ready[self._expect]) >= self.low:
                        self._cv.wait()
                    if self._stop.is_set():
                        return
                    key = self._drawing = self._expect
                scales = self.scales[key]
                tiled = np.tile(scales, self.chunk)
                block = self.randomness.draw([("gaussian", tiled)])[0] if _draws_in_children(self.randomness) \
                    else self.randomness.discrete_gaussian(tiled)  # a block: always in a child when isolated
                with self._cv:
                    self._ready[key].extend(np.asarray(block, dtype=np.int64).reshape(self.chunk, scales.size))
                    self._drawing = None
                    self._cv.notify_all()
        except BaseException as e:  # surfaced by take()
            with self._cv:
                self._error = e
                self._drawing = None
                self._cv.notify_all()

    def take(self, key=None) -> np.ndarray:
        """A fresh noise vector (never handed out before) with the scales of divisor ``key``."""
        if key not in self.scales:
            raise KeyError(f"no noise scales for divisor {key!r}")
        if self._inline:
            return self.randomness.discrete_gaussian(self.scales[key])
        with self._cv:
            if key != self._expect:
                self._expect = key  # the thread fills this divisor's buffer from now on
                self._cv.notify_all()
            if self._ready[key]:
                self._cv.notify_all()  # the thread refills what is taken
                return self._ready[key].popleft()
            if self._error is not None:
                raise RuntimeError(f"the noise sampler failed: {self._error!r}")
        # None ready (e.g. a membership change used up a divisor's spare shares while its block is drawn in a
        # child, which takes tens of seconds on a loaded host): a round never waits for that, the share is drawn
        # now, in this process for an isolated sampler (same exact sampler; each value handed out once)
        now = getattr(self.randomness, "draw_in_process", None)
        if now is not None:
            return np.asarray(now("gaussian", self.scales[key]), dtype=np.int64)
        return np.asarray(self.randomness.discrete_gaussian(self.scales[key]), dtype=np.int64)

    def close(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
