"""Numba kernels of the exact discrete Gaussian and discrete Laplace samplers (integer arithmetic only).

Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy"
(NeurIPS 2020), Algorithms 1–3, on a stream of uniformly random bits:

* Alg. 1 — Bernoulli(exp(−γ)) for a rational γ = N/D ≥ 0 (:func:`bern_exp`,
  :func:`bern_exp_wide`): for γ ≤ 1, K ← 1; while Bernoulli(γ/K): K ← K+1;
  return [K odd].  For γ > 1, ⌊γ⌋ independent Bernoulli(exp(−1)) then
  Bernoulli(exp(−(γ − ⌊γ⌋))); here done without a division, by subtracting
  D from N once per Bernoulli(exp(−1)) (expected O(1) steps since each fails
  with probability 1 − 1/e).  Bernoulli(γ/K) = Bernoulli(1/K) ∧ Bernoulli(N/D),
  two independent exact uniform integers.
* Alg. 2 — discrete Laplace Lap_Z(t/s) for integers t, s ≥ 1 (:func:`laplace_one`).
* Alg. 3 — discrete Gaussian N_Z(0, σ²) for a rational σ² = sn/sd, proposal
  Lap_Z(τ) with τ = ⌊σ⌋ + 1, accepted with probability
  exp(−(|Y| − σ²/τ)²/(2σ²)) = exp(−a²/D) with a = |Y|·τ·sd − sn and
  D = 2·sn·sd·τ² (:func:`gaussian_one`).  a² needs up to 254 bits and D up to
  255: they are held as four uint64 limbs (schoolbook 64×64→128 products from
  32-bit halves).

Nothing in here is a float: every value is a uint64 or int64 (the test
``test_no_float_in_the_sampling_path`` inspects the compiled type maps).

Randomness: ``buf`` (uint64 words) read as a little-endian bit stream, the
state ``st = [bit position, number of valid bits, exhausted flag]``.  An exact
uniform integer in [0, m) takes ⌈log2 m⌉ bits and is rejected (redrawn) when
≥ m.  When the stream runs out in the middle of a value the kernel stops,
rewinds ``st[0]`` to where that value started and returns its index: the
caller appends fresh words and calls again, and the value is *replayed* on
the same bits followed by the fresh ones.  So every value is a deterministic
function of an i.i.d. uniform bit stream — nothing is discarded depending on
its outcome, which would bias it.

Range: outputs are int64.  The Laplace proposal X = U + t·V is kept below
2^62 by rejection, so the samplers draw *exactly* from the target
distribution conditioned on |X| < 2^62 (total variation ≤ 2·exp(−2^62/t) for
Laplace, ≤ 2·exp(−2^123/σ²) for the Gaussian; the parameter checks in
:mod:`fedsbdt.common.exact_noise` keep both below 2^-(2^20)).
"""
from __future__ import annotations

import numpy as np
from numba import njit

_0 = np.uint64(0)
_1 = np.uint64(1)
_32 = np.uint64(32)
_63 = np.uint64(63)
_M32 = np.uint64(0xFFFFFFFF)
#: X = U + t·V stays below this (int64 output range, with a margin).
X_LIMIT = np.uint64(1 << 62)

# Laplace parameter row (uint64): t = m·2^z with m odd, m, bits(m − 1), z, s.
L_T, L_M, L_MBITS, L_Z, L_S = range(5)
L_WIDTH = 5
# Gaussian parameter row (uint64): the Laplace row of τ (s = 1), c = τ·sd, sn (2 limbs), D (4 limbs),
# index of D's top limb, its bit length.
G_C, G_SN0, G_SN1, G_D0, G_D1, G_D2, G_D3, G_DJ, G_DL = range(L_WIDTH, L_WIDTH + 9)


# ------------------------------------------------------------------ random bits


@njit(cache=True, nogil=True, inline="always")
def take(buf, st, k):
    """The next ``k`` (0..64) bits of the stream as a uint64.

    Past the end it returns 0 and sets the exhausted flag st[2] to the stream
    length this draw needed (> 0; the exactness tests use it to enumerate);
    once exhausted, every draw returns 0.
    """
    pos = st[0]
    if st[2] != 0 or pos + k > st[1]:
        if st[2] == 0:
            st[2] = pos + k
        return _0
    st[0] = pos + k
    if k == 0:
        return _0
    i = pos >> 6
    off = pos & 63
    x = buf[i] >> np.uint64(off)
    if off + k > 64:
        x |= buf[i + 1] << np.uint64(64 - off)
    if k < 64:
        x &= (_1 << np.uint64(k)) - _1
    return x


