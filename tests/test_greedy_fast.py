"""The fast greedy-tree path (integer level histograms with sibling subtraction, numba routing) equals the
straightforward float histograms bit for bit: same scores, same level sums, same trees (docs/greedy.md, "Speed")."""
from __future__ import annotations

import numpy as np
import pytest

from fedsbdt.common import builders, kernels
from fedsbdt.common.boosting import TASK_CODE, LocalData
from fedsbdt.common.builders import float_scores, histogram_scores, missing_sums
from fedsbdt.common.modes.greedy.builder import GreedyTrees
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.modes.greedy.levels import child_level_sums, left_counts, level_layout, level_sums, root_level_sums
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import Splits
from conftest import insecure

LEVELS = (2, 7, 60, 33)


def _data(n=1500, seed=3):
    """3 numeric + 4 categorical features (up to 60 levels), about 10% missing in each, a label from both."""
    rng = np.random.default_rng(seed)
    num = rng.normal(size=(n, 3))
    cat = np.stack([rng.integers(0, k, n) for k in LEVELS], axis=1).astype(np.float64)
    X = np.concatenate([num, cat], axis=1)
    X[rng.random(X.shape) < 0.1] = np.nan
    y = (rng.random(n) < 1 / (1 + np.exp(-(np.nan_to_num(num[:, 0]) + (cat[:, 2] % 3 == 0))))).astype(float)
    feats = [{"name": f"x{j}", "type": "numeric", "range": [-3.0, 3.0], "allow_missing": True} for j in range(3)]
    feats += [{"name": f"c{j}", "type": "categorical", "levels": [str(i) for i in range(k)], "allow_missing": True}
              for j, k in enumerate(LEVELS)]
    schema = Schema.from_dict({"name": "fast", "task": "binary", "target": "y", "features": feats})
    return schema, X, y, rng


def _local(schema, X, y, rng, hp):
    """Records with varied predictions (so gradients differ) and some not yet arrived (not present)."""
    local = LocalData(X, y, np.arange(len(y)), "binary", hp, arrival=(rng.random(len(y)) < 0.2).astype(np.int64) * 3,
                      is_categorical=np.array([f.is_categorical for f in schema.features]))
    local.pred = rng.normal(0, 0.7, len(y))
    return local


@pytest.fixture(scope="module")
def setup():
    schema, X, y, rng = _data()
    hp = Hyperparameters(tree_builder="greedy", depth=4, split_candidates=16, subsample=1.0, cyclical=False)
    return schema, hp, _local(schema, X, y, rng, hp), rng


def test_level_scores_and_sums_equal_the_float_histograms_bit_for_bit(setup):
    schema, hp, local, rng = setup
    builder = GreedyTrees(schema, hp, select=0.5)
    enc, cand = local.enc, builder.candidates
    gq, _ = kernels.grad_hess_units(local.pred, local.y, TASK_CODE["binary"], enc.scale, enc.grad.bound_units,
                                    enc.hess.bound_units)
    g, present = gq / enc.scale, builder.records(0, local).astype(np.float64)
    codes = builder._codes(local)
    miss, rows = builder._missing(local)
    features = np.arange(schema.n_features)
    fpos = cand.feature.astype(np.int64)
    node = np.zeros(local.n, np.int64)
    layout = level_layout(schema, builder.edges, 0, features)
    sums = root_level_sums(layout.bin_index(codes), gq, present > 0, layout)
    for level in range(4):
        n_nodes = 2**level
        layout = level_layout(schema, builder.edges, level, features)
        np.testing.assert_array_equal(sums.ravel(), level_sums(codes, node, gq, present > 0, layout))
        missing = missing_sums(rows, node, g * present, present, n_nodes, features)
        for m in (None, missing):
            fast = histogram_scores(sums, layout, fpos, cand.lo, cand.hi, enc.scale, hp.l2, m)
            slow = float_scores(codes, node, g, present, n_nodes, features, fpos, cand.lo, cand.hi, hp.l2, m)
            assert fast.tobytes() == slow.tobytes()  # bit for bit, signed zeros included
        # next level: random splits among the candidates, missing values sent by random directions
        chosen = rng.integers(0, cand.feature.size, 2**(level + 1) - 1)
        left = rng.random(chosen.size) < 0.5
        first = n_nodes - 1
        new = kernels.route_level(codes, node, first, cand.feature[chosen], cand.lo[chosen], cand.hi[chosen], miss,
                                  left)
        c = chosen[first + node]
        code = codes[np.arange(local.n), cand.feature[c]].astype(np.int64)
        go_left = ((cand.lo[c] <= code) & (code < cand.hi[c])) | (miss[np.arange(local.n), cand.feature[c]] &
                                                                  left[first + node])
        np.testing.assert_array_equal(new, 2 * node + ~go_left)
        # routing and the next level's sums in one pass: the same nodes and sums whichever child each parent
        # sums (the hint of left_counts, or any other)
        below = level_layout(schema, builder.edges, level + 1, features)
        split = (codes, first, cand.feature[chosen], cand.lo[chosen], cand.hi[chosen], miss, left)
        c = chosen[first:first + n_nodes]
        for hint in (rng.integers(0, 1500, n_nodes), left_counts(sums, layout, fpos[c], cand.lo[c], cand.hi[c])):
            routed, fused = child_level_sums(below.bin_index(codes), node, gq, present > 0, below, sums, split, hint)
            np.testing.assert_array_equal(routed, new)
            np.testing.assert_array_equal(fused.ravel(), level_sums(codes, new, gq, present > 0, below))
        node, sums = new, fused  # checked against level_sums again at the top of the loop


