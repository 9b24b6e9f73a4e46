"""Numba kernels of the S-BDT engine behind a small numpy API.

Trees are complete binary trees of depth d stored in heap order: inner node
k has children 2k+1 (left) and 2k+2 (right); leaf ℓ is node ℓ + 2^d − 1.
A record goes left at a numeric node iff ``x[f] < threshold`` and at a
categorical node iff ``x[f] == level`` (one level against the rest).

All kernels are pure: they read their inputs and return fresh arrays.
Compilation is cached on disk (``cache=True``).
"""
from __future__ import annotations

import numpy as np
from numba import njit

REGRESSION, BINARY = 0, 1


@njit(cache=True, nogil=True)
def _leaf_index(X, features, thresholds, is_cat, depth):
    n = X.shape[0]
    out = np.empty(n, dtype=np.int32)
    first_leaf = (1 << depth) - 1
    for i in range(n):
        k = 0
        for _ in range(depth):
            f = features[k]
            x = X[i, f]
            if is_cat[f]:
                right = x != thresholds[k]
            else:
                right = not (x < thresholds[k])
            k = 2 * k + 1 + (1 if right else 0)
        out[i] = k - first_leaf
    return out


def leaf_index(X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, is_cat: np.ndarray,
               depth: int) -> np.ndarray:
    """Leaf (0 … 2^d−1) of every row of ``X`` in one tree."""
    return _leaf_index(np.ascontiguousarray(X, dtype=np.float64), np.asarray(features, np.int32),
                       np.asarray(thresholds, np.float64), np.asarray(is_cat, np.bool_), int(depth))


@njit(cache=True, nogil=True)
def _grad_hess_units(pred, y, task, scale, g_units, h_units):
    n = pred.shape[0]
    gq = np.empty(n, dtype=np.int64)
    hq = np.empty(n, dtype=np.int64)
    for i in range(n):
        if task == 0:
            g = y[i] - pred[i]
            h = 1.0
        else:
            p = 1.0 / (1.0 + np.exp(-pred[i]))
            g = y[i] - p
            h = p * (1.0 - p)
        a = np.rint(g * scale)
        if a > g_units:
            a = g_units
        elif a < -g_units:
            a = -g_units
        b = np.rint(h * scale)
        if b > h_units:
            b = h_units
        elif b < 0:
            b = 0
        gq[i] = np.int64(a)
        hq[i] = np.int64(b)
    return gq, hq


def grad_hess_units(pred: np.ndarray, y: np.ndarray, task: int, scale: float, g_units: int,
                    h_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Clipped negative gradients and Hessians in fixed-point units (Alg. 5 lines 2 and 4).

    Regression (squared error, labels in [−1, 1]): g = y − ŷ, h = 1.
    Binary (logistic loss on the margin ŷ): g = y − σ(ŷ), h = σ(ŷ)(1 − σ(ŷ)).
    g is clipped to [−g*, g*] and h to [0, h*], both in integer units.
    """
    return _grad_hess_units(np.asarray(pred, np.float64), np.asarray(y, np.float64), int(task), float(scale),
                            int(g_units), int(h_units))


@njit(cache=True, nogil=True)
def _filter_step(gq, hq, g_units, h_units, grid, cost_table, spent, budget, available):
    n = gq.shape[0]
    active = np.zeros(n, dtype=np.bool_)
    new_spent = spent.copy()
    for i in range(n):
        if not available[i]:
            continue
        ag = gq[i] if gq[i] >= 0 else -gq[i]
        kg = (ag * grid + g_units - 1) // g_units
        kh = (hq[i] * grid + h_units - 1) // h_units
        c = cost_table[kh, kg]
        if spent[i] + c <= budget:
            active[i] = True
            new_spent[i] = spent[i] + c
    return active, new_spent


def filter_step(gq: np.ndarray, hq: np.ndarray, g_units: int, h_units: int, cost_table: np.ndarray,
                spent: np.ndarray, budget: int, available: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Individual Rényi filter for one round (Alg. 1 lines 3–5, Thm. 11).

    |g_i| and h_i are rounded *up* to the grid ``k/K`` of their clip bounds by
    exact integer arithmetic; ``cost_table[kh, kg]`` is the subsampled RDP of
    that grid cell in ledger units.  A record is active iff its spent budget
    plus this round's cost stays within ``budget``; only active records are
    charged.  Returns (active mask, new spent vector).
    """
    grid = cost_table.shape[0] - 1
    return _filter_step(np.asarray(gq, np.int64), np.asarray(hq, np.int64), int(g_units), int(h_units), int(grid),
                        np.ascontiguousarray(cost_table, np.int64), np.asarray(spent, np.int64), np.int64(budget),
                        np.asarray(available, np.bool_))


@njit(cache=True, nogil=True)
def _leaf_sums(leaf, gq, hq, selected, n_leaves):
    out = np.zeros(2 * n_leaves, dtype=np.int64)
    for i in range(leaf.shape[0]):
        if selected[i]:
            out[leaf[i]] += hq[i]
            out[n_leaves + leaf[i]] += gq[i]
    return out


def leaf_sums(leaf: np.ndarray, gq: np.ndarray, hq: np.ndarray, selected: np.ndarray, n_leaves: int) -> np.ndarray:
    """Per-leaf sums of clipped Hessians then gradients, ``[w_0 … w_{L−1}, u_0 … u_{L−1}]`` (int64 units)."""
    return _leaf_sums(np.asarray(leaf, np.int32), np.asarray(gq, np.int64), np.asarray(hq, np.int64),
                      np.asarray(selected, np.bool_), int(n_leaves))


@njit(cache=True, nogil=True)
def _apply_leaves(pred, leaf, values, eta):
    out = np.empty_like(pred)
    for i in range(pred.shape[0]):
        out[i] = pred[i] + eta * values[leaf[i]]
    return out


def apply_leaves(pred: np.ndarray, leaf: np.ndarray, values: np.ndarray, eta: float) -> np.ndarray:
    """``ŷ + η·v[leaf]`` for every record."""
    return _apply_leaves(np.asarray(pred, np.float64), np.asarray(leaf, np.int32), np.asarray(values, np.float64),
                         float(eta))


@njit(cache=True, nogil=True)
def _predict_margin(X, features, thresholds, leaves, is_cat, depth, eta, init):
    n = X.shape[0]
    T = features.shape[0]
    first_leaf = (1 << depth) - 1
    out = np.full(n, init)
    for i in range(n):
        acc = 0.0
        for t in range(T):
            k = 0
            for _ in range(depth):
                f = features[t, k]
                x = X[i, f]
                if is_cat[f]:
                    right = x != thresholds[t, k]
                else:
                    right = not (x < thresholds[t, k])
                k = 2 * k + 1 + (1 if right else 0)
            acc += leaves[t, k - first_leaf]
        out[i] += eta * acc
    return out


def predict_margin(X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, leaves: np.ndarray,
                   is_cat: np.ndarray, depth: int, eta: float, init: float) -> np.ndarray:
    """Ensemble margin ``init + η·Σ_t v_t(x)`` for every row (trees stacked as T × nodes arrays)."""
    if features.shape[0] == 0:
        return np.full(X.shape[0], float(init))
    return _predict_margin(np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(features, np.int32),
                           np.ascontiguousarray(thresholds, np.float64), np.ascontiguousarray(leaves, np.float64),
                           np.asarray(is_cat, np.bool_), int(depth), float(eta), float(init))