@njit(cache=True, nogil=True, inline="always")
def bit_length(x):
    """Number of bits of the uint64 ``x`` (0 for 0), as int64."""
    n = 0
    while x != _0:
        x >>= _1
        n += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def uniform(buf, st, m, bits):
    """Exact uniform integer in [0, m) (uint64 m ≥ 1, ``bits`` = bit_length(m − 1)) by rejection."""
    while True:
        x = take(buf, st, bits)
        if st[2] != 0 or x < m:
            return x


@njit(cache=True, nogil=True, inline="always")
def bern_inv(buf, st, k):
    """Bernoulli(1/k) for int64 k ≥ 1."""
    m = np.uint64(k)
    return uniform(buf, st, m, bit_length(m - _1)) == _0


@njit(cache=True, nogil=True)
def bern_exp_one(buf, st):
    """Bernoulli(exp(−1)) (Alg. 1 with γ = 1; its first trial, Bernoulli(1/1), always succeeds)."""
    k = 2
    while st[2] == 0 and bern_inv(buf, st, k):
        k += 1
    return (k & 1) == 1


@njit(cache=True, nogil=True, inline="always")
def uniform_t(buf, st, m, mbits, z):
    """Exact uniform integer in [0, t) for t = m·2^z: uniform on [0, m) times 2^z plus z raw bits."""
    hi = uniform(buf, st, m, mbits)
    return (hi << np.uint64(z)) | take(buf, st, z)


@njit(cache=True, nogil=True, inline="always")
def below_t(buf, st, u, m, mbits, z):
    """[v < u] for v uniform on [0, t), t = m·2^z, u ≤ t; v's low z bits are drawn only on a tie above."""
    vh = uniform(buf, st, m, mbits)
    uh = u >> np.uint64(z)
    if vh != uh:
        return vh < uh
    return take(buf, st, z) < (u & ((_1 << np.uint64(z)) - _1))


@njit(cache=True, nogil=True)
def bern_exp(buf, st, u, m, mbits, z):
    """Bernoulli(exp(−u/t)) for 0 ≤ u < t = m·2^z (Alg. 1, γ = u/t < 1)."""
    k = 1
    while st[2] == 0:
        if k > 1 and not bern_inv(buf, st, k):
            break
        if not below_t(buf, st, u, m, mbits, z):
            break
        k += 1
    return (k & 1) == 1


# ------------------------------------------------------------------ wide (multi-limb) integers


@njit(cache=True, nogil=True, inline="always")
def mul64(a, b):
    """Exact 128-bit product of two uint64 as (low, high) limbs."""
    a0 = a & _M32
    a1 = a >> _32
    b0 = b & _M32
    b1 = b >> _32
    p00 = a0 * b0
    p01 = a0 * b1
    p10 = a1 * b0
    p11 = a1 * b1
    mid = (p00 >> _32) + (p01 & _M32) + (p10 & _M32)
    lo = (p00 & _M32) | (mid << _32)
    hi = p11 + (p01 >> _32) + (p10 >> _32) + (mid >> _32)
    return lo, hi


@njit(cache=True, nogil=True, inline="always")
def add_carry(a, b, c):
    """a + b + c (c ∈ {0, 1}) as (sum mod 2^64, carry)."""
    s = a + b
    c1 = _1 if s < a else _0
    s2 = s + c
    c2 = _1 if s2 < s else _0
    return s2, c1 | c2


@njit(cache=True, nogil=True, inline="always")
def sub_borrow(a, b, c):
    """a − b − c (c ∈ {0, 1}) as (difference mod 2^64, borrow)."""
    d = a - b
    b1 = _1 if a < b else _0
    d2 = d - c
    b2 = _1 if d < c else _0
    return d2, b1 | b2


@njit(cache=True, nogil=True)
def square128(lo, hi):
    """Exact square of the 128-bit (lo, hi), hi < 2^63, as four limbs (little-endian)."""
    x0, x1 = mul64(lo, lo)
    m0, m1 = mul64(lo, hi)
    h0, h1 = mul64(hi, hi)
    top = m1 >> _63  # 2·m = (t0, t1) + top·2^128
    t0 = m0 << _1
    t1 = (m1 << _1) | (m0 >> _63)
    r1, c = add_carry(x1, t0, _0)
    r2, c = add_carry(t1, h0, c)
    r3 = h1 + top + c
    return x0, r1, r2, r3


@njit(cache=True, nogil=True, inline="always")
def geq4(n0, n1, n2, n3, d0, d1, d2, d3):
    """(n0..n3) ≥ (d0..d3) for little-endian 256-bit integers."""
    if n3 != d3:
        return n3 > d3
    if n2 != d2:
        return n2 > d2
    if n1 != d1:
        return n1 > d1
    return n0 >= d0


