"""A site's exact DP noise, drawn in short-lived child processes so that the daemon never loads numba.

Our exact samplers (:mod:`fedsbdt.common.exact_noise`) are numba kernels; loading
numba and its compiled code costs a process about 150 MB for as long as it
lives.  A site needs noise in bulk (one leaf-noise share per round, drawn
ahead by :class:`fedsbdt.common.noise_shares.NoiseShares`) and a few single vectors (the
initial-score share, central-mode retries), so :class:`IsolatedSampler`
draws them in a child Python process that imports the sampler, draws every
requested vector from its own OS-keyed CSPRNG stream, writes the int64
results to its stdout and exits (about 1 s of CPU to start, ~0.1 ms per
128-value share after that).  Nothing about the noise changes: same
sampler, same randomness source, each value handed out once.  Only the
Poisson subsample (AES-CTR, no numba) stays in the daemon.

Single vectors requested directly (``discrete_gaussian``/``discrete_laplace``)
more often than once per :data:`SINGLE_DRAW_INTERVAL` seconds are drawn in
the daemon instead, from then on (with a warning: the sampler then costs the
daemon its ~150 MB): a round that needs fresh noise every few seconds must
not wait for a child process each time.  Shares drawn ahead in blocks
(:meth:`IsolatedSampler.draw`, :func:`fedsbdt.client.noise.isolated_shares`) always
come from children.

Child protocol (:mod:`fedsbdt.client.child`, :func:`_child`): an ``.npz`` on stdin with ``sampler`` and,
per request i, ``kind_i`` ("gaussian" or "laplace") and ``scales_i``
(float64, exact binary values); exit 0 with an ``.npz`` of ``noise_i``
(int64, the shape of ``scales_i``) on stdout, exit 2 with a bad parameter's
message on stderr.
"""
from __future__ import annotations

import io
import logging
import sys
import time

import numpy as np

from fedsbdt.common.randomness import SecureRandomness

from .child import run_child, write_arrays

log = logging.getLogger("fedsbdt.site")

EXIT_BAD_PARAMETER = 2
#: direct single draws closer together than this (seconds) switch them to the daemon's own sampler
SINGLE_DRAW_INTERVAL = 60.0
KINDS = ("gaussian", "laplace")


class IsolatedSampler:
    """:class:`~fedsbdt.common.randomness.SecureRandomness` whose noise samplers run in a child process per call.

    Same interface as the randomness it wraps (``discrete_gaussian``, ``discrete_laplace``,
    ``subsample``, ``describe``); :meth:`draw` draws several vectors in one child.
    """

    insecure = False
    #: blocks drawn ahead go through :meth:`draw` (one child per block; :mod:`fedsbdt.common.noise_shares`)
    draws_in_children = True

    def __init__(self, inner: SecureRandomness) -> None:
        if getattr(inner, "insecure", False):
            raise TypeError("only secure randomness is drawn in a child process")
        self.inner = inner
        self.children = 0  # child processes started (for the cost figures)
        self.in_process = False  # direct single draws now use the daemon's own sampler
        self._last_single: float | None = None

    def draw(self, requests: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """One exact draw per entry of each request's scale array (``kind`` "gaussian": σ, "laplace": b)."""
        buf = io.BytesIO()
        arrays = {"sampler": np.array(self.inner.sampler)}
        for i, (kind, scales) in enumerate(requests):
            if kind not in KINDS:
                raise ValueError(f"unknown noise kind {kind!r}")
            arrays[f"kind_{i}"] = np.array(kind)
            arrays[f"scales_{i}"] = np.asarray(scales, dtype=np.float64)
        np.savez(buf, **arrays)
        self.children += 1
        z = run_child("fedsbdt.client.isolated_noise", "_child", (), buf.getvalue(), rejected_exit=EXIT_BAD_PARAMETER,
                      rejected=ValueError, what="the noise sampler process")
        out = [z[f"noise_{i}"] for i in range(len(requests))]
        for (_, scales), noise in zip(requests, out):
            if noise.dtype != np.int64 or noise.shape != np.shape(scales):
                raise RuntimeError("the noise sampler process returned vectors of the wrong type or shape")
        return out

    def _single(self, kind: str, scales: np.ndarray) -> np.ndarray:
        now = time.monotonic()
        frequent = self._last_single is not None and now - self._last_single < SINGLE_DRAW_INTERVAL
        self._last_single = now
        if self.in_process or frequent:
            return self.draw_in_process(kind, scales, "single noise vectors are requested every few seconds")
        return self.draw([(kind, scales)])[0]

    def draw_in_process(self, kind: str, scales: np.ndarray, why: str = "a round needed a noise share before "
                        "the child drawing its block had finished") -> np.ndarray:
        """One draw per entry of ``scales`` in this process, with the same exact sampler (no child to wait for):
        from the first such draw on, the site process holds the sampler (about 150 MB; said once)."""
        if kind not in KINDS:
            raise ValueError(f"unknown noise kind {kind!r}")
        if not self.in_process:
            self.in_process = True
            log.warning(f"{why}: drawing them in the site process from now on (the exact sampler costs it about "
                        "150 MB)", extra={"event": "noise_in_process"})
        draw = self.inner.discrete_gaussian if kind == "gaussian" else self.inner.discrete_laplace
        return np.asarray(draw(scales), dtype=np.int64)

    def discrete_gaussian(self, scales: np.ndarray) -> np.ndarray:
        """One exact discrete Gaussian N_Z(0, s²) per entry of ``scales`` (integer units), drawn in a child."""
        return self._single("gaussian", scales)

    def discrete_laplace(self, scales: np.ndarray) -> np.ndarray:
        """One exact discrete Laplace with scale s per entry of ``scales`` (integer units), drawn in a child."""
        return self._single("laplace", scales)

    def subsample(self, p: float, record_ids: np.ndarray, round_id: int) -> np.ndarray:
        return self.inner.subsample(p, record_ids, round_id)

    def describe(self) -> str:
        return self.inner.describe()


def compile_samplers(sampler: str = "ours") -> None:
    """Compile the kernels a noise child runs into numba's on-disk cache (``NUMBA_CACHE_DIR``); draws are discarded.

    A container image build step (Dockerfile): without it every site's first noise child, drawn while the
    site accepts the plan and before it joins, compiles them itself (about 15 s of CPU, more on a busy
    host), and a site that joins after the plan's join deadline misses the session's first rounds.
    """
    randomness = SecureRandomness(sampler)
    for scale in (0.5, 3.0, 40.0, 1e6):
        randomness.discrete_gaussian(np.full(4, scale))
        randomness.discrete_laplace(np.full(4, scale))


def _child() -> int:
    with np.load(io.BytesIO(sys.stdin.buffer.read()), allow_pickle=False) as z:
        randomness = SecureRandomness(str(z["sampler"]))
        requests = []
        i = 0
        while f"kind_{i}" in z:
            requests.append((str(z[f"kind_{i}"]), z[f"scales_{i}"]))
            i += 1
    out = {}
    try:
        for i, (kind, scales) in enumerate(requests):
            draw = randomness.discrete_gaussian if kind == "gaussian" else randomness.discrete_laplace
            out[f"noise_{i}"] = np.asarray(draw(scales), dtype=np.int64)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return EXIT_BAD_PARAMETER
    return write_arrays(**out)
