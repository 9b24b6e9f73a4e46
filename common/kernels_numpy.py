"""The per-round kernels of a site in plain numpy (no numba), equal to :mod:`fedsbdt.common.kernels`.

A site daemon runs for the whole session and needs only a handful of
kernels per round: the records' one-byte codes (once), the leaf of every
record in a tree, the fused gradient / filter / subsample / leaf-sum pass and
the prediction update.  Loading numba for them costs a long-lived process
about 155 MB (LLVM, its target context, the compiled kernels); these numpy
versions cost nothing to load and a fraction of a millisecond more per round
on a site's share of a data set (``benchmarks/federation_costs.py``).

Same API and the same results as the numba kernels, bit for bit
(``tests/test_kernels_numpy.py``): the tree walks are the same comparisons
level by level, sums are exact int64 arithmetic, and the logistic gradient
uses the C library's ``exp`` (through :func:`math.exp`), as the compiled
kernels do — numpy's vectorised ``exp`` differs from it in the last bit for
about 2% of inputs, which could move a gradient by one fixed-point unit.
"""
from __future__ import annotations

import math

import numpy as np

from .kernels import BINARY, NO_LEVEL, REGRESSION, node_bounds, pack_edges

__all__ = ["REGRESSION", "BINARY", "NO_LEVEL", "pack_edges", "node_bounds", "bin_codes", "code_bounds",
           "leaf_index", "leaf_index_codes", "grad_hess_units", "round_sums", "apply_leaves"]

#: exact float64 sums of integers are guaranteed below this magnitude
_EXACT_FLOAT_SUM = 2**53


def bin_codes(X: np.ndarray, edges: list, is_cat: np.ndarray, column_major: bool = False) -> np.ndarray:
    """``(n, m)`` uint8 codes of the records (see :func:`fedsbdt.common.kernels.bin_codes`)."""
    X = np.asarray(X, dtype=np.float64)
    is_cat = np.asarray(is_cat, np.bool_)
    out = np.zeros(X.shape, dtype=np.uint8, order="F" if column_major else "C")
    for f in range(X.shape[1]):
        x = X[:, f]
        if is_cat[f]:
            ok = (x >= 0) & (x < NO_LEVEL) & (x == np.floor(x))
            out[:, f] = np.where(ok, np.where(ok, x, 0).astype(np.uint8), NO_LEVEL)
        elif edges[f] is not None and len(edges[f]) > 0:
            # code = #{j : e_j ≤ x}; NaN sorts after every edge, so it gets len(edges[f]) as in the float walk
            out[:, f] = np.searchsorted(np.asarray(edges[f], np.float64), x, side="right")
    return out


