"""Randomised equivalence check of the fast engine paths against plain reference code.

Not a test (no timing, but slow-ish): ``python benchmarks/check_kernels.py``.
Every fast path of ``common/kernels.py`` — interleaved and streaming float
walks, one-byte code walks (random and single-feature trees), the fused round
kernel with and without filter/availability, and the leaf-value kernel — must
agree exactly with straightforward implementations written here, and the
buffer-reusing subsample keystream must equal ``csprng_uint64`` under a fixed key.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # kernel_cases (a package "tests" may be installed)

from fedsbdt.common import kernels  # noqa: E402
from kernel_cases import random_case  # noqa: E402


def ref_leaf(X, features, thresholds, is_cat, depth):
    n = X.shape[0]
    out = np.empty(n, np.int32)
    for i in range(n):
        k = 0
        for _ in range(depth):
            f = features[k]
            x = X[i, f]
            right = (x != thresholds[k]) if is_cat[f] else not (x < thresholds[k])
            k = 2 * k + 1 + int(right)
        out[i] = k - (2**depth - 1)
    return out


def check_walks(rng, cases=300):
    for c in range(cases):
        n = int(rng.integers(1, 300))
        m = int(rng.integers(1, 8))
        depth = int(rng.integers(1, 7))
        cyc = bool(rng.random() < 0.5)
        n_cand = int(rng.choice([0, 1, 7, 32, 255]))
        X, features, thr, is_cat, edges = random_case(rng, n, m, depth, cyc, n_cand, on_grid=1.0)
        if edges is not None and c % 4 == 0:  # irregular candidate grids (clustered, with gaps)
            for f in range(m):
                if edges[f] is not None:
                    e = np.unique(np.concatenate([rng.uniform(-3, 3, n_cand) ** 3, X[:5, f]]))[:255]
                    edges[f] = e[np.isfinite(e)]
                    X[rng.integers(0, n, 5), f] = rng.choice(edges[f], 5)
            for k in range(len(features)):
                if not is_cat[features[k]]:
                    thr[k] = rng.choice(edges[features[k]])
        ref = ref_leaf(X, features, thr, is_cat, depth)
        assert np.array_equal(kernels.leaf_index(X, features, thr, is_cat, depth), ref), c
        assert np.array_equal(kernels._leaf_index(X, features, thr, is_cat, depth), ref), c
        lo_, hi_ = kernels.node_bounds(features, thr, is_cat)
        assert np.array_equal(kernels._walk_blocked(X, features, lo_, hi_, depth), ref), c
        if edges is not None:
            codes = kernels.bin_codes(X, edges, is_cat, column_major=bool(c % 2))
            ref_codes = np.column_stack([
                np.where((X[:, f] >= 0) & (X[:, f] < 255) & (X[:, f] == np.floor(X[:, f])), X[:, f], 255)
                if is_cat[f] else np.searchsorted(edges[f], X[:, f], side="right") for f in range(m)])
            assert np.array_equal(codes, ref_codes), c
            b = kernels.code_bounds(features, thr, is_cat, kernels.pack_edges(edges))
            assert b is not None, c
            assert np.array_equal(kernels.leaf_index_codes(codes, features, b[0], b[1], depth), ref), c
            assert np.array_equal(kernels._walk_blocked(codes, features, b[0], b[1], depth), ref), c
            # a threshold off the candidate grid is refused
            k = int(np.flatnonzero(~is_cat[features])[0]) if (~is_cat[features]).any() else None
            if k is not None:
                t2 = thr.copy()
                t2[k] = np.nextafter(t2[k], np.inf)
                assert kernels.code_bounds(features, t2, is_cat, kernels.pack_edges(edges)) is None
    print(f"tree walks: {cases} random cases agree")


def ref_grad_hess(pred, y, task, scale, g_units, h_units):
    """Alg. 5 lines 2/4 record by record with math.exp (as the brute-force reference test)."""
    gq, hq = [], []
    for p_, y_ in zip(pred, y):
        if task == 0:
            g, h = y_ - p_, 1.0
        else:
            p = 1.0 / (1.0 + math.exp(-p_))
            g, h = y_ - p, p * (1.0 - p)
        gq.append(int(min(max(np.rint(g * scale), -g_units), g_units)))
        hq.append(int(min(max(np.rint(h * scale), 0), h_units)))
    return np.array(gq, np.int64), np.array(hq, np.int64)


def check_round_sums(rng, cases=300):
    for c in range(cases):
        n = int(rng.integers(1, 400))
        L = 2 ** int(rng.integers(1, 6))
        task = int(rng.integers(0, 2))
        scale = 2.0**20
        g_units, h_units = int(rng.integers(1, 2**20)), int(rng.integers(1, 2**20))
        pred = rng.normal(0, 3, n)
        y = rng.integers(0, 2, n).astype(float) if task else rng.uniform(-1, 1, n)
        leaf = rng.integers(0, L, n).astype(np.int32)
        sampled = rng.random(n) < rng.random()
        available = None if rng.random() < 0.5 else rng.random(n) < 0.8
        avail = np.ones(n, bool) if available is None else available
        if c % 3 == 0:  # large margins: clipping in both directions
            pred = pred * 50
        gq, hq = kernels.grad_hess_units(pred, y, task, scale, g_units, h_units)
        rg, rh = ref_grad_hess(pred, y, task, scale, g_units, h_units)
        assert np.array_equal(gq, rg) and np.array_equal(hq, rh), c
        if rng.random() < 0.5:
            sums, new_spent, na, ns = kernels.round_sums(leaf, pred, y, task, scale, g_units, h_units, sampled,
                                                         available, L)
            assert new_spent is None
            active = avail
        else:
            grid = 16
            table = np.cumsum(np.cumsum(rng.integers(0, 50, (grid + 1, grid + 1)), 0), 1).astype(np.int64)
            spent = rng.integers(0, 3000, n).astype(np.int64)
            budget = 3000
            sums, new_spent, na, ns = kernels.round_sums(leaf, pred, y, task, scale, g_units, h_units, sampled,
                                                         available, L, (table, spent, budget))
            active, ref_spent = kernels.filter_step(gq, hq, g_units, h_units, table, spent, budget, avail)
            assert np.array_equal(new_spent, ref_spent), c
        ref = kernels.leaf_sums(leaf, gq, hq, active & sampled, L)
        assert np.array_equal(sums, ref), c
        assert na == int(active.sum()) and ns == int((active & sampled).sum()), c
    print(f"round sums: {cases} random cases agree")


def check_leaf_values(rng, cases=2000):
    for c in range(cases):
        L = 2 ** int(rng.integers(1, 7))
        s = rng.integers(-(2**40), 2**40, 2 * L)
        s[rng.random(2 * L) < 0.2] = 0
        hs, gs = 2.0 ** int(rng.integers(8, 31)), 2.0 ** int(rng.integers(8, 31))
        l2, beta = float(rng.choice([0.0, 0.5, 15.0])), float(rng.uniform(0.1, 3))
        w, u = s[:L].astype(np.float64) / hs, s[L:].astype(np.float64) / gs
        den = w + l2
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where((w >= 0) & (den > 0), u / np.where(den > 0, den, 1.0), 0.0)
        ref = np.clip(v, -beta, beta)
        got = kernels.leaf_values(s, L, hs, gs, l2, beta)
        assert np.array_equal(got.view(np.int64), ref.view(np.int64)), c
    print(f"leaf values: {cases} random cases agree bit for bit")


def check_subsample_stream():
    """The buffer-reusing keystream equals ``csprng_uint64`` under the same key; masks match bit for bit."""
    import os
    from unittest import mock

    from fedsbdt.common import csprng, randomness

    for n in (1, 7, 1000, 30_001):
        key = os.urandom(32)
        with mock.patch.object(csprng.os, "urandom", lambda k: key):
            a = randomness.csprng_uint64(n).copy()
            b = randomness._csprng_uint64_scratch(n).copy()
            m1 = randomness._bernoulli_from_u64(randomness.csprng_uint64(n), 0.1)
            m2 = randomness.SecureRandomness().subsample(0.1, np.arange(n), 0)
        assert np.array_equal(a, b) and np.array_equal(m1, m2), n
    print("subsample keystream: identical to csprng_uint64 under a fixed key")


if __name__ == "__main__":
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    check_walks(rng)
    check_round_sums(rng)
    check_leaf_values(rng)
    check_subsample_stream()
    # streaming kernel path of leaf_index (matrix above STREAMING_BYTES)
    X, features, thr, is_cat, _ = random_case(rng, (kernels.STREAMING_BYTES // 8) // 4 + 1000, 4, 6, False, 0)
    assert X.nbytes > kernels.STREAMING_BYTES
    assert np.array_equal(kernels.leaf_index(X, features, thr, is_cat, 6),
                          kernels._walk_blocked(X, features, *kernels.node_bounds(features, thr, is_cat), 6))
    print("streaming walk agrees")
