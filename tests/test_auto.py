"""The ``auto`` settings (common/auto.py) and ``fedsbdt train --settings`` (docs/auto.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedsbdt.common.auto import (AUTO_KEYS, TABLES, AutoInputs, auto_settings, budget_signal, noise_matched_l2,
                                 resolve, rows_epsilon)
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.schema import Schema

EX = Path(__file__).resolve().parents[1] / "examples"
ABALONE = Schema.load(EX / "abalone" / "schema.toml")
WINE = Schema.load(EX / "wine" / "schema.toml")


def test_every_band_gives_valid_hyperparameters_with_reasons():
    for n in (10, 300, 3_000, 30_000, 300_000, 3_000_000):
        for eps in (0.1, 1.0, 10.0):
            c = auto_settings(AutoInputs.for_schema(ABALONE, eps, 1e-6, n))
            assert set(c.settings) == set(AUTO_KEYS) - {"l2"}  # λ follows the calibrated noise (resolve)
            Hyperparameters.from_dict({**c.settings, "epsilon": eps})  # validates
            assert len(c.reasons) >= 4 and str(round(c.budget, 2)) in c.reasons[0]
            # a cyclical choice says what it cannot fit and how to override it
            assert any("--no-cyclical" in r for r in c.reasons) == c.settings["cyclical"]


def test_the_band_follows_epsilon_times_rows_and_classes_share_it():
    assert budget_signal(1.0, 1000) == pytest.approx(3.0)
    assert budget_signal(10.0, 3000, classes=3) == pytest.approx(4.0)
    # the same ε·n gives the same settings; K classes divide the budget per model
    a = auto_settings(AutoInputs.for_schema(ABALONE, 0.5, 1e-6, 20_000)).settings
    b = auto_settings(AutoInputs.for_schema(ABALONE, 10.0, 1e-6, 1_000)).settings
    assert a == b
    for group, table in TABLES.items():
        edges = [e for e, _ in table]
        assert edges == sorted(edges) and math.isinf(edges[-1])
    # a multi-class schema (wine, K = 3) just below the first classification edge takes the first band
    first_edge, first = TABLES["classification"][0]
    lo = auto_settings(AutoInputs.for_schema(WINE, 1.0, 1e-6, int(10 ** (first_edge - 0.01) * 3))).settings
    assert {k: lo[k] for k in first} == first
    # regression has its own table
    reg = auto_settings(AutoInputs.for_schema(ABALONE, 1.0, 1e-6, 100)).settings
    assert {k: reg[k] for k in TABLES["regression"][0][1]} == TABLES["regression"][0][1]


def test_explicit_keys_override_auto_and_paper_mode_keeps_todays_defaults():
    keys, choice = resolve({"epsilon": 2.0, "trees": 7, "cyclical": True}, ABALONE, 4177)
    hp = Hyperparameters.from_dict(keys)
    assert hp.trees == 7 and hp.cyclical is True and hp.epsilon == 2.0
    assert hp.l2 == noise_matched_l2(hp, "regression") >= 1 and choice.settings["l2"] == hp.l2
    assert resolve({"epsilon": 2.0, "l2": 3.0}, ABALONE, 4177)[0]["l2"] == 3.0
    assert "trees" not in choice.settings and "override" in choice.reasons[-1]
    keys, choice = resolve({"epsilon": 2.0}, ABALONE, 4177, mode="paper")
    assert choice is None and Hyperparameters.from_dict(keys) == Hyperparameters(epsilon=2.0)
    keys, _ = resolve({"tree_builder": "greedy"}, ABALONE, 4177)  # the builder's defaults still apply
    assert Hyperparameters.from_dict(keys).subsample == 1.0


def run_train(tmp_path, *extra):
    from fedsbdt.cli import main
    import contextlib
    import io

    out = tmp_path / "m.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["train", "--data", str(EX / "abalone" / "abalone.data"), "--schema",
                   str(EX / "abalone" / "schema.toml"), "--out", str(out), "--json", "--quiet", *extra])
    return rc, (json.loads(buf.getvalue()) if rc == 0 else None), out


def test_train_auto_counts_rows_privately_and_accounts_it(tmp_path):
    rc, res, out = run_train(tmp_path, "--epsilon", "1", "--trees", "5")
    assert rc == 0
    model = json.loads(out.read_text())
    p = model["privacy"]
    assert p["eps_rows"] == pytest.approx(rows_epsilon(1.0)) and p["epsilon"] <= 1.0
    assert p["epsilon"] == pytest.approx(res["epsilon"]) and p["epsilon"] > p["eps_rows"]
    s = model["training"]["settings"]
    assert s["mode"] == "auto" and s["inputs"]["rows_source"] == "dp-count" and s["reasons"]
    assert res["auto"]["settings"] == s["settings"] and res["hyperparameters"]["trees"] == 5
    assert model["hyperparameters"]["epsilon"] == pytest.approx(1.0 - p["eps_rows"])
    from fedsbdt.common.engine import calibration_for

    trees = calibration_for(Hyperparameters.from_dict(model["hyperparameters"])).epsilon
    assert p["epsilon"] == pytest.approx(trees + p["eps_rows"])  # the count is charged on top of the trees


def test_train_declared_rows_costs_nothing_and_paper_settings_match_todays(tmp_path):
    rc, res, out = run_train(tmp_path, "--epsilon", "1", "--rows", "4177", "--trees", "5")
    model = json.loads(out.read_text())
    assert "eps_rows" not in model["privacy"] and model["training"]["settings"]["inputs"]["rows"] == 4177
    want = auto_settings(AutoInputs.for_schema(ABALONE, 1.0, 5e-8, 4177)).settings
    assert {k: model["hyperparameters"][k] for k in want if k != "trees"} == {k: v for k, v in want.items()
                                                                               if k != "trees"}
    assert model["hyperparameters"]["l2"] == model["training"]["settings"]["settings"]["l2"]
    rc, res, out = run_train(tmp_path, "--epsilon", "1", "--settings", "paper", "--trees", "5", "--seed", "3")
    model = json.loads(out.read_text())
    assert model["hyperparameters"] == Hyperparameters(epsilon=1.0, trees=5, seed=3).to_dict()
    assert "settings" not in model["training"] and "eps_rows" not in model["privacy"]


def test_bad_rows_is_one_line_exit_2(tmp_path, capsys):
    rc, _, out = run_train(tmp_path, "--rows", "0")
    assert rc == 2 and not out.exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_auto_command_prints_the_rule_for_public_inputs(capsys):
    from fedsbdt.cli import main

    assert main(["auto", "--schema", str(EX / "abalone" / "schema.toml"), "--epsilon", "1", "--rows", "4177",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rule = auto_settings(AutoInputs.for_schema(ABALONE, 1.0, 5e-8, 4177)).settings
    # every key a plan needs, λ included (matched to the noise of exactly these settings, as train and plan use it)
    assert got["settings"] == rule | {"l2": noise_matched_l2(Hyperparameters.from_dict({**rule, "epsilon": 1.0}),
                                                             "regression")}
    assert f"--l2 {got['settings']['l2']}" in got["plan_flags"] and "--no-cyclical" in got["plan_flags"]


def test_noise_matched_l2_is_the_hessian_noise_std():
    from fedsbdt.common.engine import calibration_for

    hp = Hyperparameters(epsilon=1.0, trees=100, depth=6, subsample=0.3)
    sigma = calibration_for(hp).sigma
    assert noise_matched_l2(hp, "regression") == pytest.approx(1.0 * sigma / math.sqrt(2 * 0.2), abs=1e-3)
    assert noise_matched_l2(hp, "binary") == pytest.approx(max(1.0, 0.25 * sigma / math.sqrt(0.4)), abs=1e-3)
    assert noise_matched_l2(Hyperparameters(epsilon=500.0, trees=1), "binary") == 1.0  # tiny noise: λ = 1
