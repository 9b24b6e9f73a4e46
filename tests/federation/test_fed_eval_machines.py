"""Federated evaluation in the transport-free state machines (server.session, client.site): the eval round.

The in-process transport of inproc.py; abalone with record ids, three sites, each with a held-out file.
"""
from __future__ import annotations

import numpy as np
import pytest

from common.config import Hyperparameters
from common.data import load
from common.fed_eval import exact_metrics
from common.federation.release import build_model
from common.federation.wire import Purpose, RoundStartMsg
from common.secagg import RoundStart

from .conftest import abalone_with_ids, write_splits
from .test_state_machines import SITES, Fed

HP = Hyperparameters(trees=4, depth=2, seed=5, epsilon=1.0)


class EvalFed(Fed):
    """Fed whose sites each hold a held-out file (the rows after the training sample)."""

    def __init__(self, tmp_path, hp=HP, eval_epsilon=0.1, held_out=True, site_opts=None, **session):
        self.eval_paths = {}
        if held_out:
            schema, raw = abalone_with_ids(900)
            self.eval_paths = write_splits(raw.iloc[240:], SITES, tmp_path / "held-out")
        self.site_opts = site_opts or {}
        super().__init__(tmp_path, hp, eval_epsilon=eval_epsilon, **session)

    def options(self, **opts):
        return super().options(**({"eval_data": None} | self.site_opts) | opts)

    def machine(self, s):
        self.site_opts = self.site_opts | {"eval_data": self.eval_paths.get(s)}
        return super().machine(s)

    def pooled(self):
        ys, preds = [], []
        model = build_model(self.plan, self.session.init, self.session.trees)
        for p in self.eval_paths.values():
            ds = load(p, self.plan.schema)
            ys.append(ds.y)
            preds.append(model.predict(ds.X))
        return exact_metrics(self.plan.eval_spec, np.concatenate(ys), np.concatenate(preds))


def test_noiseless_federated_evaluation_equals_pooled(tmp_path):
    f = EvalFed(tmp_path, test_noise=False).start()
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
