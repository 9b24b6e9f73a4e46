"""The sparse secure-aggregation graph as a plan option ([secure_aggregation] graph = "sparse"), end to end
through the federation state machines (Session, SiteMachine) without gRPC."""
from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.client.policy import SitePolicy
from fedsbdt.client.site import SiteMachine, SiteOptions
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import Deadlines, Plan, PlanError, SiteEntry, make_plan
from fedsbdt.server.session import Session

from .conftest import abalone_with_ids, site_model, write_splits
from .inproc import Clock, InProcess

SITES = [f"hosp-{i}" for i in range(8)]
HP = Hyperparameters(trees=4, depth=2, seed=5, epsilon=1.0)


def site_keys() -> dict[str, Ed25519PrivateKey]:
    return {s: Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i, s in enumerate(SITES)}


def sites_plan(schema, **session) -> Plan:
    """The eight sites' plan: insecure test randomness without noise (exact sums)."""
    keys = site_keys()
    return make_plan(schema, HP, [SiteEntry(s, keys[s].public_key().public_bytes_raw()) for s in SITES],
                     randomness="insecure-test", test_seed=3, test_noise=False, max_records_per_site=10_000,
                     deadlines=Deadlines(join=30, stage=10, quorum=10_000, finish=30), **session)


def federation(tmp_path, **session) -> tuple[Plan, InProcess]:
    """Eight sites on a 320-row Abalone sample, joined to a session of :func:`sites_plan`."""
    schema, raw = abalone_with_ids(320)
    paths = write_splits(raw, SITES, tmp_path / "data")
    keys = site_keys()
    plan = sites_plan(schema, **session)
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
    return plan, fed


def trees(fed: InProcess) -> list:
    return [(t["features"], t["thresholds"], t["leaves"]) for t in json.loads(fed.session.model_json)["trees"]]


def test_a_sparse_plan_trains_the_same_model_as_the_complete_graph(tmp_path):
    """Without noise every released sum is exact, so the sparse graph must give the complete graph's trees;
    each site shares its secrets only with its closed neighbourhood in the epoch's public graph."""
    plan_c, complete = federation(tmp_path / "complete")
    complete.run()
    plan_s, sparse = federation(tmp_path / "sparse", secagg_graph="sparse", secagg_neighbours=4)
    assert plan_s.secagg_config().sparse and plan_s.sha256 != plan_c.sha256
    seen_graphs = []

    def check(site, ev):  # look at the site's epoch material while the session runs
        ready = [e for e in sparse.machines[site].secagg._epochs.values() if getattr(e, "graph", None) is not None]
        for ep in ready:
            assert set(ep.held) == set(ep.graph.holders(site))
            seen_graphs.append(ep.graph)
        return True

    sparse.intercept = check
    sparse.run()
    assert complete.session.exit_code == 0 and sparse.session.exit_code == 0
    assert not sparse.rejected and not sparse.refusals
    assert trees(sparse) == trees(complete) and len(trees(sparse)) == HP.total_rounds
    assert seen_graphs and all(g.degree == 4 for g in seen_graphs)
    assert len({tuple(sorted(g.adjacency.items())) for g in seen_graphs}) >= 1
    files = {m.stage.model_path.read_bytes() for m in sparse.machines.values()}
    assert files == {sparse.session.model_json}


def test_a_fast_only_sparse_plan_trains_the_same_model(tmp_path):
    """fast_path = "always" on the sparse graph: a fast-only session (docs/secagg.md §10) — every round is one
    exchange and no site ever takes the signed path."""
    plan_c, complete = federation(tmp_path / "complete")
    complete.run()
    plan, fed = federation(tmp_path / "fast", secagg_graph="sparse", secagg_neighbours=4, secagg_fast_path="always")
    assert plan.secagg_config().fast_only and "fast-only" in plan.guarantee
    fed.run()
    assert fed.session.exit_code == 0 and trees(fed) == trees(complete)
    stages = {type(st).__name__ for m in fed.machines.values() for st in m.secagg._rounds.values()}
    assert stages == {"RoundAnsweredFast"}, stages  # no signed round anywhere


@pytest.mark.parametrize("fast_path", ["auto", "always"])
def test_a_site_that_crashes_mid_session_is_survived_on_the_sparse_graph(tmp_path, fast_path):
    _, fed = federation(tmp_path, secagg_graph="sparse", secagg_neighbours=4, secagg_fast_path=fast_path)
    fed.run(until=lambda: len(fed.session.trees) >= 1)
    fed.crash("hosp-3")
    fed.run()
    assert fed.session.exit_code == 0 and len(trees(fed)) == HP.total_rounds


