"""Federated Sarus DP-XGBoost (docs/sarus.md "Federation"): sketch, level and leaf rounds.

The in-process transport drives the real coordinator and site state machines (real secure aggregation,
real SQLite); the last test runs real gRPC processes.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from fedsbdt.common import kernels
from fedsbdt.common.accountant import GaussianEvent, PoissonSampledEvent, compose, event_epsilon_rdp, event_rdp, tree_rdp
from fedsbdt.common.boosting import TASK_CODE
from fedsbdt.common.builders import Candidates, leaf_regions
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.federation.plan import PlanError, SiteEntry, make_plan
from fedsbdt.common.modes.sarus.rounds import calibrate_federated, split_sigmas, tree_event
from fedsbdt.common.federation.wire import Purpose, RoundStartMsg, event_from_proto, event_to_proto
from fedsbdt.common.modes.greedy.levels import sketch_candidates
from fedsbdt.common.randomness import InsecureTestRandomness
from fedsbdt.common.modes.sarus.mechanism import clamped_score, leaf_value
from fedsbdt.common.secagg import RoundStart

from .conftest import ROOT, abalone_with_ids
from .test_greedy_federation import adult_with_ids, assert_shares_sum_to_full_noise, random_plan_site_answer
from .test_state_machines import SEED, SITES, Fed, _counts, fail_rounds_after_inputs


def sarus_hp(**kw) -> Hyperparameters:
    base = dict(tree_builder="sarus", trees=3, depth=3, subsample=0.5, min_child_weight=5, split_candidates=8,
                l2=0.1, learning_rate=0.3, grad_clip=1.0, cyclical=False, seed=5, epsilon=2.0)
    base.update(kw)
    return Hyperparameters(**base)


# --------------------------------------------------------------------------- an independent central reference


def reference_trees(f: Fed, init_score: float):
    """Sarus trees with the federation's rule, computed centrally on the union of the sites' records with plain
    numpy (thresholds compared as floats, no bin codes, no histograms): the same per-record subsample
    (the test randomness is a public function of seed, tree and record id), the central sketch
    post-processing, exact node counts and sums."""
    hp, schema = f.plan.hyperparameters, f.schema
    frames = [load(p, schema) for p in f.paths.values()]
    X = np.concatenate([d.X for d in frames])
    y = np.concatenate([d.y for d in frames])
    if schema.task == "regression":  # the engine's label scaling (LocalData)
        from fedsbdt.common.boosting import scale_labels

        y = scale_labels(y, schema.label_range)
    ids = np.concatenate([d.ids for d in frames])
    enc = f.plan.encoding
    rnd = InsecureTestRandomness(seed=SEED, noise=False, i_understand_this_is_insecure=True)
    N, lam, h, K = hp.min_child_weight, hp.l2, hp.hess_clip_for(schema.task), hp.split_candidates
    _, fine = Candidates.grid(schema, 4 * K)
    pred = np.full(len(y), init_score)
    out = []
    for k in range(hp.trees):
        present = np.asarray(rnd.subsample(hp.subsample, ids, k), bool)
        g, _ = kernels.grad_hess_units(pred, y, TASK_CODE[schema.task], enc.scale, enc.grad.bound_units,
                                       enc.hess.bound_units)
        g = g.astype(np.int64)
        cands = []  # (feature, threshold, categorical) in grid order
        for j, feat in enumerate(schema.features):
            if feat.is_categorical:
                cands += [(j, float(lv), True) for lv in range(len(feat.levels))]
            else:
                code = np.searchsorted(fine[j], X[present, j], side="right")
                counts = np.bincount(code, minlength=len(fine[j]) + 1)
                keep = sketch_candidates(counts[None, :], K)[0]
                cands += [(j, float(t), False) for t in fine[j][keep]]
        left = np.stack([(X[:, j] == t) if cat else (X[:, j] < t) for j, t, cat in cands], axis=1)
        node = np.zeros(len(y), np.int64)
        chosen, stopped = [], []
        for e in range(hp.depth):
            for q in range(2**e):
                heap = 2**e - 1 + q
                inq = present & (node == q)
                parent_stopped = heap > 0 and stopped[(heap - 1) // 2]
                if parent_stopped or inq.sum() < 2 * N:
                    chosen.append(0), stopped.append(True)
                    continue
                GL = (g[inq, None] * left[inq]).sum(axis=0)
                NL = left[inq].sum(axis=0)
                GR, NR = g[inq].sum() - GL, inq.sum() - NL
                u = clamped_score(GL / enc.scale, NL, N, lam, h) + clamped_score(GR / enc.scale, NR, N, lam, h)
                chosen.append(int(np.argmax(u))), stopped.append(False)
            c = np.asarray(chosen[2**e - 1:])
            node = 2 * node + ~left[np.arange(len(y)), c[node]]
        region = leaf_regions(np.asarray(stopped), hp.depth)
        G = np.bincount(region[node], weights=np.where(present, g, 0).astype(np.float64), minlength=2 * hp.leaves)
        n = np.bincount(region[node], weights=present.astype(np.float64), minlength=2 * hp.leaves)
        values = np.clip(leaf_value(G / enc.scale, n, N, lam, h), -hp.leaf_clip, hp.leaf_clip)[region]
        pred = pred + hp.learning_rate * values[node]
        out.append(([cands[i][0] for i in chosen], [cands[i][1] for i in chosen], values.tolist()))
    return out


def assert_equals_reference(f: Fed) -> None:
    fm = f.model()
    ref = reference_trees(f, fm["init_score"])
    assert len(fm["trees"]) == len(ref) == f.plan.hyperparameters.trees
    for t, (feats, thr, leaves) in zip(fm["trees"], ref):
        assert (t["features"], t["thresholds"]) == (feats, thr)
        np.testing.assert_allclose(t["leaves"], leaves, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- the protocol


@pytest.mark.parametrize("dataset", ["abalone", "adult"])
def test_federated_sarus_equals_the_central_rule_with_the_same_subsample(tmp_path, dataset):
    data = abalone_with_ids(300) if dataset == "abalone" else adult_with_ids(300)
    f = Fed(tmp_path, sarus_hp(), data=data).start()
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected and not f.fed.refusals
    assert_equals_reference(f)
    fm = f.model()
    assert fm["privacy"]["tree_builder"] == "sarus" and fm["privacy"]["epsilon"] == f.plan.calibration().epsilon
    hp = f.plan.hyperparameters
    splits_seen = 0
    for s in SITES:  # every stage of every tree carried data once, in order
        rows = f.db(s).execute("SELECT kind, tree, level, with_data FROM contributions WHERE kind != 'init' "
                               "ORDER BY round_id").fetchall()
        expect = []
        for k in range(hp.trees):
            expect += [("sketch", k, None, 1)] + [("level", k, e, 1) for e in range(hp.depth)] + [("tree", k, None, 1)]
        assert rows == expect
        m = f.machines[s]
        for k, t in enumerate(fm["trees"]):
            sketch = m.rounds.released_sketch(k)
            grid = m.rounds.tree(k, sketch)[0].tree_grid  # candidates recomputed at the site from the sketch
            c = grid.candidate_index(k, t["features"], t["thresholds"])
            splits_seen += c.size
    assert splits_seen == 3 * hp.trees * (hp.leaves - 1)
    files = {m.stage.model_path.read_bytes() for m in f.machines.values()}
    assert files == {f.session.model_json}


def test_sites_recompute_the_coordinator_s_candidates_and_keep_one_subsample_per_tree(tmp_path):
    hp = sarus_hp(trees=3)
    f = Fed(tmp_path, hp, test_noise=True, store=True).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1 and len(f.session.levels) == 1)
    sketch = f.session.rounds.tree.sketch
    coord_grid = f.session.rounds.tree.tree_grid
    for s in SITES:  # the noisy sketch is stored and the same candidates come out of it
        m = f.machines[s]
        assert np.array_equal(m.rounds.released_sketch(1), sketch)
        g = m.rounds.tree(1, m.rounds.released_sketch(1))[0].tree_grid
        assert np.array_equal(g.candidates.threshold, coord_grid.candidates.threshold)
        assert np.array_equal(g.candidates.feature, coord_grid.candidates.feature)
    # a site restarts mid-tree: the same subsample comes back from its database (not a new draw)
    before = f.machines["hosp-b"].rounds.subsample(1).copy()
    b = f.restart_site("hosp-b")
    assert np.array_equal(b.rounds.subsample(1), before)
    draws = []
    orig = b.randomness.subsample
    b.randomness.subsample = lambda *a: draws.append(a) or orig(*a)
    # the coordinator restarts too: it resumes at the next level with the checkpointed sketch
    f.session.checkpoint.close()
    f.session = f.fed.session = f.new_session()
    assert np.array_equal(f.session.rounds.tree.sketch, sketch) and len(f.session.levels) == 1
    for s in SITES:
        f.fed.join(s)
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected
    assert [a[2] for a in draws] == [2]  # hosp-b drew a subsample only for the tree it had not started
    sampled = {r[0]: r[1] for r in f.db("hosp-b").execute(
        "SELECT DISTINCT tree, sampled FROM contributions WHERE kind != 'init' AND tree = 1")}
    assert sampled == {1: int(before.sum())}


def _request(f: Fed, site: str, purpose, tree: int, level: int, features, thresholds, sketch) -> RoundStartMsg:
    ep = f.session.coord.epoch(min(f.session.coord.ready_epochs()))
    m = f.machines[site]
    r = (m.secagg._wm.max_round or 0) + 1
    if purpose == Purpose.SKETCH or len(sketch) != f.plan.sarus_grid.sketch_len:
        n = f.plan.sarus_grid.sketch_len
    else:
        n = m.rounds.tree(tree, sketch)[0].vector_len(purpose, level)
    start = RoundStart(f.session.coord.config.digest, ep.epoch, r, n, tuple(SITES))
    return RoundStartMsg(purpose, tree, start.to_bytes(), level, tuple(int(x) for x in features),
                         tuple(float(x) for x in thresholds), tuple(int(x) for x in sketch))


def test_site_refuses_requests_off_the_released_sketch_and_charges_nothing(tmp_path, monkeypatch):
    hp = sarus_hp(trees=3, depth=3)
    f = Fed(tmp_path, hp, test_noise=True).start()
    m = f.machines["hosp-a"]
    f.fed.run(until=lambda: len(f.session.trees) == 1 and m.ledger.released_splits(1)[0].size == 3)
    sketch = m.rounds.released_sketch(1)
    feats, thr = m.ledger.released_splits(1)
    grid = m.rounds.tree(1, sketch)[0].tree_grid
    fine = f.plan.sarus_grid.fine
    numeric = int(f.plan.sarus_grid.numeric[0])
    off = [t for t in fine.threshold[fine.feature == numeric] if t not in set(grid.candidates.threshold)][0]
    other_sketch = sketch.copy()
    other_sketch[0] += 1000
    before = _counts(f, "hosp-a")
    calls = []
    monkeypatch.setattr("fedsbdt.common.modes.greedy.levels.level_sums", lambda *a, **k: calls.append(a))
    cases = {  # why: (purpose, tree, level, features, thresholds, sketch)
        "not the plan's candidates": (Purpose.LEVEL, 1, 2, np.r_[feats[:2], numeric], np.r_[thr[:2], off], sketch),
        "another sketch": (Purpose.LEVEL, 1, 2, feats, thr, other_sketch),
        "does not carry its released sketch": (Purpose.LEVEL, 1, 2, feats, thr, sketch[:-1]),
        "already released; refusing to sketch": (Purpose.SKETCH, 1, 0, [], [], []),
        "rewrites splits": (Purpose.LEVEL, 1, 2, np.r_[feats[1], feats[1:]], np.r_[thr[1], thr[1:]], sketch),
        "already passed": (Purpose.LEVEL, 1, 1, feats[:1], thr[:1], sketch),
        "have depth 3": (Purpose.LEVEL, 1, 3, np.r_[feats, feats, feats[:1]], np.r_[thr, thr, thr[:1]], sketch),
        "tree 0 was already released": (Purpose.LEVEL, 0, 1, feats[:1], thr[:1], sketch),
    }
    for why, (purpose, tree, level, fe, th, sk) in cases.items():
        out = m.handle(_request(f, "hosp-a", purpose, tree, level, fe, th, sk))
        assert len(out) == 1 and why in out[0].detail, (why, out)
    assert not calls and _counts(f, "hosp-a") == before  # nothing computed, charged, logged or stored
    assert np.array_equal(m.rounds.released_sketch(1), sketch)


def test_a_site_sends_each_stage_s_data_once_however_often_the_coordinator_retries(tmp_path):
    hp = sarus_hp(trees=2, depth=2)
    f = Fed(tmp_path, hp, secagg_fast_path="never", max_failed_attempts=5).start()
    fail_rounds_after_inputs(f, 5)  # rounds fail after every site sent its masked input
    assert f.session.exit_code == 0 and len(f.session.trees) == 2
    for s in SITES:
        rows = f.db(s).execute("SELECT kind, tree, level, SUM(with_data), COUNT(*) FROM contributions "
                               "WHERE kind != 'init' GROUP BY kind, tree, level").fetchall()
        assert len(rows) == hp.trees * (hp.depth + 2)
        assert all(r[3] == 1 for r in rows)  # one data-bearing input per stage, retries carry zeros
        assert sum(r[4] for r in rows) > len(rows)  # there were retries


def test_a_random_plan_site_refuses_sketch_rounds(tmp_path):
    assert "sketch rounds are not in this plan's schedule (mode random: INIT_SCORE, TREE)" in \
        random_plan_site_answer(tmp_path, Purpose.SKETCH)


def test_round_start_carries_the_sketch_on_the_wire():
    ev = RoundStartMsg(Purpose.LEVEL, 4, b"x" * 10, 2, (3, 1, 0), (0.5, 2.0, -1.25), (5, -3, 0, 2**40))
    assert event_from_proto(event_to_proto(ev, 7)) == ev
    sk = RoundStartMsg(Purpose.SKETCH, 1, b"y")
    assert event_from_proto(event_to_proto(sk, 1)) == sk


# --------------------------------------------------------------------------- plans and accounting


def test_plans_accept_sarus_with_the_rdp_ledger_only(tmp_path):
    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]
    plan = make_plan(schema, sarus_hp(), sites)
    assert plan.sarus_grid is not None and plan.calibration().sigma_sketch > 0
    with pytest.raises(PlanError, match="accountant = \"rdp\""):
        make_plan(schema, sarus_hp(accountant="pure"), sites)
    with pytest.raises(ConfigError, match="accounted by 'rdp'"):  # PLD: refused for Sarus trees anywhere
        make_plan(schema, sarus_hp(accountant="pld"), sites)


def test_the_tree_is_one_subsampled_gaussian_of_the_composed_slopes():
    """A composition of Gaussians on one Poisson subsample is charged as the subsampled Gaussian whose RDP slope
    is the sum (Lemma 15 + Thm. 14); checked against dp-accounting's RDP accountant and the closed-form split."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    sigma_tree, depth, gamma, T = 3.0, 4, 0.1, 20
    sk, lv, lf = split_sigmas(sigma_tree, depth)
    # closed form of the paper's split: slopes 1/σ² add to 1/σ_tree², a third each, the selection over d levels
    assert 1 / sk**2 + depth / lv**2 + 1 / lf**2 == pytest.approx(1 / sigma_tree**2, rel=1e-12)
    assert 1 / sk**2 == pytest.approx(1 / (3 * sigma_tree**2)) and depth / lv**2 == pytest.approx(1 / sk**2)
    orders = np.arange(2, 129)
    ours = event_rdp(compose(tree_event(sigma_tree, depth, gamma), count=T), orders)
    np.testing.assert_allclose(ours, T * tree_rdp(gamma, sigma_tree, orders), rtol=1e-12)
    acc = RdpAccountant(orders=[float(a) for a in orders])
    acc.compose(dp_accounting.PoissonSampledDpEvent(gamma, dp_accounting.GaussianDpEvent(sigma_tree / math.sqrt(2))),
                T)
    eps_theirs = acc.get_epsilon(1e-6)
    ev = compose(tree_event(sigma_tree, depth, gamma), count=T)
    eps_ours, _ = event_epsilon_rdp(ev, 1e-6, 128)
    assert eps_ours == pytest.approx(eps_theirs, rel=2e-2)  # their RDP→DP conversion is a little tighter
    assert eps_ours >= eps_theirs * (1 - 1e-9)
    rdp_theirs = np.array(acc._rdp)
    np.testing.assert_allclose(ours, rdp_theirs, rtol=1e-6)
    # a non-Gaussian part leaves the tight Gaussian bound
    mixed = PoissonSampledEvent(gamma, compose(GaussianEvent(1.0), compose(GaussianEvent(2.0), count=2)))
    assert event_rdp(mixed, np.array([8]))[0] == pytest.approx(tree_rdp(gamma, math.sqrt(2) / math.sqrt(1 + 2 / 4),
                                                                        np.array([8]))[0], rel=1e-12)


