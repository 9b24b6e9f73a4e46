"""Federated greedy trees (docs/greedy.md "Federated greedy"): level rounds through the real state machines.

The in-process transport (inproc.py) drives :class:`fedsbdt.server.session.Session`
and :class:`fedsbdt.client.site.SiteMachine` with real secure aggregation and real
SQLite; the last test runs real gRPC processes.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fedsbdt.client.site import NeedCatchUp, SessionAbort
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.engine import calibration_for, train
from fedsbdt.common.federation.plan import PlanError, SiteEntry, make_plan
from fedsbdt.common.federation.wire import (Purpose, RoundStartMsg, TreeMsg, WireError, event_from_proto,
                                    event_to_proto)
from fedsbdt.common.randomness import InsecureTestRandomness, SecureRandomness
from fedsbdt.common.schema import Schema
from fedsbdt.common.secagg import RoundStart

from .conftest import EXAMPLES, ROOT, abalone_with_ids
from .test_state_machines import SEED, SITES, Fed, _counts, fail_rounds_after_inputs


def adult_with_ids(n: int):
    """The first ``n`` complete Adult rows with a record-id column (categorical features with many levels)."""
    base = Schema.load(EXAMPLES / "adult" / "schema.toml").to_dict()
    d = dict(base)
    d["columns"] = ["rid"] + list(base["columns"])
    d["id_column"] = "rid"
    d["format"] = {"header": True, "separator": ",", "out_of_range": "clip"}
    raw = pd.read_csv(EXAMPLES / "adult" / "adult.data", header=None, names=base["columns"], sep=", ",
                      engine="python", nrows=2 * n)
    raw = raw[~(raw == "?").any(axis=1)].iloc[:n].reset_index(drop=True)
    raw.insert(0, "rid", np.arange(len(raw)) * 5 + 3)
    return Schema.from_dict(d), raw


def assert_shares_sum_to_full_noise(share, full, k: int, vectors: int) -> None:
    """k exact discrete-Gaussian share vectors (OS randomness) sum to the full noise: 5σ bounds on the mean and
    the variance of ``vectors`` sums, scaled by ``full`` (k shares of the undivided scale would give variance k)."""
    rnd = SecureRandomness()
    z = np.concatenate([sum(rnd.discrete_gaussian(share) for _ in range(k)) / full for _ in range(vectors)])
    n = z.size
    assert abs(z.mean()) <= 5 / math.sqrt(n)
    assert abs(z.var() - 1.0) <= 5 * math.sqrt(2.0 / n)


def first_tree_released(f: Fed):
    """Run until hosp-a holds tree 1's three level-1 splits; (hosp-a's machine, features, thresholds, another
    grid threshold of the first split's feature)."""
    m = f.machines["hosp-a"]
    f.fed.run(until=lambda: len(f.session.trees) == 1 and m.ledger.released_splits(1)[0].size == 3)
    feats, thr = m.ledger.released_splits(1)
    grid = f.plan.greedy_grid
    other = [t for t in grid.candidates.threshold[grid.candidates.feature == feats[0]] if t != thr[0]][0]
    return m, feats, thr, other


def greedy_hp(**kw) -> Hyperparameters:
    base = dict(tree_builder="greedy", selection="histogram", subsample=1.0, cyclical=False, trees=3, depth=2,
                seed=5, epsilon=1.0)
    base.update(kw)
    return Hyperparameters(**base)


def central_model(f: Fed):
    """The centralised engine (histogram selection, noise off) on the union of the sites' files."""
    union = f.tmp / "union.csv"
    pd.concat([pd.read_csv(p) for p in f.paths.values()]).to_csv(union, index=False)
    rnd = InsecureTestRandomness(seed=SEED, noise=False, i_understand_this_is_insecure=True)
    return train(load(union, f.schema), f.plan.hyperparameters, rnd).model


def assert_equals_central(f: Fed) -> None:
    ref, fm = central_model(f), f.model()
    assert fm["init_score"] == ref.init_score
    assert len(fm["trees"]) == len(ref.trees) == f.plan.hyperparameters.total_rounds
    for t, r in zip(fm["trees"], ref.trees):
        assert (t["features"], t["thresholds"]) == (r.features.tolist(), r.thresholds.tolist())
        assert t["leaves"] == r.leaves.tolist()  # exact integer sums: bit-identical


