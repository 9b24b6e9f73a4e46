"""Where a numeric feature's split candidates lie (docs/data-sources.md#split-candidates).

Random trees (paper §4.1) split a numeric feature at one of ``N`` public candidate thresholds.  By default they
are equidistant on the feature's public range (:func:`fedsbdt.common.splits.grid_thresholds`).  A schema may
place them itself, at no privacy cost (public knowledge, like the range):

* ``scale = "log"`` — equidistant in ``log(x − lo + 1)``:
  ``t_i = lo − 1 + (hi − lo + 1)^{i/(N+1)}``, ``i = 1 … N`` (Eq. C1), dense near ``lo`` where skewed values
  (lab values, durations, counts) lie; with ``N = 0`` a threshold is ``lo − 1 + (hi − lo + 1)^u``, ``u``
  uniform (log-uniform, the continuous analogue).  The ``+ 1`` keeps the log finite at ``lo`` and makes the
  scale the feature's own unit: on a range narrower than about one unit it is close to equidistant.
* ``cuts = [...]`` — the candidates themselves.

Or a central run may spend a declared share of ε on **DP quantile candidates** (:func:`dp_quantile_cuts`): a
noisy histogram of every numeric feature over ``B`` equal bins of its public range, released with discrete
Laplace noise of scale ``m/ε_c`` per bin (``m`` numeric features: one record changes one count in each
histogram, L1 sensitivity ``m``, so the release is ε_c-DP, Eq. C2), and the candidates at the noisy CDF's
``i/(N+1)`` quantiles (post-processing, Eq. C3) of the noisy histogram plus a public pseudo-count per bin equal
to the noise's standard deviation (:func:`pseudo_count`), which falls back to the equidistant grid where the noise
swamps the counts.  The accountant composes ε_c with the trees
(:func:`fedsbdt.common.accountant.calibrate`'s ``eps_extra``).

Every candidate is rounded *down* to a float32 (:func:`float32_floor`), as the equidistant ones are, so the
XGBoost export compares records as our trees do (docs/xgboost-export.md).  A node of a tree that splits a
feature with placed candidates picks one of them uniformly by the node's public uniform draw ``u``
(:func:`pick`): the draws of the random splits are unchanged, so a schema without placements gives the
same trees, bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import numpy as np

from .schema import Feature, Schema

#: bins of the DP quantile histogram over each public range (a public constant; docs/data-sources.md)
QUANTILE_BINS = 64


def float32_floor(x) -> np.ndarray:
    """The largest float32 ``≤ x`` for each (finite) ``x``, as float64 (beyond the float32 range: ``x``)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        t = x.astype(np.float32)
    t = np.where(t.astype(np.float64) > x, np.nextafter(t, np.float32(-np.inf)), t).astype(np.float64)
    return np.where(np.isfinite(t), t, x)


def log_grid(lo: float, hi: float, n: int) -> np.ndarray:
    """Eq. C1: ``n`` candidates equidistant in ``log(x − lo + 1)`` on ``[lo, hi]``, float32-floored, sorted."""
    i = np.arange(1, int(n) + 1, dtype=np.float64)
    t = lo - 1.0 + np.exp(np.log1p(hi - lo) * i / (int(n) + 1))
    return float32_floor(np.clip(t, lo, hi))


def log_uniform(lo: float, hi: float, u: np.ndarray) -> np.ndarray:
    """``N = 0`` with ``scale = "log"``: ``lo − 1 + (hi − lo + 1)^u`` for uniform draws ``u`` in [0, 1)."""
    return np.clip(lo - 1.0 + np.exp(np.log1p(hi - lo) * np.asarray(u, dtype=np.float64)), lo, hi)


def feature_candidates(f: Feature, n: int) -> np.ndarray | None:
    """The placed candidates of numeric feature ``f`` for ``n`` candidates per feature (sorted float64), or
    None where the schema places none (categorical, or equidistant: :func:`~fedsbdt.common.splits.grid_thresholds`
    as before).  ``cuts`` are the candidates whatever ``n``; ``scale = "log"`` gives Eq. C1 (None for
    ``n = 0``: thresholds are then log-uniform, :func:`log_uniform`)."""
    if f.is_categorical or not f.declares_candidates:
        return None
    if f.cuts:
        return float32_floor(np.asarray(f.cuts, dtype=np.float64))
    return log_grid(f.lo, f.hi, n) if n > 0 else None


@lru_cache(maxsize=64)
def schema_candidates(schema: Schema, n: int) -> tuple[np.ndarray | None, ...]:
    """:func:`feature_candidates` of every feature (cached: the schema is frozen and public)."""
    out = tuple(feature_candidates(f, n) for f in schema.features)
    for c in out:
        if c is not None:
            c.setflags(write=False)
    return out


