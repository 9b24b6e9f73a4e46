"""Random kernel inputs with awkward values, shared by tests/test_kernels_numpy.py and benchmarks/check_kernels.py."""
from __future__ import annotations

import numpy as np


def random_case(rng, n, m, depth, cyclical, n_cand, on_grid=0.9):
    """Records ``X`` (n × m) and a random tree of ``depth`` (``features``, ``thresholds``, ``is_cat``) with
    awkward values: NaN, ±inf and −0 in every numerical column, out-of-range and fractional levels in every
    categorical one, and (with ``n_cand`` candidates per numerical feature) mass exactly on the candidate
    thresholds.  With candidates, a numerical node's threshold is one of them with probability ``on_grid``
    (else it falls off the grid) and ``edges`` lists each feature's candidates (None for a categorical
    one); without, ``edges`` is None.  Returns ``(X, features, thresholds, is_cat, edges)``."""
    is_cat = rng.random(m) < 0.3
    levels = rng.integers(2, 12, m)
    lo = rng.uniform(-5, 0, m)
    hi = lo + rng.uniform(0.5, 10, m)
    X = np.empty((n, m))
    for f in range(m):
        if is_cat[f]:
            X[:, f] = rng.integers(0, levels[f], n)
        else:
            X[:, f] = rng.uniform(lo[f] - 1, hi[f] + 1, n)
            if n_cand:  # mass exactly on candidate thresholds
                j = rng.integers(0, n_cand, n)
                on = rng.random(n) < 0.2
                X[on, f] = (lo[f] + (hi[f] - lo[f]) * (j + 1) / (n_cand + 1))[on]
    for f in range(m):
        idx = rng.integers(0, n, 4)
        X[idx[0], f] = -0.0
        X[idx[1], f] = np.nan
        X[idx[2], f] = 300.0 if is_cat[f] else -np.inf
        X[idx[3], f] = 2.5 if is_cat[f] else np.inf
    n_inner = 2**depth - 1
    features = (np.full(n_inner, rng.integers(0, m)) if cyclical else rng.integers(0, m, n_inner)).astype(np.int32)
    thr = np.empty(n_inner)
    for k in range(n_inner):
        f = features[k]
        if is_cat[f]:
            thr[k] = rng.integers(0, levels[f])
        elif n_cand and rng.random() < on_grid:
            thr[k] = lo[f] + (hi[f] - lo[f]) * (rng.integers(0, n_cand) + 1) / (n_cand + 1)
        else:
            thr[k] = rng.uniform(lo[f], hi[f])  # off the grid: code_bounds must say so
    edges = None
    if n_cand:
        j = np.arange(n_cand)
        edges = [None if is_cat[f] else lo[f] + (hi[f] - lo[f]) * (j + 1) / (n_cand + 1) for f in range(m)]
    return X, features, thr, is_cat, edges
