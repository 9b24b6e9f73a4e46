"""The site's numpy kernels (common/kernels_numpy.py) give exactly the numba kernels' results.

Random trees and records with awkward values (NaN, ±inf, −0, off-grid and
on-grid thresholds, unknown categorical levels), both tasks, with and without
the filter and arrival, and whole training runs of LocalData with either
backend: every output is compared for exact equality.
"""
from __future__ import annotations

import numpy as np
import pytest

from fedsbdt.common import kernels, kernels_numpy
from fedsbdt.common.accountant import calibrate
from fedsbdt.common.boosting import LocalData
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.randomness import InsecureTestRandomness
from fedsbdt.common.rdp_filter import filter_table
from fedsbdt.common.splits import Splits
from kernel_cases import random_case


@pytest.mark.parametrize("seed", range(6))
def test_tree_walks_and_codes_equal_the_numba_kernels(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n, m, depth = int(rng.integers(1, 400)), int(rng.integers(1, 8)), int(rng.integers(1, 7))
        cyc = bool(rng.random() < 0.5)
        X, features, thr, is_cat, edges = random_case(rng, n, m, depth, cyc, int(rng.choice([0, 1, 7, 32, 255])))
        want = kernels.leaf_index(X, features, thr, is_cat, depth)
        got = kernels_numpy.leaf_index(X, features, thr, is_cat, depth)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        if edges is None:
            continue
        packed = kernels.pack_edges(edges)
        for column_major in (False, True):
            codes = kernels.bin_codes(X, edges, is_cat, column_major)
            ncodes = kernels_numpy.bin_codes(X, edges, is_cat, column_major)
            assert np.array_equal(ncodes, codes) and ncodes.flags.f_contiguous == codes.flags.f_contiguous
        b = kernels.code_bounds(features, thr, is_cat, packed)
        nb = kernels_numpy.code_bounds(features, thr, is_cat, packed)
        assert (b is None) == (nb is None)
        if b is not None:
            assert np.array_equal(nb[0], b[0]) and np.array_equal(nb[1], b[1])
            got = kernels_numpy.leaf_index_codes(codes, features, nb[0], nb[1], depth)
            assert np.array_equal(got, kernels.leaf_index_codes(codes, features, b[0], b[1], depth))
            assert np.array_equal(got, want)  # the code walk is the float walk


@pytest.mark.parametrize("seed", range(3))
def test_missing_values_take_the_default_directions_as_in_the_numba_kernels(seed):
    """Missing values (docs/missing-values.md): NaN goes left at node k iff default_left[k], in both backends
    and through LocalData (which walks the floats, not the codes, when the tree has directions)."""
    rng = np.random.default_rng(100 + seed)
    differs = 0
    for _ in range(20):
        n, m, depth = int(rng.integers(1, 300)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
        X, features, thr, is_cat, edges = random_case(rng, n, m, depth, bool(rng.random() < 0.5), 32)
        X[rng.random(X.shape) < 0.2] = np.nan
        dl = rng.random(features.size) < 0.5
        want = kernels.leaf_index(X, features, thr, is_cat, depth, default_left=dl)
        assert np.array_equal(kernels_numpy.leaf_index(X, features, thr, is_cat, depth, default_left=dl), want)
        hp = Hyperparameters(epsilon=1.0, trees=1, depth=depth)
        for backend in (None, kernels_numpy):
            local = LocalData(X, np.zeros(n), np.arange(n), "binary", hp, None, None, is_cat, edges=edges,
                              backend=backend)
            assert np.array_equal(local.leaf_index(Splits(features, thr, dl)), want)
            nan_right = kernels.leaf_index(X, features, thr, is_cat, depth)  # no directions: NaN goes right
            assert np.array_equal(local.leaf_index(Splits(features, thr)), nan_right)
        differs += not np.array_equal(want, nan_right)
    assert differs >= 5  # the directions were exercised


@pytest.mark.parametrize("task", [kernels.REGRESSION, kernels.BINARY])
@pytest.mark.parametrize("use_filter", [False, True])
@pytest.mark.parametrize("arrival", [False, True])
def test_round_sums_and_apply_equal_the_numba_kernels(task, use_filter, arrival):
    rng = np.random.default_rng(7 + 2 * task + use_filter)
    cal = calibrate(0.5, 5e-8, 0.1, 20)
    table = filter_table(cal.alpha, cal.sigma, 0.1, 0.2, 20)
    for _ in range(25):
        n, L = int(rng.integers(1, 3000)), 2 ** int(rng.integers(1, 7))
        leaf = rng.integers(0, L, n).astype(np.int32)
        pred = rng.normal(0, 4, n) * (rng.random() < 0.9)
        y = (rng.random(n) < 0.5).astype(float) if task == kernels.BINARY else rng.uniform(-1, 1, n)
        scale = float(2 ** int(rng.integers(8, 30)))
        g_units, h_units = int(scale * rng.choice([0.3, 1.0])), int(scale * rng.choice([0.1, 0.25]))
        sampled = rng.random(n) < rng.uniform(0, 1)
        avail = (rng.random(n) < 0.7) if arrival else None
        fa = None
        if use_filter:
            budget = table.budget_units
            spent = rng.integers(0, budget + 1, n).astype(np.int64)
            edge = rng.random(n) < 0.3  # records whose budget this round's cost exactly uses up, or just not
            cells = table.cost_units.ravel()[rng.integers(0, table.cost_units.size, n)]
            spent[edge] = np.maximum(budget - cells[edge] + rng.integers(-1, 2, n)[edge], 0)
            fa = (table.cost_units, spent, budget)
        want = kernels.round_sums(leaf, pred, y, task, scale, g_units, h_units, sampled, avail, L, fa)
        got = kernels_numpy.round_sums(leaf, pred, y, task, scale, g_units, h_units, sampled, avail, L, fa)
        assert np.array_equal(got[0], want[0]) and got[0].dtype == np.int64
        assert (got[1] is None) == (want[1] is None)
        if want[1] is not None:
            assert np.array_equal(got[1], want[1])
        assert got[2:] == want[2:]
        gq, hq = kernels.grad_hess_units(pred, y, task, scale, g_units, h_units)
        ngq, nhq = kernels_numpy.grad_hess_units(pred, y, task, scale, g_units, h_units)
        assert np.array_equal(ngq, gq) and np.array_equal(nhq, hq)
        values = rng.normal(0, 1, L)
        assert np.array_equal(kernels_numpy.apply_leaves(pred, leaf, values, 0.3),
                              kernels.apply_leaves(pred, leaf, values, 0.3))


@pytest.mark.parametrize("task", [kernels.REGRESSION, kernels.BINARY])
def test_parallel_chunks_and_given_gradients_change_no_result(task):
    """Records enough for several parallel chunks (and a tail past the walks' blocks): the numba walks and round
    sums equal the numpy backend's, and ``round_sums`` with the records' gradients given equals computing them."""
    rng = np.random.default_rng(11 + task)
    n, m, depth, L = 70_001, 6, 5, 32
    assert kernels.parallel_chunks(n) > 1
    X, features, thr, is_cat, edges = random_case(rng, n, m, depth, False, 32, on_grid=1.0)
    assert np.array_equal(kernels.leaf_index(X, features, thr, is_cat, depth),
                          kernels_numpy.leaf_index(X, features, thr, is_cat, depth))
    codes = kernels.bin_codes(X, edges, is_cat)
    lo, hi = kernels.code_bounds(features, thr, is_cat, kernels.pack_edges(edges))
    leaf = kernels.leaf_index_codes(codes, features, lo, hi, depth)
    assert np.array_equal(leaf, kernels_numpy.leaf_index_codes(codes, features, lo, hi, depth))
    pred = rng.normal(0, 2, n)
    y = (rng.random(n) < 0.5).astype(float) if task == kernels.BINARY else rng.uniform(-1, 1, n)
    args = (leaf, pred, y, task, 2.0**20, 2**19, 2**18)
    grads = kernels.grad_hess_units(*args[1:])
    assert all(np.array_equal(a, b) for a, b in zip(grads, kernels_numpy.grad_hess_units(*args[1:])))
    for sampled, avail in ((np.ones(n, bool), None), (rng.random(n) < 0.3, rng.random(n) < 0.8)):
        want = kernels_numpy.round_sums(*args, sampled, avail, L)
        assert int(want[0][L:].sum()) != 0
        for got in (kernels.round_sums(*args, sampled, avail, L), kernels.round_sums(*args, sampled, avail, L, None, grads),
                    kernels_numpy.round_sums(*args, sampled, avail, L, None, grads)):
            assert np.array_equal(got[0], want[0]) and got[1] is None and got[2:] == want[2:]


@pytest.mark.parametrize("backend", [None, kernels_numpy])
def test_a_contribution_from_the_kept_gradients_equals_computing_them(backend):
    rng = np.random.default_rng(5)
    n, m, depth = 3000, 5, 4
    X, features, thr, is_cat, edges = random_case(rng, n, m, depth, False, 32)
    hp = Hyperparameters(epsilon=1.0, trees=2, depth=depth, subsample=0.5)
    local = LocalData(X, (rng.random(n) < 0.4).astype(float), np.arange(n), "binary", hp, None,
                      rng.integers(0, 2, n), is_cat, edges=edges, backend=backend)
    local.set_init_score(0.3)
    splits, r = Splits(features, thr), InsecureTestRandomness(seed=4, i_understand_this_is_insecure=True)
    for round_id in (0, 1):
        fresh = local.contribution(splits, round_id, r, None)  # gradients computed in the pass
        kept = local.grad_hess_units()
        assert local.grad_hess_units() is kept  # kept while the predictions stay
        again = local.contribution(splits, round_id, r, None)  # from the kept gradients
        assert np.array_equal(again.sums, fresh.sums) and (again.active, again.sampled) == (fresh.active, fresh.sampled)
        local.apply(fresh.leaf, rng.normal(0, 1, hp.leaves))
        assert local.grad_hess_units() is not kept  # new predictions, new gradients


def test_a_training_run_is_identical_with_either_backend():
    rng = np.random.default_rng(3)
    n, m = 2000, 6
    X, _, _, is_cat, edges = random_case(rng, n, m, 4, False, 32)
    y = (X[:, 0] + rng.normal(0, 1, n) > 0).astype(float)
    hp = Hyperparameters(epsilon=1.0, trees=30, depth=4, filter=True)
    cal = calibrate(0.5, 5e-8, 0.1, 20)
    table = filter_table(cal.alpha, cal.sigma, hp.subsample, 0.2, 20)
    ids = np.arange(n)
    arrival = rng.integers(0, 10, n)
    runs = []
    for backend in (None, kernels_numpy):
        local = LocalData(X, y, ids, "binary", hp, None, arrival, is_cat, edges=edges, backend=backend)
        local.set_init_score(0.1)
        rnd = InsecureTestRandomness(seed=5, i_understand_this_is_insecure=True)
        out = []
        for k in range(hp.trees):
            feats = rng.integers(0, m, 2**hp.depth - 1) if backend is None else runs[0][k][3]
            thr = np.where(is_cat[feats], 1.0, np.array([e[rng.integers(0, 32)] if e is not None else 0.0
                                                         for e in edges])[feats]) if backend is None \
                else runs[0][k][4]
            c = local.contribution(Splits(feats.astype(np.int32), thr), k, rnd, table)
            local.commit(c)
            local.apply(c.leaf, np.tanh(c.sums[hp.leaves:] / (1.0 + np.abs(c.sums[:hp.leaves]))) * 0.5)
            out.append((c.sums.copy(), c.leaf.copy(), local.pred.copy(), feats, thr))
        runs.append(out)
    for a, b in zip(*runs):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
