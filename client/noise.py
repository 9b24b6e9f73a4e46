"""A site's leaf-noise shares, drawn ahead of use in a background thread.

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
"""
from __future__ import annotations

import os
import threading
from collections import deque

import numpy as np

from .isolated_noise import IsolatedSampler


class NoiseShares:
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
                block = self.randomness.draw([("gaussian", tiled)])[0] if isinstance(self.randomness, IsolatedSampler) \
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


#: bytes of leaf-noise shares a site draws per child process (isolated sampler): 1 MiB is 1024 rounds at depth 6
ISOLATED_BLOCK_BYTES = 1 << 20
#: vectors drawn ahead for each noise divisor other than the expected one (isolated sampler)
SPARE_SHARES = 4


def isolated_shares(randomness, scales: dict, expect, rounds: int, init_scales=None):
    """:class:`NoiseShares` for the isolated sampler, and the initial-score noise share drawn ahead (or None).

    ``randomness`` is a :class:`fedsbdt.client.isolated_noise.IsolatedSampler`: shares are drawn in blocks of up
    to :data:`ISOLATED_BLOCK_BYTES` (at most ``rounds`` + 8 vectors; one child process per block), the
    next block when an eighth of one is left (8 vectors if one block covers all ``rounds``: only retries
    need more), and the first block in the same child as the initial-score share (so a session starts
    with one child, not two).  That child also draws :data:`SPARE_SHARES` vectors for every other
    divisor, so a round with fewer participants takes its share at once while the next block for its
    divisor is drawn in the background (a child takes seconds to start on a loaded machine).
    """
    row = np.asarray(scales[expect], dtype=np.float64)
    chunk = max(8, min(ISOLATED_BLOCK_BYTES // (8 * max(row.size, 1)), rounds + 8))
    keys = [expect] + [k for k in scales if k != expect]
    requests = [("gaussian", np.tile(np.asarray(scales[k], dtype=np.float64), chunk if k == expect else SPARE_SHARES))
                for k in keys]
    if init_scales is not None:
        requests.append(("laplace", np.asarray(init_scales, dtype=np.float64)))
    drawn = randomness.draw(requests)
    low = 8 if chunk >= rounds + 8 else chunk // 8  # a block that covers the session is refilled only for retries
    shares = NoiseShares(randomness, scales, chunk=chunk, ahead=1, expect=expect, low=low,
                         initial=dict(zip(keys, drawn)))
    return shares, (drawn[len(keys)] if init_scales is not None else None)


def draw_share(plan, release, randomness, *, participants: int | None, retry: bool, where=None, ahead=None):
    """The noise share this site adds to one attempt of ``release`` (a ``Release`` of ``plan.releases``), or None.

    The site's one noise rule, for every release kind of every mode (docs/threat-model.md "Retries"):

    * **split** noise (tree, level and sketch rounds), distributed: a share of variance σ²/k_r of the release's
      full noise, k_r = ``plan.noise_divisor(p)`` recomputed from the public plan and the round's ``participants``
      (none for an impossible participant set: secure aggregation refuses that round); central: no share on the
      first attempt (the coordinator adds the noise), a full, fresh share on a ``retry``;
    * **full** noise (the initial score, the evaluation): distributed, a full share; central, a full share on a
      ``retry`` only — or on every attempt for noise the coordinator never adds (``Noise.central`` False: the
      evaluation).

    ``where`` fixes the layout of the noise (``Noise.scales``); ``ahead`` holds shares drawn beforehand:
    :class:`NoiseShares` (split noise, one buffer per divisor) or one vector (full noise), used instead of a new
    draw.  The sampler follows the release's mechanism (discrete Gaussian or discrete Laplace).
    """
    noise, where = release.noise, dict(where or {})
    draw = randomness.discrete_gaussian if noise.mechanism == "gaussian" else randomness.discrete_laplace
    if not noise.split:
        if noise.central and not retry and plan.noise != "distributed":  # the coordinator adds it
            return None
        if ahead is not None and not retry:
            return ahead
        return draw(release.scales(1, **where))
    if plan.noise == "distributed":
        p = int(participants)
        if not plan.threshold <= p <= plan.n:  # secure aggregation refuses the round
            return None
        k = plan.noise_divisor(p)
        return ahead.take(k) if ahead is not None else draw(release.scales(k, **where))
    return draw(release.scales(1, **where)) if retry else None