def pick(candidates: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Candidate ``⌊u·K⌋`` of the ``K`` ``candidates`` for each uniform draw ``u`` in [0, 1) (uniform over
    them)."""
    k = len(candidates)
    return candidates[np.minimum(np.floor(np.asarray(u) * k).astype(np.int64), k - 1)]


# --------------------------------------------------------------------------- DP quantile candidates


def histogram_codes(x: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """The bin ``min(⌊(x − lo)/(hi − lo)·B⌋, B − 1)`` (clipped to ``0 … B−1``) of each non-missing
    ``x``."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    k = np.floor((x - lo) / (hi - lo) * bins)
    return np.clip(k, 0, bins - 1).astype(np.int64)


def exact_histograms(X: np.ndarray, schema: Schema, bins: int = QUANTILE_BINS) -> np.ndarray:
    """Counts (int64, ``m × B``) of the records of ``X`` in ``B`` equal bins of each numeric feature's public range,
    one row per numeric feature in schema order.  A record adds at most one count to each row (a missing value
    none): the L1 sensitivity of the whole matrix under add/remove is ``m``, the number of numeric features."""
    num = [j for j, f in enumerate(schema.features) if not f.is_categorical]
    out = np.zeros((len(num), bins), dtype=np.int64)
    for r, j in enumerate(num):
        f = schema.features[j]
        out[r] = np.bincount(histogram_codes(X[:, j], f.lo, f.hi, bins), minlength=bins)
    return out


def laplace_scale(n_numeric: int, eps: float) -> float:
    """Eq. C2: discrete Laplace scale ``m/ε_c`` per bin makes the ``m`` histograms ε_c-DP (L1 sensitivity m;
    the discrete Laplace with scale b is (Δ/b)-DP for integer queries of L1 sensitivity Δ, Canonne et al. 2020)."""
    return float(n_numeric) / float(eps)


def quantile_cuts(counts: np.ndarray, lo: float, hi: float, n: int, prior: float = 0.5) -> np.ndarray:
    """Eq. C3 (post-processing of one noisy histogram): the ``i/(n+1)`` quantiles, ``i = 1 … n``, of the
    distribution with bin weights ``max(c_k, 0) + prior`` (noise clipped at zero; the public pseudo-count
    ``prior > 0`` per bin keeps the CDF strictly increasing and pulls the candidates towards the equidistant grid
    where the noise dominates the counts: an all-zero histogram gives the equidistant grid), uniform inside each
    bin; float32-floored, sorted (equal values may repeat: that threshold is then drawn more often)."""
    if not prior > 0:
        raise ValueError(f"the pseudo-count per bin must be > 0, got {prior}")
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0) + float(prior)
    bins = c.size
    cdf = np.concatenate([[0.0], np.cumsum(c)])
    q = np.arange(1, int(n) + 1, dtype=np.float64) / (int(n) + 1) * cdf[-1]
    k = np.clip(np.searchsorted(cdf, q, side="right") - 1, 0, bins - 1)  # bin holding quantile q
    frac = (q - cdf[k]) / c[k]
    t = lo + (hi - lo) * (k + frac) / bins
    return float32_floor(np.clip(t, lo, hi))


def noisy_histograms(X: np.ndarray, schema: Schema, eps: float, randomness,
                     bins: int = QUANTILE_BINS) -> tuple[np.ndarray, float]:
    """Eq. C2: the ε-DP release — :func:`exact_histograms` plus one discrete Laplace of scale
    :func:`laplace_scale` per bin (the run's exact sampler) — and that scale."""
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"ε of the quantile histograms must be a positive number, got {eps}")
    exact = exact_histograms(X, schema, bins)
    b = laplace_scale(exact.shape[0], eps)
    return exact + np.asarray(randomness.discrete_laplace(np.full(exact.shape, b)), dtype=np.int64), b


def pseudo_count(scale: float) -> float:
    """The public pseudo-count per bin of Eq. C3: the standard deviation ``√2·b`` of the Laplace noise of scale
    ``b`` (the discrete one's is slightly less), so that bins whose counts the noise would swamp weigh like the
    noise (many features or few records: close to equidistant; many records: the data's quantiles)."""
    return math.sqrt(2.0) * float(scale)


def dp_quantile_cuts(X: np.ndarray, schema: Schema, n: int, eps: float, randomness,
                     bins: int = QUANTILE_BINS) -> tuple[Schema, dict]:
    """Spend ``eps`` on the noisy histograms (Eq. C2) and return the schema with every numeric feature's
    ``cuts`` at its noisy quantiles (Eq. C3), plus what was released (public: the noisy counts' quantiles,
    the scale, the bins).  Categorical features are unchanged; so is a schema without numeric features."""
    num = [j for j, f in enumerate(schema.features) if not f.is_categorical]
    if not num:
        return schema, {"eps": 0.0, "bins": bins, "scale": 0.0, "features": {}}
    noisy, b = noisy_histograms(X, schema, eps, randomness, bins)
    feats = list(schema.features)
    cuts = {}
    for r, j in enumerate(num):
        f = feats[j]
        c = quantile_cuts(noisy[r], f.lo, f.hi, n, prior=pseudo_count(b))
        feats[j] = replace(f, scale="linear", cuts=tuple(float(v) for v in c))
        cuts[f.name] = [float(v) for v in c]
    return replace(schema, features=tuple(feats)), {"eps": float(eps), "bins": int(bins), "scale": b,
                                                    "features": cuts}
