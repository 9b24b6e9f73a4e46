"""A 3-class federation of three sites as separate processes (real gRPC, mutual TLS): K class trees per round,
a round vector K times longer, and the same model as the centralised engine on the union of the data."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from common.config import Hyperparameters
from common.schema import Schema

from .conftest import (EXAMPLES, SITES, assert_same_trees, central_training, make_identities, make_test_plan,
                       models_identical, tls_session_files)


def wine_with_ids():
    base = Schema.load(EXAMPLES / "wine" / "schema.toml").to_dict()
    raw = pd.concat([pd.read_csv(EXAMPLES / "wine" / "wine_train.csv"),
                     pd.read_csv(EXAMPLES / "wine" / "wine_test.csv")], ignore_index=True)
    raw.insert(0, "rid", np.arange(len(raw)) * 3 + 5)
    d = dict(base, columns=list(raw.columns), id_column="rid")
    return Schema.from_dict(d), raw


def test_three_sites_train_a_multiclass_model_equal_to_the_centralised_engine(tmp_path, ca_dir, cluster_factory):
    hp = Hyperparameters(trees=6, depth=2, seed=21, epsilon=2.0, subsample=0.5, learning_rate=0.3)
    schema, raw = wine_with_ids()
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False)
    assert files.plan.secagg_config().max_vector_len == 2 * 3 * hp.leaves  # the leaf vector is K = 3 times longer
    cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness")
    model = json.loads(models_identical(tmp_path, SITES))
    assert len(model["trees"]) == 3 * hp.trees and len(model["init_score"]) == 3
    assert model["privacy"]["classes"] == 3 and model["privacy"]["noise_mode"] == "distributed"
    ref = central_training(tmp_path, schema, raw, hp, seed=3)[1].model
    assert model["init_score"] == [float(x) for x in ref.init_score]
    assert_same_trees(model, ref)


def test_a_multiclass_plan_refuses_the_filter(tmp_path):
    import pytest

    from common.federation.plan import PlanError

    schema, _ = wine_with_ids()
    ids = make_identities(tmp_path, SITES)
    with pytest.raises(PlanError, match="Rényi filter does not support task = 'multiclass'"):
        make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=1, filter=True))
    plan = make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=1))
    leaf, init = plan.noise_scales()
    assert leaf.size == 2 * 3 * 4 and init.size == 4  # K·2L leaf coordinates; [N, n_0, n_1, n_2]


def test_class_margins_and_k_leaf_vectors_survive_the_wire_and_the_checkpoint(tmp_path):
    import pytest

    from common.federation.wire import (InitScoreMsg, TreeMsg, WireError, init_from_proto, init_to_proto,
                                        tree_from_proto, tree_to_proto)
    from server.checkpoint import CoordinatorStore

    init = InitScoreMsg(0.0, 4, ("hospital-1", "hospital-2"), (0.25, -0.5, 0.25))
    assert init_from_proto(init_to_proto(init)) == init and init.value == (0.25, -0.5, 0.25)
    tree = TreeMsg(0, 5, ("hospital-1",), np.zeros(3, np.int32), np.ones(3), np.arange(12, dtype=float))
    assert tree_from_proto(tree_to_proto(tree)) == tree  # K = 3 classes × 4 leaves
    bad = tree_to_proto(TreeMsg(0, 5, ("hospital-1",), np.zeros(3, np.int32), np.ones(3), np.arange(10.0)))
    with pytest.raises(WireError, match="complete tree"):
        tree_from_proto(bad)
    store = CoordinatorStore(tmp_path / "c", "cd" * 32)
    store.load()
    store.append_init(init)
    store.close()
    assert CoordinatorStore(tmp_path / "c", "cd" * 32).load().init == init