def test_account_on_the_plan_agrees_with_the_coordinator_s_ledger(tmp_path):
    f = Fed(tmp_path, sarus_hp(trees=2, depth=2)).start()
    f.fed.run()
    model = f.model()
    path = tmp_path / "plan.toml"
    f.plan.save(path)
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "account", "--plan", str(path), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    acc = json.loads(p.stdout)
    hp = f.plan.hyperparameters
    for key in ("epsilon", "sigma", "sigma_select", "sigma_sketch", "alpha", "rho"):
        assert acc[key] == model["privacy"][key], key
    assert acc["epsilon"] == f.plan.stated_epsilon and acc["sigma"] == f.plan.stated_sigma
    # independent: the released rounds as dp-accounting events, σ from the plan's ledger entries
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    priv = model["privacy"]
    z = 1 / math.sqrt(2 / priv["sigma_sketch"] ** 2 + 2 * hp.depth / priv["sigma_select"] ** 2
                      + 2 / priv["sigma"] ** 2)
    alpha = priv["alpha"]
    racc = RdpAccountant(orders=[float(alpha)])
    racc.compose(dp_accounting.PoissonSampledDpEvent(hp.subsample, dp_accounting.GaussianDpEvent(z)), hp.trees)
    assert racc._rdp[0] == pytest.approx(priv["rho"], rel=1e-6)
    assert calibrate_federated(hp.epsilon, hp.delta, hp.trees, hp.depth, hp.subsample, hp.init_share, hp.eps_ds,
                               "rdp").epsilon == priv["epsilon"]
    assert priv["epsilon"] <= hp.epsilon
    from fedsbdt.common.report import epsilon_curve  # the report's ε curve ends at the ledger's ε

    rs, eps = epsilon_curve(priv, depth=hp.depth)
    assert rs[-1] == hp.trees and eps[-1] == pytest.approx(priv["epsilon"], rel=1e-12) and np.all(np.diff(eps) > 0)


