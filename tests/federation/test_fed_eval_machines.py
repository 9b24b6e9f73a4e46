"""Federated evaluation in the transport-free state machines (fedsbdt.server.session, fedsbdt.client.site): the eval round.

The in-process transport of inproc.py; abalone with record ids, three sites, each with a held-out file.
"""
from __future__ import annotations

import numpy as np
import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.fed_eval import exact_metrics
from fedsbdt.common.federation.release import build_model, model_content_sha256, model_sha256, released_from_model
from fedsbdt.server.session import Session
from fedsbdt.client.evaluation import check_request
from fedsbdt.client.site import NeedCatchUp, SiteMachine, SiteRefusal
from fedsbdt.common.federation.plan import make_plan
from fedsbdt.common.federation.wire import InputReply, Purpose, Refusal, RoundStartMsg
from fedsbdt.common.secagg import RoundStart, decode_message

from .conftest import abalone_with_ids, write_splits
from .test_state_machines import SITES, Fed

HP = Hyperparameters(trees=4, depth=2, seed=5, epsilon=1.0)


class EvalFed(Fed):
    """Fed whose sites each hold a held-out file (the rows after the training sample).

    With ``model`` (an existing model), the plan only evaluates it: the session starts with its trees
    released and the sites have no training data (``--eval-data`` only).  ``held_out_rows``: other held-out rows.
    """

    def __init__(self, tmp_path, hp=HP, eval_epsilon=0.1, held_out=True, model=None, held_out_rows=None, **session):
        self.eval_paths = {}
        if held_out:
            rows = abalone_with_ids(900)[1].iloc[240:] if held_out_rows is None else held_out_rows
            self.eval_paths = write_splits(rows, SITES, tmp_path / "held-out")
        self.existing = model
        if model is not None:
            session["eval_model_sha256"] = model_sha256(model)
            session["eval_model_content_sha256"] = model_content_sha256(model)
        super().__init__(tmp_path, hp, eval_epsilon=eval_epsilon, **session)

    def new_session(self):
        if self.existing is None:
            return super().new_session()
        released = released_from_model(self.plan, self.existing, model_sha256(self.existing))
        return Session(self.plan, self.plan.make_randomness(True), self.clock.now, released=released)

    def options(self, **opts):
        return super().options(**{"eval_data": None} | opts)

    def machine(self, s):
        data = None if self.existing is not None else self.paths[s]
        m = SiteMachine(s, self.keys[s], data, self.tmp / f"state-{s}", self.options(eval_data=self.eval_paths.get(s)))
        m.accept_plan(self.plan.canonical_json, self.plan.sha256)
        return m

    def pooled(self):
        ys, preds = [], []
        model = build_model(self.plan, self.session.init, self.session.trees)
        for p in self.eval_paths.values():
            ds = load(p, self.plan.schema)
            ys.append(ds.y)
            preds.append(model.predict(ds.X))
        return exact_metrics(self.plan.eval_spec, np.concatenate(ys), np.concatenate(preds))


@pytest.mark.parametrize("noise", ["distributed", "central"])
def test_noiseless_federated_evaluation_equals_pooled(tmp_path, noise):
    f = EvalFed(tmp_path, test_noise=False, noise=noise).start()
    f.fed.run()
    assert f.session.exit_code == 0, f.session.stage
    ev = f.session.evaluation
    pooled = f.pooled()
    m = ev["metrics"]
    assert m["n"] == pooled["n"] == 660
    res = f.plan.eval_spec.resolution(np.zeros(f.plan.eval_spec.length))
    assert abs(m["mae"] - pooled["mae"]) <= res["mae"]
    assert abs(m["rmse"] ** 2 - pooled["rmse"] ** 2) <= res["mse"]
    assert ev["epsilon_eval"] == 0.1 and ev["training_epsilon"] == pytest.approx(1.0)
    assert sorted(ev["sites"]) == SITES
    for s in SITES:
        charge = f.machines[s].ledger.eval_charge()
        assert charge["epsilon_eval"] == 0.1 and charge["records"] == 220


