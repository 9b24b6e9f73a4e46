"""A federation splits on the candidates its plan's schema places (``cuts``, ``scale = "log"``;
docs/data-sources.md#split-candidates): every site recomputes them from the plan, and the released trees are the
centralised engine's on the union of the sites' rows — through the federation state machines, without gRPC."""
from __future__ import annotations

import json

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.client.policy import SitePolicy
from fedsbdt.client.site import SiteMachine, SiteOptions
from fedsbdt.common.boosting import split_edges
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan
from fedsbdt.common.schema import Schema
from fedsbdt.server.session import Session

from .conftest import abalone_with_ids, assert_same_trees, central_training, write_splits
from .inproc import Clock, InProcess

SITES = ["hosp-a", "hosp-b", "hosp-c"]
HP = Hyperparameters(trees=12, depth=2, seed=9, epsilon=1.0, cyclical=False, split_candidates=16)
CUTS = [0.1, 0.2, 0.3, 0.45, 0.6]


def placed_schema() -> tuple[Schema, object]:
    schema, raw = abalone_with_ids(300)
    d = schema.to_dict()
    for f in d["features"]:
        if f["name"] == "Whole_weight":
            f["cuts"] = CUTS
        if f["name"] == "Shucked_weight":
            f["scale"] = "log"
    return Schema.from_dict(d), raw


def test_sites_split_on_the_plans_placed_candidates_as_the_central_engine_does(tmp_path):
    schema, raw = placed_schema()
    keys = {s: Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i, s in enumerate(SITES)}
    plan = make_plan(schema, HP, [SiteEntry(s, keys[s].public_key().public_bytes_raw()) for s in SITES],
                     randomness="insecure-test", test_seed=3, test_noise=False, max_records_per_site=10_000,
                     deadlines=Deadlines(join=30, stage=10, quorum=10_000, finish=30))
    assert "cuts" in json.loads(plan.canonical_json)["schema"]["features"][4]  # the plan carries them
    paths = write_splits(raw, SITES, tmp_path / "data")
    clock = Clock()
    machines = {}
    for s in SITES:
        m = SiteMachine(s, keys[s], paths[s], tmp_path / f"state-{s}", SiteOptions(
            expected_plan_sha256=plan.sha256, allow_insecure_test_randomness=True,
            policy=SitePolicy(allow_central_noise=True)))
        m.accept_plan(plan.canonical_json, plan.sha256)
        machines[s] = m
    fed = InProcess(Session(plan, plan.make_randomness(True), clock.now), machines, clock)
    for s in SITES:
        fed.join(s)
    fed.run()
    assert fed.session.exit_code == 0 and not fed.rejected and not fed.refusals
    model = json.loads(fed.session.model_json)
    names = schema.feature_names
    w, sh = names.index("Whole_weight"), names.index("Shucked_weight")
    edges = split_edges(schema, HP.split_candidates)
    used = {w: set(), sh: set()}
    for t in model["trees"]:
        for f, thr in zip(t["features"], t["thresholds"]):
            if f in used:
                used[f].add(thr)
    floor32 = {float(f) if float(f) <= c else float(np.nextafter(f, np.float32(0))) for c in CUTS for f in [np.float32(c)]}
    assert used[w] and used[w] <= floor32  # each cut as the largest float32 not above it
    assert used[w] <= set(edges[w].tolist()) and used[sh] and used[sh] <= set(edges[sh].tolist())
    # noise off: the same trees as the centralised engine on the union of the rows
    _, ref = central_training(tmp_path, schema, raw, HP, 3)
    assert_same_trees(model, ref.model)