def test_summed_sketch_shares_have_the_full_sketch_noise():
    """k exact discrete-Gaussian shares (OS randomness) sum to the sketch's full noise: a 5σ test of the
    variance, with the scale the accountant's σ_sketch gives (σ_k·√m/√2 per count, m sketched features).
    Sums of shares of the level and leaf noise: tests/federation/test_greedy_federation.py
    ``test_summed_level_shares_have_the_full_level_noise`` (the same ``level_noise_scales``)."""
    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]
    plan = make_plan(schema, sarus_hp(), sites)
    grid, cal = plan.sarus_grid, plan.calibration()
    k = plan.noise_divisor(3)
    full = grid.sketch_noise_scales(cal.sigma_sketch, 1)
    C = grid.count_units  # a record counts C units (fixed point): sensitivity √m·C
    assert full[0] == pytest.approx(C * cal.sigma_sketch * math.sqrt(grid.numeric.size) / math.sqrt(2), rel=1e-12)
    share = grid.sketch_noise_scales(cal.sigma_sketch, k)
    assert_shares_sum_to_full_noise(share, full, k, vectors=40)


# --------------------------------------------------------------------------- real processes


def test_three_site_processes_train_sarus_and_account(tmp_path, ca_dir, cluster_factory):
    from .conftest import SITES as PSITES, models_identical, tls_session_files

    hp = sarus_hp(trees=2, depth=2, seed=21)
    files = tls_session_files(tmp_path, ca_dir, *abalone_with_ids(600), hp, PSITES)
    plan = files.plan
    c = cluster_factory(tmp_path / "plan.toml")
    c.run(files.data, timeout=300)
    model = json.loads(models_identical(tmp_path, PSITES))
    mine = [e for e in c.events if e.get("_proc") == "coordinator" and e.get("event") in ("sketch", "level")]
    assert sorted((e["tree"], e["event"], e["tree_level"]) for e in mine if e["event"] == "level") == \
        [(k, "level", e) for k in range(2) for e in range(2)]
    assert sorted(e["tree"] for e in mine if e["event"] == "sketch") == [0, 1]
    assert {e["vector_len"] for e in mine if e["event"] == "sketch"} == {plan.sarus_grid.sketch_len}
    assert model["privacy"]["tree_builder"] == "sarus" and model["privacy"]["noise_mode"] == "distributed"
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "account", "--plan", str(tmp_path / "plan.toml"),
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["epsilon"] == model["privacy"]["epsilon"] <= hp.epsilon
    import sqlite3

    from fedsbdt.client.ledger import ledger_path
    for s in PSITES:  # each site sent data once per stage: T sketches, T·d levels, T leaf rounds
        db = sqlite3.connect(ledger_path(tmp_path / s, plan.sha256))
        n = dict(db.execute("SELECT kind, SUM(with_data) FROM contributions GROUP BY kind").fetchall())
        assert (n["sketch"], n["level"], n["tree"]) == (hp.trees, hp.trees * hp.depth, hp.trees)
