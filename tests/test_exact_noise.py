"""Our exact discrete Gaussian / Laplace sampler (common/exact_noise.py, common/exact_kernels.py).

* Exactness by enumeration: the compiled kernels are run on every bit string
  they can ask for (shortest first), which gives the exact probability of
  each outcome as a Fraction, up to the mass of the strings not explored; the
  closed forms (exp(−γ), the Laplace and Gaussian pmfs, in 60-digit Decimal)
  must lie in those intervals.
* Distribution: χ² against the closed-form pmf and two-sample χ² against
  OpenDP's samplers, small and large scales, both tails, at p = 1e-6.
* No float anywhere in the compiled sampling path (type maps of a fresh compile).
"""
import heapq
import json
import math
import os
import subprocess
import sys
from decimal import Decimal, getcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedsbdt.common import exact_kernels as K
from fedsbdt.common import exact_noise as E
from fedsbdt.common.randomness import SecureRandomness

ROOT = Path(__file__).resolve().parents[1]
P = 1e-6
getcontext().prec = 60
EPS_DEC = Fraction(1, 10**50)


# ------------------------------------------------------------------ exact enumeration


def enumerate_kernel(run, max_nodes=20_000):
    """Exact outcome probabilities of ``run(bits, length)`` over uniform random bits, and the unexplored mass.

    ``run`` returns ("done", outcome, bits consumed) or ("need", total bits wanted).  Prefixes are
    explored shortest first (one child per value of the next draw) for at most ``max_nodes`` runs.
    """
    probs: dict = {}
    heap = [(0, 0)]
    pending = Fraction(1)
    for _ in range(max_nodes):
        if not heap:
            break
        length, bits = heapq.heappop(heap)
        w = Fraction(1, 2**length)
        res = run(bits, length)
        if res[0] == "done":
            assert res[2] == length  # a finished value consumed exactly the prefix that finished it
            probs[res[1]] = probs.get(res[1], 0) + w
            pending -= w
        else:
            need = res[1]
            assert need > length
            for ext in range(2 ** (need - length)):
                heapq.heappush(heap, (need, bits | (ext << length)))
    return probs, pending


