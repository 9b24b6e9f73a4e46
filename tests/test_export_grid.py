"""Public grid thresholds vs the XGBoost export on the float64 data users have (docs/xgboost-export.md).

Grid points are round numbers that discrete features take (Abalone Diameter 0.45 on a 0 … 1 grid of 19
candidates); a threshold one float64 step from such a value used to send the record one way here and the
other way in XGBoost, which rounds inputs to float32 (a greedy federation test flaked on it)."""
from decimal import Decimal

import numpy as np
import pytest
import xgboost as xgb

from fedsbdt.common.boosting import split_edges
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.engine import train
from fedsbdt.common.export_xgboost import export_xgboost
from fedsbdt.common.model import Ensemble, Tree
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import grid_threshold, random_splits

RANGES = [(0, 1, 19), (0, 1, 9), (-1, 1, 39), (0.1, 0.9, 15), (0, 1000, 99), (2.5, 7.5, 9), (-3.3, 0, 32)]


def schema_for(lo, hi):
    return Schema.from_dict({"task": "regression", "target": "y", "label_range": [-1, 1],
                             "features": [{"name": "x", "type": "numeric", "range": [lo, hi]}]})


def decimal_grid(lo, hi, n):
    """The grid points as the decimals a data file holds, parsed to float64 like a CSV reader does."""
    a, b = Decimal(repr(float(lo))), Decimal(repr(float(hi)))
    return [float(a + (b - a) * i / (n + 1)) for i in range(1, n + 1)]


@pytest.mark.parametrize("lo, hi, n", RANGES)
def test_records_on_grid_points_take_our_side_in_xgboost(lo, hi, n, tmp_path):
    """Every threshold of the grid, and every record on, one float64 step above, or 1e-6 of the range
    around every grid point.  (Only a float64 within half a float32 ulp *below* a threshold may differ.)"""
    schema = schema_for(lo, hi)
    edges = split_edges(schema, n)[0]
    points = np.array(decimal_grid(lo, hi, n))
    d = 1e-6 * (hi - lo)
    xs = np.concatenate([points, np.nextafter(points, np.inf), points - d, points + d])
    for t in edges:
        assert t == np.float32(t), "a grid threshold is a float32"
        tree = Tree(np.array([0], np.int32), np.array([t]), np.array([-1.0, 1.0]))
        model = Ensemble(schema, Hyperparameters(depth=1, learning_rate=1.0), 0.0, [tree])
        export_xgboost(model, tmp_path / "m.json")
        theirs = xgb.Booster(model_file=str(tmp_path / "m.json")).predict(xgb.DMatrix(xs[:, None]))
        np.testing.assert_array_equal(np.sign(theirs), np.sign(model.predict(xs[:, None])), err_msg=f"t={t!r}")


@pytest.mark.parametrize("lo, hi, n", RANGES)
def test_grid_is_the_float32_floor_of_the_exact_points(lo, hi, n):
    from fractions import Fraction
    edges = split_edges(schema_for(lo, hi), n)[0]
    assert np.all(np.diff(edges) > 0)
    for i, t in enumerate(edges, 1):
        g = Fraction(repr(float(lo))) + (Fraction(repr(float(hi))) - Fraction(repr(float(lo)))) * i / (n + 1)
        up = float(np.nextafter(np.float32(t), np.float32(np.inf)))
        assert Fraction(t) <= g < Fraction(up)
    # the random builder draws from the same grid (records are then coded on these edges)
    sp = random_splits(schema_for(lo, hi), 6, 7, 0, split_candidates=n)
    assert set(sp.thresholds.tolist()) <= set(edges.tolist())


def test_grid_threshold_beyond_float32_range_stays_float64():
    assert grid_threshold(0, 1e300, 1, 1) == 5e299


@pytest.mark.parametrize("builder", [dict(tree_builder="greedy", selection="histogram", subsample=1.0,
                                          cyclical=False), dict()])
def test_abalone_float64_rows_predict_alike(abalone, builder, tmp_path):
    """The bundled Abalone rows as float64 (Diameter 0.45 sits on the default grid): XGBoost's prediction
    of the export equals ours up to float32 rounding of the leaves."""
    model = train(abalone, Hyperparameters(epsilon=1.0, trees=40, depth=4, **builder)).model
    export_xgboost(model, tmp_path / "m.json")
    theirs = xgb.Booster(model_file=str(tmp_path / "m.json")).predict(xgb.DMatrix(abalone.X))
    lo, hi = model.schema.label_range
    assert np.abs(theirs - model.predict(abalone.X)).max() <= 1e-6 * (hi - lo)


def test_vectorised_grid_thresholds_equal_the_exact_ones():
    """grid_thresholds (float64 with an exact fallback) equals grid_threshold (exact fractions) everywhere:
    random ranges, decimal ranges whose grid points fall on float32 numbers (0.5, 0.25, …), huge ranges."""
    from fedsbdt.common.splits import grid_thresholds
    rng = np.random.default_rng(7)
    cases = [(0.0, 1.0, n) for n in (1, 3, 7, 9, 15, 19, 31, 32, 63, 255)]
    cases += [(-4.0, 4.0, 15), (0.0, 1000.0, 99), (-3.3, 0.0, 32), (2.5, 7.5, 9), (0.0, 1e300, 3), (-1e39, 1e39, 5)]
    cases += [(float(a), float(a + w), int(n)) for a, w, n in
              zip(rng.normal(0, 50, 300), rng.exponential(20, 300), rng.integers(1, 256, 300))]
    cases += [(round(float(a), 2), round(float(a), 2) + round(float(w), 1) + 0.1, int(n)) for a, w, n in
              zip(rng.uniform(-10, 10, 200), rng.uniform(0, 20, 200), rng.integers(1, 64, 200))]
    for lo, hi, n in cases:
        i = np.arange(1, n + 1)
        fast = grid_thresholds(np.full(n, lo), np.full(n, hi), i, n)
        exact = np.array([grid_threshold(lo, hi, int(k), n) for k in i])
        assert np.array_equal(fast, exact), (lo, hi, n, np.flatnonzero(fast != exact))
