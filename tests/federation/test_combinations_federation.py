"""Features that meet in a federation: missing values with federated greedy trees, with multiclass and with
federated evaluation; greedy trees and federated evaluation in one session; multiclass with federated greedy
trees refused by the plan (before any site joins).  Multiclass training then federated evaluation:
test_multiclass_federation.py; random trees and federated evaluation on files with missing values:
test_fed_eval_processes.py; greedy sites' in-process secure noise for training and evaluation:
test_greedy_federation.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.federation.plan import PlanError
from fedsbdt.common.model import Ensemble
from fedsbdt.common.schema import Schema

from .conftest import (SITES, assert_same_trees, central_training, make_identities, make_test_plan, models_identical,
                       tls_session_files)
from .test_fed_eval_processes import pooled
from .test_greedy_federation import assert_equals_central, central_model, greedy_hp
from .test_missing_federation import schema_and_rows
from .test_multiclass_federation import wine_with_ids
from .test_state_machines import Fed


def test_federated_greedy_on_missing_values_equals_the_central_histogram_rule(tmp_path):
    """Histogram selection sends missing values right (docs/greedy.md): the sites' level histograms and
    leaf sums route every NaN as the central engine does, so the models are equal."""
    schema, raw = schema_and_rows(240)
    f = Fed(tmp_path, greedy_hp(depth=3, trees=2), data=(schema, raw)).start()
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected and not f.fed.refusals
    assert_equals_central(f)
    ref = central_model(f)
    assert all(t.default_left is not None and not t.default_left.any() for t in ref.trees)
    assert [t["default_left"] for t in f.model()["trees"]] == [t.default_left.tolist() for t in ref.trees]


def wine_with_holes():
    schema, raw = wine_with_ids()
    d = schema.to_dict()
    holes = [f["name"] for f in d["features"][:3]]
    for f in d["features"]:
        if f["name"] in holes:
            f["allow_missing"] = True
    rng = np.random.default_rng(5)
    raw = raw.astype({c: object for c in holes})
    for c in holes:
        raw.loc[rng.random(len(raw)) < 0.3, c] = ""
    return Schema.from_dict(d), raw


def test_three_sites_train_multiclass_on_missing_values_equal_to_the_centralised_engine(tmp_path, ca_dir,
                                                                                         cluster_factory):
    """The sites' numpy kernels, K class trees per round and the default directions of missing values."""
    hp = Hyperparameters(trees=4, depth=3, seed=21, epsilon=2.0, subsample=0.5, learning_rate=0.3)
    schema, raw = wine_with_holes()
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False)
    cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness")
    model = json.loads(models_identical(tmp_path, SITES))
    ds, res = central_training(tmp_path, schema, raw, hp, seed=3)
    assert np.isnan(ds.X).sum() > 100
    assert model["init_score"] == [float(x) for x in res.model.init_score]
    assert len(model["trees"]) == len(res.model.trees) == 3 * hp.trees
    assert_same_trees(model, res.model, default_left=True)
    # the released model predicts what the sites' training applied (NaN by each class tree's directions)
    np.testing.assert_allclose(Ensemble.load(tmp_path / "coordinator" / "model.json").predict_margin(ds.X),
                               res.local.pred, rtol=0, atol=1e-12)


def test_a_multiclass_plan_refuses_federated_greedy_trees(tmp_path, ca_dir):
    schema, _ = wine_with_ids()
    ids = make_identities(tmp_path, SITES, ca_dir)
    with pytest.raises((PlanError, ConfigError), match="tree_builder = 'greedy' does not support task = 'multiclass'"):
        make_test_plan(schema, ids, greedy_hp(depth=2, trees=2))


def test_greedy_training_then_evaluation_of_held_out_files_with_missing_values(tmp_path, ca_dir,
                                                                               cluster_factory):
    """One session: greedy training on files with missing values, then federated evaluation of held-out files
    with missing values; the released metrics are the pooled ones (noise off).  (Random trees on the same files:
    test_fed_eval_processes.py.)"""
    schema, raw = schema_and_rows(900)
    hp = greedy_hp(depth=2, trees=2)
    files = tls_session_files(tmp_path, ca_dir, schema, raw.iloc[:600], hp, held_out=raw.iloc[600:],
                              randomness="insecure-test", test_seed=2, test_noise=False, eval_epsilon=0.2,
                              eval_bins=10)
    plan, held = files.plan, files.held
    coord = cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness",
                                                        "--max-eval-epsilon", "0.2", held=held)
    ev = coord.result()["evaluation"]
    model = Ensemble.load(tmp_path / "coordinator" / "model.json")
    assert sum(np.isnan(load(p, schema).X).sum() for p in held.values()) > 100
    ref = pooled(plan, model, held)
    res = plan.eval_spec.resolution(np.zeros(plan.eval_spec.length))
    assert ev["metrics"]["n"] == ref["n"] == 300
    assert abs(ev["metrics"]["mae"] - ref["mae"]) <= res["mae"]
    assert abs(ev["metrics"]["rmse"] ** 2 - ref["rmse"] ** 2) <= res["mse"]
