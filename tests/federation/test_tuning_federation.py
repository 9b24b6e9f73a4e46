"""Federated tuning (common/federation/tuning.py, docs/auto.md "In a federation"): a tuning plan of K trial plans,
its composed privacy against dp-accounting, its checks, and three site processes running it end to end."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import PlanError
from fedsbdt.common.federation.tuning import FederatedTuning, plan_trials

from .conftest import (SITES, abalone_with_ids, assert_same_trees, central_training, make_identities, make_test_plan,
                       write_splits)

ORDERS = [1 + x / 20 for x in range(1, 100)] + list(range(6, 64)) + list(range(64, 4000, 16))


def tuning_for(schema, ids, hp, k=2, epsilon=None, epsilon_eval=0.2, **session) -> FederatedTuning:
    def make(h, suffix, eval_epsilon):
        return make_test_plan(schema, ids, h, session_id="tune" + suffix, eval_epsilon=eval_epsilon, **session)

    return plan_trials(make, hp, schema.task, k, epsilon or hp.epsilon, epsilon_eval, matched_l2=True)


@pytest.fixture
def identities(tmp_path):
    return make_identities(tmp_path, SITES)


def oracle_epsilons(tuning: FederatedTuning) -> tuple[float, float]:
    """dp-accounting's RDP accountant on the trials as its own events: each trial T Poisson-subsampled Gaussian
    trees (no initial score in these tests), each evaluation one Gaussian."""
    train = RdpAccountant(ORDERS)
    held = RdpAccountant(ORDERS)
    for p in tuning.trials:
        hp, cal = p.hyperparameters, p.calibration()
        assert hp.init_share == 0
        train.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            hp.subsample, dp_accounting.GaussianDpEvent(cal.sigma / math.sqrt(2))), hp.accounted_rounds))
        held.compose(dp_accounting.GaussianDpEvent(p.eval_spec.sigma))
    return train.get_epsilon(tuning.delta), held.get_epsilon(tuning.delta)


@pytest.mark.parametrize("k,epsilon", [(2, 1.0), (3, 4.0)])
def test_the_trials_compose_to_the_budget_by_an_independent_accountant(identities, k, epsilon):
    schema, _ = abalone_with_ids(50)
    hp = Hyperparameters(trees=20, depth=3, seed=5, epsilon=epsilon, init_share=0.0)
    t = tuning_for(schema, identities, hp, k=k)
    assert len(t.trials) == k and t.stated_epsilon <= epsilon * (1 + 1e-9) and t.stated_epsilon > 0.99 * epsilon
    assert t.stated_epsilon_eval <= 0.2 * (1 + 1e-9) and t.stated_epsilon_eval > 0.99 * 0.2
    eps_train, eps_eval = oracle_epsilons(t)
    assert eps_train == pytest.approx(t.stated_epsilon, rel=0.02)
    assert eps_eval == pytest.approx(t.stated_epsilon_eval, rel=0.02)
    assert all(epsilon / k < p.stated_epsilon < epsilon for p in t.trials)  # RDP composes better than ε/K each
    first, second = t.settings(0), t.settings(1)
    assert (first["trees"], first["depth"], first["cyclical"]) == (20, 3, True)  # the centre, then cyclical flipped
    assert second["cyclical"] is False and second["depth"] == 3


def test_a_tuning_plan_round_trips_and_refuses_what_does_not_add_up(tmp_path, identities):
    schema, _ = abalone_with_ids(50)
    hp = Hyperparameters(trees=10, depth=2, seed=5, epsilon=1.0)
    t = tuning_for(schema, identities, hp)
    t.save(tmp_path / "tune.toml")
    back = FederatedTuning.load(tmp_path / "tune.toml")
    assert back.sha256 == t.sha256 and [p.sha256 for p in back.trials] == [p.sha256 for p in t.trials]
    text = (tmp_path / "tune.toml").read_text()
    (tmp_path / "tune.toml").write_text(text.replace(f"epsilon = {t.stated_epsilon!r}", "epsilon = 0.5"))
    with pytest.raises(PlanError, match="composes the trial plans to"):
        FederatedTuning.load(tmp_path / "tune.toml")
    (tmp_path / "tune.toml").write_text(text)
    # a site whose --max-epsilon is below the trials' composed ε refuses before it contacts anyone
    r = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "client", "--plan", str(tmp_path / "tune.toml"),
                        "--site", SITES[0], "--data", "none.csv", "--coordinator", "localhost:1", "--insecure",
                        "--state", str(tmp_path / "site"), "--max-epsilon", "0.9"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "above this site's --max-epsilon 0.9" in r.stderr
    trial = tmp_path / "tune.trial-2.toml"
    trial.write_text(trial.read_text().replace('id = "tune-trial-2"', 'id = "tune-trial-x"'))
    with pytest.raises(PlanError, match="has hash .* but the tuning plan pins"):
        FederatedTuning.load(tmp_path / "tune.toml")
    other = make_test_plan(schema, identities, hp.replace(epsilon=0.3), session_id="other", eval_epsilon=0.1,
                           threshold=3)
    with pytest.raises(PlanError, match="threshold differs"):
        FederatedTuning((t.trials[0], other), 1.0, 0.2)


def test_the_plan_command_refuses_a_budget_too_small_for_the_trials(tmp_path, identities):
    args = [sys.executable, "-m", "fedsbdt.cli", "plan", "--schema", "examples/abalone/schema.toml",
            *(a for s, i in identities.items() for a in ("--site", f"{s}={i.public.hex()}")),
            "--settings", "paper", "--epsilon", "0.01", "--tune-trials", "9", "--out", str(tmp_path / "t.toml")]
    r = subprocess.run(args, capture_output=True, text=True, cwd=_root())
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is too small for 9 trials" in r.stderr and not list(tmp_path.glob("t*.toml"))
    r = subprocess.run(args[:-6] + ["--epsilon", "1", "--tune-trials", "2", "--tree-builder", "greedy", "--out",
                                    str(tmp_path / "t.toml")], capture_output=True, text=True, cwd=_root())
    assert r.returncode == 2 and "random trees" in r.stderr and not list(tmp_path.glob("t*.toml"))


def status_json(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "status.json", timeout=30) as r:
        return json.loads(r.read())


def _root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


def test_three_site_processes_run_the_trials_and_the_coordinator_keeps_the_best(tmp_path, ca_dir, cluster_factory):
    from fedsbdt.common.federation.pki import ca_server

    schema, raw = abalone_with_ids(600)
    ids = make_identities(tmp_path, SITES, ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    data = write_splits(raw.iloc[:450], SITES, tmp_path / "data")
    held = write_splits(raw.iloc[450:], SITES, tmp_path / "held-out")
    hp = Hyperparameters(trees=4, depth=2, seed=7, epsilon=2.0)
    tuning = tuning_for(schema, ids, hp, randomness="insecure-test", test_seed=3, test_noise=False)
    tuning.save(tmp_path / "tune.toml")
    c = cluster_factory(tmp_path / "tune.toml")
    coord = c.run(data, "--allow-insecure-test-randomness", "--max-eval-epsilon", "0.2", held=held, timeout=240)
    out = coord.result()
    receipt = json.loads((tmp_path / "coordinator" / "tuning.json").read_text())
    assert out["tuning_plan_sha256"] == receipt["tuning_plan_sha256"] == tuning.sha256
    rmse = [t["metrics"]["rmse"] for t in receipt["trials"]]
    assert receipt["winner"] == int(np.argmin(rmse)) + 1 and len(rmse) == 2  # regression: the lowest RMSE
    win = receipt["winner"]
    # the winner, stating the whole tuning's privacy: its trees are trial `win`'s, which every site verified
    model = json.loads((tmp_path / "coordinator" / "model.json").read_text())
    trial_model = json.loads((tmp_path / "coordinator" / f"trial-{win}" / "model.json").read_text())
    assert model["trees"] == trial_model["trees"] and receipt["trial_model_sha256"] == \
        receipt["trials"][win - 1]["model_sha256"] == out["trial_model_sha256"]
    assert model["privacy"]["epsilon"] == tuning.stated_epsilon and trial_model["privacy"]["epsilon"] < 0.9 * \
        tuning.stated_epsilon and model["training"]["tuning"]["winner"] == win
    from fedsbdt.common.report import write_report

    write_report(tmp_path / "coordinator" / "model.json", tmp_path / "report.html")
    assert "federated tuning" in (tmp_path / "report.html").read_text()
    for i, plan in enumerate(tuning.trials):  # every trial: the sites' models are the coordinator's, = central
        ref = (tmp_path / "coordinator" / f"trial-{i + 1}" / "model.json").read_bytes()
        for s in SITES:
            assert (tmp_path / s / f"model-{tuning.sha256[:16]}.trial-{i + 1}.json").read_bytes() == ref
        _, res = central_training(tmp_path, schema, raw.iloc[:450], plan.hyperparameters, seed=3)
        assert_same_trees(json.loads(ref), res.model)
    for p in c.procs[1:]:
        r = p.result()
        assert r["tuning_plan_sha256"] == tuning.sha256 and [t["plan_sha256"] for t in r["trials"]] == \
            [p.sha256 for p in tuning.trials]
        # the site's lifetime ledger composes both trials: more than one trial's ε, within the tuning's total
        life = r["trials"][-1]["lifetime"]["train"]["epsilon"]
        assert tuning.trials[0].stated_epsilon < life <= tuning.stated_epsilon * (1 + 1e-6)


def test_a_site_skips_a_trial_it_finished_and_waits_while_the_coordinator_serves_it(tmp_path, ca_dir,
                                                                                   cluster_factory):
    """Resumed after trial 1 (its model file is there), the site takes part in trial 2 only; a coordinator still
    serving trial 1 is waited for (``waiting_for_plan``), not refused as a plan mismatch, until the reconnect
    timeout."""
    from fedsbdt.common.federation.pki import ca_server

    schema, raw = abalone_with_ids(90)
    ids = make_identities(tmp_path, SITES, ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    data = write_splits(raw, SITES, tmp_path / "data")
    tuning = tuning_for(schema, ids, Hyperparameters(trees=2, depth=2, seed=7, epsilon=2.0),
                        randomness="insecure-test", test_seed=3)
    tuning.save(tmp_path / "tune.toml")
    c = cluster_factory(tmp_path / "tune.trial-1.toml")  # this coordinator serves trial 1 and waits for sites
    c.coordinator()
    (tmp_path / SITES[0]).mkdir(exist_ok=True)
    (tmp_path / SITES[0] / f"model-{tuning.sha256[:16]}.trial-1.json").write_text("{}")
    site = c.site(SITES[0], data[SITES[0]], "--allow-insecure-test-randomness", "--plan", str(tmp_path / "tune.toml"),
                  "--reconnect-timeout", "6", "--status-port", "0")
    page = c.wait_event(lambda ev: ev.get("_proc") == SITES[0] and ev.get("event") == "status_page", timeout=60)
    c.wait_event(lambda ev: ev.get("_proc") == SITES[0] and ev.get("event") == "waiting_for_plan", timeout=60)
    status = status_json(page["url"])  # the site's page shows the trial it waits to take part in
    assert status["tuning"] == {"trial": 2, "trials": 2} and status["plan_sha256"] == tuning.trials[1].sha256
    assert site.wait(timeout=60) == 2
    assert "still serves the finished plan" in site.errors and tuning.trials[0].sha256 in site.errors


def test_a_coordinator_killed_in_the_second_trial_resumes_it_and_keeps_the_first(tmp_path, ca_dir, cluster_factory):
    """SIGKILL after trial 2's first tree: the restarted coordinator does not rerun trial 1 (its result.json) and
    resumes trial 2 from its checkpoint; trial 1's model is the centralised engine's, and no site's lifetime ε
    exceeds the tuning's total (a round the kill interrupted is retried and charged again, so trial 2 may have
    trees a site sat out: the gate's rule, tests/federation/test_processes.py)."""
    from fedsbdt.common.federation.pki import ca_server

    schema, raw = abalone_with_ids(600)
    ids = make_identities(tmp_path, SITES, ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    data = write_splits(raw.iloc[:450], SITES, tmp_path / "data")
    held = write_splits(raw.iloc[450:], SITES, tmp_path / "held-out")
    tuning = tuning_for(schema, ids, Hyperparameters(trees=12, depth=2, seed=9, epsilon=2.0),
                        randomness="insecure-test", test_seed=4, test_noise=False)
    tuning.save(tmp_path / "tune.toml")
    c = cluster_factory(tmp_path / "tune.toml")
    first = c.coordinator("--status-port", "0")
    page = c.wait_event(lambda ev: ev.get("_proc") == "coordinator" and ev.get("event") == "status_page", timeout=60)
    sites = [c.site(s, data[s], "--allow-insecure-test-randomness", "--eval-data", str(held[s]), "--max-eval-epsilon",
                    "0.2", *(["--status-port", "0"] if s == SITES[0] else [])) for s in SITES]
    site_page = c.wait_event(lambda ev: ev.get("_proc") == SITES[0] and ev.get("event") == "status_page", timeout=60)
    c.wait_event(lambda ev: ev.get("_proc") == "coordinator" and ev.get("event") == "tuning_trial"
                 and ev.get("trial") == 2, timeout=120)
    mark = c.mark()
    c.wait_event(lambda ev: ev.get("_proc") == "coordinator" and ev.get("event") == "tree", timeout=120, after=mark)
    for url in (page["url"], site_page["url"]):  # one page, one port each: trial 1's, now showing trial 2
        status = status_json(url)
        assert status["tuning"] == {"trial": 2, "trials": 2} and status["plan_sha256"] == tuning.trials[1].sha256
        assert status["trees_total"] == 12
    first.kill()
    assert (tmp_path / "coordinator" / "trial-1" / "result.json").exists()
    trial1 = (tmp_path / "coordinator" / "trial-1" / "model.json").read_bytes()
    second = c.coordinator()
    assert second.wait(timeout=180) == 0, second.errors
    for p in sites:
        assert p.wait() == 0, p.errors
    assert (tmp_path / "coordinator" / "trial-1" / "model.json").read_bytes() == trial1  # not trained again
    assert not any(ev.get("_proc") == "coordinator" and ev.get("event") == "tuning_trial" and ev.get("trial") == 1
                   for ev in c.events[mark:])
    receipt = json.loads((tmp_path / "coordinator" / "tuning.json").read_text())
    assert [t["trial"] for t in receipt["trials"]] == [1, 2]
    _, res = central_training(tmp_path, schema, raw.iloc[:450], tuning.trials[0].hyperparameters, seed=4)
    assert_same_trees(json.loads(trial1), res.model)
    assert len(json.loads((tmp_path / "coordinator" / "trial-2" / "model.json").read_text())["trees"]) == 12
    for p in sites:
        assert p.result()["trials"][-1]["lifetime"]["train"]["epsilon"] <= tuning.stated_epsilon * (1 + 1e-6)
