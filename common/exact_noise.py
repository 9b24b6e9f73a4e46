"""Exact discrete Gaussian and discrete Laplace noise (Canonne–Kamath–Steinke 2020, Alg. 1–3).

A small numpy API over the numba kernels of :mod:`fedsbdt.common.exact_kernels`,
fed in big blocks by a stream of uniformly random 64-bit words — in
production the AES-256-CTR keystream of :func:`fedsbdt.common.csprng.csprng_fill`
(fresh ``os.urandom`` key per block).

Parameters are exact rationals (``int``, :class:`fractions.Fraction`, or a
``float`` taken at its exact binary value; never rounded through floats):

* N_Z(0, σ²): σ² = sn/sd is used exactly when sn < 2^126, τ·sd < 2^64 and
  2·sn·sd·τ² < 2^255 (τ ≈ σ, :func:`_proposal_scale`); otherwise it is rounded **up** to
  sn/2^f with the largest such f ≤ 128 — more noise is always safe; the
  relative increase is below 1/sn: ≤ 2^-61/σ at σ ≥ 1 (≤ 2^-85 at our leaf
  scales, σ ≈ 2^24) and ≤ 2^-63/σ² below.  σ must lie in (0, 2^50].
* Lap_Z(b) (pmf ∝ exp(−|x|/b)): b = t/s is used exactly when t ≤ 2^40 and
  s < 2^62, otherwise rounded **up** to ⌈b·2^f⌉/2^f with the largest such
  f ≤ 62 (relative increase < 2^-(bits of t − 1), ≤ 2^-39 at b ≥ 1).  b must
  lie in (0, 2^40].

The draws are exact for the (rounded-up) parameter, conditioned on the
Laplace proposal staying below 2^62 (int64 outputs): a total-variation
change below exp(−2^22) for either sampler within these ranges
(:mod:`fedsbdt.common.exact_kernels`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from numbers import Rational

import numpy as np

from . import exact_kernels as K
from .csprng import csprng_fill

#: A source of random words: fills a uint64 array in place with independent uniform words.
WordSource = Callable[[np.ndarray], None]

MAX_SIGMA2 = Fraction(2**100)  # σ ≤ 2^50
MAX_LAPLACE_SCALE = Fraction(2**40)
#: Expected random words per value (a little above the measured means), to size the blocks.
_WORDS_PER_VALUE = {"gaussian": 4.0, "laplace": 2.0}
_MAX_BLOCK_WORDS = 1 << 20  # 8 MiB of keystream per block at most


class NoiseParameterError(ValueError):
    pass


def _exact(x, what: str) -> Fraction:
    """``x`` as an exact rational (a float at its exact binary value); refuses NaN, ±inf, bools, strings."""
    if isinstance(x, bool) or not isinstance(x, (Rational, float, np.integer, np.floating)):
        raise NoiseParameterError(f"{what} must be a number, got {x!r}")
    if isinstance(x, (float, np.floating)):
        if not math.isfinite(x):
            raise NoiseParameterError(f"{what} must be finite, got {x!r}")
        return Fraction(float(x))
    return Fraction(int(x)) if isinstance(x, np.integer) else Fraction(x)


def _proposal_scale(sn: int, sd: int) -> int:
    """τ for Alg. 3: ⌈σ⌉ rounded up to 5 significant bits (any τ ≥ 1 is exact; τ ∈ [σ, σ + σ/16 + 1]
    keeps the acceptance rate within 1% of τ = σ's and makes U ~ uniform[0, τ) mostly raw bits)."""
    r = math.isqrt(sn // sd)
    ceil_sigma = r if r * r * sd == sn else r + 1  # ⌈σ⌉ ≥ 1
    j = max(0, ceil_sigma.bit_length() - 5)
    return -(-ceil_sigma >> j) << j


def _gaussian_fits(sn: int, sd: int) -> bool:
    tau = _proposal_scale(sn, sd)
    return sn < 2**126 and tau * sd < 2**64 and 2 * sn * sd * tau * tau < 2**255


@lru_cache(maxsize=1024)
def gaussian_variance(sigma2: Fraction) -> Fraction:
    """The variance the sampler uses for a requested σ²: σ² itself, or the smallest representable value above."""
    if not 0 < sigma2 <= MAX_SIGMA2:
        raise NoiseParameterError(f"discrete Gaussian variance must be in (0, 2^100], got {sigma2}")
    if _gaussian_fits(sigma2.numerator, sigma2.denominator):
        return sigma2
    for f in range(128, -1, -1):
        sn = -((-sigma2.numerator << f) // sigma2.denominator)  # ⌈σ²·2^f⌉
        if _gaussian_fits(sn, 1 << f):
            return Fraction(sn, 1 << f)
    raise NoiseParameterError(f"discrete Gaussian variance {sigma2} cannot be represented")  # pragma: no cover


@lru_cache(maxsize=1024)
def laplace_scale(b: Fraction) -> Fraction:
    """The scale the sampler uses for a requested b: b itself, or the smallest representable value above."""
    if not 0 < b <= MAX_LAPLACE_SCALE:
        raise NoiseParameterError(f"discrete Laplace scale must be in (0, 2^40], got {b}")
    if b.numerator <= 2**40 and b.denominator < 2**62:
        return b
    for f in range(62, -1, -1):
        t = -((-b.numerator << f) // b.denominator)
        if t <= 2**40:
            return Fraction(t, 1 << f)
    raise NoiseParameterError(f"discrete Laplace scale {b} cannot be represented")  # pragma: no cover


def _laplace_row(t: int, s: int) -> list[int]:
    z = (t & -t).bit_length() - 1  # t = m·2^z, m odd
    m = t >> z
    return [t, m, (m - 1).bit_length(), z, s]


def _bernoulli_row(n: int, d: int) -> list[int]:
    """Kernel row for Bernoulli(exp(−n/d)) (tests of Alg. 1)."""
    z = (d & -d).bit_length() - 1
    return [n, d, d.bit_length(), d >> z, ((d >> z) - 1).bit_length(), z]


def _gaussian_row(sigma2: Fraction) -> list[int]:
    sn, sd = sigma2.numerator, sigma2.denominator
    tau = _proposal_scale(sn, sd)
    d = 2 * sn * sd * tau * tau
    dl = d.bit_length()
    dj = (dl - 1) // 64
    limbs = [(d >> (64 * i)) & (2**64 - 1) for i in range(4)]
    return [*_laplace_row(tau, 1), tau * sd, sn & (2**64 - 1), sn >> 64, *limbs, dj, dl - 64 * dj]


def _draw(kind: str, rows: list[list[int]], which: np.ndarray, words: WordSource | None) -> np.ndarray:
    """Run the fill kernel over ``which`` with fresh blocks of words (:func:`_run_blocks`)."""
    code = {"gaussian": K.GAUSSIAN, "laplace": K.LAPLACE}[kind]
    params = np.array(rows, dtype=np.uint64).reshape(len(rows), -1)
    which = np.ascontiguousarray(which, dtype=np.int64)
    return _run_blocks(lambda out, buf, st, i: K.fill(out, code, which, params, buf, st, i), which.size,
                       _WORDS_PER_VALUE[kind], words)


def _run_blocks(step, size: int, words_per_value: float, words: WordSource | None) -> np.ndarray:
    """``size`` values from ``step(out, buf, st, i)`` (a fill kernel) on fresh blocks of words, replaying a
    value cut by a block's end on the same bits followed by fresh ones."""
    if words is None:
        words = csprng_fill
    out = np.empty(size, dtype=np.int64)
    carry = np.empty(0, dtype=np.uint64)
    offset = 0
    i = 0
    while i < out.size:
        fresh = min(int((out.size - i) * words_per_value) + 64, _MAX_BLOCK_WORDS)
        buf = np.empty(carry.size + fresh, dtype=np.uint64)
        buf[:carry.size] = carry
        words(buf[carry.size:])
        st = np.array([offset, 64 * buf.size, 0], dtype=np.int64)
        i = step(out, buf, st, i)
        if i < out.size:  # keep the unfinished value's bits: it is replayed on them and then fresh ones
            carry = buf[st[0] >> 6:].copy()
            offset = int(st[0] & 63)
    return out


@lru_cache(maxsize=4096)
def _row_for_scale(kind: str, scale: float) -> tuple[int, ...] | None:
    """The kernel parameter row for a float scale (σ for the Gaussian, b for Laplace); None for 0."""
    q = _exact(scale, "noise scale")
    if q == 0:
        return None
    if kind == "gaussian":
        return tuple(_gaussian_row(gaussian_variance(q * q)))
    b = laplace_scale(q)
    return tuple(_laplace_row(b.numerator, b.denominator))


def _per_entry(kind: str, values) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if np.any(~np.isfinite(arr)) or np.any(arr < 0):
        raise NoiseParameterError("noise scales must be finite and non-negative")
    uniq, inv = np.unique(arr.ravel(), return_inverse=True)
    rows, lookup = [], np.empty(uniq.size, dtype=np.int64)
    for i, u in enumerate(uniq.tolist()):
        row = _row_for_scale(kind, u)
        lookup[i] = -1 if row is None else len(rows)
        if row is not None:
            rows.append(row)
    which = lookup[inv.ravel()]
    out = np.zeros(which.size, dtype=np.int64)
    live = np.flatnonzero(which >= 0)
    if live.size:
        out[live] = _draw(kind, rows, which[live], None)
    return out.reshape(arr.shape)


def discrete_gaussian(sigma2, size: int, *, words: WordSource | None = None) -> np.ndarray:
    """``size`` independent draws of N_Z(0, σ²) (pmf ∝ exp(−x²/(2σ²)) on the integers) for an exact σ² > 0."""
    row = _gaussian_row(gaussian_variance(_exact(sigma2, "variance")))
    return _draw("gaussian", [row], np.zeros(int(size), dtype=np.int64), words)


def discrete_laplace(scale, size: int, *, words: WordSource | None = None) -> np.ndarray:
    """``size`` independent draws of Lap_Z(b) (pmf ∝ exp(−|x|/b) on the integers) for an exact scale b > 0."""
    b = laplace_scale(_exact(scale, "scale"))
    row = _laplace_row(b.numerator, b.denominator)
    return _draw("laplace", [row], np.zeros(int(size), dtype=np.int64), words)


def discrete_gaussian_scales(sigmas) -> np.ndarray:
    """One draw of N_Z(0, σ_i²) per entry σ_i ≥ 0 of the float array ``sigmas`` (σ_i² computed exactly from
    σ_i's binary value; σ_i = 0 gives 0), from the CSPRNG."""
    return _per_entry("gaussian", sigmas)


def discrete_laplace_scales(scales) -> np.ndarray:
    """One draw of Lap_Z(b_i) per entry b_i ≥ 0 of the float array ``scales`` (b_i = 0 gives 0), from the CSPRNG."""
    return _per_entry("laplace", scales)


#: The exponential mechanism counts scores in units u = 2^k with u ≤ Δ·2^-EM_UNIT_BITS, and |score| ≤ 2^EM_SCORE_BITS·u.
EM_UNIT_BITS = 24
EM_SCORE_BITS = 46
#: The sampler's weights are exp(−a·p/2^EM_RATE_BITS).
EM_RATE_BITS = 63
_EM_ONE = 1 << EM_RATE_BITS


def em_parameters(scores, scale, sensitivity) -> tuple[np.ndarray, int]:
    """The integer form of the exponential mechanism P[c] ∝ exp(score_c / scale) whose scores have
    sensitivity Δ (McSherry & Talwar 2007; ε = 2Δ/scale): ``(a, p)`` with ``a[r, c]`` = max_c' S[r, c'] −
    S[r, c] (uint64) and the rate p, so that the sampler draws c with probability ∝ exp(−a[r, c]·p/2^63).

    * S = ⌊score/u⌋ for a power of two u ≤ Δ·2^-24 (larger where needed so |S| ≤ 2^46).  Neighbouring
      data sets move S by at most Δ_S = ⌈Δ/u⌉ + 1 units; the extra unit covers float64 rounding of the
      scores (each within 2^5 ulps: at most u/2 at |score| ≤ 2^46·u).
    * The rate is ε/(2Δ_S) per unit, rounded *down* to p/2^63: P[c] ∝ exp(ε'·S_c/(2Δ_S)) with ε' ≤ ε.
      That is the exponential mechanism of a score with sensitivity Δ_S at ε' ≤ ε: ε-DP and ε-bounded
      range (Durfee & Rogers 2019), so ε²/8-zCDP (Cesar & Rogers 2021) as accounted.
    * Utility: in score units it runs at ε'·Δ/(Δ_S·u) ≥ ε'·(1 − 2u/Δ); 2u/Δ ≤ 2^-23 while |score| < 2^22·Δ
      (greedy gains stay below that up to n ≈ 12M records), ≤ 2^-44·max|score|/Δ beyond; p's rounding
      adds a relative 2^-(bits of p)."""
    s = np.asarray(scores, dtype=np.float64)
    s = s.reshape(1, -1) if s.ndim == 1 else s
    if s.ndim != 2 or s.size == 0 or s.shape[1] == 0 or not np.all(np.isfinite(s)):
        raise NoiseParameterError("the exponential mechanism needs non-empty rows of finite scores")
    delta, b = _exact(sensitivity, "sensitivity"), _exact(scale, "scale")
    if not (delta > 0 and b > 0):
        raise NoiseParameterError(f"the exponential mechanism needs a positive scale and sensitivity, got "
                                  f"{float(scale)} and {float(sensitivity)}")
    k = math.frexp(float(sensitivity))[1] - 1 - EM_UNIT_BITS  # 2^k ≤ Δ·2^-24
    top = float(np.abs(s).max())
    if top > 0:
        k = max(k, math.frexp(top)[1] - EM_SCORE_BITS)  # |score| < 2^(k + 46)
    S = np.floor(np.ldexp(s, -k)).astype(np.int64)
    a = (S.max(axis=1, keepdims=True) - S).astype(np.uint64)
    unit = Fraction(2) ** k
    delta_s = -(-delta // unit) + 1  # ⌈Δ/u⌉ + 1
    rate = delta / (b * delta_s)  # ε / (2Δ_S), ε = 2Δ/scale
    return a, min(rate.numerator * _EM_ONE // rate.denominator, _EM_ONE - 1)


def exponential_mechanism(scores, scale, sensitivity, *, words: WordSource | None = None) -> np.ndarray:
    """Per row of ``scores`` (or the one vector) an index drawn exactly with probability ∝ exp(score/scale)
    for scores of sensitivity Δ = ``sensitivity`` — the ε = 2Δ/scale exponential mechanism, in integers
    (:func:`em_parameters`; the kernel :func:`fedsbdt.common.exact_kernels.em_one`)."""
    a, p = em_parameters(scores, scale, sensitivity)
    rows = np.empty((a.shape[0], K.E_A + a.shape[1]), np.uint64)  # per row: p, z, trials (0: until kept), a
    rows[:, K.E_P], rows[:, K.E_Z], rows[:, K.E_TRIALS], rows[:, K.E_A:] = p, EM_RATE_BITS, 0, a
    which = np.arange(a.shape[0], dtype=np.int64)
    return _run_blocks(lambda out, buf, st, i: K.fill(out, K.EXPONENTIAL, which, rows, buf, st, i), which.size,
                       4.0 + a.shape[1] / 2, words)
