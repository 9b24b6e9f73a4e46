"""Explaining a released model: per-prediction feature contributions and feature importance (``fedsbdt explain``).

Everything here is post-processing of the released model (and, for contributions, of records the caller
already holds): it costs no privacy.

**Contributions** are exact SHAP values (Lundberg, Erion & Lee, "Consistent individualized feature attribution
for tree ensembles", 2018, Algorithm 2, "path-dependent" TreeSHAP) of the model's output in its own units —
the label (regression), the log-odds (binary), each class's margin (multi-class) — with **every leaf weighted
equally**: the training set's covers (how many records reached each node) are private statistics and are
never released, so a node with a feature outside the coalition S sends half of the weight to each child.
Those are the covers the XGBoost export writes (``sum_hessian`` = leaves below a node, export_xgboost.py),
so :func:`contributions` equals ``xgboost.Booster.predict(DMatrix(X), pred_contribs=True)`` of the exported
model, up to XGBoost's float32 arithmetic (tests/test_explain.py).  As every SHAP value, they add up:
``bias + Σ_f φ_f(x)`` is the model's output at ``x``.

The game of one leaf ℓ with value v is a product over the distinct features F_ℓ on its path,
``v·Π_{f∈F_ℓ} (p_f if f ∈ S else q_f)``, where ``p_f ∈ {0, 1}`` says whether x takes the path at every node
splitting on f and ``q_f = 2^(−k_f)`` (k_f: the path's nodes on f).  Its Shapley value for i ∈ F_ℓ is
``v·(p_i − q_i)·Σ_k k!(m−k−1)!/m! · e_k``, m = |F_ℓ|, e_k the coefficient of z^k in
``Π_{f∈F_ℓ∖{i}} (q_f + p_f·z)``; a tree's value is the sum over its leaves (SHAP values are linear in the game).

**Importance** of a feature is the mean absolute contribution over a set of points: the caller's records
(``fedsbdt explain --data``), or without data a sample of the schema's public feature box — then it
describes the model over the box, not over any population.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Ensemble, unscale_labels
from .numba_lazy import njit

BOX_POINTS = 2000  # the public-box sample of the importance when no records are given


@njit(cache=True, nogil=True)
def _leaf_shap(X, features, thresholds, leaves, is_cat, default_left, has_default, depth, weights, out):
    """Add every tree's SHAP values (every leaf weighted equally) of every row of X to ``out`` (n × F)."""
    n = X.shape[0]
    T = features.shape[0]
    L = 1 << depth
    uniq = np.empty(depth, np.int64)
    p = np.empty(depth)
    cnt = np.empty(depth, np.int64)
    coef = np.empty(depth + 1)
    for i in range(n):
        for t in range(T):
            for leaf in range(L):
                v = leaves[t, leaf]
                if v == 0.0:
                    continue
                m = 0
                node = 0
                for lev in range(depth):
                    right = (leaf >> (depth - 1 - lev)) & 1
                    f = features[t, node]
                    x = X[i, f]
                    if np.isnan(x):
                        left = has_default and default_left[t, node]
                    elif is_cat[f]:
                        left = x == thresholds[t, node]
                    else:
                        left = x < thresholds[t, node]
                    on_path = 1.0 if left == (right == 0) else 0.0
                    j = 0
                    while j < m and uniq[j] != f:
                        j += 1
                    if j == m:
                        uniq[m] = f
                        p[m] = on_path
                        cnt[m] = 1
                        m += 1
                    else:
                        p[j] *= on_path
                        cnt[j] += 1
                    node = 2 * node + 1 + right
                for j in range(m):
                    q_j = 0.5 ** cnt[j]
                    if p[j] == q_j:
                        continue
                    coef[0] = 1.0
                    deg = 0
                    for o in range(m):
                        if o == j:
                            continue
                        q_o = 0.5 ** cnt[o]
                        coef[deg + 1] = 0.0
                        for k in range(deg + 1, 0, -1):
                            coef[k] = coef[k] * q_o + coef[k - 1] * p[o]
                        coef[0] *= q_o
                        deg += 1
                    s = 0.0
                    for k in range(m):
                        s += weights[m, k] * coef[k]
                    out[i, uniq[j]] += v * (p[j] - q_j) * s


def _shapley_weights(depth: int) -> np.ndarray:
    """``w[m, k] = k!(m−k−1)!/m!``: the Shapley weight of a coalition of k among m players (m ≤ depth)."""
    from math import factorial

    w = np.zeros((depth + 1, depth + 1))
    for m in range(1, depth + 1):
        for k in range(m):
            w[m, k] = factorial(k) * factorial(m - k - 1) / factorial(m)
    return w


