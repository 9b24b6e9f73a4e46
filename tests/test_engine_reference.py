"""With noise off (test-only source) the engine equals a tiny brute-force S-BDT written here."""
import math
from fractions import Fraction

import numpy as np
import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.data import Dataset
from fedsbdt.common.engine import calibration_for, train
from fedsbdt.common.rdp_filter import filter_table
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import random_splits

from conftest import insecure

SCHEMA = {
    "name": "toy", "target": "y", "columns": ["a", "b", "c", "y"], "format": {"header": True},
    "features": [{"name": "a", "type": "numeric", "range": [0.0, 1.0]},
                 {"name": "b", "type": "categorical", "levels": ["x", "y", "z"]},
                 {"name": "c", "type": "numeric", "range": [-5.0, 5.0]}],
}


def toy(task, n=80, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.random(n), rng.integers(0, 3, n), rng.uniform(-5, 5, n)])
    if task == "regression":
        schema = Schema.from_dict({**SCHEMA, "task": "regression", "label_range": [0, 10]})
        y = np.clip(3 + 4 * X[:, 0] + (X[:, 1] == 2) * 2 + rng.normal(0, 0.5, n), 0, 10)
    else:
        schema = Schema.from_dict({**SCHEMA, "task": "binary"})
        y = (X[:, 0] + 0.3 * (X[:, 1] == 1) + rng.normal(0, 0.2, n) > 0.6).astype(float)
    return Dataset.from_arrays(X, y, schema, ids=np.arange(1000, 1000 + n))


