"""Federated DPBoost (docs/dpboost.md "Federation"): the greedy level rounds with DPBoost's partition, GDF and GLC.

The in-process transport (inproc.py) drives :class:`fedsbdt.server.session.Session` and :class:`fedsbdt.client.site.SiteMachine`
with real secure aggregation and real SQLite; the last test runs real gRPC processes.
"""
from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from fedsbdt.client.ledger import ledger_path
from fedsbdt.client.site import NeedCatchUp, SessionAbort
from fedsbdt.common.modes.dpboost import mechanism as dpboost
from fedsbdt.common.config import Hyperparameters, builder_defaults
from fedsbdt.common.modes.dpboost import rounds as dpboost_rounds
from fedsbdt.common.federation.plan import Plan, PlanError, SiteEntry, make_plan
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes.greedy.levels import level_sums

from .conftest import ROOT, abalone_with_ids
from .test_greedy_federation import _level_start, adult_with_ids, assert_shares_sum_to_full_noise, first_tree_released
from .test_state_machines import SITES, Fed, _counts


def dpboost_hp(**kw) -> Hyperparameters:
    base = dict(tree_builder="dpboost", trees=4, ensemble_trees=2, depth=2, seed=5, epsilon=1.0)
    base.update(kw)
    return Hyperparameters(**builder_defaults(base))


def stored_partition(f: Fed, site: str, ensemble: int) -> np.ndarray:
    """A site's partition of ``ensemble`` as its database holds it (read with plain SQL)."""
    row = f.db(site).execute("SELECT value FROM meta WHERE key = ?", (f"dpboost_partition/{ensemble}",)).fetchone()
    assert row is not None, f"{site} stored no partition for ensemble {ensemble}"
    return np.frombuffer(bytes(row[0])[32:], "<u4").astype(np.int64)


def reference(f: Fed, partitions: dict[str, dict[int, np.ndarray]] | None = None) -> list[dict]:
    """DPBoost with histogram selection, noise off, on the pooled records and the sites' own partitions —
    written here from the paper's steps: per tree the records of its part that pass GDF, level by level the
    arg max of the gain on the exact histograms, leaves ``Σg/(n+λ)`` clipped by GLC, shrinkage η."""
    plan, hp = f.plan, f.plan.hyperparameters
    grid, enc, cal = plan.greedy_grid, plan.encoding, plan.calibration()
    ms = [f.machines[s] for s in SITES]
    X = np.concatenate([m.local.X for m in ms])
    y = np.concatenate([m.local.y for m in ms])
    arrival = np.concatenate([m.local.arrival for m in ms])
    task = ms[0].local.task
    codes = grid.codes(X)
    T_e = hp.ensemble_trees or hp.trees
    pred = np.full(y.size, f.model()["init_score"])
    out = []
    for k in range(hp.trees):
        e, t = k // T_e, k % T_e + 1
        parts = np.concatenate([(partitions or {}).get(s, {}).get(e, None) if partitions else
                                stored_partition(f, s, e) for s in SITES])
        g = y - pred if task == "regression" else y - 1.0 / (1.0 + np.exp(-pred))
        use = (parts == t - 1) & (np.abs(g) <= hp.grad_clip) & (arrival <= k)
        filtered = int(((parts == t - 1) & (arrival <= k)).sum() - use.sum())  # GDF sat them out
        gq = np.clip(np.rint(g * enc.scale), -enc.grad.bound_units, enc.grad.bound_units).astype(np.int64)
        chosen = np.zeros(0, np.int64)
        feats, thr = [], []
        for level in range(hp.depth):
            node = grid.route(codes, chosen, level)
            fl, tl = grid.select(level_sums(codes, node, gq, use, grid.layout(k, level)), k, level, enc.scale, hp.l2,
                                 cal.sigma_select)
            feats += fl.tolist()
            thr += tl.tolist()
            chosen = grid.candidate_index(k, feats, thr)
        leaf = grid.route(codes, chosen, hp.depth)
        n = np.bincount(leaf[use], minlength=hp.leaves)
        G = np.bincount(leaf[use], weights=gq[use].astype(np.float64), minlength=hp.leaves) / enc.scale
        v = np.where(n > 0, G / (n + hp.l2), 0.0)
        theta = min(hp.grad_clip * (1.0 - hp.learning_rate) ** (t - 1), hp.leaf_clip)
        v = np.clip(v, -theta, theta)
        pred = pred + hp.learning_rate * v[leaf]
        out.append({"features": feats, "thresholds": thr, "leaves": v, "records": int(use.sum()), "filtered": filtered})
    return out


