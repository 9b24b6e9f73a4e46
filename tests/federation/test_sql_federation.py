"""Three hospitals whose records sit in their own PostgreSQL databases (docs/data-sources.md): each site
process runs its query (through its child loader) and the federation releases the very model the centralised
engine trains on the same rows read from a file (same public seed, test randomness with noise off)."""
from __future__ import annotations

import json

from fedsbdt.common.config import Hyperparameters

from postgres_server import load_frame

from .conftest import SITES, abalone_with_ids, assert_same_trees, central_training, models_identical, tls_session_files

QUERY = 'SELECT * FROM cohort ORDER BY rid'


def test_three_sites_reading_their_own_databases_equal_the_files(tmp_path, ca_dir, cluster_factory, postgres):
    schema, raw = abalone_with_ids(300)
    hp = Hyperparameters(trees=4, depth=2, seed=23, epsilon=1.0)
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False)
    urls = {}
    for k, s in enumerate(SITES):  # each hospital its own database; rows dealt as the files were
        urls[s] = postgres.create_database(f"fed_{k}")
        load_frame(urls[s], "cohort", raw.iloc[k::len(SITES)], types={"Rings": "integer", "Sex": "text"})
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    procs = {s: c.site(s, urls[s], "--query", QUERY, "--allow-insecure-test-randomness") for s in SITES}
    assert coord.wait(timeout=120) == 0, coord.errors
    for s, p in procs.items():
        assert p.wait() == 0, p.errors
    model = json.loads(models_identical(tmp_path, SITES))
    assert [r["sites"] for r in model["training"]["rounds"]] == [SITES] * hp.total_rounds
    ds, res = central_training(tmp_path, schema, raw, hp, seed=3)  # the same rows from a file
    assert ds.n == 300
    assert model["init_score"] == res.model.init_score
    assert_same_trees(model, res.model)
    assert files.plan.schema.id_column == "rid"
