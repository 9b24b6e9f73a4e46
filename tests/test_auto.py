"""The ``auto`` settings (common/auto.py) and ``fedsbdt train --settings`` (docs/auto.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedsbdt.common.auto import (AUTO_KEYS, CANDIDATES, CURVES, NUMERIC_WIDE, PROFILE, WIDE, AutoInputs, auto_settings, band_table,
                                 budget_signal, candidate, choose, count_interval, count_points, curve_at,
                                 noise_matched_l2, numeric_wide_override, profile_key, resolve, rows_epsilon, rule_table)
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


def inputs(profile: str, b: float, epsilon: float = 1.0, classes: int = 0, **kw) -> AutoInputs:
    """Inputs of the profile ``profile`` whose budget signal is ``b`` (n declared unless ``rows_source`` given)."""
    group, kind = profile.split("/")
    wide_at = PROFILE["wide_at"]
    features = (wide_at + 5 if "wide" in kind else max(1, wide_at - 5)) if wide_at else 8
    categorical = features if kind.startswith("mixed") else 0
    task = "regression" if group == "regression" else ("multiclass" if classes else "binary")
    rows = max(1, round(10 ** b * max(classes, 1) / epsilon))
    return AutoInputs(epsilon, 1e-6, task, classes, features, categorical, 0, rows, **kw)


def test_the_choice_follows_epsilon_times_rows_and_classes_share_it():
    assert budget_signal(1.0, 1000) == pytest.approx(3.0)
    assert budget_signal(10.0, 3000, classes=3) == pytest.approx(4.0)
    # the same ε·n gives the same settings; K classes divide the budget per model
    a = auto_settings(AutoInputs.for_schema(ABALONE, 0.5, 1e-6, 20_000)).settings
    b = auto_settings(AutoInputs.for_schema(ABALONE, 10.0, 1e-6, 1_000)).settings
    assert a == b
    three = auto_settings(AutoInputs.for_schema(WINE, 1.0, 1e-6, 3_000))
    assert three.budget == pytest.approx(3.0) and three.profile.startswith("classification/")


def test_a_declared_count_takes_the_band_table_and_every_band_is_reachable():
    """For a declared n the rule is the band table of docs/auto.md: at the middle of every band of every profile,
    auto_settings picks the band's candidate, for binary and multi-class schemas alike."""
    assert set(CURVES) == {f"{g}/{k}" for g in ("classification", "regression")
                           for k in {p.split("/")[1] for p in CURVES}}
    for profile in CURVES:
        lo = 0.0
        for edge, key in band_table(profile):
            mid = lo + 0.5 if math.isinf(edge) else (lo + edge) / 2
            for classes in ((0, 5) if profile.startswith("classification") else (0,)):
                c = auto_settings(inputs(profile, mid, classes=classes))
                assert c.profile == profile and c.key == key, (profile, mid, classes)
                assert {k: c.settings[k] for k in candidate(key)} == candidate(key)
            lo = edge
        assert all(k in CANDIDATES for k in CURVES[profile][1])


def test_profile_comes_from_the_public_schema():
    wine = AutoInputs.for_schema(WINE, 1.0, 1e-6, 178)  # 13 numeric features
    abalone = AutoInputs.for_schema(ABALONE, 1.0, 1e-6, 4177)  # Sex is categorical
    assert wine.numeric_share == 1.0 and abalone.numeric_share == pytest.approx(7 / 8)
    assert profile_key("binary", 1.0, 8, (1.0, None)) == "classification/numeric"
    assert profile_key("multiclass", 0.9, 8, (1.0, None)) == "classification/mixed"
    assert profile_key("regression", 0.9, 8, (0.8, None)) == "regression/numeric"
    assert profile_key("regression", 0.0, 30, (None, 20)) == "regression/all-wide"
    assert profile_key("binary", 0.5, 3, (None, None)) == "classification/all"
    assert auto_settings(wine).profile == profile_key("multiclass", 1.0, 13)


def numeric_inputs(b: float, features: int, categorical: int = 0, classes: int = 0) -> AutoInputs:
    task = "multiclass" if classes else "binary"
    rows = max(1, round(10 ** b * max(classes, 1)))
    return AutoInputs(1.0, 1e-6, task, classes, features, categorical, 2 if categorical else 0, rows)


def test_a_wide_all_numeric_schema_gets_non_cyclical_trees_from_b_3():
    """NUMERIC_WIDE: classification on ≥ WIDE all-numeric features, where the fitted curves pick a cyclical setting
    at b ≥ 3, takes g18 (not cyclical, depth 6) and says why; a narrower, a mixed or a regression schema, or a
    smaller budget, keeps the fitted choice.  Wine (13 numeric features, 3 classes) is such a schema."""
    switched = [b / 4 for b in range(0, 33) if auto_settings(numeric_inputs(b / 4, WIDE)).key != auto_settings(
        numeric_inputs(b / 4, WIDE - 1)).key]
    assert switched and min(switched) >= NUMERIC_WIDE["from_budget"]
    for b in switched:
        wide = auto_settings(numeric_inputs(b, WIDE))
        assert wide.key == NUMERIC_WIDE["key"] and wide.settings["cyclical"] is False and wide.settings["depth"] == 6
        assert any("NUMERIC_WIDE" in r for r in wide.reasons) and not any("--no-cyclical" in r for r in wide.reasons)
        for other in (numeric_inputs(b, WIDE - 1), numeric_inputs(b, WIDE + 5, categorical=1)):
            assert auto_settings(other).settings["cyclical"] is True
    assert auto_settings(numeric_inputs(2.5, 30)).key == auto_settings(numeric_inputs(2.5, 5)).key  # below b = 3
    reg = AutoInputs(1.0, 1e-6, "regression", 0, 30, 0, 0, 10_000)
    assert numeric_wide_override(reg, "g28", 4.0) is None
    b = switched[0]
    wine = auto_settings(AutoInputs.for_schema(WINE, 1.0, 1e-6, round(3 * 10 ** b)))
    assert wine.key == "g18" and "every feature numeric" in wine.reasons[0]