def _eval_start(f: Fed, site: str, vector_len: int, offset: int = 1) -> RoundStartMsg:
    """A structurally valid evaluation RoundStart for the site's current epoch and a fresh round slot."""
    ep = f.session.coord.epoch(min(f.session.coord.ready_epochs()))
    r = (f.machines[site].secagg._wm.max_round or 0) + offset
    start = RoundStart(f.session.coord.config.digest, ep.epoch, r, vector_len, tuple(SITES))
    return RoundStartMsg(Purpose.EVAL, 0, start.to_bytes())


def test_site_refuses_evaluation_requests_its_plan_does_not_allow(tmp_path):
    # a plan without [evaluation]: an evaluation request is refused, whatever it looks like
    g = EvalFed(tmp_path / "b", eval_epsilon=0.5).start()
    no_eval = make_plan(g.schema, HP, list(g.plan.sites), max_records_per_site=10_000)
    assert "declares no federated evaluation" in check_request(no_eval, 22, HP.total_rounds, True)
    # a plan with one: a request of another vector length, or before the last tree, is refused
    g.fed.run(until=lambda: g.machines["hosp-a"].trees_applied == 2)
    m = g.machines["hosp-a"]
    with pytest.raises(NeedCatchUp):  # before the last tree: fetch the released trees first
        m.handle(_eval_start(g, "hosp-a", g.plan.eval_spec.length))
    g.fed.run(until=lambda: all(x.trees_applied == HP.total_rounds for x in g.machines.values()))
    out = m.handle(_eval_start(g, "hosp-a", g.plan.eval_spec.length + 2))
    assert isinstance(out[0], Refusal) and "vector length" in out[0].detail
    assert m.ledger.eval_charge() is None  # nothing charged, nothing stored
    # ε_eval above the site's own limit: refused before joining
    with pytest.raises(SiteRefusal, match="max-eval-epsilon"):
        SiteMachine("hosp-a", g.keys["hosp-a"], g.paths["hosp-a"], tmp_path / "c",
                    g.options(max_eval_epsilon=0.25)).accept_plan(g.plan.canonical_json, g.plan.sha256)
    # a held-out file that does not match the schema: refused with one sentence
    bad = tmp_path / "bad.csv"
    bad.write_text("rid,x\n1,2\n")
    with pytest.raises(SiteRefusal, match="held-out data"):
        SiteMachine("hosp-a", g.keys["hosp-a"], g.paths["hosp-a"], tmp_path / "d",
                    g.options(eval_data=bad)).accept_plan(g.plan.canonical_json, g.plan.sha256)


def test_a_retried_evaluation_resends_the_stored_vector_and_charges_once(tmp_path):
    f = EvalFed(tmp_path, eval_epsilon=0.3, test_noise=True).start()
    f.fed.run(until=lambda: f.machines["hosp-a"].trees_applied == HP.total_rounds)
    m = f.machines["hosp-a"]
    sent, draws = [], []
    draw = m.randomness.discrete_gaussian
    m.randomness.discrete_gaussian = lambda scales: draws.append(len(scales)) or draw(scales)  # a spy
    for offset in (1, 2):  # two attempts of the evaluation round (the first one failed somewhere)
        out = m.handle(_eval_start(f, "hosp-a", f.plan.eval_spec.length, offset=1))
        assert isinstance(out[0], InputReply)
        sent.append(m.ledger.eval_vector())
        if offset == 1:
            first = decode_message(out[0].secagg).round_id
    (x1, n1), (x2, n2) = sent
    assert np.array_equal(x1, x2) and np.array_equal(n1, n2) and np.any(n1 != 0)  # identical vector and noise
    assert draws == [f.plan.eval_spec.length]  # noise was drawn for the first attempt only: the retry resent it
    assert int(x1[: f.plan.eval_spec.bins].sum()) == 220  # the held-out records, in the residual histogram
    assert m.ledger.eval_charge()["round_id"] == first  # one ε_eval release, charged at the first attempt
    assert m.ledger.tree_contributions() == HP.total_rounds  # the training ledger is untouched by evaluation


