"""A 3-class federation of three sites as separate processes (real gRPC, mutual TLS): K class trees per round,
a round vector K times longer, the same model as the centralised engine on the union of the data, and its
federated evaluation in the same session."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.model import Ensemble
from fedsbdt.common.schema import Schema

from .conftest import (EXAMPLES, SITES, assert_same_trees, central_training, make_identities, make_test_plan,
                       models_identical, tls_session_files)
from .test_fed_eval_processes import pooled


def wine_with_ids():
    base = Schema.load(EXAMPLES / "wine" / "schema.toml").to_dict()
    raw = pd.concat([pd.read_csv(EXAMPLES / "wine" / "wine_train.csv"),
                     pd.read_csv(EXAMPLES / "wine" / "wine_test.csv")], ignore_index=True)
    raw.insert(0, "rid", np.arange(len(raw)) * 3 + 5)
    d = dict(base, columns=list(raw.columns), id_column="rid")
    return Schema.from_dict(d), raw


def test_three_sites_train_a_multiclass_model_equal_to_the_centralised_engine_then_evaluate_it(tmp_path, ca_dir,
                                                                                                cluster_factory):
    """One session: multi-class training on 120 wine records, equal to the centralised engine's model, then
    federated evaluation of the 58 held-out records (noise off): the released accuracy is the pooled one,
    macro-AUC within bin resolution, log-loss within rounding."""
    hp = Hyperparameters(trees=6, depth=2, seed=21, epsilon=2.0, subsample=0.5, learning_rate=0.3)
    schema, raw = wine_with_ids()
    files = tls_session_files(tmp_path, ca_dir, schema, raw.iloc[:120], hp, held_out=raw.iloc[120:],
                              randomness="insecure-test", test_seed=3, test_noise=False, eval_epsilon=0.2,
                              eval_bins=10)
    plan, held = files.plan, files.held
    # the leaf vector is K = 3 times longer (the training plan alone; the evaluation vector is longer still)
    assert make_test_plan(schema, files.ids, hp).secagg_config().max_vector_len == 2 * 3 * hp.leaves
    assert plan.eval_spec.task == "multiclass" and plan.eval_spec.classes == schema.classes
    coord = cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness",
                                                        "--max-eval-epsilon", "0.2", held=held)
    model = json.loads(models_identical(tmp_path, SITES))
    assert len(model["trees"]) == 3 * hp.trees and len(model["init_score"]) == 3
    assert model["privacy"]["classes"] == 3 and model["privacy"]["noise_mode"] == "distributed"
    ref = central_training(tmp_path, schema, raw.iloc[:120], hp, seed=3)[1].model
    assert model["init_score"] == [float(x) for x in ref.init_score]
    assert_same_trees(model, ref)
    # the federated evaluation of the released model
    ev = coord.result()["evaluation"]
    released = Ensemble.load(tmp_path / "coordinator" / "model.json")
    pooled_metrics = pooled(plan, released, held)
    m = ev["metrics"]
    assert m["n"] == pooled_metrics["n"] == len(raw) - 120 and m["classes"] == list(schema.classes)
    assert m["accuracy"] == pooled_metrics["accuracy"]
    ds = [load(p, schema) for p in held.values()]
    total = sum(plan.eval_spec.histogram(d.y, released.predict(d.X)) for d in ds)
    res = plan.eval_spec.resolution(total)
    assert abs(m["macro_auc"] - pooled_metrics["macro_auc"]) <= res["macro_auc"] + 1e-12
    assert abs(m["logloss"] - pooled_metrics["logloss"]) <= res["logloss"]


def test_a_multiclass_plan_refuses_the_filter(tmp_path):
    import pytest

    from fedsbdt.common.federation.plan import PlanError

    schema, _ = wine_with_ids()
    ids = make_identities(tmp_path, SITES)
    with pytest.raises(PlanError, match="Rényi filter does not support task = 'multiclass'"):
        make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=1, filter=True))
    plan = make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=1))
    leaf, init = plan.noise_scales()
    assert leaf.size == 2 * 3 * 4 and init.size == 4  # K·2L leaf coordinates; [N, n_0, n_1, n_2]


def test_class_margins_and_k_leaf_vectors_survive_the_wire_and_the_checkpoint(tmp_path):
    import pytest

    from fedsbdt.common.federation.wire import (InitScoreMsg, TreeMsg, WireError, init_from_proto, init_to_proto,
                                        tree_from_proto, tree_to_proto)
    from fedsbdt.server.checkpoint import CoordinatorStore

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
