"""Sources of privacy-relevant randomness (design.md "Noise").

* :class:`SecureRandomness` — the only source allowed outside tests.  DP noise
  comes from exact discrete Gaussian and discrete Laplace samplers (integer,
  fixed-point units): by default our own (:mod:`fedsbdt.common.exact_noise`,
  Canonne–Kamath–Steinke 2020, integer arithmetic only, numba), or OpenDP's
  (``sampler="opendp"``, ~30× slower, the oracle of the tests).  Their
  random bits, and the Poisson subsample's, come from a CSPRNG stream
  (AES-256-CTR keyed with 32 fresh bytes from ``os.urandom`` per block — a
  key-erasure DRBG).  Never numpy's floating-point generators (Mironov 2012).
* :class:`InsecureTestRandomness` — deterministic, *clearly insecure*, for
  tests only: noise can be switched off and the subsample is a public hash
  of (seed, round, record id), so a federated run and a centralised run select
  exactly the same records.  It refuses to be constructed unless the caller
  passes ``i_understand_this_is_insecure=True``.

All samplers return int64 numpy arrays in fixed-point units.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np

from .config import SAMPLERS
from .csprng import _csprng_uint64_scratch, csprng_bytes, csprng_fill, csprng_uint64  # noqa: F401 (re-exported)
from fedsbdt.common.federation.errors import PlanError

_U64 = 2.0**64


class InsecureRandomnessError(RuntimeError):
    pass


def bernoulli_threshold(p: float) -> int:
    """Integer threshold k with P[U < k] = k/2^64 ≤ p for U uniform on 64 bits (never above p)."""
    if not 0 <= p <= 1:
        raise ValueError(f"probability must be in [0, 1], got {p}")
    if p == 1:
        return 2**64
    return int(math.floor(p * _U64))


def _bernoulli_from_u64(u: np.ndarray, p: float) -> np.ndarray:
    k = bernoulli_threshold(p)
    if k >= 2**64:
        return np.ones(u.shape, dtype=bool)
    return u < np.uint64(k)


def _check_scores(scores: np.ndarray, scale: float) -> np.ndarray:
    """``scores`` as rows (a vector is one row) of finite float64 scores."""
    scores = np.asarray(scores, dtype=np.float64)
    rows = scores.reshape(1, -1) if scores.ndim == 1 else scores
    if rows.ndim != 2 or rows.size == 0 or not np.all(np.isfinite(rows)):
        raise ValueError("the exponential mechanism needs a non-empty vector of finite scores")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"the exponential mechanism's scale must be positive and finite, got {scale}")
    return rows


@dataclass
class SecureRandomness:
    """Exact noise samplers and the Poisson subsample, all fed by the OS-keyed CSPRNG."""

    sampler: str = "ours"
    insecure: bool = field(default=False, init=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def _measurement(self, kind: str, scale: float, size: int):
        key = (kind, float(scale), int(size))
        with self._lock:
            m = self._cache.get(key)
            if m is None:
                # Import the parts we need: opendp.prelude also imports scikit-learn (seconds).
                from opendp import domains, measurements, metrics, mod

                mod.enable_features("contrib")
                domain = domains.vector_domain(domains.atom_domain(T=int), size=int(size))
                if kind == "gaussian":
                    m = measurements.make_gaussian(domain, metrics.l2_distance(T=int), scale=float(scale))
                else:
                    m = measurements.make_laplace(domain, metrics.l1_distance(T=int), scale=float(scale))
                if len(self._cache) > 256:
                    self._cache.clear()
                self._cache[key] = m
        return m

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")

    def _sample(self, kind: str, scales: np.ndarray) -> np.ndarray:
        scales = np.asarray(scales, dtype=np.float64)
        if self.sampler == "ours":
            from . import exact_noise

            try:
                draw = exact_noise.discrete_gaussian_scales if kind == "gaussian" else \
                    exact_noise.discrete_laplace_scales
                return draw(scales)
            except exact_noise.NoiseParameterError as e:
                raise ValueError(str(e)) from None
        if np.any(~np.isfinite(scales)) or np.any(scales < 0):
            raise ValueError("noise scales must be finite and non-negative")
        out = np.zeros(scales.shape, dtype=np.int64)
        for s in np.unique(scales):
            idx = np.flatnonzero(scales == s)
            if s == 0:
                continue
            out[idx] = np.asarray(self._measurement(kind, s, idx.size)([0] * idx.size), dtype=np.int64)
        return out

    def discrete_gaussian(self, scales: np.ndarray) -> np.ndarray:
        """One exact discrete Gaussian N_Z(0, s²) per entry of ``scales`` (integer units)."""
        return self._sample("gaussian", scales)

    def discrete_laplace(self, scales: np.ndarray) -> np.ndarray:
        """One exact discrete Laplace with scale s per entry of ``scales`` (integer units)."""
        return self._sample("laplace", scales)

    def subsample(self, p: float, record_ids: np.ndarray, round_id: int) -> np.ndarray:
        """Poisson subsample: each record independently with probability ≤ p (exactly floor(p·2^64)/2^64)."""
        if bernoulli_threshold(p) >= 2**64:  # p ≥ 1: every record, no words drawn
            return np.ones(len(record_ids), dtype=bool)
        return _bernoulli_from_u64(_csprng_uint64_scratch(len(record_ids)), p)

    def exponential_mechanism(self, scores: np.ndarray, scale: float, sensitivity: float):
        """Index i drawn with probability ∝ exp(scores[i]/scale), exactly, for scores of sensitivity
        ``sensitivity`` (ε = 2·sensitivity/scale); a 2-D ``scores`` gives one independent index per row.
        Ours: :func:`fedsbdt.common.exact_noise.exponential_mechanism` (integer scores, rejection sampling on
        exact Bernoulli(exp(−γ))); OpenDP: ``make_noisy_max`` with zCDP output (report-noisy-max with exactly
        sampled Gumbel noise = the exponential mechanism)."""
        rows = _check_scores(scores, scale)
        if self.sampler == "ours":
            from . import exact_noise

            try:
                picks = exact_noise.exponential_mechanism(rows, scale, sensitivity)
            except exact_noise.NoiseParameterError as e:
                raise ValueError(str(e)) from None
        else:
            picks = np.array([self._noisy_max(row, scale) for row in rows], np.int64)
        return int(picks[0]) if np.ndim(scores) == 1 else picks

    def _noisy_max(self, scores: np.ndarray, scale: float) -> int:
        key = ("noisy_max", float(scale), scores.size)
        with self._lock:
            m = self._cache.get(key)
            if m is None:
                from opendp import domains, measurements, measures, metrics, mod

                mod.enable_features("contrib")
                m = measurements.make_noisy_max(
                    domains.vector_domain(domains.atom_domain(T=float, nan=False), size=scores.size),
                    metrics.linf_distance(T=float), measures.zero_concentrated_divergence(), scale=float(scale))
                if len(self._cache) > 256:
                    self._cache.clear()
                self._cache[key] = m
        return int(m(np.ascontiguousarray(scores, np.float64)))  # a float64 vector: OpenDP's fast input path

    def describe(self) -> str:
        return describe_secure(self.sampler)


def describe_secure(sampler: str) -> str:
    """How :class:`SecureRandomness` with this sampler is named in privacy receipts."""
    return "cks-exact+aes-ctr-drbg" if sampler == "ours" else "opendp-exact+aes-ctr-drbg"


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass
class InsecureTestRandomness:
    """Deterministic randomness for tests.  NOT differentially private.  Never use on real data."""

    seed: int = 0
    noise: bool = True
    i_understand_this_is_insecure: bool = False
    insecure: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        if not self.i_understand_this_is_insecure:
            raise InsecureRandomnessError(
                "InsecureTestRandomness is deterministic and offers no privacy; it exists for tests only")
        self._rng = np.random.default_rng(self.seed)

    def discrete_gaussian(self, scales: np.ndarray) -> np.ndarray:
        scales = np.asarray(scales, dtype=np.float64)
        if not self.noise:
            return np.zeros(scales.shape, dtype=np.int64)
        return np.rint(self._rng.normal(0.0, 1.0, scales.shape) * scales).astype(np.int64)

    def discrete_laplace(self, scales: np.ndarray) -> np.ndarray:
        scales = np.asarray(scales, dtype=np.float64)
        if not self.noise:
            return np.zeros(scales.shape, dtype=np.int64)
        return np.rint(self._rng.laplace(0.0, 1.0, scales.shape) * scales).astype(np.int64)

    def exponential_mechanism(self, scores: np.ndarray, scale: float, sensitivity: float):
        """Gumbel-max on numpy floats (insecure), per row of a 2-D ``scores``; without noise the arg max."""
        rows = _check_scores(scores, scale)
        if self.noise:
            rows = rows / scale + self._rng.gumbel(size=rows.shape)
        picks = np.argmax(rows, axis=1)
        return int(picks[0]) if np.ndim(scores) == 1 else picks

    def subsample(self, p: float, record_ids: np.ndarray, round_id: int) -> np.ndarray:
        """A public function of (seed, round, record id): identical wherever the record lives."""
        with np.errstate(over="ignore"):
            key = _splitmix64(np.asarray(record_ids, dtype=np.int64).view(np.uint64)
                              ^ _splitmix64(np.array([self.seed * 1_000_003 + round_id], dtype=np.uint64)))
        return _bernoulli_from_u64(_splitmix64(key), p)

    def describe(self) -> str:
        return f"INSECURE-TEST(seed={self.seed}, noise={'on' if self.noise else 'off'})"


class _ChunkDraws:
    """Chunks of noise drawn by background threads *and* by the consumer while it would otherwise wait."""

    def __init__(self, draw, sizes: list[int], lookahead: int):
        self.draw, self.sizes, self.lookahead = draw, sizes, max(1, lookahead)
        self.cond = threading.Condition()
        self.next_claim = 0  # chunks below this are claimed by some thread
        self.consumed = 0  # chunks below this were handed to the consumer
        self.done: dict[int, tuple[np.ndarray | None, BaseException | None]] = {}
        self.closed = False

    def _claim(self, limit: int) -> int | None:
        if self.next_claim < min(limit, len(self.sizes)):
            self.next_claim += 1
            return self.next_claim - 1
        return None

    def _run(self, j: int) -> None:
        try:
            res = (self.draw(self.sizes[j]), None)
        except BaseException as e:  # handed to the consumer when it reaches chunk j
            res = (None, e)
        with self.cond:
            self.done[j] = res
            self.cond.notify_all()

    def worker(self) -> None:
        while True:
            with self.cond:
                while True:
                    if self.closed or self.next_claim >= len(self.sizes):
                        return
                    j = self._claim(self.consumed + self.lookahead)
                    if j is not None:
                        break
                    self.cond.wait()
            self._run(j)

    def get(self, j: int) -> np.ndarray:
        while True:
            with self.cond:
                if j in self.done:
                    block, err = self.done.pop(j)
                    self.consumed = j + 1
                    self.cond.notify_all()
                    if err is not None:
                        raise err
                    return block
                k = self._claim(j + self.lookahead)  # help instead of waiting
                if k is None:
                    self.cond.wait()
                    continue
            self._run(k)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def prefetched_gaussian(randomness, scales: np.ndarray, rounds: int, chunk: int = 16, workers: int = 2,
                        lookahead: int = 4):
    """Yield ``rounds`` discrete-Gaussian vectors with per-coordinate ``scales``, drawn ahead of use.

    Leaf noise does not depend on the data, so it is drawn in chunks of
    ``chunk`` rounds by ``workers − 1`` background threads (both samplers
    release the GIL) while the training thread computes leaf sums; when the
    training thread needs a chunk that is not ready it draws the next
    unclaimed chunk itself instead of idling.  So at most ``workers`` threads
    compute at any time (training included) and none of them waits while
    noise is outstanding.  At most ``lookahead`` chunks are drawn ahead.
    Deterministic test sources are drawn in order, inline.
    """
    scales = np.asarray(scales, dtype=np.float64)
    if getattr(randomness, "insecure", False) or rounds <= chunk or workers <= 1:
        for _ in range(rounds):
            yield randomness.discrete_gaussian(scales)
        return

    def draw(k: int) -> np.ndarray:
        return randomness.discrete_gaussian(np.tile(scales, k)).reshape(k, scales.size)

    sizes = [min(chunk, rounds - i) for i in range(0, rounds, chunk)]
    draws = _ChunkDraws(draw, sizes, lookahead)
    threads = [threading.Thread(target=draws.worker, name=f"dp-noise-{i}", daemon=True) for i in range(workers - 1)]
    for t in threads:
        t.start()
    try:
        for j in range(len(sizes)):
            yield from draws.get(j)
    finally:
        draws.close()
        for t in threads:
            t.join()


def plan_randomness(plan, allow_insecure: bool = False):
    """A plan's source of DP randomness (``session.randomness``, ``sampler``, ``test_seed``, ``test_noise``); the
    test-only source needs an explicit opt-in (a :class:`~fedsbdt.common.federation.errors.PlanError` without)."""
    if not plan.insecure:
        return SecureRandomness(sampler=plan.sampler)
    if not allow_insecure:
        raise PlanError("the plan uses test-only randomness (session.randomness = \"insecure-test\"): it is "
                        "deterministic and gives no privacy; refusing (start with "
                        "--allow-insecure-test-randomness only for tests on synthetic or public data)")
    return InsecureTestRandomness(seed=plan.test_seed, noise=plan.test_noise, i_understand_this_is_insecure=True)
