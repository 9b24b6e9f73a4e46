"""Public random splits (paper Alg. 4 line 2, Alg. 7 lines 13–16, §4.1).

Splits are data-independent: a feature per inner node (uniform, or one
feature per tree cycling through the features — "cyclical feature
interactions", Nori et al.) and a threshold uniform over the feature's
*public* range, or uniform over ``N`` equidistant candidates inside it (or the candidates the schema
places, ``scale = "log"`` or ``cuts``: common/candidates.py);
categorical nodes pick one public level.  The randomness is public and
reproducible: tree *r* is a function of ``(seed, r)`` only, so every party can
recompute (and check) what the coordinator broadcasts.

The ``N`` candidates are float32 numbers (:func:`grid_threshold`), so the
XGBoost export compares records exactly like our trees do (docs/xgboost-export.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .candidates import log_uniform, pick, schema_candidates
from .schema import Schema


@dataclass(frozen=True)
class Splits:
    """The inner nodes of one complete tree of depth ``depth`` (heap order)."""

    features: np.ndarray  # int32, 2^d − 1
    thresholds: np.ndarray  # float64, 2^d − 1 (categorical: level index)
    default_left: np.ndarray | None = None  # bool, 2^d − 1: where a missing value goes (None: right everywhere)

    @property
    def depth(self) -> int:
        return int(np.log2(self.features.shape[0] + 1))


def random_splits(schema: Schema, depth: int, seed: int, round_id: int, cyclical: bool = False,
                  split_candidates: int = 0) -> Splits:
    """The public random tree of round ``round_id`` (0-based)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(round_id)])))
    m = schema.n_features
    n_inner = 2**depth - 1
    if cyclical:
        features = np.full(n_inner, round_id % m, dtype=np.int32)
    else:
        features = rng.integers(0, m, size=n_inner).astype(np.int32)
    u = rng.random(n_inner)
    cand = rng.integers(0, max(split_candidates, 1), size=n_inner)
    lo, hi, levels = _feature_table(schema)
    lo, hi, levels = lo[features], hi[features], levels[features]
    thresholds = np.minimum(np.floor(u * levels), levels - 1)  # categorical nodes: a public level
    num = levels == 0
    if split_candidates > 0:
        thresholds[num] = grid_thresholds(lo[num], hi[num], cand[num] + 1, split_candidates)
    else:
        thresholds[num] = (lo + (hi - lo) * u)[num]
    _placed(schema, split_candidates, features, u, thresholds)
    return Splits(features, thresholds, missing_directions(schema, seed, round_id, n_inner))


def _placed(schema: Schema, split_candidates: int, features: np.ndarray, u: np.ndarray,
            thresholds: np.ndarray) -> None:
    """Nodes on a feature whose schema places its candidates (``scale``, ``cuts``; common/candidates.py) take
    the candidate the node's uniform draw ``u`` picks, in place; other nodes keep their threshold (the same
    draws, so a schema without placements gives the same trees)."""
    placed = [j for j, f in enumerate(schema.features) if not f.is_categorical and f.declares_candidates]
    if not placed:
        return
    cands = schema_candidates(schema, split_candidates)
    for j in placed:
        at = features == j
        if not at.any():
            continue
        f = schema.features[j]
        thresholds[at] = (pick(cands[j], u[at]) if cands[j] is not None else log_uniform(f.lo, f.hi, u[at]))


def grid_threshold(lo: float, hi: float, i: int, n: int) -> float:
    """The ``i``-th (1 … n) of ``n`` equidistant candidate thresholds inside the public range ``[lo, hi]``:
    the exact point ``g = lo + (hi − lo)·i/(n + 1)``, computed in rationals from the decimals ``lo`` and
    ``hi`` print as, rounded *down* to a float32 ``t ≤ g`` (beyond the float32 range: g in float64).

    Why: grid points are "round" numbers that discrete data take (0.45 on a 0 … 1 grid of 19).  A float64
    threshold one step from the record's float64 value sends it one way here (``x < t``) and the other
    way in XGBoost, which rounds ``x`` to float32 first.  With ``t`` a float32 the export writes ``t``
    itself, and every record ``x ≥ t`` — the float32 inputs, and every float64 on or just above a grid
    point, since ``float64(g) ≥ t`` — goes right in both; only a float64 ``x`` within half a float32
    ulp *below* ``t`` can still differ (unavoidable: XGBoost rounds it up to ``t``)."""
    a, b = Fraction(repr(float(lo))), Fraction(repr(float(hi)))
    g = a + (b - a) * int(i) / (int(n) + 1)
    with np.errstate(over="ignore"):
        t = np.float32(float(g))
    if not np.isfinite(t):
        return float(g)
    if Fraction(float(t)) > g:
        t = np.nextafter(t, np.float32(-np.inf))
    return float(t)


def grid_thresholds(lo, hi, i, n: int) -> np.ndarray:
    """:func:`grid_threshold` for arrays ``lo``, ``hi``, ``i`` (same results, bit for bit), vectorised.

    The float32 nearest the float64 point ``g ≈ lo + (hi − lo)·i/(n + 1)`` is the answer or one float32 above
    it; which one only the exact point can tell when that float32 lies within the float64 error of ``g``
    (a few ulps: a grid point on a float32, such as 0.5), and there the exact :func:`grid_threshold` decides.
    """
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    i = np.asarray(i, dtype=np.int64)
    g = lo + (hi - lo) * i / (int(n) + 1)
    with np.errstate(over="ignore", invalid="ignore"):
        t = g.astype(np.float32)
        below = np.nextafter(t, np.float32(-np.inf)).astype(np.float64)
        t64 = t.astype(np.float64)
        tol = 16 * np.spacing(np.maximum(np.maximum(np.abs(lo), np.abs(hi)), np.abs(g)))
        out = np.where(t64 > g, below, t64)
        exact = ~np.isfinite(t) | (np.abs(t64 - g) <= tol)
    for k in np.flatnonzero(exact):
        out[k] = grid_threshold(float(lo.flat[k]), float(hi.flat[k]), int(i.flat[k]), n)
    return out


#: spawn key of the default-direction stream: independent of the split stream of the same ``(seed, round)``
_DIRECTION_STREAM = 1


def missing_directions(schema: Schema, seed: int, round_id: int, n_inner: int) -> np.ndarray | None:
    """Default direction of a missing value at every inner node of tree ``round_id`` (True: left), or None
    when no feature of the schema allows missing values (then NaN never occurs and trees stay as before).

    Each node flips a fair public coin drawn from its own stream of the public split seed (``SeedSequence
    ([seed, round], spawn_key=(1,))``, independent of the stream the splits come from, so trees without
    missing values are unchanged).  It is a function of public randomness only, never of a record, so
    like the splits themselves it costs no privacy (post-processing of nothing private), and every party
    of a federation recomputes it from the plan without any message (docs/missing-values.md)."""
    if not schema.allows_missing:
        return None
    ss = np.random.SeedSequence([int(seed), int(round_id)], spawn_key=(_DIRECTION_STREAM,))
    return np.random.Generator(np.random.PCG64(ss)).random(n_inner) < 0.5


def _feature_table(schema: Schema) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per feature: public range (lo, hi; 0 for categorical ones) and number of levels (0 for numeric ones)."""
    fs = schema.features
    return (np.array([0.0 if f.is_categorical else f.lo for f in fs]),
            np.array([0.0 if f.is_categorical else f.hi for f in fs]),
            np.array([float(len(f.levels)) if f.is_categorical else 0.0 for f in fs]))
