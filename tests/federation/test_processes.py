"""Whole federations as separate processes on loopback, with mutual TLS (``fedsbdt coordinator`` + ``client``).

Tests wait for events in the processes' JSON logs (a tree released, a site
joined), never for fixed times.  The basic session (the filter, every way a
site pins its plan and schema, a model equal to the centralised engine's) runs
on files with missing values in test_missing_federation.py.
"""
from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from fedsbdt.client.ledger import ledger_path
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.engine import calibration_for, filter_for
from fedsbdt.common.federation.pki import ca_init, ca_sign

from .conftest import (EXAMPLES, ROOT, SITES, abalone_with_ids, make_identities, make_test_plan, models_identical,
                       tls_session_files, tree_event)


def setup_federation(tmp_path, ca_dir, hp, n_rows=600, **session):
    schema, raw = abalone_with_ids(n_rows)
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, SITES, **session)
    return files.plan, schema, raw, files.data


def test_site_and_coordinator_crashes_are_survived_without_exceeding_any_budget(tmp_path, ca_dir, cluster_factory):
    hp = Hyperparameters(trees=30, extra_trees=10, filter=True, depth=2, seed=3, epsilon=1.0, subsample=0.5)
    plan, schema, raw, data = setup_federation(tmp_path, ca_dir, hp, n_rows=450, epoch_rounds=8)
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    sites = {s: c.site(s, data[s]) for s in SITES}
    c.wait_event(tree_event(min_tree=2))
    # 1. a site dies mid-training (n − t = 1 slack): training goes on without it
    sites["hospital-3"].kill()
    mark = c.mark()
    c.wait_event(tree_event(sites=["hospital-1", "hospital-2"]), after=mark)
    # 2. a second site dies: fewer than t remain, nothing more can be released — then the coordinator dies too
    sites["hospital-2"].kill()
    mark = c.mark()
    coord.kill()
    coord.wait()  # all of its log lines are read
    released_before = max(e["tree"] for e in c.events if e.get("event") == "tree")
    # 3. everything comes back: the coordinator resumes from its checkpoint, both sites rejoin
    coord = c.coordinator()
    sites["hospital-2"] = c.site("hospital-2", data["hospital-2"])
    sites["hospital-3"] = c.site("hospital-3", data["hospital-3"])
    resumed = c.wait_event(lambda e: e.get("event") == "resumed", after=mark)
    assert resumed["trees_released"] >= released_before + 1  # a tree may be committed before its log line
    c.wait_event(tree_event(sites=SITES), after=mark)  # the restarted sites take part again
    assert coord.wait() == 0, coord.errors
    for s, p in sites.items():
        assert p.wait() == 0, p.errors
    model = json.loads(models_identical(tmp_path, SITES))
    rounds = model["training"]["rounds"]
    assert [r["tree"] for r in rounds] == list(range(hp.total_rounds))
    assert ["hospital-1", "hospital-2"] in [r["sites"] for r in rounds]
    # no record's Rényi ledger exceeds its budget, read from each site's SQLite database
    budget = filter_for(hp, calibration_for(hp)).budget_units
    for s in SITES:
        db = sqlite3.connect(ledger_path(tmp_path / s, plan.sha256))
        spent = np.array([r[0] for r in db.execute("SELECT spent FROM ledger")])
        assert len(spent) == len(raw.iloc[SITES.index(s)::3]) and spent.max() <= budget
        assert spent.max() > 0


