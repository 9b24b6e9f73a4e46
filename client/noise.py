"""A site's leaf-noise shares, drawn ahead of use in a background thread.

DP noise does not depend on the data, so a site can draw the next rounds'
shares while it waits for the coordinator; OpenDP's exact sampler releases
the GIL.  Each vector is handed out exactly once (:meth:`NoiseShares.take`)
and never reused; vectors still queued when the process exits are simply
lost, which costs no privacy.  The deterministic test source is drawn inline,
in order, so that a federated test run stays in step with a centralised one.
"""
from __future__ import annotations

import os
import queue
import threading

import numpy as np


class NoiseShares:
    def __init__(self, randomness, scales: np.ndarray, chunk: int = 8, ahead: int = 4) -> None:
        self.randomness = randomness
        self.scales = np.asarray(scales, dtype=np.float64)
        self.chunk = chunk
        self._inline = bool(getattr(randomness, "insecure", False))
        self._q: queue.Queue = queue.Queue(maxsize=ahead)
        self._buf: list[np.ndarray] = []
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
            while not self._stop.is_set():
                block = self.randomness.discrete_gaussian(np.tile(self.scales, self.chunk))
                block = block.reshape(self.chunk, self.scales.size)
                while not self._stop.is_set():
                    try:
                        self._q.put(block, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # surfaced by take()
            self._error = e
            self._q.put(None)

    def take(self) -> np.ndarray:
        """A fresh noise vector (never handed out before)."""
        if self._inline:
            return self.randomness.discrete_gaussian(self.scales)
        if not self._buf:
            block = self._q.get()
            if block is None:
                raise RuntimeError(f"the noise sampler failed: {self._error!r}")
            self._buf = list(block)
        return np.array(self._buf.pop(), dtype=np.int64)

    def close(self) -> None:
        self._stop.set()