def brute_force(ds, hp, rnd):
    """Plain-Python S-BDT (Alg. 2–5) with the fixed-point encoding of the design."""
    S = 2.0 ** hp.scale_bits
    task = ds.schema.task
    G = int(round(hp.grad_clip * S))
    H = int(round(hp.hess_clip_for(task) * S))
    lo, hi = ds.schema.label_range or (0, 1)
    ys = [2 * (v - lo) / (hi - lo) - 1 if task == "regression" else v for v in ds.y]
    # initial score from exact sums
    init = 0.0
    if hp.init_share > 0:
        lab = sum(int(np.rint(min(max(v, -hp.label_clip if task == "regression" else 0.0), hp.label_clip) * S))
                  for v in ys)
        mean = lab / S / len(ys)
        if task == "regression":
            init = min(max(mean, -1.0), 1.0)
        else:
            p = min(max(mean, 1e-3), 1 - 1e-3)
            init = math.log(p / (1 - p))
    pred = [init] * ds.n
    cal = calibration_for(hp)
    table = filter_table(cal.alpha, cal.sigma, hp.subsample, hp.r1, hp.trees) if hp.filter else None
    spent = [0] * ds.n
    trees = []
    for r in range(hp.total_rounds):
        sp = random_splits(ds.schema, hp.depth, hp.seed, r, hp.cyclical, hp.split_candidates)
        sample = rnd.subsample(hp.subsample, ds.ids, r)
        w = [0] * hp.leaves
        u = [0] * hp.leaves
        leaf_of = []
        for i in range(ds.n):
            node = 0
            for _ in range(hp.depth):
                f = int(sp.features[node])
                x = ds.X[i, f]
                go_left = (x == sp.thresholds[node]) if ds.schema.features[f].is_categorical else (x < sp.thresholds[node])
                node = 2 * node + (1 if go_left else 2)
            leaf = node - (2**hp.depth - 1)
            leaf_of.append(leaf)
            if task == "regression":
                g, h = ys[i] - pred[i], 1.0
            else:
                p = 1.0 / (1.0 + math.exp(-pred[i]))
                g, h = ys[i] - p, p * (1 - p)
            gq = int(min(max(np.rint(g * S), -G), G))
            hq = int(min(max(np.rint(h * S), 0), H))
            active = True
            if table is not None:
                kg = -(-abs(gq) * table.grid // G)
                kh = -(-hq * table.grid // H)
                cost = int(table.cost_units[kh, kg])
                active = spent[i] + cost <= table.budget_units
                if active:
                    spent[i] += cost
            if active and sample[i]:
                w[leaf] += hq
                u[leaf] += gq
        values = []
        for k in range(hp.leaves):
            wk = w[k] / S
            v = (u[k] / S) / (wk + hp.l2) if wk >= 0 and wk + hp.l2 > 0 else 0.0
            values.append(min(max(v, -hp.leaf_clip), hp.leaf_clip))
        for i in range(ds.n):
            pred[i] = pred[i] + hp.learning_rate * values[leaf_of[i]]
        trees.append(values)
    return init, trees, spent


@pytest.mark.parametrize("task", ["regression", "binary"])
@pytest.mark.parametrize("variant", [
    dict(),
    dict(cyclical=True, split_candidates=7, depth=2),
    dict(filter=True, extra_trees=15, grad_clip=0.2, subsample=0.7, epsilon=0.3),
    dict(init_share=0.0, subsample=1.0, depth=4),
])
def test_engine_matches_brute_force(task, variant):
    ds = toy(task)
    base = dict(epsilon=2.0, trees=12, depth=3, subsample=0.5, seed=7, init_share=0.2)
    hp = Hyperparameters(**{**base, **variant})
    res = train(ds, hp, randomness=insecure(seed=5, noise=False))
    init, trees, spent = brute_force(ds, hp, insecure(seed=5, noise=False))
    assert res.model.init_score == pytest.approx(init, abs=1e-12)
    assert len(res.model.trees) == len(trees)
    for t_engine, t_ref in zip(res.model.trees, trees):
        np.testing.assert_allclose(t_engine.leaves, t_ref, rtol=0, atol=1e-12)
    if hp.filter:
        np.testing.assert_array_equal(res.local.spent, spent)
        assert max(spent) > 0
    # prediction path agrees with the training-time predictions
    margin = res.model.predict_margin(ds.X)
    np.testing.assert_allclose(margin, res.local.pred, atol=1e-9)
    assert any(np.abs(t.leaves).max() > 0 for t in res.model.trees)


def test_noise_changes_the_model_and_seed_fixes_splits():
    ds = toy("regression")
    hp = Hyperparameters(epsilon=1.0, trees=5, depth=2, seed=3)
    a = train(ds, hp, randomness=insecure(seed=1)).model
    b = train(ds, hp, randomness=insecure(seed=2)).model
    assert [t.features.tolist() for t in a.trees] == [t.features.tolist() for t in b.trees]
    assert any(not np.array_equal(x.leaves, y.leaves) for x, y in zip(a.trees, b.trees))


def test_the_dataset_arrival_column_holds_late_records_back_until_their_round():
    """``train`` follows the dataset's arrival rounds (schema ``arrival_column``, paper §6.6): a record
    arriving at round r takes no part in trees 0 … r−1."""
    import dataclasses

    ds = toy("regression")
    hp = Hyperparameters(epsilon=2.0, trees=12, depth=3, subsample=1.0, seed=7, init_share=0.0)
    early = np.arange(ds.n) % 2 == 0
    arrival = np.where(early, 0, 6).astype(np.int64)
    streamed = train(dataclasses.replace(ds, arrival=arrival), hp, randomness=insecure(seed=5, noise=False)).model
    only_early = train(ds.subset(np.flatnonzero(early)), hp, randomness=insecure(seed=5, noise=False)).model
    everyone = train(ds, hp, randomness=insecure(seed=5, noise=False)).model
    for k in range(6):
        np.testing.assert_array_equal(streamed.trees[k].leaves, only_early.trees[k].leaves)
    assert not np.array_equal(streamed.trees[0].leaves, everyone.trees[0].leaves)
    assert all(not np.array_equal(streamed.trees[k].leaves, only_early.trees[k].leaves) for k in range(6, 12))


@pytest.mark.parametrize("cyclical,candidates", [(False, 0), (True, 0), (False, 7), (True, 32)])
def test_random_splits_follow_the_per_node_definition(cyclical, candidates):
    """Alg. 4 line 2 node by node (the generator's draws in the documented order) against the vectorised
    ``random_splits``: a feature per node, a threshold uniform in the public range or on N equidistant
    candidates, a categorical node picks a level.  Every party recomputes these bit for bit."""
    schema = toy("binary").schema
    for r in range(30):
        s = random_splits(schema, 4, 99, r, cyclical, candidates)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([99, r])))
        feats = [r % 3] * 15 if cyclical else list(rng.integers(0, 3, size=15))
        u, cand = rng.random(15), rng.integers(0, max(candidates, 1), size=15)
        for k in range(15):
            f = schema.features[feats[k]]
            if f.is_categorical:
                want = float(min(int(u[k] * len(f.levels)), len(f.levels) - 1))
            elif candidates:
                # the largest float32 ≤ the exact grid point of the decimal range (docs/xgboost-export.md)
                g = Fraction(repr(f.lo)) + (Fraction(repr(f.hi)) - Fraction(repr(f.lo))) * int(cand[k] + 1) \
                    / (candidates + 1)
                want = np.float32(float(g))
                while Fraction(float(want)) > g:
                    want = np.nextafter(want, np.float32(-np.inf))
                while Fraction(float(np.nextafter(want, np.float32(np.inf)))) <= g:
                    want = np.nextafter(want, np.float32(np.inf))
                want = float(want)
            else:
                want = f.lo + (f.hi - f.lo) * u[k]
            assert s.features[k] == feats[k] and s.thresholds[k] == want, (r, k)