def kernel_runner(fill, *args):
    def run(bits, length):
        words = np.array([(bits >> (64 * i)) & (2**64 - 1) for i in range(length // 64 + 2)], dtype=np.uint64)
        st = np.array([0, length, 0], dtype=np.int64)
        out = np.zeros(1, dtype=np.int64)
        if fill(out, *args, words, st, 0) == 1:
            return "done", int(out[0]), int(st[0])
        return "need", int(st[2])
    return run


def dexp(x: Fraction) -> Decimal:
    return (Decimal(x.numerator) / Decimal(x.denominator)).exp()


def check_interval(probs, pending, exact):
    """Every closed-form probability lies in [enumerated, enumerated + unexplored mass]."""
    for outcome, p in probs.items():
        ref = Fraction(exact(outcome))
        assert p - EPS_DEC <= ref <= p + pending + EPS_DEC, (outcome, float(p), float(ref), float(pending))
    assert 1 - sum(Fraction(exact(o)) for o in probs) <= pending + EPS_DEC  # outcomes never reached


def bern_runner(wide, n, d):
    return kernel_runner(K.fill, K.BERN_WIDE if wide else K.BERN_SMALL, np.zeros(1, np.int64),
                         np.array([E._bernoulli_row(n, d)], dtype=np.uint64))


WIDE = [(0, 1), (1, 3), (2, 3), (1, 1), (5, 4), (7, 2), (13, 5), (3, 7)]  # γ = n/d, both branches of Alg. 1
SMALL = [(0, 5), (1, 3), (2, 3), (3, 4), (5, 6), (7, 12), (1, 8)]  # γ = u/t < 1, t = m·2^z in several shapes


@pytest.mark.parametrize("wide,n,d", [(True, *g) for g in WIDE] + [(False, *g) for g in SMALL])
def test_bernoulli_exp_minus_gamma_is_exact(wide, n, d):
    """Alg. 1, as used by Alg. 3 (wide: any γ) and by Alg. 2 (γ = u/t < 1, lazy comparison):
    P[1] = exp(−γ) lies in the exact enumerated interval over all random bit strings."""
    probs, pending = enumerate_kernel(bern_runner(wide, n, d))
    assert pending < Fraction(5, 100), float(pending)
    e = Fraction(dexp(-Fraction(n, d)))
    check_interval(probs, pending, lambda o: e if o == 1 else 1 - e)


def test_enumeration_catches_a_wrong_probability():
    """The interval check has teeth: Bernoulli(exp(−2/3)) does not pass for exp(−0.7)."""
    probs, pending = enumerate_kernel(bern_runner(True, 2, 3))
    e = Fraction(dexp(-Fraction(7, 10)))
    with pytest.raises(AssertionError):
        check_interval(probs, pending, lambda o: e if o == 1 else 1 - e)


@pytest.mark.parametrize("wide,n,d", [(True, 2, 3), (True, 7, 2), (True, 10**12 + 7, 10**12), (False, 5, 6),
                                      (False, 2**40 - 3, 2**40)])
def test_bernoulli_exp_frequency(wide, n, d):
    """10^6 draws from the CSPRNG: the count of ones is within the binomial p = 1e-6 bounds of exp(−n/d)."""
    from fedsbdt.common.randomness import csprng_fill

    N = 1_000_000
    words = np.empty(40 * N, dtype=np.uint64)
    csprng_fill(words)
    out = np.empty(N, dtype=np.int64)
    st = np.array([0, 64 * words.size, 0], dtype=np.int64)
    params = np.array([E._bernoulli_row(n, d)], dtype=np.uint64)
    assert K.fill(out, K.BERN_WIDE if wide else K.BERN_SMALL, np.zeros(N, np.int64), params, words, st, 0) == N
    p = math.exp(-n / d)
    lo, hi = stats.binom.isf(1 - P / 2, N, p), stats.binom.isf(P / 2, N, p)
    assert lo <= out.sum() <= hi, (out.sum(), lo, hi)


# ------------------------------------------------------------------ wide arithmetic


def test_wide_integer_helpers_match_python_integers():
    rng = np.random.default_rng(5)
    edge = [0, 1, 2, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
    vals = edge + [int(x) for x in rng.integers(0, 2**64, size=300, dtype=np.uint64)]
    for i, a in enumerate(vals):
        b = vals[(7 * i + 3) % len(vals)]
        lo, hi = K.mul64(np.uint64(a), np.uint64(b))
        assert int(lo) + (int(hi) << 64) == a * b
        for c in (0, 1):
            s, carry = K.add_carry(np.uint64(a), np.uint64(b), np.uint64(c))
            assert int(s) + (int(carry) << 64) == a + b + c
            d, borrow = K.sub_borrow(np.uint64(a), np.uint64(b), np.uint64(c))
            assert int(d) - (int(borrow) << 64) == a - b - c
        h = b >> 1  # square128 needs hi < 2^63
        limbs = K.square128(np.uint64(a), np.uint64(h))
        assert sum(int(x) << (64 * j) for j, x in enumerate(limbs)) == (a + (h << 64)) ** 2
        n4 = [np.uint64(x) for x in (a, b, h, a >> 3)]
        d4 = [np.uint64(x) for x in (b, a, h, b >> 3)]
        as_int = lambda v: sum(int(x) << (64 * j) for j, x in enumerate(v))  # noqa: E731
        assert K.geq4(*n4, *d4) == (as_int(n4) >= as_int(d4))
    for x in edge:
        assert K.bit_length(np.uint64(x)) == x.bit_length()


# ------------------------------------------------------------------ parameters


def test_parameters_are_exact_or_rounded_up_by_a_negligible_amount():
    assert E.gaussian_variance(Fraction(5, 3)) == Fraction(5, 3)
    assert E.gaussian_variance(Fraction(2**48)) == 2**48
    for sigma in (1.0 + 2**-40, 2.0**24 * 1.1, 12595257.3, 2.0**50, 0.1, 1 / 3):
        want = Fraction(sigma) ** 2
        got = E.gaussian_variance(want)
        bound = 1 / (2**61 * Fraction(sigma)) if sigma >= 1 else 1 / (want * 2**62)  # the documented bounds
        assert want <= got and (got - want) / want < bound, sigma
    for b in (0.1, 1 / 3, 20.0, 2.0**30 / 3):
        want = Fraction(b)
        got = E.laplace_scale(want)
        assert want <= got and (got - want) / want < Fraction(1, 2**39), b
    assert E.laplace_scale(Fraction(7, 3)) == Fraction(7, 3)
    for bad in (0, -1, Fraction(2**101), float("nan"), float("inf"), "1", True):
        with pytest.raises(E.NoiseParameterError):
            E.discrete_gaussian(bad, 3)
    for bad in (0, -2.0, 2.0**41, float("nan")):
        with pytest.raises(E.NoiseParameterError):
            E.discrete_laplace(bad, 3)
    with pytest.raises(ValueError, match="finite and non-negative"):
        SecureRandomness().discrete_gaussian(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="sampler"):
        SecureRandomness(sampler="numpy")


class Stream:
    """A fixed word stream handed out block by block (deterministic, for the replay test)."""

    def __init__(self, seed):
        self.words = np.random.default_rng(seed).integers(0, 2**64, size=100_000, dtype=np.uint64)
        self.pos = 0

    def __call__(self, out):
        out[:] = self.words[self.pos:self.pos + out.size]
        self.pos += out.size


def test_values_cut_by_a_block_end_are_replayed_not_redrawn(monkeypatch):
    """Tiny blocks (a replay every few values) give exactly the values of one big block on the same stream:
    no value is discarded depending on how much randomness it used."""
    big = E.discrete_gaussian(Fraction(2**40), 5000, words=Stream(1))
    big_l = E.discrete_laplace(Fraction(1000, 3), 5000, words=Stream(2))
    monkeypatch.setattr(E, "_WORDS_PER_VALUE", {"gaussian": 0.001, "laplace": 0.001})
    assert np.array_equal(E.discrete_gaussian(Fraction(2**40), 5000, words=Stream(1)), big)
    assert np.array_equal(E.discrete_laplace(Fraction(1000, 3), 5000, words=Stream(2)), big_l)


def test_per_entry_scales_zero_and_shapes():
    rnd = SecureRandomness()
    scales = np.array([[0.0, 3.0, 2.0**24], [2.0**24, 0.0, 3.0]])
    x = rnd.discrete_gaussian(scales)
    assert x.shape == scales.shape and x.dtype == np.int64
    assert x[0, 0] == 0 and x[1, 1] == 0
    assert rnd.discrete_laplace(np.zeros(4)).tolist() == [0, 0, 0, 0]
    assert rnd.describe() == "cks-exact+aes-ctr-drbg"
    assert SecureRandomness(sampler="opendp").describe() == "opendp-exact+aes-ctr-drbg"
    many = rnd.discrete_gaussian(np.full(40_000, 2.0**24))
    assert len(np.unique(many)) > 39_000  # fresh randomness, no repeated blocks


# ------------------------------------------------------------------ distribution (χ², p = 1e-6)


def gaussian_cdf(sigma):
    """CDF of N_Z(0, σ²) at integers (float): exact sums for small σ, Φ((k + ½)/σ) for large σ."""
    if sigma > 2**12:
        return lambda k: 0.5 * math.erfc(-(k + 0.5) / (sigma * math.sqrt(2)))
    w = int(math.ceil(14 * sigma)) + 2
    ys = np.arange(-w, w + 1)
    pmf = np.exp(-(ys.astype(np.float64) ** 2) / (2 * sigma**2))
    cum = np.cumsum(pmf / pmf.sum())
    return lambda k: 0.0 if k < -w else 1.0 if k >= w else float(cum[k + w])


def laplace_cdf(b):
    q = math.exp(-1 / b)
    return lambda k: 1 - q ** (k + 1) / (1 + q) if k >= 0 else q ** (-k) / (1 + q)


def bins_for(cdf, scale, n, tail=2e-4):
    """Integer bin edges: both tails (mass ≈ ``tail``), 30 central bins; merged to ≥ 20 expected counts."""
    levels = [tail] + list(np.linspace(0, 1, 32)[1:-1]) + [1 - tail]
    lo, hi = -int(60 * scale) - 10, int(60 * scale) + 10
    edges = []
    for lv in levels:  # the smallest k with cdf(k) ≥ level
        a, b = lo, hi
        while a < b:
            m = (a + b) // 2
            if cdf(m) >= lv:
                b = m
            else:
                a = m + 1
        edges.append(a)
    edges = sorted(set(edges))
    probs = np.diff([0.0] + [cdf(e) for e in edges] + [1.0])
    # merge bins with small expectation into their neighbour
    keep = []
    acc = 0.0
    for e, p in zip(edges + [None], probs):
        acc += p
        if acc * n >= 20 or e is None:
            keep.append((e, acc))
            acc = 0.0
    if keep[-1][1] * n < 20 and len(keep) > 1:
        e, p = keep.pop()
        keep[-1] = (e, keep[-1][1] + p)
    return [e for e, _ in keep[:-1]], np.array([p for _, p in keep])


def counts(x, edges):
    return np.bincount(np.searchsorted(np.asarray(edges), x, side="left"), minlength=len(edges) + 1)


def fits(x, edges, p) -> bool:
    """Pearson χ² of the draws ``x`` in the bins against probabilities ``p``, below the p = 1e-6 critical value."""
    n = x.size
    obs = counts(x, edges)
    return float(((obs - n * p) ** 2 / (n * p)).sum()) < stats.chi2.isf(P, len(p) - 1)


@pytest.mark.parametrize("kind,scale", [("gaussian", 0.7), ("gaussian", 3.0), ("gaussian", 2.0**10 + 0.3),
                                        ("gaussian", 2.0**24), ("gaussian", 12595257.3), ("laplace", 0.4),
                                        ("laplace", 2.5), ("laplace", 20.0), ("laplace", 2.0**20 / 3)])
def test_matches_the_closed_form_pmf(kind, scale):
    n = 200_000
    x = getattr(SecureRandomness(), f"discrete_{kind}")(np.full(n, scale))
    cdf = gaussian_cdf(scale) if kind == "gaussian" else laplace_cdf(scale)
    edges, p = bins_for(cdf, scale, n)
    assert fits(x, edges, p)
    obs = counts(x, edges)
    assert obs[0] > 0 and obs[-1] > 0  # the tail bins are populated on both sides
    if scale > 100:  # and a 5% wider distribution fails the same test (power > 1 - 1e-12 for every case here;
        # at 2% the Laplace case had power 0.88 only)
        assert not fits(np.rint(x * 1.05).astype(np.int64), edges, p)


@pytest.mark.parametrize("kind,scale", [("gaussian", 3.0), ("gaussian", 2.0**24), ("laplace", 2.5),
                                        ("laplace", 2.0**20 / 3)])
def test_matches_opendp(kind, scale):
    """Two-sample χ² (homogeneity) of ours against OpenDP's exact sampler, same bins, p = 1e-6."""
    n = 60_000
    draws = {}
    for sampler in ("ours", "opendp"):
        rnd = SecureRandomness(sampler=sampler)
        draws[sampler] = getattr(rnd, f"discrete_{kind}")(np.full(n, scale))
    cdf = gaussian_cdf(scale) if kind == "gaussian" else laplace_cdf(scale)
    edges, _ = bins_for(cdf, scale, n)
    table = np.array([counts(draws[s], edges) for s in ("ours", "opendp")])
    table = table[:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table)[1] > P


# ------------------------------------------------------------------ the exponential mechanism


def em_runner(a, p, z, trials=1):
    return kernel_runner(K.fill, K.EXPONENTIAL, np.zeros(1, np.int64), np.array([[p, z, trials, *a]], dtype=np.uint64))


def em_trial(a, p, z):
    """Exact law of one trial: c with probability exp(−a_c·p/2^z)/m, −2 (rejected) with the rest."""
    w = [Fraction(dexp(-Fraction(x * p, 2**z))) for x in a]
    return lambda c: w[c] / len(a) if c >= 0 else 1 - sum(w) / len(a)


EM_CASES = [([0, 1, 2], 1, 1), ([3, 0, 5, 1], 3, 2), ([0, 0], 5, 2), ([7, 2, 0], 1, 0), ([0, 9], 2, 3),
            ([2**63 - 1, 0, 2**40, 1], 2**63 - 1, 3)]


@pytest.mark.parametrize("a,p,z", EM_CASES)
def test_exponential_mechanism_trial_is_exact(a, p, z):
    """One trial of the rejection sampler proposes c uniformly and keeps it with probability
    exp(−a_c·p/2^z) exactly (weights below, at and above exp(−1), a 127-bit exponent): every closed-form
    probability lies in the enumerated interval.  Trials start afresh, so the sampler's output is exactly
    ∝ exp(−a_c·p/2^z); the whole loop's enumeration agrees too (wider intervals)."""
    probs, pending = enumerate_kernel(em_runner(a, p, z))
    assert pending < Fraction(5, 100), float(pending)
    check_interval(probs, pending, em_trial(a, p, z))
    probs, pending = enumerate_kernel(em_runner(a, p, z, trials=0))
    w = [Fraction(dexp(-Fraction(x * p, 2**z))) for x in a]
    check_interval(probs, pending, lambda c: w[c] / sum(w))


def test_exponential_mechanism_enumeration_catches_a_wrong_weight():
    """The interval check has teeth: a trial keeping with exp(−a·3/4) does not pass for exp(−a·0.7)."""
    probs, pending = enumerate_kernel(em_runner([3, 0, 5, 1], 3, 2))
    w = [Fraction(dexp(-Fraction(x * 7, 10))) for x in (3, 0, 5, 1)]
    with pytest.raises(AssertionError):
        check_interval(probs, pending, lambda c: w[c] / 4 if c >= 0 else 1 - sum(w) / 4)


def test_exponential_mechanism_parameters_keep_epsilon():
    """The integer form never spends more than ε = 2Δ/scale: scores moved by at most Δ move the unit scores
    by at most Δ_S, and the rate p/2^63 times 2Δ_S is ≤ ε (and within 2^-20 of it)."""
    rng = np.random.default_rng(5)
    for delta, scale, mag in [(3.0, 6.0, 1e4), (0.75 * 2**-20, 1e-5, 1.0), (12.0, 0.37, 1e9), (1.0, 1e6, 1e12)]:
        s = rng.normal(0, mag, (50, 40))
        moved = s + rng.uniform(-delta, delta, s.shape)
        moved[:, :5] = s[:, :5] + delta * np.sign(rng.normal(size=(50, 5)))  # moved by exactly ±Δ
        a, p = E.em_parameters(s, scale, delta)
        b, q = E.em_parameters(moved, scale, delta)
        assert p == q
        k = math.frexp(delta)[1] - 1 - E.EM_UNIT_BITS
        k = max(k, math.frexp(float(max(np.abs(s).max(), np.abs(moved).max())))[1] - E.EM_SCORE_BITS)
        delta_s = -(-Fraction(delta) // Fraction(2) ** k) + 1
        S = np.floor(np.ldexp(s, -k)).astype(np.int64)
        T = np.floor(np.ldexp(moved, -k)).astype(np.int64)
        assert int(np.abs(S - T).max()) <= delta_s
        eps = Fraction(2) * Fraction(delta) / Fraction(scale)
        used = Fraction(p, 2**63) * 2 * delta_s
        assert used <= eps and used >= eps * (1 - Fraction(1, 2**20)), (float(used), float(eps))
        np.testing.assert_array_equal(a, (S.max(axis=1, keepdims=True) - S).astype(np.uint64))
    with pytest.raises(E.NoiseParameterError):
        E.em_parameters(np.array([1.0, np.inf]), 1.0, 1.0)
    with pytest.raises(E.NoiseParameterError):
        E.em_parameters(np.array([1.0, 2.0]), 1.0, 0.0)


@pytest.mark.parametrize("sampler", ["ours", "opendp"])
def test_exponential_mechanism_matches_the_closed_form(sampler):
    """χ² of 20,000 draws (rows of one 2-D call for ours) against exp(score/scale) / Σ, p = 1e-6, on a
    spread (13 candidates, weights 1 … e^-12) and a near-tie; and OpenDP against ours (homogeneity)."""
    rnd = SecureRandomness(sampler=sampler)
    for scores, scale in [(np.linspace(0.0, 24.0, 13), 2.0), (np.array([5.0, 5.0 - 1e-3, 4.0, -30.0]), 0.5)]:
        n = 20_000 if sampler == "ours" else 4_000
        picks = rnd.exponential_mechanism(np.tile(scores, (n, 1)), scale, 1.0)
        w = np.exp((scores - scores.max()) / scale)
        expect = n * w / w.sum()
        obs = np.bincount(picks, minlength=scores.size)
        keep = expect >= 5
        rest = (obs[~keep].sum(), expect[~keep].sum())
        o = np.append(obs[keep], rest[0]) if rest[1] > 0 else obs[keep]
        e = np.append(expect[keep], rest[1]) if rest[1] > 0 else expect[keep]
        assert float(((o - e) ** 2 / e).sum()) < stats.chi2.isf(P, o.size - 1), (obs, expect)
    assert isinstance(rnd.exponential_mechanism(scores, scale, 1.0), int)


# ------------------------------------------------------------------ no floats


_TYPEMAP_SCRIPT = r"""
import json
from fractions import Fraction
import numpy as np
from numba.core import types
from numba.core.registry import CPUDispatcher
from fedsbdt.common import exact_kernels as K, exact_noise as E

E.discrete_gaussian(Fraction(5, 3), 50)
E.discrete_laplace(Fraction(7, 2), 50)
E.exponential_mechanism(np.array([[0.0, 1.0, 5.0], [2.0, 2.0, 9.0]]), 1.0, 1.0)
for kind in (K.BERN_WIDE, K.BERN_SMALL):
    st = np.array([0, 64 * 8, 0], dtype=np.int64)
    K.fill(np.zeros(3, np.int64), kind, np.zeros(3, np.int64), np.array([E._bernoulli_row(1, 2)], dtype=np.uint64),
           np.ones(8, np.uint64), st, 0)

def floaty(ty):
    if isinstance(ty, (types.Float, types.Complex)):
        return True
    if isinstance(ty, types.Array):
        return floaty(ty.dtype)
    if isinstance(ty, types.BaseTuple):
        return any(floaty(t) for t in ty)
    if isinstance(ty, types.NumberClass):
        return floaty(ty.instance_type)
    if isinstance(ty, types.Optional):
        return floaty(ty.type)
    return False

checked, bad = [], []
for name, disp in sorted(vars(K).items()):
    if not isinstance(disp, CPUDispatcher):
        continue
    for sig, cres in disp.overloads.items():
        ann = cres.type_annotation
        if ann is None:
            raise SystemExit(f"{name}: loaded from a cache, no type map")
        checked.append(name)
        for var, ty in ann.typemap.items():
            if floaty(ty):
                bad.append(f"{name}: {var}: {ty}")
        for inst, csig in ann.calltypes.items():
            if csig is not None and (floaty(csig.return_type) or any(floaty(a) for a in csig.args)):
                bad.append(f"{name}: {inst}: {csig}")
        if floaty(cres.signature.return_type) or any(floaty(a) for a in cres.signature.args):
            bad.append(f"{name}: signature {cres.signature}")
print(json.dumps({"checked": checked, "bad": bad}))
"""


def test_no_float_in_the_sampling_path(tmp_path):
    """Compile the kernels afresh (empty numba cache) and scan every variable type and every call
    signature of every compiled kernel (helpers are inlined into them) for float or complex types."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", _TYPEMAP_SCRIPT], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"fill", "draw_one", "gaussian_one", "laplace_one", "bern_exp_wide", "bern_exp", "bern_exp_one",
            "uniform_below", "em_one", "bern_exp_dyadic"} <= set(res["checked"])
    assert res["bad"] == []


@pytest.mark.parametrize("sampler,described", [("ours", "cks-exact+aes-ctr-drbg"),
                                               ("opendp", "opendp-exact+aes-ctr-drbg")])
def test_train_cli_sampler_flag(tmp_path, sampler, described):
    ex = ROOT / "examples" / "abalone"
    out = tmp_path / "model.json"
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "train", "--data", str(ex / "abalone.data"), "--schema",
                        str(ex / "schema.toml"), "--out", str(out), "--trees", "3", "--depth", "2", "--sampler",
                        sampler, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["privacy"]["randomness"] == described


def test_train_cli_refuses_an_unknown_sampler(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "train", "--data", "x.csv", "--schema", "s.toml",
                        "--out", str(tmp_path / "m.json"), "--sampler", "numpy"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "--sampler" in p.stderr and not (tmp_path / "m.json").exists()


def test_csprng_pool_hands_out_each_word_once_and_not_across_fork():
    from fedsbdt.common.randomness import csprng_fill

    a, b = np.empty(300, np.uint64), np.empty(300, np.uint64)
    csprng_fill(a)
    csprng_fill(b)
    assert not set(a.tolist()) & set(b.tolist())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child draws from the pool it inherited
        c = np.empty(300, np.uint64)
        csprng_fill(c)
        os.write(w, c.tobytes())
        os._exit(0)
    os.close(w)
    d = np.empty(300, np.uint64)
    csprng_fill(d)
    got = b""
    while len(got) < 2400:
        chunk = os.read(r, 2400 - len(got))
        if not chunk:
            break
        got += chunk
    os.waitpid(pid, 0)
    child = np.frombuffer(got, dtype=np.uint64)
    assert child.size == 300 and not set(child.tolist()) & set(d.tolist())