def test_the_plan_option_round_trips_and_is_validated():
    schema, _ = abalone_with_ids(320)  # a plan only: no site joins (the tests above run the sessions)
    plan = sites_plan(schema, secagg_graph="sparse", secagg_neighbours=4)
    again = Plan.from_toml(plan.to_toml())
    assert again.sha256 == plan.sha256 and again.secagg_neighbours == 4
    assert plan.to_dict()["secure_aggregation"] == {"graph": "sparse", "neighbours": 4}
    complete = sites_plan(schema)
    assert "secure_aggregation" not in complete.to_dict()  # complete-graph plans (and their hashes) are unchanged
    d = plan.to_dict()
    for bad, match in (({"graph": "sparse", "neighbours": 3}, "even"),
                       ({"graph": "sparse", "neighbours": 2}, "too small"),
                       ({"graph": "sparse", "neighbours": 8}, "complete"),
                       ({"graph": "ring"}, "complete"),
                       ({"graph": "complete", "neighbours": 4}, "only with graph"),
                       ({"graph": "sparse", "k": 4}, "unknown key")):
        with pytest.raises(PlanError, match=match):
            Plan.from_dict(d | {"secure_aggregation": bad})


def test_fedsbdt_plan_writes_the_sparse_graph_option(tmp_path, capsys):
    from fedsbdt.cli import main

    from .conftest import EXAMPLES

    def base(n):
        keys = [bytes([i + 1]) * 32 for i in range(n)]
        return ["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), "--settings", "paper",
                "--trees", "5", "--seed", "1",
                "--json", *[a for i, k in enumerate(keys) for a in ("--site", f"s{i}={k.hex()}")]]

    assert main([*base(8), "--out", str(tmp_path / "p.toml"), "--secagg-graph", "sparse", "--neighbours", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["secagg_graph"] == "sparse" and out["neighbours"] == 4
    assert "sparse graph (k = 4 neighbours, local threshold t_k = 4" in out["guarantee"]
    assert "follows the protocol" in out["guarantee"]
    plan = Plan.load(tmp_path / "p.toml")
    assert plan.secagg_graph == "sparse" and plan.secagg_config().local_threshold.threshold == 4
    assert main([*base(8), "--out", str(tmp_path / "q.toml"), "--secagg-graph", "sparse", "--neighbours", "5"]) == 2
    assert "even" in capsys.readouterr().err and not (tmp_path / "q.toml").exists()
    assert main([*base(3), "--out", str(tmp_path / "r.toml"), "--secagg-graph", "sparse"]) == 2  # k ≥ n − 1
    assert "complete" in capsys.readouterr().err
    assert main([*base(3), "--out", str(tmp_path / "s.toml"), "--neighbours", "4"]) == 2
    assert "--secagg-graph sparse" in capsys.readouterr().err


def test_six_site_processes_train_on_the_sparse_graph_over_mutual_tls(tmp_path, ca_dir, cluster_factory):
    """Real processes (``fedsbdt coordinator`` + six ``fedsbdt client``), gRPC with mutual TLS, a sparse plan
    (k = 4 of 5 possible neighbours, t_k = 4): every party ends with the model the engine trains centrally."""
    from fedsbdt.common.data import load
    from fedsbdt.common.engine import train
    from fedsbdt.common.randomness import InsecureTestRandomness
    from fedsbdt.common.federation.pki import ca_server

    from .conftest import make_identities, make_test_plan

    sites = [f"hospital-{i}" for i in range(6)]
    hp = Hyperparameters(trees=3, depth=2, seed=13, epsilon=1.0)
    schema, raw = abalone_with_ids(360)
    ids = make_identities(tmp_path, sites, ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    data = write_splits(raw, sites, tmp_path / "data")
    plan = make_test_plan(schema, ids, hp, randomness="insecure-test", test_seed=2, test_noise=False,
                          secagg_graph="sparse", secagg_neighbours=4)
    plan.save(tmp_path / "plan.toml")
    assert plan.secagg_config().local_threshold.threshold == 4
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    procs = {s: c.site(s, data[s], "--allow-insecure-test-randomness") for s in sites}
    assert coord.wait() == 0, coord.errors
    for s, p in procs.items():
        assert p.wait() == 0, p.errors
    released = (tmp_path / "coordinator" / "model.json").read_bytes()
    model = json.loads(released)
    for s in sites:
        assert site_model(tmp_path, s, released).read_bytes() == released
    union = tmp_path / "union.csv"
    raw.to_csv(union, index=False)
    ref = train(load(union, schema), hp, InsecureTestRandomness(seed=2, noise=False,
                                                               i_understand_this_is_insecure=True)).model
    assert model["init_score"] == ref.init_score
    for t, r in zip(model["trees"], ref.trees, strict=True):
        assert (t["features"], t["thresholds"], t["leaves"]) == (r.features.tolist(), r.thresholds.tolist(),
                                                                 r.leaves.tolist())