def test_the_outside_checks_dp_count_no_longer_flips_the_choice():
    """Issue 39: at ε = 0.1 a 3,680-row binary numeric set's DP count (2 % of ε) fell anywhere in 2,628–5,408
    and flipped the old table between bands.  The choice over that whole range is one setting now."""
    keys = {auto_settings(AutoInputs(0.098, 1e-6, "binary", 0, 10, 0, 0, c, "dp-count", 0.002)).key
            for c in range(2628, 5409, 20)}
    assert len(keys) == 1, keys


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="rows_source"):
        AutoInputs(1.0, 1e-6, "binary", 0, 5, 0, 0, 100, "guessed")
    with pytest.raises(ValueError, match="categorical"):
        AutoInputs(1.0, 1e-6, "binary", 0, 5, 6, 0, 100)
    with pytest.raises(ValueError, match="rows_epsilon"):
        AutoInputs(1.0, 1e-6, "binary", 0, 5, 0, 0, 100, "dp-count", 0.0)
    with pytest.raises(ValueError, match="rows_epsilon"):
        AutoInputs(1.0, 1e-6, "binary", 0, 5, 0, 0, 100, "declared", 0.02)


def test_count_interval_is_the_discrete_laplace_tail():
    """count_interval's k is the smallest with P(|X| > k) ≤ 5 % for X discrete Laplace at ε (eq. (2))."""
    for eps in (0.002, 0.02, 0.2, 2.0):
        lo, hi = count_interval(100_000, eps)
        k = hi - 100_000
        assert 100_000 - lo == k

        def tail(j):  # P(|X| > j) = 2·e^{−ε(j+1)}/(1 + e^{−ε})
            return 2 * math.exp(-eps * (j + 1)) / (1 + math.exp(-eps))

        assert tail(k) <= 0.05 < tail(k - 1)
    assert count_interval(50, 0.002) == (1, 50 + count_interval(10**6, 0.002)[1] - 10**6)  # never below 1
    assert count_interval(1234, 0.0) == (1234, 1234)


def test_dp_count_choice_averages_over_the_counts_noise():
    """A DP count's choice is the candidate with the smallest curve averaged over the count's noise quantiles
    (eq. (1)): symmetric around the count, covering its 95 % interval, and a declared count is one point."""
    pts = sorted(count_points(30_000, 0.002))
    assert len(pts) == 17 and pts[8] == 30_000
    assert [30_000 - p for p in pts[:8]] == [p - 30_000 for p in pts[9:]][::-1]  # symmetric
    lo, hi = count_interval(30_000, 0.002)
    assert lo < pts[0] < pts[-1] < hi and pts[-1] - pts[0] > 0.8 * (hi - lo)  # spans most of the 95 % interval
    assert count_points(3680, 0.0) == [3680] and min(count_points(100, 0.002)) == 1
    for profile, curves in CURVES.items():
        bs, by = curves
        for b in (1.0, 2.6, 3.3, 5.0):
            inp = inputs(profile, b, epsilon=0.098, rows_source="dp-count", rows_epsilon=0.002)
            c = auto_settings(inp)
            budgets = [budget_signal(0.098, n) for n in count_points(inp.rows, 0.002)]
            means = {k: sum(curve_at(bs, g, x) for x in budgets) / len(budgets) for k, g in by.items()}
            assert c.key == min(means, key=means.get) == choose(curves, budgets)
            assert c.budget_range[0] < c.budget < c.budget_range[1]
            assert "DP count" in c.reasons[0]


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
    assert f"--l2 {got['settings']['l2']}" in got["plan_flags"]
    assert ("--no-cyclical" in got["plan_flags"]) == (not rule["cyclical"])


def test_noise_matched_l2_is_the_hessian_noise_std():
    from fedsbdt.common.engine import calibration_for

    hp = Hyperparameters(epsilon=1.0, trees=100, depth=6, subsample=0.3)
    sigma = calibration_for(hp).sigma
    assert noise_matched_l2(hp, "regression") == pytest.approx(1.0 * sigma / math.sqrt(2 * 0.2), abs=1e-3)
    assert noise_matched_l2(hp, "binary") == pytest.approx(max(1.0, 0.25 * sigma / math.sqrt(0.4)), abs=1e-3)
    assert noise_matched_l2(Hyperparameters(epsilon=500.0, trees=1), "binary") == 1.0  # tiny noise: λ = 1


def test_docs_table_is_the_rule():
    """docs/auto.md's table under <!-- table:auto --> is the rule as shipped (auto.rule_table)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "auto.md").read_text()
    block = text.split("<!-- table:auto -->\n", 1)[1].split("\n\n", 1)[0].strip()
    assert block == rule_table()
