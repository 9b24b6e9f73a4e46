"""Multi-class training on missing values, then federated evaluation, in the in-process state machines.

The wine records with holes (test_combinations_federation.wine_with_holes): 120 training rows dealt to three
sites, the 58 others held out.  With every site in every round the released model is the centralised engine's
on the 120 rows; a site that misses the initial-score round is, by design (a round closes with the t sites that
answered before its deadline), left out of that round's counts and named in the model's training record.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.data import load
from fedsbdt.common.engine import train
from fedsbdt.common.federation.release import build_model, training_record
from fedsbdt.common.federation.wire import Purpose, RoundStartMsg
from fedsbdt.common.multiclass import init_score, init_sums
from fedsbdt.common.randomness import InsecureTestRandomness

from .test_combinations_federation import wine_with_holes
from .test_fed_eval_machines import EvalFed
from .test_state_machines import SEED, SITES

HP = Hyperparameters(trees=2, depth=3, seed=21, epsilon=2.0, subsample=0.5, learning_rate=0.3)


def fed(tmp_path) -> tuple[EvalFed, object]:
    schema, raw = wine_with_holes()
    return EvalFed(tmp_path, hp=HP, data=(schema, raw.iloc[:120]), held_out_rows=raw.iloc[120:], test_noise=False,
                   eval_epsilon=0.2), raw


def test_all_sites_give_the_central_engines_model_on_the_training_rows_and_evaluate_the_held_out_ones(tmp_path):
    f, raw = fed(tmp_path)
    f.start().fed.run()
    assert f.session.exit_code == 0, f.session.stage
    raw.iloc[:120].to_csv(tmp_path / "union.csv", index=False)
    ds = load(tmp_path / "union.csv", f.schema)
    assert np.isnan(ds.X).sum() > 50
    ref = train(ds, HP, InsecureTestRandomness(seed=SEED, noise=False, i_understand_this_is_insecure=True)).model
    model = build_model(f.plan, f.session.init, f.session.trees)
    # every site in every round (the precondition of comparing with the engine on the union of their rows)
    assert model.training["init"]["sites"] == SITES and all(r["sites"] == SITES for r in model.training["rounds"])
    assert len(model.trees) == len(ref.trees) == 3 * HP.trees
    np.testing.assert_array_equal(model.init_score, ref.init_score)
    # every record counts, holes or not: the centred log priors of the 120 labels
    np.testing.assert_array_equal(model.init_score, init_score(np.r_[120, np.bincount(ds.y.astype(int))], 3))
    for t, r in zip(model.trees, ref.trees, strict=True):  # K = 3 class trees per round
        for a in ("features", "thresholds", "leaves", "default_left"):
            np.testing.assert_array_equal(getattr(t, a), getattr(r, a))
    m, pooled = f.session.evaluation["metrics"], f.pooled()
    assert m["n"] == pooled["n"] == len(raw) - 120 and m["accuracy"] == pooled["accuracy"]


def test_a_site_late_for_the_initial_score_round_is_left_out_of_its_counts_and_named(tmp_path):
    f, _ = fed(tmp_path)
    f.fed.intercept = lambda sid, ev: not (sid == "hosp-b" and isinstance(ev, RoundStartMsg)
                                           and ev.purpose == Purpose.INIT_SCORE)
    f.start().fed.run()
    assert f.session.exit_code == 0, f.session.stage
    present = [load(f.paths[s], f.schema) for s in ("hosp-a", "hosp-c")]
    counts = sum(init_sums(d.y, np.ones(len(d.y), bool), 3) for d in present)
    assert counts[0] == 80
    assert f.session.init.sites == ("hosp-a", "hosp-c")
    np.testing.assert_array_equal(f.session.init.value, init_score(counts, 3))
    assert training_record(f.plan, f.session.init, f.session.trees)["init"]["sites"] == ["hosp-a", "hosp-c"]
