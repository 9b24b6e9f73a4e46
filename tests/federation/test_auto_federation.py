"""Federated = central with ``auto`` settings (docs/auto.md): the rule applied to the same public inputs (schema,
ε, the declared row count) gives the plan the same hyperparameters as ``fedsbdt train --rows N``, and three site
processes then release the centralised engine's model."""
from __future__ import annotations

import json

from .conftest import SITES, abalone_with_ids, assert_same_trees, central_training, models_identical, \
    tls_session_files


def test_three_site_processes_with_auto_settings_train_the_central_model(tmp_path, ca_dir, cluster_factory):
    from fedsbdt.common.auto import resolve
    from fedsbdt.common.config import Hyperparameters

    schema, raw = abalone_with_ids(300)
    # what `fedsbdt auto --rows 300` gives a plan and `fedsbdt train --rows 300` uses (5 trees keep it short)
    keys, choice = resolve({"epsilon": 1.0, "trees": 5, "seed": 13}, schema, len(raw))
    hp = Hyperparameters.from_dict(keys)
    assert choice is not None and hp.l2 > 1.0 and hp.l2 == choice.settings["l2"]  # auto chose beyond the flags
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False)
    cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness")
    model = json.loads(models_identical(tmp_path, SITES))
    assert model["hyperparameters"] == hp.to_dict()
    _, res = central_training(tmp_path, schema, raw, hp, seed=3)
    assert model["init_score"] == res.model.init_score
    assert_same_trees(model, res.model)