def test_refusals_are_clear_and_nothing_is_released(tmp_path, ca_dir, cluster_factory):
    hp = Hyperparameters(trees=5, depth=2, seed=4, epsilon=1.0)
    plan, schema, raw, data = setup_federation(tmp_path, ca_dir, hp, n_rows=150)
    # a site whose certificate comes from another CA
    other = tmp_path / "other-ca"
    ca_init(other, days=2)
    ca_sign(other, tmp_path / "hospital-2" / "tls.csr", tmp_path / "rogue.crt", days=2)
    # a site that is not in the roster (certificate from the consortium CA, though)
    make_identities(tmp_path, ["intruder"], ca_dir)
    c = cluster_factory(tmp_path / "plan.toml")
    coord = c.coordinator()
    good = c.site("hospital-1", data["hospital-1"])
    h3 = data["hospital-3"]
    keys = tmp_path / "hospital-3"
    h3_keys = ["--identity-key", str(keys / "identity.key"), "--tls-cert", str(keys / "tls.crt"),
               "--tls-key", str(keys / "tls.key"), "--tls-ca", str(keys / "ca.crt")]

    def h3_site(case: str, *flags: str):  # one --state each: a state directory holds one client at a time
        return c.site("hospital-3", h3, *flags, *h3_keys, state=tmp_path / f"hospital-3-{case}")

    bad = {
        "other CA": c.site("hospital-2", data["hospital-2"], "--tls-cert", str(tmp_path / "rogue.crt")),
        "unknown site": c.site("intruder", h3),
        "plan hash": h3_site("hash", "--plan-hash", "ab" * 32),
        "epsilon cap": h3_site("cap", "--max-epsilon", "0.5"),
        "schema": h3_site("schema", "--schema", str(EXAMPLES / "abalone" / "schema.toml")),
    }
    expected = {
        "other CA": "rejected this site's certificate",
        "unknown site": "not in the plan's roster",
        "plan hash": "plan hash mismatch",
        "epsilon cap": "exceeds this site's limit --max-epsilon 0.5",
        "schema": "schema mismatch",
    }
    for what, p in bad.items():
        assert p.wait(timeout=120) == 2, what
        assert expected[what] in p.errors, (what, p.errors)
        assert "Traceback" not in "".join(p.lines)
        # gRPC's C-core lines ("E1127 12:00:00.1 … ssl_transport_security.cc:…") are off by default
        assert not [ln for ln in p.lines if re.match(r"[DIWEF]\d{4} \d\d:\d\d", ln)], (what, p.lines)
    c.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "connected")
    status = subprocess.run([sys.executable, "-c", STATUS, str(c.port), str(tmp_path / "hospital-1")],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    st = json.loads(status.stdout)
    assert st["trees_released"] == 0 and st["stage"] == "gathering"
    assert [s["connected"] for s in st["sites"]] == [True, False, False]
    assert not any(e.get("event") in ("tree", "init") for e in c.events)
    coord.p.terminate()  # SIGTERM: a clean stop
    assert coord.wait() == 130
    assert not (tmp_path / "coordinator" / "model.json").exists()
    good.kill()


STATUS = """
import json, sys, grpc
from pathlib import Path
from fedsbdt.proto.v1 import federation_pb2 as pb, federation_pb2_grpc as pbg
from fedsbdt.common.federation.pki import TlsFiles, channel_credentials
ch = grpc.secure_channel(f"localhost:{sys.argv[1]}", channel_credentials(TlsFiles.in_dir(Path(sys.argv[2]))))
st = pbg.FederationStub(ch).GetStatus(pb.GetStatusRequest(), timeout=20)
print(json.dumps({"stage": st.stage, "trees_released": st.trees_released,
                  "sites": [{"site": s.site_id, "connected": s.connected} for s in st.sites]}))
"""


def test_demo_runs_a_whole_federation_and_prints_one_json_object():
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "demo", "--sites", "3", "--trees", "6", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert set(out) == {"n", "rmse", "epsilon", "delta", "sites", "trees", "dataset", "rows", "dropped",
                        "model_sha256", "seconds", "federated", "epsilon_total", "settings", "hyperparameters"}
    assert out["settings"] == "auto" and out["epsilon_total"] == pytest.approx(out["epsilon"] + 1.0)  # ε_eval 1
    fed = out["federated"]  # the held-out metric, evaluated federatedly (docs/federated-evaluation.md)
    assert fed["epsilon_eval"] == 1.0 and fed["training_epsilon"] == out["epsilon"] and len(fed["sites"]) == 3
    assert fed["model_sha256"] == out["model_sha256"] and 0 < fed["metrics"]["rmse"] <= 7.0
    assert out["sites"] == 3 and out["epsilon"] <= 1.0 and 1.0 < out["rmse"] < 5.0
    assert out["delta"] == 5e-8 and out["trees"] == 6 and out["dataset"] == "abalone"
    assert out["rows"] + out["n"] == 4177 and out["dropped"] == 0 and len(out["model_sha256"]) == 64


def test_coordinator_refuses_a_plan_whose_noise_does_not_match_its_claim(tmp_path):
    from fedsbdt.common.federation.plan import Plan

    schema, _ = abalone_with_ids(30)
    ids = make_identities(tmp_path, SITES)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=5, depth=2, seed=1))
    text = plan.to_toml().replace(f"sigma = {plan.stated_sigma!r}", f"sigma = {plan.stated_sigma / 2!r}")
    assert Plan.from_toml(text).stated_sigma == plan.stated_sigma / 2
    (tmp_path / "plan.toml").write_text(text)
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "coordinator", "--plan", str(tmp_path / "plan.toml"),
                        "--insecure", "--listen", "127.0.0.1:0", "--state", str(tmp_path / "state")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "states σ" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "state" / "coordinator.sqlite").exists()