def test_an_existing_model_is_evaluated_without_training(tmp_path):
    from fedsbdt.common.engine import train
    from fedsbdt.common.randomness import InsecureTestRandomness

    schema, raw = abalone_with_ids(900)
    train_file = tmp_path / "train.csv"
    raw.iloc[:300].to_csv(train_file, index=False)
    rnd = InsecureTestRandomness(seed=1, noise=False, i_understand_this_is_insecure=True)
    model = train(load(train_file, schema), HP, rnd).model
    g = EvalFed(tmp_path / "fed", eval_epsilon=1.0, test_noise=False, model=model)  # sites: --eval-data only
    plan = g.plan
    with pytest.raises(ValueError, match="pins"):
        released_from_model(plan, model, "0" * 64)
    with pytest.raises(ValueError, match="splits"):
        other = train(load(train_file, schema), HP.replace(seed=6), rnd).model
        released_from_model(plan, other.__class__(other.schema, HP, other.init_score, other.trees), plan.eval_model_sha256)
    g.start().fed.run()
    assert g.session.exit_code == 0
    pooled = exact_metrics(plan.eval_spec, *_pooled_arrays(g, model))
    assert g.session.evaluation["metrics"]["n"] == pooled["n"]
    assert abs(g.session.evaluation["metrics"]["mae"] - pooled["mae"]) <= plan.eval_spec.resolution(
        np.zeros(plan.eval_spec.length))["mae"]
    for m in g.machines.values():
        assert m.ledger.tree_contributions() == 0 and not any(m.ledger.all_spent().values())  # nothing trained


def _pooled_arrays(g, model):
    ds = [load(p, g.plan.schema) for p in g.eval_paths.values()]
    return np.concatenate([d.y for d in ds]), model.predict(np.concatenate([d.X for d in ds]))


def test_the_evaluation_section_of_a_plan():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedsbdt.common.federation.plan import Plan, PlanError, SiteEntry

    schema, _ = abalone_with_ids(10)
    sites = [SiteEntry(s, Ed25519PrivateKey.generate().public_key().public_bytes_raw()) for s in SITES]
    plain = make_plan(schema, HP, sites)
    plan = make_plan(schema, HP, sites, eval_epsilon=0.25)
    assert "evaluation" not in plain.to_dict() and plain.eval_spec is None  # plans without it are unchanged
    d = plan.to_dict()
    assert d["evaluation"] == {"epsilon": 0.25, "bins": 20}
    assert Plan.from_toml(plan.to_toml()).sha256 == plan.sha256  # part of the plan hash every site pins
    assert plan.sha256 != Plan.from_dict(d | {"evaluation": {"epsilon": 0.5, "bins": 20}}).sha256
    # secure aggregation is sized for the evaluation vector and its noise share
    cfg = plan.secagg_config()
    assert cfg.max_vector_len >= plan.eval_spec.length > plain.secagg_config().max_vector_len
    assert cfg.noise_sigma_units >= plan.eval_spec.noise_scales().max()
    for bad, msg in (({"bins": 20}, "epsilon"), ({"epsilon": 0.1, "colour": 1}, "unknown key"),
                     ({"epsilon": 0.1, "bins": 3}, "even integer"), ({"epsilon": -1}, "evaluation.epsilon"),
                     ({"epsilon": 0.1, "model_sha256": "xyz"}, "model_sha256"),
                     ({"epsilon": 0.1, "residual_clip": 0}, "residual_clip")):
        with pytest.raises(PlanError, match=msg):
            Plan.from_dict(d | {"evaluation": bad})