def assert_equals_reference(f: Fed, ref: list[dict]) -> None:
    fm = f.model()
    assert len(fm["trees"]) == len(ref)
    for k, (t, r) in enumerate(zip(fm["trees"], ref)):
        assert (t["features"], t["thresholds"]) == (r["features"], r["thresholds"]), k
        np.testing.assert_allclose(t["leaves"], r["leaves"], rtol=1e-12, atol=1e-15)
        # the sites' leaf vectors held exactly the tree's records (their private counts in the ledgers)
        active = sum(f.db(s).execute("SELECT active FROM contributions WHERE kind = 'tree' AND tree = ?",
                                     (k,)).fetchone()[0] for s in SITES)
        assert active == r["records"], k


# --------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("dataset, noise", [("abalone", "distributed"), ("abalone", "central"),
                                            ("adult", "distributed")])
def test_federated_dpboost_equals_the_reference_on_the_sites_partitions(tmp_path, dataset, noise):
    data = abalone_with_ids(240) if dataset == "abalone" else adult_with_ids(300)
    # GDF must bite: abalone g*_l = 0.4; adult (a log-loss gradient never exceeds the paper's 1) starts from the
    # noisy log prior (an initial-score round), where a positive record's |g| ≈ 0.75 > g*_l = 0.6
    hp = dpboost_hp(depth=2, grad_clip=0.4) if dataset == "abalone" else \
        dpboost_hp(depth=3, grad_clip=0.6, init_share=0.1)
    f = Fed(tmp_path, hp, data=data, noise=noise).start()
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected and not f.fed.refusals
    ref = reference(f)
    assert_equals_reference(f, ref)
    assert all(r["records"] > 0 for r in ref) and sum(r["filtered"] for r in ref) > 0
    T_e = hp.ensemble_trees
    for s in SITES:  # every ensemble drew its own partition, over every tree of the ensemble
        p0, p1 = stored_partition(f, s, 0), stored_partition(f, s, 1)
        assert p0.size == f.machines[s].local.n and set(p0.tolist()) <= set(range(T_e))
        assert not np.array_equal(p0, p1)
        kinds = f.db(s).execute("SELECT kind, tree, level FROM contributions WHERE kind != 'init' "
                                "ORDER BY round_id").fetchall()
        assert kinds == [x for k in range(hp.trees) for x in
                         [("level", k, e) for e in range(hp.depth)] + [("tree", k, None)]]
    fm = f.model()
    priv = fm["privacy"]
    assert priv["tree_builder"] == "dpboost" and priv["selection"] == "histogram"
    assert priv["dpboost"]["federated"] and priv["epsilon"] == pytest.approx(f.plan.calibration().epsilon, rel=0)
    files = {m.stage.model_path.read_bytes() for m in f.machines.values()}
    assert files == {f.session.model_json}


def test_partition_shares_and_gdf_bound_what_a_tree_sees(tmp_path):
    """The parts follow Alg. 2 line 8's shares (5σ), and a GDF-filtered record enters no vector."""
    shares = dpboost.tree_shares(5, 0.3)
    part = dpboost_rounds.SitePartition(dpboost_hp(trees=5, ensemble_trees=5, learning_rate=0.3),
                                        np.arange(40_000), lambda e: None, lambda e, b: None)
    p = part.parts(0)
    counts = np.bincount(p, minlength=5)
    n = p.size
    assert np.all(np.abs(counts - n * shares) <= 5 * np.sqrt(n * shares * (1 - shares)))
    hp = dpboost_hp()
    g = np.array([0.5, -1.0, 1.0 + 1e-12, -3.0, 0.0])
    use = dpboost_rounds.tree_records(hp, 1, g, np.zeros(5), np.ones(5, np.int64))
    assert use.tolist() == [True, True, False, False, True]
    assert not dpboost_rounds.tree_records(hp, 1, g, np.zeros(5), np.zeros(5, np.int64)).any()  # other tree
    leaf = np.array([0, 1, 1, 2, 3])
    gq = np.array([5, -7, 11, -13, 0])
    x = dpboost_rounds.leaf_sums(leaf, gq, use, 4, 3)
    assert x.tolist() == [3, 3, 0, 3, 5, -7, 0, 0]  # counts × h* units | gradient sums of the kept records