@njit(cache=True, nogil=True)
def uniform_below(buf, st, n, d, dj, dl):
    """[v < n] for v exactly uniform on [0, d), 256-bit limb tuples n < d.

    ``dj`` is the index of d's top non-zero limb and ``dl`` its bit length
    (v is drawn on [0, 2^L), L = bit length of d, and redrawn when ≥ d).
    Lazy: v's limbs are drawn from the top and drawing stops as soon as the
    comparison is decided (the undrawn limbs cannot change the outcome);
    v ≥ d is rejected and redrawn from the start.
    """
    while True:
        eq_n = True
        eq_d = True
        i = dj
        while i >= 0:
            vi = take(buf, st, dl if i == dj else 64)
            if st[2] != 0:
                return False
            di = d[i]
            ni = n[i]
            if eq_d:
                if vi > di:
                    break  # v > d: reject
                if vi < di:
                    eq_d = False
            if eq_n:
                if vi < ni:
                    return True  # v < n < d
                if vi > ni:
                    eq_n = False
            if not eq_n and not eq_d:
                return False  # n < v < d
            i -= 1
        if i < 0 and not eq_d:
            return False  # v = n < d
        # v > d or v = d: redraw


@njit(cache=True, nogil=True)
def bern_exp_wide(buf, st, n0, n1, n2, n3, d, dj, dl):
    """Bernoulli(exp(−N/D)) for 256-bit N ≥ 0 and D > 0 (Alg. 1), D as a limb tuple."""
    d0, d1, d2, d3 = d
    while geq4(n0, n1, n2, n3, d0, d1, d2, d3):  # γ ≥ 1: one Bernoulli(exp(−1)) per unit of γ
        if not bern_exp_one(buf, st) or st[2] != 0:
            return False
        n0, b = sub_borrow(n0, d0, _0)
        n1, b = sub_borrow(n1, d1, b)
        n2, b = sub_borrow(n2, d2, b)
        n3, b = sub_borrow(n3, d3, b)
    n = (n0, n1, n2, n3)
    k = 1
    while st[2] == 0:
        if k > 1 and not bern_inv(buf, st, k):
            break
        if not uniform_below(buf, st, n, d, dj, dl):
            break
        k += 1
    return (k & 1) == 1


# ------------------------------------------------------------------ Algorithms 2 and 3


