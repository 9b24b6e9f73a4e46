"""A federation keeps records with missing values (docs/missing-values.md): three site processes and a
coordinator over mutual-TLS gRPC train on files with ``?`` and empty fields, and the released model is the
one the centralised engine trains on the union — the sites routed every missing value by the same public
default directions, recomputed from the plan's seed without any message."""
from __future__ import annotations

import json

import numpy as np

from common.config import Hyperparameters
from common.data import load
from common.engine import train
from common.federation.pki import ca_server
from common.randomness import InsecureTestRandomness
from common.schema import Schema

from .conftest import abalone_with_ids, make_identities, make_test_plan, write_splits

SITES = ["hospital-1", "hospital-2", "hospital-3"]
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
    schema, raw = schema_and_rows(600)
    hp = Hyperparameters(trees=8, depth=3, seed=41, epsilon=1.0)  # cyclical: every feature once
    ids = make_identities(tmp_path, SITES, ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    data = write_splits(raw, SITES, tmp_path / "data")
    plan = make_test_plan(schema, ids, hp, randomness="insecure-test", test_seed=3, test_noise=False)
    plan.save(tmp_path / "plan.toml")
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    sites = {s: c.site(s, data[s], "--allow-insecure-test-randomness") for s in SITES}
    assert coord.wait() == 0, coord.errors
    for s, p in sites.items():
        assert p.wait() == 0, p.errors
    model = json.loads((tmp_path / "coordinator" / "model.json").read_text())
    for s in SITES:  # every party rebuilt the same file, directions included
        assert json.loads((tmp_path / s / "model.json").read_text()) == model
    assert [r["sites"] for r in model["training"]["rounds"]] == [SITES] * hp.total_rounds
    union = tmp_path / "union.csv"
    raw.to_csv(union, index=False)
    ds = load(union, schema)
    assert ds.n == 600 and np.isnan(ds.X).sum() > 300  # no record dropped
    ref = train(ds, hp, InsecureTestRandomness(seed=3, noise=False, i_understand_this_is_insecure=True)).model
    assert model["init_score"] == ref.init_score
    for t, r in zip(model["trees"], ref.trees, strict=True):
        assert t["default_left"] == r.default_left.tolist()
        assert (t["features"], t["thresholds"], t["leaves"]) == (r.features.tolist(), r.thresholds.tolist(),
                                                                 r.leaves.tolist())