def test_the_partition_survives_a_site_restart(tmp_path):
    hp = dpboost_hp(trees=3, ensemble_trees=3, depth=2, grad_clip=0.4)
    f = Fed(tmp_path, hp).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    before = {s: f.machines[s].rounds.partition.parts(0).copy() for s in SITES}
    b = f.restart_site("hosp-b")  # a new process on the same database, mid-ensemble
    assert np.array_equal(b.rounds.partition.parts(0), before["hosp-b"])
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected
    # the model is the reference on the partition drawn *before* the restart: nothing was redrawn
    assert_equals_reference(f, reference(f, {s: {0: before[s]} for s in SITES}))
    with pytest.raises(Exception, match="never drawn twice"):
        b.ledger.set_mode_state("dpboost_partition/0", b"x" * 40)


def test_a_partition_whose_storing_was_rolled_back_is_not_used_from_memory(tmp_path):
    """A draw stored inside a transaction that rolls back is never used: the site uses only what its database
    holds (a restart would otherwise draw another partition for records a tree has already read)."""
    f = Fed(tmp_path, dpboost_hp(trees=2, ensemble_trees=2)).start()
    m = f.machines["hosp-a"]
    with pytest.raises(RuntimeError):
        with m.ledger.transaction():
            m.rounds.partition.parts(0)
            raise RuntimeError("the round failed")
    assert f.db("hosp-a").execute("SELECT 1 FROM meta WHERE key = 'dpboost_partition/0'").fetchone() is None
    p = m.rounds.partition.parts(0)
    assert np.array_equal(p, stored_partition(f, "hosp-a", 0))
    assert np.array_equal(m.rounds.partition.parts(0), p)


def test_a_stored_partition_for_other_records_ends_the_session(tmp_path):
    hp = dpboost_hp(trees=2, ensemble_trees=2)
    f = Fed(tmp_path, hp).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    db = f.db("hosp-a")
    blob = bytes(db.execute("SELECT value FROM meta WHERE key = 'dpboost_partition/0'").fetchone()[0])
    db.execute("UPDATE meta SET value = ? WHERE key = 'dpboost_partition/0'", (b"\0" * 32 + blob[32:],))
    db.commit()
    m = f.restart_site("hosp-a")
    with pytest.raises(SessionAbort, match="other records"):
        m.rounds.call(m.rounds.partition.parts, 0)