@pytest.mark.parametrize("noise", ["distributed", "central"])
def test_noiseless_multiclass_federated_evaluation_equals_pooled(tmp_path, noise):
    """Wine (3 classes): K class trees per round, then the evaluation round of the multi-class vector."""
    from .test_multiclass_federation import wine_with_ids

    schema, raw = wine_with_ids()
    f = EvalFed(tmp_path, Hyperparameters(trees=2, depth=2, seed=5, epsilon=2.0), eval_epsilon=0.2,
                held_out_rows=raw.iloc[120:], data=(schema, raw.iloc[:120]), test_noise=False, noise=noise,
                eval_bins=10)
    f.start()
    f.fed.run()
    assert f.session.exit_code == 0, f.session.stage
    spec = f.plan.eval_spec
    assert spec.task == "multiclass" and spec.length == 2 * 3 * 10 + 9 + 1
    m, pooled = f.session.evaluation["metrics"], f.pooled()
    assert m["n"] == pooled["n"] == len(raw) - 120
    assert m["accuracy"] == pooled["accuracy"]
    model = build_model(f.plan, f.session.init, f.session.trees)
    total = sum(spec.histogram(d.y, model.predict(d.X)) for d in (load(p, schema) for p in f.eval_paths.values()))
    assert m["confusion"] == spec.metrics(total)["confusion"]  # the released sum is the sites' exact sum
    res = spec.resolution(total)
    assert abs(m["macro_auc"] - pooled["macro_auc"]) <= res["macro_auc"] + 1e-12
    assert abs(m["logloss"] - pooled["logloss"]) <= res["logloss"]
    for s in SITES:
        assert f.machines[s].ledger.eval_charge()["records"] in (19, 20)


def test_every_site_gets_the_released_metrics_and_writes_the_coordinators_receipt(tmp_path):
    """The sites see the released evaluation: Finished carries the noisy sum and its sites, and every site
    recomputes the coordinator's receipt from it (post-processing), logs it and writes it next to its
    model (model-<plan>.evaluation.json) — the very receipt the coordinator publishes."""
    import json

    f = EvalFed(tmp_path, eval_epsilon=0.5, test_noise=True).start()
    f.fed.run()
    assert f.session.exit_code == 0, f.session.stage
    ev = f.session.evaluation
    assert "metrics" in ev and len(ev["sum"]) == f.plan.eval_spec.length
    assert ev["too_wide"] == f.plan.eval_spec.too_wide(ev["intervals"])
    sha = model_sha256(build_model(f.plan, f.session.init, f.session.trees))
    for s in SITES:
        m = f.machines[s]
        assert m.evaluation_released == ev | {"model_sha256": sha}
        written = json.loads(m.stage.model_path.with_suffix(".evaluation.json").read_text())
        assert written == ev | {"model_sha256": sha}


TOTAL = "ε = 1 (training records) + ε_eval = 0.5 (held-out records) = 1.5 in total"


def test_the_total_budget_a_site_accepts_is_shown_wherever_the_plans_epsilon_is(tmp_path, caplog, capsys):
    """A site accepts ε + ε_eval (its --max-epsilon caps the sum): the plan summary, the site's log, both status
    pages and the report show that total, not the training ε alone."""
    import json
    import logging

    from fedsbdt.client.status import SiteMonitor
    from fedsbdt.cli import main
    from fedsbdt.common.report import write_report
    from fedsbdt.server.status import CoordinatorMonitor

    caplog.set_level(logging.INFO)
    f = EvalFed(tmp_path, eval_epsilon=0.5)
    assert f.plan.total_epsilon == pytest.approx(1.5) and f.plan.budget_text().startswith(TOTAL)
    accepted = [r.getMessage() for r in caplog.records if "accepted plan" in r.getMessage()]
    assert len(accepted) == 3 and all(TOTAL in m for m in accepted)
    f.start()
    f.fed.run()
    mon = CoordinatorMonitor(f.session)
    mon._take_snapshot(0.0)
    assert mon.current()["epsilon"]["total"] == pytest.approx(1.5) and mon.current()["epsilon"]["eval"] == 0.5
    site = SiteMonitor(f.machines[SITES[0]], max_epsilon=1.5).current()
    assert site["epsilon"]["total"] == pytest.approx(1.5) and site["epsilon"]["eval"] == 0.5
    # the plan command's summary
    keys = [f"--site=s{i}={bytes([i + 1]).hex() * 32}" for i in range(3)]
    from .conftest import EXAMPLES

    assert main(["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), *keys, "--settings", "paper", "--trees", "4",
                 "--eval-epsilon", "0.5", "--out", str(tmp_path / "p.toml")]) == 0
    assert f"privacy budget: {TOTAL}" in capsys.readouterr().out
    # the report of the released model
    model = tmp_path / "model.json"
    model.write_bytes(f.session.model_json)
    write_report(model, tmp_path / "report.html")
    assert "In total ε + ε_eval = 1.5</strong>" in (tmp_path / "report.html").read_text()