# --------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("dataset", ["abalone", "adult"])
def test_federated_greedy_equals_the_central_histogram_rule(tmp_path, dataset):
    data = abalone_with_ids(240) if dataset == "abalone" else adult_with_ids(300)
    hp = greedy_hp(depth=3 if dataset == "adult" else 2, trees=2 if dataset == "adult" else 3)
    f = Fed(tmp_path, hp, data=data).start()
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected and not f.fed.refusals
    assert_equals_central(f)
    fm = f.model()
    assert fm["privacy"]["tree_builder"] == "greedy" and fm["privacy"]["selection"] == "histogram"
    for s in SITES:  # every level and every leaf release is logged and charged once
        db = f.db(s)
        kinds = db.execute("SELECT kind, tree, level, with_data FROM contributions WHERE kind != 'init' "
                           "ORDER BY round_id").fetchall()
        expect = []
        for k in range(hp.trees):
            expect += [("level", k, e, 1) for e in range(hp.depth)] + [("tree", k, None, 1)]
        assert kinds == expect
        for k, t in enumerate(fm["trees"]):  # the site remembers exactly the released splits
            feats, thr = f.machines[s].ledger.released_splits(k)
            assert feats.tolist() == t["features"] and thr.tolist() == t["thresholds"]
    files = {m.stage.model_path.read_bytes() for m in f.machines.values()}
    assert files == {f.session.model_json}


def test_level_vectors_carry_the_plan_s_noise_shares(tmp_path, monkeypatch):
    """Distributed noise: each site's share of a level has std (per entry) = the level's noise / √k_r."""
    f = Fed(tmp_path, greedy_hp(trees=2), test_noise=True, dropout_slack=1).start()
    seen = []
    for s, m in f.machines.items():
        draw = m.randomness.discrete_gaussian

        def record(scales, draw=draw, s=s):
            seen.append((s, np.asarray(scales, np.float64).copy()))
            return draw(scales)
        monkeypatch.setattr(m.randomness, "discrete_gaussian", record)
    f.fed.run()
    assert f.session.exit_code == 0
    plan, grid = f.plan, f.plan.greedy_grid
    k = plan.noise_divisor(3)
    lengths = {grid.layout(0, e).length: e for e in range(plan.hyperparameters.depth)}
    levels = [(s, sc) for s, sc in seen if sc.size in lengths]
    assert len(levels) == 3 * plan.hyperparameters.trees * plan.hyperparameters.depth
    for s, sc in levels:
        e = lengths[sc.size]
        np.testing.assert_allclose(sc, plan.level_share_scales(0, e, k), rtol=0, atol=0)
        np.testing.assert_allclose(sc * math.sqrt(k), plan.level_share_scales(0, e, 1), rtol=1e-12)


def test_summed_level_shares_have_the_full_level_noise():
    """k exact discrete-Gaussian shares (OS randomness) sum to the level's full noise: a 5σ variance test."""
    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]
    plan = make_plan(schema, greedy_hp(), sites)
    k = plan.noise_divisor(3)
    full = plan.level_share_scales(0, 1, 1)
    share = plan.level_share_scales(0, 1, k)
    assert_shares_sum_to_full_noise(share, full, k, vectors=12)


def test_coordinator_and_site_restart_mid_tree_resume_at_the_next_level(tmp_path):
    hp = greedy_hp(trees=3, depth=3)
    f = Fed(tmp_path, hp, store=True).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1 and len(f.session.levels) == 2)
    levels = [(a.tolist(), b.tolist()) for a, b in f.session.levels]
    # the coordinator process dies between levels: a new one resumes from the checkpoint
    f.session.checkpoint.close()
    f.session = f.fed.session = f.new_session()
    assert [(a.tolist(), b.tolist()) for a, b in f.session.levels] == levels
    assert f.session.next_work().purpose == Purpose.LEVEL and f.session.next_work().level == 2
    for s in SITES:
        f.fed.join(s)
    f.fed.run(until=lambda: len(f.session.trees) == 2
              and f.machines["hosp-b"].ledger.released_splits(2)[0].size == 1)
    b = f.restart_site("hosp-b")  # a site restarts mid-tree: it remembers the released splits from its database
    feats, thr = b.ledger.released_splits(2)
    assert (feats.tolist(), thr.tolist()) == (f.session.levels[0][0].tolist(), f.session.levels[0][1].tolist())
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected
    assert_equals_central(f)  # noise off, nothing lost or repeated: still the engine's model
    log = f.session.checkpoint.db.execute("SELECT kind FROM log WHERE kind = 'level'").fetchall()
    assert len(log) >= hp.trees * hp.depth