def test_site_refuses_tampered_dpboost_requests_and_charges_nothing(tmp_path, monkeypatch):
    hp = dpboost_hp(trees=4, ensemble_trees=2, depth=3)
    f = Fed(tmp_path, hp).start()
    m, feats, thr, other = first_tree_released(f)
    before = _counts(f, "hosp-a")
    parts_before = f.db("hosp-a").execute("SELECT key FROM meta WHERE key LIKE 'dpboost%'").fetchall()
    calls = []
    monkeypatch.setattr("fedsbdt.common.modes.greedy.site.level_sums", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(m.rounds.partition, "contribution", lambda *a, **k: calls.append(a))
    cases = {
        "not a tree of the plan": (4, 0, [], []),  # ensemble 2 of a plan with 2 ensembles
        "not a tree of the plan ": (-1, 0, [], []),
        "have depth 3": (1, 3, np.r_[feats, feats, feats[:1]], np.r_[thr, thr, thr[:1]]),  # level ≥ depth
        "rewrites splits": (1, 2, np.r_[feats[0], feats[1:]], np.r_[other, thr[1:]]),
        "already passed": (1, 1, feats[:1], thr[:1]),
        "not the plan's candidates": (1, 2, feats, np.r_[thr[:2], 0.123456789]),
        "already released": (0, 1, feats[:1], thr[:1]),
    }
    for why, (tree, level, fe, th) in cases.items():
        out = m.handle(_level_start(f, "hosp-a", tree, level, fe, th))
        assert len(out) == 1 and why.strip() in out[0].detail, (why, out)
    out = m.handle(_level_start(f, "hosp-a", 7, 0, np.r_[feats, feats, feats[:1]], np.r_[thr, thr, thr[:1]],
                                Purpose.TREE))
    assert "not a tree of the plan" in out[0].detail  # the leaf round of a tree beyond the plan
    with pytest.raises(NeedCatchUp):
        m.handle(_level_start(f, "hosp-a", 2, 0, [], []))
    assert not calls and _counts(f, "hosp-a") == before  # nothing computed, charged, logged or stored
    assert f.db("hosp-a").execute("SELECT key FROM meta WHERE key LIKE 'dpboost%'").fetchall() == parts_before


# --------------------------------------------------------------------------- accounting


def test_account_on_the_plan_equals_the_ledger_and_dp_accounting(tmp_path):
    from dp_accounting import GaussianDpEvent, ComposedDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    from fedsbdt.common.accountant import alpha_grid, default_alpha_max

    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]
    hp = dpboost_hp(trees=50, ensemble_trees=10, depth=4, epsilon=4.0)
    plan = make_plan(schema, hp, sites)
    plan.save(tmp_path / "plan.toml")
    cal = plan.calibration()
    assert cal.epsilon <= hp.epsilon and cal.epsilon == pytest.approx(hp.epsilon, rel=1e-5)
    assert cal.ensembles == 5 and cal.rounds == 50
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "account", "--plan", str(tmp_path / "plan.toml"),
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    acc = json.loads(p.stdout)
    assert acc["epsilon"] == cal.epsilon == plan.stated_epsilon
    assert acc["sigma"] == cal.sigma == plan.stated_sigma and acc["sigma_select"] == cal.sigma_select
    assert acc["dpboost"]["epsilon_composed"] == pytest.approx(5 * acc["dpboost"]["eps_ensemble"])
    # independent: dp-accounting's RDP accountant, one tree per ensemble (a record lies in one tree of it), N_e
    # ensembles in sequence, at our integer orders
    tree = ComposedDpEvent([GaussianDpEvent(cal.sigma_select / math.sqrt(2))] * hp.depth
                           + [GaussianDpEvent(cal.sigma / math.sqrt(2))])
    acct = rdp_lib.RdpAccountant(orders=[float(a) for a in alpha_grid(default_alpha_max(hp.epsilon, hp.delta))])
    acct.compose(SelfComposedDpEvent(tree, 5))
    assert acct.get_epsilon(hp.delta) == pytest.approx(cal.epsilon, rel=1e-9)
    # closed form of the Gaussian: ρ(α) = N_e·α·(d/σ_s² + 1/σ²)
    assert cal.rho == pytest.approx(5 * cal.alpha * (hp.depth / cal.sigma_select**2 + 1 / cal.sigma**2), rel=1e-12)
    # one ensemble = one tree, at δ/N_e
    one = rdp_lib.RdpAccountant(orders=[float(a) for a in alpha_grid(default_alpha_max(hp.epsilon, hp.delta))])
    one.compose(tree)
    assert one.get_epsilon(hp.delta / 5) == pytest.approx(cal.eps_ensemble, rel=1e-9)
    # the human output names both
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "account", "--plan", str(tmp_path / "plan.toml")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "paper-style" in p.stdout and "federated DPBoost" in p.stdout
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "account", "--plan", str(tmp_path / "plan.toml"),
                        "--trees", "3"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "drop --trees" in p.stderr and "Traceback" not in p.stderr


def test_federated_dpboost_refusals_and_plan_round_trip():
    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]
    with pytest.raises(PlanError, match="RDP ledger"):
        make_plan(schema, dpboost_hp(accountant="pld"), sites)
    plan = make_plan(schema, dpboost_hp(), sites)
    text = plan.to_toml().replace('accountant = "rdp"', 'accountant = "pld"')
    assert 'accountant = "pld"' in text
    with pytest.raises(PlanError, match="PLD"):
        Plan.from_toml(text)
    assert Plan.from_toml(plan.to_toml()).sha256 == plan.sha256
    assert plan.greedy_grid is not None and plan.calibration().sigma_select > 0