def tree_shap(X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, leaves: np.ndarray,
              is_cat: np.ndarray, depth: int, default_left: np.ndarray | None = None) -> np.ndarray:
    """SHAP values (n × F) of ``Σ_t v_t(x)`` for trees stacked as T × nodes arrays, every leaf weighted equally
    (module docstring); the bias is ``Σ_t mean(v_t)``."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    out = np.zeros(X.shape)
    if features.shape[0] == 0:
        return out
    dl = np.zeros(features.shape, np.bool_) if default_left is None else np.asarray(default_left, np.bool_)
    _leaf_shap(X, np.ascontiguousarray(features, np.int64), np.ascontiguousarray(thresholds, np.float64),
               np.ascontiguousarray(leaves, np.float64), np.asarray(is_cat, np.bool_), dl, default_left is not None,
               int(depth), _shapley_weights(int(depth)), out)
    return out


@dataclass(frozen=True)
class Contributions:
    """Per-row contributions in the model's output units: ``bias + values.sum(axis=-1)`` is the output.

    Regression: the label (original units); binary: the log-odds of the positive class; multi-class:
    ``values`` is n × K × F and ``bias`` has K entries, one per class margin."""

    values: np.ndarray
    bias: np.ndarray
    units: str


def contributions(model: Ensemble, X: np.ndarray) -> Contributions:
    """SHAP contributions of every feature to the model's output at every row of ``X`` (schema order,
    categorical columns as level codes, as :func:`fedsbdt.common.data.load` gives them)."""
    f, th, lv = model.stacked()
    eta, dl, is_cat = model.hyperparameters.learning_rate, model.stacked_default_left(), model.is_categorical()
    X = np.asarray(X, np.float64)
    if model.task == "multiclass":
        K = model.schema.n_classes
        init = np.broadcast_to(np.asarray(model.init_score, np.float64), (K,))
        vals = np.stack([eta * tree_shap(X, f[k::K], th[k::K], lv[k::K], is_cat, model.depth,
                                         None if dl is None else dl[k::K]) for k in range(K)], axis=1)
        bias = np.array([init[k] + eta * lv[k::K].mean(axis=1).sum() for k in range(K)])
        return Contributions(vals, bias, "class margin")
    vals = eta * tree_shap(X, f, th, lv, is_cat, model.depth, dl)
    bias = float(model.init_score) + eta * float(lv.mean(axis=1).sum())
    if model.task == "regression":
        lo, hi = model.schema.label_range
        return Contributions(vals * (hi - lo) / 2.0, np.array([unscale_labels(bias, (lo, hi))]), "label")
    return Contributions(vals, np.array([bias]), "log-odds")


def public_box_sample(model: Ensemble, n: int, seed: int = 0) -> np.ndarray:
    """``n`` points drawn uniformly from the schema's public box (numeric ranges, categorical levels): a
    reference set that depends on no record.  Not privacy-relevant randomness (post-processing), so seeded."""
    rng = np.random.default_rng(seed)
    cols = []
    for feat in model.schema.features:
        if feat.is_categorical:
            cols.append(rng.integers(0, len(feat.levels), n).astype(np.float64))
        else:
            cols.append(rng.uniform(feat.lo, feat.hi, n))
    return np.column_stack(cols) if cols else np.zeros((n, 0))


@dataclass(frozen=True)
class Importance:
    """Mean absolute contribution of each feature (summed over classes for multi-class), largest first."""

    features: tuple[str, ...]
    mean_abs: tuple[float, ...]
    share: tuple[float, ...]  # of the total
    units: str
    points: int
    over: str  # "data" or "public box"


def importance(model: Ensemble, X: np.ndarray, over: str) -> Importance:
    """Feature importance of ``model`` over the rows of ``X`` (:class:`Importance`)."""
    c = contributions(model, X)
    a = np.abs(c.values)
    per = a.sum(axis=1).mean(axis=0) if a.ndim == 3 else a.mean(axis=0)
    total = float(per.sum())
    order = np.argsort(-per, kind="stable")
    names = [feat.name for feat in model.schema.features]
    return Importance(tuple(names[j] for j in order), tuple(float(per[j]) for j in order),
                      tuple(float(per[j]) / total if total > 0 else 0.0 for j in order), c.units, int(X.shape[0]),
                      over)