def test_no_site_sends_level_data_in_more_rounds_than_accounted(tmp_path):
    hp = greedy_hp(trees=2, depth=2)
    f = Fed(tmp_path, hp, secagg_fast_path="never", max_failed_attempts=4).start()
    fail_rounds_after_inputs(f, 4)  # level rounds fail after every site sent its masked input
    assert f.session.exit_code == 0 and len(f.session.trees) == 2
    for s in SITES:
        sent = [r[0] for r in f.db(s).execute("SELECT with_data FROM contributions WHERE kind = 'level' "
                                              "ORDER BY round_id")]
        assert sum(sent) <= hp.accounted_rounds * hp.depth  # failed rounds count
        assert len(sent) > hp.accounted_rounds * hp.depth and sent[-1] == 0  # later levels carried no data


# --------------------------------------------------------------------------- what a site refuses


def _level_start(f: Fed, site: str, tree: int, level: int, features, thresholds, purpose=Purpose.LEVEL,
                 offset: int = 1) -> RoundStartMsg:
    """A structurally valid RoundStart for a fresh round slot carrying a (possibly tampered) greedy request."""
    ep = f.session.coord.epoch(min(f.session.coord.ready_epochs()))
    r = (f.machines[site].secagg._wm.max_round or 0) + offset
    grid = f.plan.greedy_grid
    n = grid.layout(tree, min(level, f.plan.hyperparameters.depth - 1)).length if purpose == Purpose.LEVEL else \
        2 * f.plan.hyperparameters.leaves
    start = RoundStart(f.session.coord.config.digest, ep.epoch, r, n, tuple(SITES))
    return RoundStartMsg(purpose, tree, start.to_bytes(), level, tuple(int(x) for x in features),
                         tuple(float(x) for x in thresholds))


def test_site_refuses_tampered_level_requests_before_computing_anything(tmp_path, monkeypatch):
    hp = greedy_hp(trees=3, depth=3)
    f = Fed(tmp_path, hp).start()
    m, feats, thr, other = first_tree_released(f)
    before = _counts(f, "hosp-a")
    calls = []
    monkeypatch.setattr("fedsbdt.common.modes.greedy.site.level_sums", lambda *a, **k: calls.append(a))
    cases = {
        "have depth 3": (1, 3, np.r_[feats, feats, feats[:1]], np.r_[thr, thr, thr[:1]]),  # level ≥ depth
        "rewrites splits": (1, 2, np.r_[feats[0]], np.r_[other]),  # splits so far: node 0 rewritten
        "already passed": (1, 1, feats[:1], thr[:1]),  # going back to a released level
        "not the plan's candidates": (1, 2, feats, np.r_[thr[:2], 0.123456789]),  # off the public grid
        "carries 2 splits": (1, 2, feats[:2], thr[:2]),
        "already released": (0, 1, feats[:1], thr[:1]),
    }
    cases["rewrites splits"] = (1, 2, np.r_[feats[0], feats[1:]], np.r_[other, thr[1:]])
    for why, (tree, level, fe, th) in cases.items():
        out = m.handle(_level_start(f, "hosp-a", tree, level, fe, th))
        assert len(out) == 1 and why in out[0].detail, (why, out)
    # the leaf round of a greedy tree: its splits must repeat the released ones too
    leaves = _level_start(f, "hosp-a", 1, 0, np.r_[feats, feats, feats[:1]], np.r_[other, thr[1:], thr, thr[:1]],
                          Purpose.TREE)
    out = m.handle(leaves)
    assert "rewrites splits" in out[0].detail
    with pytest.raises(NeedCatchUp):  # a tree it has not caught up to
        m.handle(_level_start(f, "hosp-a", 2, 0, [], []))
    assert not calls and _counts(f, "hosp-a") == before  # nothing computed, charged, logged or stored
    # a coordinator that releases the tree with other splits than its requests carried is caught
    fake = TreeMsg(1, 10**6, tuple(SITES), np.r_[feats, feats, feats[:1]].astype(np.int32),
                   np.r_[other, thr[1:], thr, thr[:1]], np.zeros(hp.leaves))
    with pytest.raises(SessionAbort, match="other splits"):
        m.handle(fake)


def random_plan_site_answer(tmp_path, purpose: Purpose, *fields) -> str:
    """What a site of a random-tree plan answers to a ``purpose`` round for tree 0 (the reply's detail)."""
    f = Fed(tmp_path, Hyperparameters(trees=2, depth=2, seed=5, epsilon=1.0)).start()
    f.fed.run(until=lambda: f.session.init is not None)
    m = f.machines["hosp-a"]
    ep = f.session.coord.epoch(min(f.session.coord.ready_epochs()))
    r = (m.secagg._wm.max_round or 0) + 1
    start = RoundStart(f.session.coord.config.digest, ep.epoch, r, 8, tuple(SITES))
    return m.handle(RoundStartMsg(purpose, 0, start.to_bytes(), *fields))[0].detail


