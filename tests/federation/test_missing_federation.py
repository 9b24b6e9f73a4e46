"""A federation keeps records with missing values (docs/missing-values.md): three site processes and a
coordinator over mutual-TLS gRPC train on files with ``?`` and empty fields, and the released model is the
one the centralised engine trains on the union — the sites routed every missing value by the same public
default directions, recomputed from the plan's seed without any message."""
from __future__ import annotations

import json

import numpy as np

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.toml_writer import dumps
from fedsbdt.common.schema import Schema

from .conftest import (SITES, abalone_with_ids, assert_same_trees, central_training, models_identical,
                       tls_session_files)

HOLES = {"Sex": "?", "Length": "", "Shell_weight": "?"}  # column → how its missing values are written


def schema_and_rows(n_rows: int):
    schema, raw = abalone_with_ids(n_rows)
    d = schema.to_dict()
    d["format"]["missing"] = "?"
    for f in d["features"]:
        if f["name"] in HOLES:
            f["allow_missing"] = True
    rng = np.random.default_rng(11)
    raw = raw.astype({c: object for c in HOLES})
    for c, marker in HOLES.items():
        raw.loc[rng.random(len(raw)) < 0.25, c] = marker
    return Schema.from_dict(d), raw


def test_three_sites_keep_missing_values_and_equal_the_centralised_engine(tmp_path, ca_dir, cluster_factory):
    """Also the basic end-to-end session: the filter, every way a site pins its plan and schema, and each party's
    result naming the one model."""
    schema, raw = schema_and_rows(600)
    hp = Hyperparameters(trees=8, extra_trees=2, filter=True, depth=3, seed=41, epsilon=1.0)  # every feature once
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False)
    plan, data = files.plan, files.data
    schema_file = tmp_path / "schema.toml"
    schema_file.write_text(dumps(schema.to_dict()))
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    flags = {"hospital-1": ["--plan", str(tmp_path / "plan.toml")],  # out-of-band plan file
             "hospital-2": ["--plan-hash", plan.sha256, "--max-epsilon", "1.0"],
             "hospital-3": ["--schema", str(schema_file)]}  # the site's own copy of the schema
    sites = {s: c.site(s, data[s], "--allow-insecure-test-randomness", *flags[s]) for s in SITES}
    assert coord.wait() == 0, coord.errors
    for s, p in sites.items():
        assert p.wait() == 0, p.errors
        out = p.result()
        assert out["trees"] == hp.total_rounds and out["model_sha256"] == coord.result()["model_sha256"]
    model = json.loads(models_identical(tmp_path, SITES))  # every party rebuilt the same file, directions included
    assert model["privacy"]["noise_mode"] == "distributed"
    assert model["training"]["plan_sha256"] == plan.sha256
    assert [r["sites"] for r in model["training"]["rounds"]] == [SITES] * hp.total_rounds
    # the same public seed and test randomness (noise off) on the union of the data: the same model
    ds, res = central_training(tmp_path, schema, raw, hp, seed=3)
    assert ds.n == 600 and np.isnan(ds.X).sum() > 300  # no record dropped
    assert model["init_score"] == res.model.init_score
    assert_same_trees(model, res.model, default_left=True)
