"""Federated evaluation with real processes: ``fedsbdt coordinator`` + three ``fedsbdt client`` over mutual TLS."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.fed_eval import exact_metrics
from fedsbdt.common.model import Ensemble

from .conftest import tls_session_files, write_splits
from .test_missing_federation import schema_and_rows
from .test_processes import SITES, setup_federation


def held_out_files(tmp_path, n_rows=600, extra=300):
    from .conftest import abalone_with_ids

    _, raw = abalone_with_ids(n_rows + extra)
    return write_splits(raw.iloc[n_rows:], SITES, tmp_path / "held-out")


def pooled(plan, model, files):
    ds = [load(p, plan.schema) for p in files.values()]
    return exact_metrics(plan.eval_spec, np.concatenate([d.y for d in ds]),
                         model.predict(np.concatenate([d.X for d in ds])))


def test_three_sites_train_then_evaluate_and_release_only_the_aggregate_metrics(tmp_path, ca_dir, cluster_factory):
    """Training and held-out files with missing values (``?`` and empty fields, test_missing_federation.py)."""
    hp = Hyperparameters(trees=6, depth=2, seed=21, epsilon=1.0)
    schema, raw = schema_and_rows(900)
    files = tls_session_files(tmp_path, ca_dir, schema, raw.iloc[:600], hp, held_out=raw.iloc[600:],
                              randomness="insecure-test", test_seed=2, test_noise=False, eval_epsilon=0.2,
                              eval_bins=10)
    plan, data, held = files.plan, files.data, files.held
    assert sum(np.isnan(load(p, schema).X).sum() for p in held.values()) > 100
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    sites = {s: c.site(s, data[s], "--allow-insecure-test-randomness", "--eval-data", str(held[s]),
                       "--max-eval-epsilon", "0.2") for s in SITES}
    assert coord.wait() == 0, coord.errors
    out = coord.result()
    ev = out["evaluation"]
    assert ev["epsilon_eval"] == 0.2 and ev["training_epsilon"] == out["epsilon"]  # shown separately
    assert sorted(ev["sites"]) == SITES and ev["model_sha256"] == out["model_sha256"]
    receipt = json.loads((tmp_path / "coordinator" / "evaluation.json").read_text())
    assert receipt == ev
    model = Ensemble.load(tmp_path / "coordinator" / "model.json")
    assert model.privacy["evaluation"]["epsilon"] == 0.2 and model.privacy["epsilon"] == out["epsilon"]
    ref = pooled(plan, model, held)  # noise off (test randomness): the pooled metric, within resolution
    res = plan.eval_spec.resolution(np.zeros(plan.eval_spec.length))
    assert ev["metrics"]["n"] == ref["n"] == 300
    assert abs(ev["metrics"]["mae"] - ref["mae"]) <= res["mae"]
    assert abs(ev["metrics"]["rmse"] ** 2 - ref["rmse"] ** 2) <= res["mse"]
    # each released metric with its 95 % interval for the privacy noise (public scale, 3 summed shares)
    assert ev["interval_level"] == 0.95 and set(ev["intervals"]) == {"n", "rmse", "mae"}
    assert all(lo <= ev["metrics"][k] <= hi for k, (lo, hi) in ev["intervals"].items())
    half = 1.96 * np.sqrt(3 * plan.eval_bins) * plan.eval_spec.noise_scales()[0]
    assert ev["intervals"]["n"] == pytest.approx([max(300 - half, 0.0), 300 + half], rel=1e-3)
    for s, p in sites.items():
        assert p.wait() == 0, p.errors
        r = p.result()
        assert r["evaluation"]["epsilon_eval"] == 0.2 and r["evaluation"]["records"] == 100
        assert r["epsilon"] == out["epsilon"] and r["model_sha256"] == out["model_sha256"]
        assert r["epsilon_total"] == out["epsilon_total"] == pytest.approx(out["epsilon"] + 0.2)
        # the released metrics reach every site (over gRPC, with Finished): it writes the coordinator's receipt
        assert r["evaluation_released"] == ev
        (written,) = (tmp_path / s).glob("model-*.evaluation.json")  # beside the plan-named model
        assert json.loads(written.read_text()) == receipt
        logged = [e for e in c.events if e.get("_proc") == s and e.get("event") == "evaluation_released"]
        assert len(logged) == 1 and logged[0]["evaluation"] == ev
    # the report shows ε_eval in a section of its own, apart from the training ε, with the released metrics
    from fedsbdt.common.report import ReportError, write_report

    html = tmp_path / "report.html"
    summary = write_report(tmp_path / "coordinator" / "model.json", html,
                           evaluation_path=tmp_path / "coordinator" / "evaluation.json")
    assert "evaluation" in summary.sections and summary.epsilon == out["epsilon"]
    text = html.read_text()
    assert "ε_eval = 0.2" in text and "Federated evaluation" in text and f"{ev['metrics']['rmse']:.6g}" in text
    lo, hi = ev["intervals"]["rmse"]
    assert f"95 % interval {lo:.4g} – {hi:.4g}" in text
    other = tmp_path / "other.json"
    other.write_text(json.dumps(receipt | {"model_sha256": "0" * 64}))

    with pytest.raises(ReportError, match="another model"):
        write_report(tmp_path / "coordinator" / "model.json", html, evaluation_path=other)
    # the coordinator's log carries the aggregate metrics only: no site's own vector
    rel = [e for e in c.events if e.get("_proc") == "coordinator" and e.get("event") == "evaluation"]
    assert len(rel) == 1 and set(rel[0]["evaluation"]) >= {"metrics", "epsilon_eval", "sites"}


def test_an_existing_model_is_evaluated_federatedly_with_real_noise(tmp_path, ca_dir, cluster_factory):
    """``fedsbdt train`` → ``fedsbdt plan --evaluate-model`` → coordinator ``--model`` + sites with only --eval-data."""
    from .processes import Proc

    hp = Hyperparameters(trees=5, depth=2, seed=4, epsilon=1.0)
    plan, schema, raw, data = setup_federation(tmp_path, ca_dir, hp)
    held = held_out_files(tmp_path, extra=600)
    union = tmp_path / "train.csv"
    raw.to_csv(union, index=False)
    schema_file = tmp_path / "schema.toml"
    from fedsbdt.common.federation.toml_writer import dumps

    schema_file.write_text(dumps(schema.to_dict()))
    c = cluster_factory(tmp_path / "eval-plan.toml")
    model_file = tmp_path / "central.json"
    tr = Proc(c, "train", ["train", "--data", str(union), "--schema", str(schema_file), "--out", str(model_file),
                           "--trees", "5", "--depth", "2", "--seed", "4", "--json"])
    assert tr.wait() == 0, tr.errors
    sites_flags = []
    for s in SITES:
        sites_flags += ["--site", f"{s}={tmp_path / s / 'identity.pub'}"]
    mk = Proc(c, "plan", ["plan", "--evaluate-model", str(model_file), "--eval-epsilon", "1", *sites_flags,
                          "--max-records", "10000", "--out", str(tmp_path / "eval-plan.toml"), "--json"])
    assert mk.wait() == 0, mk.errors
    assert mk.result()["epsilon_eval"] == 1.0
    from fedsbdt.common.federation.plan import Plan

    eplan = Plan.load(tmp_path / "eval-plan.toml")
    coord = c.coordinator("--model", str(model_file))
    sites = {s: c.site(s, held[s], "--eval-data", str(held[s])) for s in SITES[:2]}
    s3 = SITES[2]  # this one has no training data at all: --eval-data only
    third = Proc(c, s3, ["client", "--coordinator", c.address, "--site", s3, "--state", str(tmp_path / s3),
                         "--plan", str(tmp_path / "eval-plan.toml"), "--eval-data", str(held[s3]), "--json",
                         "--reconnect-timeout", "60"])
    c.procs.append(third)
    assert coord.wait() == 0, coord.errors
    for p in [*sites.values(), third]:
        assert p.wait() == 0, p.errors
        assert p.result()["tree_contributions"] == 0  # nothing trained
    ev = coord.result()["evaluation"]
    model = Ensemble.load(model_file)
    ref = pooled(eplan, model, held)
    spec = eplan.eval_spec
    # real noise: every site adds a full share; n is the sum of B noisy counts over 3 sites (5σ)
    sd_n = math.sqrt(3 * spec.bins) * spec.noise_scales()[0]
    assert abs(ev["metrics"]["n"] - ref["n"]) <= 5 * sd_n + 1
    assert ev["metrics"]["n"] != ref["n"] or ev["metrics"]["mae"] != ref["mae"]  # the noise is really there
    assert 0 <= ev["metrics"]["mae"] <= 7 and ev["sigma_eval"] == spec.sigma