def test_a_random_plan_site_refuses_level_rounds(tmp_path):
    assert "level rounds are not in this plan's schedule (mode random: INIT_SCORE, TREE)" in \
        random_plan_site_answer(tmp_path, Purpose.LEVEL, 0)


def test_federated_greedy_refuses_what_central_greedy_refuses(tmp_path):
    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]
    with pytest.raises(ConfigError, match="filter does not apply to greedy trees"):
        make_plan(schema, greedy_hp(filter=True), sites)
    with pytest.raises(ConfigError, match="set subsample = 1"):
        make_plan(schema, greedy_hp(subsample=0.5), sites)
    with pytest.raises(PlanError, match="set selection = \"histogram\""):
        make_plan(schema, greedy_hp(selection="exponential"), sites)
    # PLD: every release of federated greedy is Gaussian, but discrete (sums of discrete shares), which the
    # continuous PLD does not dominate — refused as for random trees (docs/privacy.md "PLD")
    with pytest.raises(PlanError, match="PLD accountant"):
        make_plan(schema, greedy_hp(accountant="pld"), sites)
    plan = make_plan(schema, greedy_hp(), sites)
    assert plan.calibration() == calibration_for(plan.hyperparameters)
    assert plan.calibration().sigma_select > 0 and plan.calibration().eps_select == 0
    text = plan.to_toml().replace('selection = "histogram"', 'selection = "exponential"')
    from fedsbdt.common.federation.plan import Plan
    with pytest.raises(PlanError, match="histogram"):
        Plan.from_toml(text)


def test_round_start_carries_level_and_splits_on_the_wire():
    ev = RoundStartMsg(Purpose.LEVEL, 4, b"x" * 10, 2, (3, 1, 0), (0.5, 2.0, -1.25))
    assert event_from_proto(event_to_proto(ev, 7)) == ev
    plain = RoundStartMsg(Purpose.TREE, 1, b"y")
    assert event_from_proto(event_to_proto(plain, 1)) == plain
    m = event_to_proto(ev, 7)
    m.round_start.thresholds.append(1.0)
    with pytest.raises(WireError, match="features"):
        event_from_proto(m)
    m = event_to_proto(RoundStartMsg(Purpose.LEVEL, 4, b"x", 1, (3,), (float("nan"),)), 1)
    with pytest.raises(WireError, match="non-finite"):
        event_from_proto(m)


# --------------------------------------------------------------------------- real processes


def test_three_site_processes_train_greedy_evaluate_and_the_model_exports(tmp_path, ca_dir, cluster_factory):
    """Greedy sites sample their noise in-process (random-tree sites in child processes): a greedy session with
    the OS CSPRNG trains and then evaluates held-out files (the released record count is the true one within
    5σ), and its model file works downstream like a central one."""
    from .test_fed_eval_processes import held_out_files
    from .test_processes import SITES as PSITES, models_identical, setup_federation

    hp = greedy_hp(trees=3, depth=2, seed=21)
    plan, schema, raw, data = setup_federation(tmp_path, ca_dir, hp, n_rows=600, eval_epsilon=1.0, eval_bins=10)
    held = held_out_files(tmp_path)
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    sites = {s: c.site(s, data[s], "--eval-data", str(held[s]), "--max-eval-epsilon", "1") for s in PSITES}
    assert coord.wait(timeout=300) == 0, coord.errors
    for s, p in sites.items():
        assert p.wait() == 0, p.errors
    model = json.loads(models_identical(tmp_path, PSITES))
    assert "insecure" not in model["privacy"]["randomness"].lower()
    ev = coord.result()["evaluation"]
    spec = plan.eval_spec
    assert abs(ev["metrics"]["n"] - 300) <= 5 * math.sqrt(3 * spec.bins) * spec.noise_scales()[0] + 1
    levels = [e for e in c.events if e.get("_proc") == "coordinator" and e.get("event") == "level"]
    assert sorted((e["tree"], e["tree_level"]) for e in levels) == [(k, e) for k in range(3) for e in range(2)]
    assert {e["vector_len"] for e in levels} == {plan.greedy_grid.layout(0, e).length for e in range(2)}
    grid = plan.greedy_grid
    for k, t in enumerate(model["trees"]):
        grid.candidate_index(k, t["features"], t["thresholds"])  # every split is a public candidate
    assert model["privacy"]["tree_builder"] == "greedy" and model["privacy"]["noise_mode"] == "distributed"
    # the model file works downstream like a central one: evaluate, XGBoost export, account
    mpath = tmp_path / "coordinator" / "model.json"
    union = tmp_path / "union.csv"
    raw.to_csv(union, index=False)
    schema_file = tmp_path / "schema.toml"
    from fedsbdt.common.federation.toml_writer import dumps
    schema_file.write_text(dumps(schema.to_dict()))

    def cli(*argv):
        p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)

    ev = cli("evaluate", "--model", str(mpath), "--data", str(union), "--json")
    cli("export", "--model", str(mpath), "--format", "xgboost", "--out", str(tmp_path / "m.xgb.json"), "--json")
    import xgboost as xgb

    from fedsbdt.common.model import Ensemble
    ens = Ensemble.load(mpath)
    ds = load(union, schema)
    X = ds.X
    assert ev["rmse"] == pytest.approx(float(np.sqrt(np.mean((ens.predict(X) - ds.y) ** 2))), rel=1e-9)
    theirs = xgb.Booster(model_file=str(tmp_path / "m.xgb.json")).predict(xgb.DMatrix(X))
    assert np.abs(theirs - ens.predict(X)).max() <= 1e-5
    acc = cli("account", "--tree-builder", "greedy", "--selection", "histogram", "--trees", "3", "--depth", "2",
              "--epsilon", str(hp.epsilon), "--delta", str(hp.delta), "--json")
    assert acc["epsilon"] == pytest.approx(model["privacy"]["epsilon"], rel=1e-9)
    assert acc["sigma_select"] == pytest.approx(model["privacy"]["sigma_select"], rel=1e-9)