def code_bounds(features: np.ndarray, thresholds: np.ndarray, is_cat: np.ndarray,
                packed: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """Integer ``(lo, hi)`` per node for :func:`leaf_index_codes`, or None (see :func:`fedsbdt.common.kernels.code_bounds`)."""
    E, counts = packed
    features = np.asarray(features, np.int64)
    thresholds = np.asarray(thresholds, np.float64)
    is_cat = np.asarray(is_cat, np.bool_)
    lo = np.zeros(features.size, dtype=np.int64)
    hi = np.zeros(features.size, dtype=np.int64)
    for k, (f, t) in enumerate(zip(features.tolist(), thresholds.tolist())):
        if is_cat[f]:
            if not (0 <= t < NO_LEVEL and t == math.floor(t)):
                return None
            lo[k], hi[k] = int(t), int(t) + 1
        else:
            c = int(counts[f])
            if c < 0:
                return None
            a = int(np.searchsorted(E[f, :c], t, side="left"))
            if a >= c or E[f, a] != t:
                return None
            hi[k] = a + 1
    return lo, hi


def _walk(M: np.ndarray, features: np.ndarray, lo: np.ndarray, hi: np.ndarray, depth: int,
          default_left: np.ndarray | None = None) -> np.ndarray:
    """Leaf of every row of ``M``: at node k go left iff ``lo[k] ≤ M[i, features[k]] < hi[k]``, or the value
    is NaN (missing) and ``default_left[k]``."""
    n = M.shape[0]
    rows = np.arange(n)
    k = np.zeros(n, dtype=np.int64)
    for _ in range(depth):
        x = M[rows, features[k]]
        left = (x >= lo[k]) & (x < hi[k])
        if default_left is not None:
            left |= np.isnan(x) & default_left[k]
        k = 2 * k + 2 - left
    return (k - ((1 << depth) - 1)).astype(np.int32)


def leaf_index(X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, is_cat: np.ndarray,
               depth: int, default_left: np.ndarray | None = None) -> np.ndarray:
    """Leaf (0 … 2^d−1) of every row of ``X`` in one tree; NaN goes left at node k iff ``default_left[k]``
    (None: right everywhere), as :func:`fedsbdt.common.kernels.leaf_index`."""
    X = np.asarray(X, dtype=np.float64)
    lo, hi = node_bounds(features, thresholds, is_cat)
    dl = None if default_left is None else np.asarray(default_left, np.bool_)
    return _walk(X, np.asarray(features, np.int64), lo, hi, int(depth), dl)


def leaf_index_codes(codes: np.ndarray, features: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     depth: int) -> np.ndarray:
    """Leaf of every record from its :func:`bin_codes`; a tree testing one feature is a table lookup."""
    features = np.asarray(features, np.int64)
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    if features.size and (features == features[0]).all():
        table = _walk(np.arange(256, dtype=np.int64).reshape(256, 1), np.zeros_like(features), lo, hi, int(depth))
        return table[codes[:, int(features[0])]]
    return _walk(codes, features, lo, hi, int(depth))


def grad_hess_units(pred: np.ndarray, y: np.ndarray, task: int, scale: float, g_units: int,
                    h_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Clipped negative gradients and Hessians in fixed-point units (Alg. 5 lines 2 and 4).

    As :func:`fedsbdt.common.kernels.grad_hess_units`: regression g = y − ŷ, h = 1;
    binary g = y − σ(ŷ), h = σ(ŷ)(1 − σ(ŷ)) with σ(ŷ) = 1/(1 + exp(−ŷ)) and the C library's exp;
    ``g`` clipped to [−g*, g*] and ``h`` to [0, h*] in integer units.
    """
    pred = np.asarray(pred, np.float64)
    y = np.asarray(y, np.float64)
    if task == REGRESSION:
        g = y - pred
        h = np.ones_like(pred)
    elif task == BINARY:
        e = np.fromiter(map(math.exp, (-pred).tolist()), dtype=np.float64, count=pred.size)
        p = 1.0 / (1.0 + e)
        g = y - p
        h = p * (1.0 - p)
    else:
        raise ValueError(f"unknown task code {task}")
    gu, hu = float(g_units), float(h_units)
    a = np.clip(np.rint(g * scale), -gu, gu)
    b = np.clip(np.rint(h * scale), 0.0, hu)
    return a.astype(np.int64), b.astype(np.int64)


def _leaf_sums(leaf: np.ndarray, gq: np.ndarray, hq: np.ndarray, n_leaves: int, bound: int) -> np.ndarray:
    """``[Σ h per leaf, Σ g per leaf]`` as exact int64 (float bincount only where every partial sum is exact)."""
    out = np.zeros(2 * n_leaves, dtype=np.int64)
    if leaf.size * bound < _EXACT_FLOAT_SUM:
        out[:n_leaves] = np.bincount(leaf, weights=hq, minlength=n_leaves).astype(np.int64)
        out[n_leaves:] = np.bincount(leaf, weights=gq, minlength=n_leaves).astype(np.int64)
    else:  # pragma: no cover - only for scales far beyond the plan checks' defaults
        np.add.at(out, leaf, hq)
        np.add.at(out, n_leaves + leaf, gq)
    return out


def _grads_of(idx, pred, y, task, scale, g_units, h_units, grads) -> tuple[np.ndarray, np.ndarray]:
    """The records ``idx``'s clipped gradients and Hessians: from ``grads`` (every record's) where given."""
    if grads is not None:
        return np.asarray(grads[0], np.int64)[idx], np.asarray(grads[1], np.int64)[idx]
    return grad_hess_units(np.asarray(pred)[idx], np.asarray(y)[idx], task, scale, g_units, h_units)


def round_sums(leaf: np.ndarray, pred: np.ndarray, y: np.ndarray, task: int, scale: float, g_units: int,
               h_units: int, sampled: np.ndarray, available: np.ndarray | None, n_leaves: int,
               filter_args: tuple | None = None,
               grads: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray | None, int, int]:
    """One round of a site: gradients, filter, subsample and leaf sums (see :func:`fedsbdt.common.kernels.round_sums`).

    Returns ``(sums, new_spent or None, #active, #active-and-sampled)``; without the filter only the
    subsampled available records' gradients are computed.
    """
    leaf = np.asarray(leaf, np.int64)
    sampled = np.asarray(sampled, np.bool_)
    bound = max(int(g_units), int(h_units))
    if filter_args is None:
        if available is None:
            n_active, sel = leaf.size, sampled
        else:
            available = np.asarray(available, np.bool_)
            n_active, sel = int(available.sum()), sampled & available
        idx = np.flatnonzero(sel)
        gq, hq = _grads_of(idx, pred, y, task, scale, g_units, h_units, grads)
        return _leaf_sums(leaf[idx], gq, hq, n_leaves, bound), None, int(n_active), int(idx.size)
    cost_table, spent, budget = filter_args
    cost_table = np.asarray(cost_table, np.int64)
    spent = np.asarray(spent, np.int64)
    grid = cost_table.shape[0] - 1
    idx = np.arange(leaf.size) if available is None else np.flatnonzero(np.asarray(available, np.bool_))
    gq, hq = _grads_of(idx, pred, y, task, scale, g_units, h_units, grads)
    # |g|, h rounded up to the grid k/K of their clip bounds, exactly: ⌈v·K/units⌉ in integers
    cost = cost_table[-(-(hq * grid) // int(h_units)), -(-(np.abs(gq) * grid) // int(g_units))]
    ok = spent[idx] + cost <= budget
    new_spent = spent.copy()
    new_spent[idx] += np.where(ok, cost, 0)
    use = ok & sampled[idx]
    sums = _leaf_sums(leaf[idx][use], gq[use], hq[use], n_leaves, bound)
    return sums, new_spent, int(ok.sum()), int(use.sum())


def apply_leaves(pred: np.ndarray, leaf: np.ndarray, values: np.ndarray, eta: float) -> np.ndarray:
    """``ŷ + η·v[leaf]`` for every record."""
    return np.asarray(pred, np.float64) + float(eta) * np.asarray(values, np.float64)[leaf]