def test_summed_leaf_shares_have_the_full_leaf_noise():
    """k exact discrete-Gaussian shares (OS randomness) of the DPBoost leaf vector sum to the full noise: 5σ."""
    schema, _ = abalone_with_ids(30)
    plan = make_plan(schema, dpboost_hp(), [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)])
    k = plan.noise_divisor(3)
    from fedsbdt.common.boosting import leaf_noise_scales

    enc, cal, L = plan.encoding, plan.calibration(), plan.hyperparameters.leaves
    full, share = leaf_noise_scales(plan.hyperparameters, enc, cal.sigma), plan.leaf_share_scales(k)
    # the sensitivity of a record is h* units on its count and g* units on its gradient sum: multiplier σ/√2
    assert np.sum((np.array([enc.hess.bound_units, enc.grad.bound_units]) / full[[0, L]]) ** 2) == \
        pytest.approx(2 / cal.sigma**2, rel=1e-12)
    assert_shares_sum_to_full_noise(share, full, k, vectors=200)


# --------------------------------------------------------------------------- real processes


def test_three_site_processes_train_dpboost_export_and_account(tmp_path, ca_dir, cluster_factory):
    from fedsbdt.common.data import load
    from fedsbdt.common.federation.toml_writer import dumps

    from .conftest import SITES as PSITES, models_identical, tls_session_files

    hp = dpboost_hp(trees=4, ensemble_trees=2, depth=2, seed=21)
    schema, raw = abalone_with_ids(600)
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, PSITES)
    plan = files.plan
    c = cluster_factory(tmp_path / "plan.toml")
    c.run(files.data, timeout=300)
    model = json.loads(models_identical(tmp_path, PSITES))
    levels = [e for e in c.events if e.get("_proc") == "coordinator" and e.get("event") == "level"]
    assert sorted((e["tree"], e["tree_level"]) for e in levels) == [(k, e) for k in range(4) for e in range(2)]
    contributed = 0
    for s in PSITES:  # a site drew one partition per ensemble it took part in, in its own database (t = 2 of 3:
        db = sqlite3.connect(ledger_path(tmp_path / s, plan.sha256))  # a site that joins late may miss them all)
        keys = sorted(k for (k,) in db.execute("SELECT key FROM meta WHERE key LIKE 'dpboost_partition/%'"))
        trees = {k for (k,) in db.execute("SELECT tree FROM contributions WHERE kind != 'init'")}
        assert keys == [f"dpboost_partition/{e}" for e in sorted({k // 2 for k in trees})]
        contributed += keys == ["dpboost_partition/0", "dpboost_partition/1"]
    assert contributed >= plan.threshold
    assert model["privacy"]["dpboost"]["federated"] and model["privacy"]["noise_mode"] == "distributed"
    for k, t in enumerate(model["trees"]):
        plan.greedy_grid.candidate_index(k, t["features"], t["thresholds"])
        theta = hp.grad_clip * (1 - hp.learning_rate) ** (k % 2)
        assert np.abs(t["leaves"]).max() <= theta  # GLC
    mpath = tmp_path / "coordinator" / "model.json"
    union = tmp_path / "union.csv"
    raw.to_csv(union, index=False)

    def cli(*argv):
        p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)

    cli("export", "--model", str(mpath), "--format", "xgboost", "--out", str(tmp_path / "m.xgb.json"), "--json")
    import xgboost as xgb

    from fedsbdt.common.model import Ensemble
    (tmp_path / "schema.toml").write_text(dumps(schema.to_dict()))
    X = load(union, schema).X
    ens = Ensemble.load(mpath)
    theirs = xgb.Booster(model_file=str(tmp_path / "m.xgb.json")).predict(xgb.DMatrix(X))
    assert np.abs(theirs - ens.predict(X)).max() <= 1e-5
    acc = cli("account", "--plan", str(tmp_path / "plan.toml"), "--json")
    assert acc["epsilon"] == model["privacy"]["epsilon"] and acc["dpboost"] == model["privacy"]["dpboost"]