def test_coordinator_process_killed_between_levels_resumes_from_its_checkpoint(tmp_path, ca_dir, cluster_factory):
    from .test_processes import SITES as PSITES, models_identical, setup_federation

    hp = greedy_hp(trees=4, depth=3, seed=8)
    plan, schema, raw, data = setup_federation(tmp_path, ca_dir, hp, n_rows=450)
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    sites = {s: c.site(s, data[s]) for s in PSITES}
    c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "level" and e.get("tree") == 1
                 and e.get("tree_level") == 0)
    coord.kill()  # SIGKILL between two levels of tree 1
    coord.wait()
    mark = c.mark()
    coord = c.coordinator()
    resumed = c.wait_event(lambda e: e.get("event") == "resumed", after=mark)
    assert resumed["trees_released"] >= 1
    assert coord.wait(timeout=300) == 0, coord.errors
    for s, p in sites.items():
        assert p.wait() == 0, p.errors
    model = json.loads(models_identical(tmp_path, PSITES))
    assert [r["tree"] for r in model["training"]["rounds"]] == list(range(hp.trees))
    import sqlite3

    # the checkpoint holds every level once, in order: a level chosen before the kill was not chosen again
    db = sqlite3.connect(tmp_path / "coordinator" / "coordinator.sqlite")
    levels = [json.loads(b) for (b,) in db.execute("SELECT body FROM log WHERE kind = 'level' ORDER BY seq")]
    assert [(r["tree"], r["level"]) for r in levels] == [(k, e) for k in range(hp.trees) for e in range(hp.depth)]
    for k, t in enumerate(model["trees"]):
        assert t["features"] == [f for r in levels if r["tree"] == k for f in r["features"]]
    assert not [e for e in c.events if e.get("event") == "refused" and "split" in str(e.get("detail"))]

    from fedsbdt.client.ledger import ledger_path
    for s in PSITES:  # each site sent data in at most T·d level rounds and T leaf rounds
        db = sqlite3.connect(ledger_path(tmp_path / s, plan.sha256))
        n = dict(db.execute("SELECT kind, SUM(with_data) FROM contributions GROUP BY kind").fetchall())
        assert n["level"] <= hp.trees * hp.depth and n["tree"] <= hp.trees


def test_fedsbdt_plan_writes_histogram_selection_for_greedy_trees(tmp_path):
    keys = [f"--site=s{i}={bytes([i + 1]).hex() * 32}" for i in range(3)]
    base = [sys.executable, "-m", "fedsbdt.cli", "plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"),
            *keys, "--tree-builder", "greedy", "--trees", "4", "--depth", "2"]
    p = subprocess.run([*base, "--out", str(tmp_path / "plan.toml"), "--json"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    from fedsbdt.common.federation.plan import Plan
    plan = Plan.load(tmp_path / "plan.toml")
    assert plan.hyperparameters.selection == "histogram" and plan.hyperparameters.subsample == 1.0
    assert json.loads(p.stdout)["sigma"] == plan.stated_sigma
    p = subprocess.run([*base, "--filter", "--out", str(tmp_path / "never.toml")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "filter does not apply to greedy trees" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "never.toml").exists()