@pytest.mark.parametrize("sketch", [0.0, 5.0])
def test_greedy_trees_equal_the_float_path(setup, monkeypatch, sketch):
    """Whole trees, exponential mechanism with noise (seeded), missing values directed: the fast path and the
    float path (taken when sums could leave float64's exact range) draw the same splits and directions."""
    schema, hp, local, _ = setup
    trees = {}
    for path, limit in (("fast", builders.EXACT_FLOAT_SUM), ("float", 0)):
        monkeypatch.setattr(builders, "EXACT_FLOAT_SUM", limit)
        b = GreedyTrees(schema, hp, select=2.0, sigma_sketch=sketch)
        r = insecure(seed=11)
        trees[path] = [b.splits(t, local, r) for t in (0, 3)]
    for fast, slow in zip(trees["fast"], trees["float"]):
        np.testing.assert_array_equal(fast.features, slow.features)
        np.testing.assert_array_equal(fast.thresholds, slow.thresholds)
        np.testing.assert_array_equal(fast.default_left, slow.default_left)
    assert len({tuple(s.features) for s in trees["fast"]}) == 2  # the draws differ: the test sees noise


@pytest.mark.parametrize("selection", ["exponential", "histogram"])
@pytest.mark.parametrize("exact", [True, False])
def test_the_leaves_kept_while_routing_equal_walking_the_tree(setup, monkeypatch, selection, exact):
    """GreedyTrees routes the records into the leaves of the tree it returns and keeps them with the records
    (LocalData.keep_leaves): they equal the leaf walk of that tree (missing values by its directions), and
    only that very tree uses them."""
    schema, hp, local, _ = setup
    monkeypatch.setattr(builders, "EXACT_FLOAT_SUM", builders.EXACT_FLOAT_SUM if exact else 0)
    b = GreedyTrees(schema, hp.replace(selection=selection), select=2.0)
    r = insecure(seed=5)
    for t in (0, 3):
        splits = b.splits(t, local, r)
        kept = local.leaf_index(splits)
        assert kept is local.leaf_index(splits)
        twin = Splits(splits.features.copy(), splits.thresholds.copy(),
                      None if splits.default_left is None else splits.default_left.copy())
        walked = local.leaf_index(twin)  # another object: walked
        assert walked is not kept and walked.dtype == kept.dtype == np.int32
        np.testing.assert_array_equal(kept, walked)
        assert len(np.unique(kept)) > 4


@pytest.mark.parametrize("big", [2**20, 2**58])
def test_node_bin_sums_pack_or_split_the_two_sums(setup, big):
    """Small gradients: one packed sum per bin (g·2^b + 1); gradients too large to pack: two sums. Both equal
    level_sums, negative sums and a skipped node included."""
    schema, hp, local, rng = setup
    builder = GreedyTrees(schema, hp, select=0.5)
    codes = builder._codes(local)[:40]
    gq = rng.integers(-big, big, 40)
    gq[:20] = -big  # a negative sum in many bins
    node = rng.integers(0, 4, 40)
    present = rng.random(40) < 0.8
    layout = level_layout(schema, builder.edges, 2, np.arange(schema.n_features))
    out = kernels.node_bin_sums(layout.bin_index(codes), node, np.array([0, 1, -1, 2]), gq, present, layout.per_node)
    ref = level_sums(codes, node, gq, present, layout).reshape(2, 4, -1)
    np.testing.assert_array_equal(out, ref[:, [0, 1, 3]])


def test_several_parallel_chunks_give_the_one_chunk_sums():
    """Records enough for several parallel chunks (the kernels above saw one, and ran its serial twin): the root's
    and a routed level's sums equal level_sums, missing values and absent records included."""
    schema, X, y, rng = _data(n=70_001, seed=8)
    hp = Hyperparameters(tree_builder="greedy", depth=3, split_candidates=16, subsample=1.0, cyclical=False)
    local = _local(schema, X, y, rng, hp)
    assert kernels.parallel_chunks(local.n) > 1
    builder = GreedyTrees(schema, hp, select=0.5)
    codes, cand = builder._codes(local), builder.candidates
    miss, _ = builder._missing(local)
    gq, _ = local.grad_hess_units()
    present = builder.records(0, local)
    features = np.arange(schema.n_features)
    root, below = (level_layout(schema, builder.edges, level, features) for level in (0, 1))
    sums = root_level_sums(root.bin_index(codes), gq, present, root)
    np.testing.assert_array_equal(sums.ravel(), level_sums(codes, np.zeros(local.n, np.int64), gq, present, root))
    chosen = rng.integers(0, cand.feature.size, 1)
    split = (codes, 0, cand.feature[chosen], cand.lo[chosen], cand.hi[chosen], miss, np.array([True]))
    node, fused = child_level_sums(below.bin_index(codes), np.zeros(local.n, np.int64), gq, present, below, sums,
                                   split, rng.integers(0, local.n, 1))
    np.testing.assert_array_equal(node, kernels.route_level(codes, np.zeros(local.n, np.int64), *split[1:]))
    assert 0 < node.sum() < local.n
    np.testing.assert_array_equal(fused.ravel(), level_sums(codes, node, gq, present, below))