@njit(cache=True, nogil=True)
def laplace_one(buf, st, p, s):
    """One draw of Lap_Z(t/s) (Alg. 2) with t from the row ``p`` (see ``L_*``), conditioned on
    X = U + t·V < 2^62."""
    t = p[L_T]
    m = p[L_M]
    mbits = np.int64(p[L_MBITS])
    z = np.int64(p[L_Z])
    while st[2] == 0:
        u = uniform_t(buf, st, m, mbits, z)
        if st[2] != 0 or not bern_exp(buf, st, u, m, mbits, z):
            continue
        vmax = (X_LIMIT - _1 - u) // t
        v = _0
        while v <= vmax and st[2] == 0 and bern_exp_one(buf, st):
            v += _1
        if v > vmax:
            continue  # X would reach 2^62: reject
        y = np.int64((u + t * v) // s)
        b = take(buf, st, 1)
        if b == _1 and y == 0:
            continue
        return -y if b == _1 else y
    return np.int64(0)


@njit(cache=True, nogil=True)
def gaussian_one(buf, st, p):
    """One draw of N_Z(0, sn/sd) (Alg. 3) with the parameter row ``p`` (see ``G_*``)."""
    c = p[G_C]
    d = (p[G_D0], p[G_D1], p[G_D2], p[G_D3])
    dj = np.int64(p[G_DJ])
    dl = np.int64(p[G_DL])
    while st[2] == 0:
        y = laplace_one(buf, st, p, _1)
        if st[2] != 0:
            break
        z = np.uint64(-y if y < 0 else y)
        lo, hi = mul64(z, c)  # a = |z·c − sn|, below 2^126
        if hi > p[G_SN1] or (hi == p[G_SN1] and lo >= p[G_SN0]):
            a0, b = sub_borrow(lo, p[G_SN0], _0)
            a1, b = sub_borrow(hi, p[G_SN1], b)
        else:
            a0, b = sub_borrow(p[G_SN0], lo, _0)
            a1, b = sub_borrow(p[G_SN1], hi, b)
        n0, n1, n2, n3 = square128(a0, a1)
        if bern_exp_wide(buf, st, n0, n1, n2, n3, d, dj, dl):
            return y
    return np.int64(0)


# ------------------------------------------------------------------ the exponential mechanism


@njit(cache=True, nogil=True)
def bern_exp_dyadic(buf, st, lo, hi, z):
    """Bernoulli(exp(−N/2^z)) for the 128-bit N = (lo, hi) and 0 ≤ z ≤ 63 (Alg. 1): one Bernoulli(exp(−1))
    per unit of ⌊N/2^z⌋ (a 128-bit count, stopping at the first failure), then Bernoulli(exp(−f/2^z)) for
    the fraction f = N mod 2^z (:func:`bern_exp` with t = 2^z)."""
    zz = np.uint64(z)
    f = lo & ((_1 << zz) - _1) if z < 64 else lo
    k0 = lo >> zz if z > 0 else lo
    k1 = hi >> zz if z > 0 else hi
    if z > 0:
        k0 |= hi << np.uint64(64 - z)
    while k0 != _0 or k1 != _0:
        if not bern_exp_one(buf, st) or st[2] != 0:
            return False
        if k0 == _0:
            k1 -= _1
        k0 -= _1
    return bern_exp(buf, st, f, _1, 0, z)


@njit(cache=True, nogil=True)
def em_one(buf, st, a, p, z, trials):
    """One index c of ``a`` (uint64 distances) with probability ∝ exp(−a[c]·p/2^z), exactly: a uniform
    proposal c accepted with probability exp(−a[c]·p/2^z) ≤ 1 (:func:`bern_exp_dyadic`), repeated until one
    is accepted — rejection sampling, so the accepted index has exactly the normalised weights
    (McSherry–Talwar's exponential mechanism when a = max score − score in units).  Each trial starts
    afresh on new bits, so one trial's law (c with probability exp(−a[c]·p/2^z)/m, else rejection: what
    ``trials = 1`` returns, −2 for the rejection) fixes the whole; ``trials = 0``: until accepted."""
    m = np.uint64(a.shape[0])
    mbits = bit_length(m - _1)
    t = 0
    while st[2] == 0:
        c = uniform(buf, st, m, mbits)
        if st[2] != 0:
            break
        lo, hi = mul64(a[np.int64(c)], p)
        if bern_exp_dyadic(buf, st, lo, hi, z) and st[2] == 0:
            return np.int64(c)
        t += 1
        if t == trials:
            return np.int64(-2)
    return np.int64(-1)


# ------------------------------------------------------------------ batch kernels


#: What :func:`fill` draws; the Bernoulli kinds exist for the exactness tests.
GAUSSIAN, LAPLACE, BERN_WIDE, BERN_SMALL, EXPONENTIAL = 0, 1, 2, 3, 4
# Exponential-mechanism parameter row (uint64): p, z, trials (0: until accepted), then the distances a.
E_P, E_Z, E_TRIALS, E_A = range(4)
# Bernoulli(exp(−n/d)) parameter row (uint64): n, d, bits(d), m, bits(m − 1), z with d = m·2^z, m odd.
B_N, B_D, B_DL, B_M, B_MBITS, B_Z = range(6)


@njit(cache=True, nogil=True)
def draw_one(kind, buf, st, p):
    """One value of ``kind`` with the parameter row ``p`` (Bernoulli kinds: 0/1).

    BERN_WIDE goes through :func:`bern_exp_wide` (Alg. 3's acceptance step, any n);
    BERN_SMALL through :func:`bern_exp` (Alg. 2's step, n < d); EXPONENTIAL is :func:`em_one` (an index).
    """
    if kind == GAUSSIAN:
        return gaussian_one(buf, st, p)
    if kind == LAPLACE:
        return laplace_one(buf, st, p, p[L_S])
    if kind == EXPONENTIAL:
        return em_one(buf, st, p[E_A:], p[E_P], np.int64(p[E_Z]), np.int64(p[E_TRIALS]))
    if kind == BERN_WIDE:
        r = bern_exp_wide(buf, st, p[B_N], _0, _0, _0, (p[B_D], _0, _0, _0), 0, np.int64(p[B_DL]))
    else:
        r = bern_exp(buf, st, p[B_N], p[B_M], np.int64(p[B_MBITS]), np.int64(p[B_Z]))
    return np.int64(1) if r else np.int64(0)


@njit(cache=True, nogil=True)
def fill(out, kind, which, params, buf, st, start):
    """out[i] ← a draw of ``kind`` with the row params[which[i]], for i ≥ start until done or the bits
    run out; returns the next index.  On running out, st[0] is rewound to the bit where value i
    started (see the module docstring)."""
    i = start
    while i < out.shape[0]:
        pos = st[0]
        y = draw_one(kind, buf, st, params[which[i]])
        if st[2] != 0:
            st[0] = pos
            return i
        out[i] = y
        i += 1
    return i
