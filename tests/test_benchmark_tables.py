"""The table builders of benchmarks/modes.py (cross-mode) and benchmarks/dp_peers.py (DP peers) on small
synthetic results files (no training)."""
from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EPS = (1.0, 2.0, 4.0, 6.0, 8.0, 10.0)


@pytest.fixture(scope="module")
def modes():
    """benchmarks/modes.py as a module (it imports its sibling benchmark scripts by name)."""
    before = set(sys.modules)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_modes", ROOT / "benchmarks" / "modes.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    yield mod
    for name in ("_util", "sarus", "dpboost"):
        if name not in before:
            sys.modules.pop(name, None)


def cell_list(base: float, delta: float, **extra) -> list[dict]:
    """sarus.py-style cells: one per ε, three values each (base + ε/100 + {0, 0.1, 0.5}), no summary given."""
    return [{"epsilon": e, "values": [base + e / 100, base + e / 100 + 0.1, base + e / 100 + 0.5],
             "released_delta": delta, **extra} for e in EPS]


def write(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload))


def full_inputs(d: Path, *, federated: bool = True) -> None:
    write(d / "sarus.json", {"results": {n: {"sarus_pure": cell_list(20, 0.0), "sarus_rdp": cell_list(21, 5e-8),
                                             "sbdt": cell_list(19, 5e-8)} for n in ("adult", "abalone")}})
    write(d / "modes_central.json", {"settings": {
        "fig4": {n: {"dpboost": cell_list(22, 5e-8, pure=False)} for n in ("adult", "abalone")},
        "fig2": {n: {"sarus_pure": cell_list(23, 0.0), "sarus_rdp": cell_list(24, 1e-4)}
                 for n in ("adult", "abalone")}}})
    # dpboost.py's layout: cells keyed by ε as a string, summaries only, δ = 1/train_rows, receipts with "pure"
    fig2 = {n: {"train_rows": 1000,
                "dpboost": {str(e): {"mean": 25 + e, "se": 0.5, "runs": 2} for e in EPS},
                "sbdt": {str(e): {"mean": 19.5, "se": 0.25, "runs": 2} for e in EPS},
                "dpboost_receipts": {str(e): {"pure": e == 10.0} for e in EPS}} for n in ("adult", "abalone")}
    write(d / "dpboost.json", {"fig2": fig2})
    if federated:
        write(d / "sarus_federated.json", {"results": {n: {"sarus_federated": [
            {"epsilon": e, "runs": 1, "mean": 30 + e, "std": None, "se": None, "released_delta": 5e-8} for e in EPS]}
            for n in ("adult", "abalone")}})
        # dpboost_federated.py's layout: one training per ε (1, 4, 10 only), a bare "error"
        write(d / "dpboost_federated.json", {"results": {n: {"delta": 0.001, "rows": {
            "1.0": {"federated_dpboost": {"error": 40.0}}, "4.0": {"federated_dpboost": {"error": 41.0}},
            "10.0": {"federated_dpboost": {"values": [42.0, 43.0, 47.0]}}}} for n in ("adult", "abalone")}})


def rows(tables: dict, setting: str, name: str) -> dict:
    return {r["key"]: r for r in tables[setting]["datasets"][name]["rows"]}


def test_every_row_of_every_setting_from_its_own_file(modes, tmp_path):
    full_inputs(tmp_path)
    t = modes.build_tables(tmp_path)
    assert list(t) == ["fig4", "fig2"]
    for setting in t:
        for name in ("adult", "abalone"):
            assert [r["key"] for r in t[setting]["datasets"][name]["rows"]] == [
                "paper", "sarus_pure", "sarus_rdp", "sarus_federated", "dpboost", "dpboost_federated", "sbdt"]
    f4 = rows(t, "fig4", "adult")
    assert [f4["paper"]["cells"][str(e)]["mean"] for e in EPS] == [24, 18, 19, 19, 18, 18]
    assert [rows(t, "fig4", "abalone")["paper"]["cells"][str(e)]["mean"] for e in EPS] == [6, 5.5, 3.2, 2.7, 2.6, 2.4]
    # mean ± SE recomputed from the values (the file gives no summary): base + ε/100 + {0, .1, .5}
    c = f4["sarus_rdp"]["cells"]["4.0"]
    vals = [21.04, 21.14, 21.54]
    assert c["runs"] == 3
    assert c["mean"] == pytest.approx(statistics.mean(vals))
    assert c["se"] == pytest.approx(statistics.stdev(vals) / math.sqrt(3))
    assert modes.format_cell(c) == f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals) / math.sqrt(3):.2f} (3)"
    assert f4["dpboost"]["cells"]["2.0"]["mean"] == pytest.approx(22.02 + 0.2)  # modes_central.json, fig4
    assert f4["sarus_federated"]["cells"]["6.0"] == {"mean": 36.0, "se": None, "runs": 1, "delta": 5e-8}
    assert modes.format_cell(f4["sarus_federated"]["cells"]["6.0"]) == "36.00 (1)"
    assert f4["sbdt"]["source"] == "sarus.json" and f4["dpboost"]["source"] == "modes_central.json"
    # no benchmark measures federated DPBoost at Fig. 4, nor federated Sarus at Fig. 2
    assert all(v is None for v in f4["dpboost_federated"]["cells"].values())
    f2 = rows(t, "fig2", "abalone")
    assert all(v is None for v in f2["sarus_federated"]["cells"].values())
    assert all(v is None for v in f2["paper"]["cells"].values())  # DPBoost's Fig. 2 is a plot
    assert f2["sarus_pure"]["cells"]["8.0"]["mean"] == pytest.approx(23.08 + 0.2)
    assert f2["dpboost"]["cells"]["6.0"] == {"mean": 31.0, "se": 0.5, "runs": 2, "delta": 0.001}
    assert f2["sbdt"]["cells"]["1.0"]["delta"] == pytest.approx(1 / 1000)
    fed = f2["dpboost_federated"]["cells"]
    assert fed["1.0"] == {"mean": 40.0, "se": None, "runs": 1, "delta": 0.001}
    assert fed["2.0"] is None and fed["6.0"] is None  # measured at 1, 4, 10 only
    assert fed["10.0"]["mean"] == pytest.approx(44.0)
    assert fed["10.0"]["se"] == pytest.approx(statistics.stdev([42, 43, 47]) / math.sqrt(3))


def test_privacy_column_says_pure_or_delta(modes, tmp_path):
    full_inputs(tmp_path)
    t = modes.build_tables(tmp_path)
    f4, f2 = rows(t, "fig4", "adult"), rows(t, "fig2", "adult")
    assert f4["sarus_pure"]["privacy"] == "pure ε-DP (δ = 0)"
    assert f4["sarus_rdp"]["privacy"] == "(ε, δ = 5e-08)"
    assert f4["paper"]["privacy"].startswith("pure")
    # a DPBoost cell whose receipt says the paper's pure composition was the tighter bound has δ = 0
    assert f2["dpboost"]["cells"]["10.0"]["delta"] == 0.0
    assert f2["dpboost"]["privacy"] == "(ε, δ = 0.001); pure at ε = 10"
    assert f2["sarus_rdp"]["privacy"] == "(ε, δ = 0.0001)"
    # a file that does not record δ is never read as pure
    sarus = json.loads((tmp_path / "sarus.json").read_text())
    for c in sarus["results"]["adult"]["sbdt"]:
        del c["released_delta"]
    write(tmp_path / "sarus.json", sarus)
    assert rows(modes.build_tables(tmp_path), "fig4", "adult")["sbdt"]["privacy"] == "δ not recorded"


def test_missing_files_rows_and_epsilons_say_not_run(modes, tmp_path):
    t = modes.build_tables(tmp_path)  # empty directory: only the paper's numbers
    for setting in t:
        for name in ("adult", "abalone"):
            for key, r in rows(t, setting, name).items():
                if key == "paper" and setting == "fig4":
                    assert all(c is not None for c in r["cells"].values())
                    continue
                assert all(c is None for c in r["cells"].values()), (setting, name, key)
                assert key == "paper" or r["note"].startswith("not run"), r["note"]
    assert rows(t, "fig4", "adult")["sbdt"]["note"] == "not run: no sarus.json"
    md = modes.render_markdown(t)
    assert "| Sarus, central, our RDP ledger |  | " + " | ".join(["not run"] * 6) + " |" in md
    assert "| paper: Sarus Fig. 4 (5 trials) | pure ε-DP (paper's composition) | 24 | 18 | 19 | 19 | 18 | 18 |" in md

    # a file without one dataset or one row: that row alone is not run
    full_inputs(tmp_path, federated=False)
    sarus = json.loads((tmp_path / "sarus.json").read_text())
    del sarus["results"]["abalone"]
    del sarus["results"]["adult"]["sbdt"]
    write(tmp_path / "sarus.json", sarus)
    t = modes.build_tables(tmp_path)
    assert rows(t, "fig4", "abalone")["sarus_pure"]["note"] == "not run: sarus.json has no sarus_pure row for abalone"
    assert rows(t, "fig4", "adult")["sbdt"]["note"].startswith("not run")
    assert rows(t, "fig4", "adult")["sarus_pure"]["cells"]["1.0"] is not None
    assert rows(t, "fig2", "adult")["dpboost_federated"]["note"] == "not run: no dpboost_federated.json"
    md = modes.render_markdown(t)
    assert "| DPBoost, federated (3 sites) |  | " + " | ".join(["not run"] * 6) + " |" in md


def test_federated_sarus_row_inside_sarus_json_counts(modes, tmp_path):
    """sarus_federated.py also adds its row to sarus.json: the table finds it there without the separate file."""
    full_inputs(tmp_path, federated=False)
    sarus = json.loads((tmp_path / "sarus.json").read_text())
    sarus["results"]["adult"]["sarus_federated"] = cell_list(30, 5e-8)
    write(tmp_path / "sarus.json", sarus)
    t = modes.build_tables(tmp_path)
    assert rows(t, "fig4", "adult")["sarus_federated"]["cells"]["1.0"]["runs"] == 3
    assert rows(t, "fig4", "abalone")["sarus_federated"]["cells"]["1.0"] is None


def test_table_command_writes_json_and_markdown_and_rejects_a_broken_file(modes, tmp_path, capsys):
    """(modes.png needs matplotlib, which the test extra does not install: the command runs with --no-png.)"""
    full_inputs(tmp_path)
    assert modes.main(["--table", "--no-png", "--results-dir", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "modes.json").read_text())
    assert saved["tables"]["fig2"]["datasets"]["adult"]["rows"][5]["cells"]["1.0"]["mean"] == 40.0
    md = (tmp_path / "modes.md").read_text()
    assert md.count("| row | privacy |") == 4 and "S-BDT federated is left out" in md
    assert not (tmp_path / "modes.png").exists()
    assert "40.00 (1)" in capsys.readouterr().out

    (tmp_path / "dpboost.json").write_text("{not json")
    assert modes.main(["--table", "--no-png", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modes.py: error:") and "dpboost.json" in err[0]
    with pytest.raises(SystemExit) as e:
        modes.main(["--table", "--no-png", "--results-dir", str(tmp_path / "absent")])
    assert e.value.code == 2


def test_modes_federated_json_fills_the_missing_federated_rows(modes, tmp_path):
    """modes_federated.py's cells (modes_central.json's layout) fill federated DPBoost at Fig. 4, federated Sarus
    at Fig. 2 and an S-BDT federated row, which appears only where measured; Sarus' Fig. 4 federated row inside
    sarus.json never leaks into Fig. 2."""
    full_inputs(tmp_path, federated=False)
    sarus = json.loads((tmp_path / "sarus.json").read_text())
    sarus["results"]["adult"]["sarus_federated"] = cell_list(30, 5e-8)
    write(tmp_path / "sarus.json", sarus)
    t = modes.build_tables(tmp_path)
    assert all(c is None for c in rows(t, "fig2", "adult")["sarus_federated"]["cells"].values())
    assert "sbdt_federated" not in rows(t, "fig2", "adult") and "S-BDT federated is left out" in \
        modes.render_markdown(t)

    one = [{"epsilon": 1.0, "runs": 1, "mean": 50.0, "values": [50.0], "released_delta": 1e-3, "pure": False}]
    write(tmp_path / "modes_federated.json", {"settings": {
        "fig4": {"adult": {"dpboost_federated": cell_list(60, 5e-8), "sbdt_federated": one}},
        "fig2": {"adult": {"sarus_federated": one, "sbdt_federated": cell_list(70, 1e-3)},
                 "abalone": {"sarus_federated": one}}}})
    t = modes.build_tables(tmp_path)
    f4, f2 = rows(t, "fig4", "adult"), rows(t, "fig2", "adult")
    assert [r["key"] for r in t["fig2"]["datasets"]["adult"]["rows"]][-2:] == ["sbdt", "sbdt_federated"]
    assert f4["dpboost_federated"]["source"] == "modes_federated.json"
    assert f4["dpboost_federated"]["cells"]["4.0"]["mean"] == pytest.approx(60.04 + 0.2)
    assert f4["sbdt_federated"]["cells"]["1.0"] == {"mean": 50.0, "se": None, "runs": 1, "delta": 1e-3}
    assert f4["sbdt_federated"]["cells"]["4.0"] is None and f4["sbdt_federated"]["federated"]
    assert f2["sarus_federated"]["cells"]["1.0"]["mean"] == 50.0 and f2["sarus_federated"]["cells"]["2.0"] is None
    assert f2["sbdt_federated"]["cells"]["10.0"]["runs"] == 3 and f2["sbdt_federated"]["privacy"] == \
        "(ε, δ = 0.001)"
    assert rows(t, "fig2", "abalone")["sarus_federated"]["cells"]["1.0"]["mean"] == 50.0
    assert "sbdt_federated" not in rows(t, "fig2", "abalone") and "sbdt_federated" not in rows(t, "fig4", "abalone")
    assert rows(t, "fig4", "abalone")["dpboost_federated"]["note"] == \
        "not run: modes_federated.json has no dpboost_federated row for abalone"
    md = modes.render_markdown(t)
    assert "| S-BDT, federated (3 sites, defaults) | (ε, δ = 0.001) | 50.00 (1) | not run |" in md
    assert "S-BDT federated is left out" not in md


# --------------------------------------------------------------------------- benchmarks/dp_peers.py


@pytest.fixture(scope="module")
def peers():
    """benchmarks/dp_peers.py as a module (it imports auto_grid, suite, _util and diffprivlib_compare by name)."""
    before = set(sys.modules)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_dp_peers", ROOT / "benchmarks" / "dp_peers.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    yield mod
    for name in ("_util", "auto_grid", "suite", "diffprivlib_compare"):
        if name not in before:
            sys.modules.pop(name, None)


def peer_runs() -> list[dict]:
    """dp_peers.py's run rows for two data sets: 'big' (binary, 200,000 rows), where DP-EBM beats ours at ε = 1
    and one of ours' runs failed; 'small' (multi-class, 500 rows), which DP-EBM cannot fit and where
    diffprivlib's forest beats ours."""
    out = []

    def add(name, task, n, eps, rep, method, score, **extra):
        out.append({"dataset": name, "task": task, "n": n, "n_train": int(0.8 * n), "epsilon": eps, "rep": rep,
                    "method": method, "score": score, **extra})

    add("big", "binary", 200_000, None, 0, "xgboost", 0.90)
    for rep, (o, e, rf, lr) in enumerate([(0.80, 0.84, 0.60, 0.50), (0.82, 0.86, 0.70, 0.75)]):
        add("big", "binary", 200_000, 1.0, rep, "ours", o)
        add("big", "binary", 200_000, 1.0, rep, "dp_ebm", e)
        add("big", "binary", 200_000, 1.0, rep, "diffprivlib", max(rf, lr),
            models={"random_forest": rf, "logistic_regression": lr})
        add("big", "binary", 200_000, 4.0, rep, "ours", o + 0.08)
        add("big", "binary", 200_000, 4.0, rep, "dp_ebm", e + 0.01)
        add("big", "binary", 200_000, 4.0, rep, "diffprivlib", 0.7, models={"random_forest": 0.7,
                                                                           "logistic_regression": 0.6})
    add("big", "binary", 200_000, 1.0, 2, "ours", None, error="RuntimeError: killed")
    add("small", "multiclass", 500, None, 0, "xgboost", 0.95)
    for rep, o in enumerate((0.70, 0.80)):
        add("small", "multiclass", 500, 1.0, rep, "ours", o)
        add("small", "multiclass", 500, 1.0, rep, "dp_ebm", None, note="n/a: DP-EBM has no multi-class model")
        add("small", "multiclass", 500, 1.0, rep, "diffprivlib", 0.8,
            models={"random_forest": 0.8, "logistic_regression": None, "logistic_regression_error": "ValueError"})
    return out


def test_dp_peers_table_means_per_cell_peers_ahead_and_the_large_set_gap(peers):
    t = peers.build_table(peer_runs())
    cells = {(c["dataset"], c["epsilon"]): c for c in t["cells"]}
    assert list(cells) == [("big", 1.0), ("big", 4.0), ("small", 1.0)]
    big = cells[("big", 1.0)]
    assert big["ours"] == pytest.approx(0.81) and big["ours_runs"] == 2  # the failed run counts nowhere
    assert big["dp_ebm"] == pytest.approx(0.85) and big["xgboost"] == 0.90
    # each diffprivlib model is averaged over the runs, then the best model is taken (not the runs' best)
    assert big["diffprivlib_models"] == pytest.approx({"logistic_regression": 0.625, "random_forest": 0.65})
    assert big["diffprivlib"] == pytest.approx(0.65)
    assert big["peers_ahead"] == ["dp_ebm"] and big["xgboost_minus_ours"] == pytest.approx(0.09)
    assert cells[("big", 4.0)]["peers_ahead"] == []
    small = cells[("small", 1.0)]
    assert small["dp_ebm"] is None and small["dp_ebm_runs"] == 0 and small["peers_ahead"] == ["diffprivlib"]
    assert small["diffprivlib_models"] == {"logistic_regression": None, "random_forest": 0.8}
    assert [(x["dataset"], x["peer"]) for x in t["losses_at_eps_ge_1"]] == [("big", "dp_ebm"), ("small", "diffprivlib")]
    assert big["ours_range"] == [0.80, 0.82] and small["dp_ebm_range"] is None
    b1, m1, b4 = t["summary"]  # per (ε, task)
    assert (b1["epsilon"], b1["task"], m1["task"], b4["epsilon"]) == (1.0, "binary", "multiclass", 4.0)
    assert b1["dp_ebm"] == {"datasets": 1, "ours_mean": pytest.approx(0.81), "peer_mean": pytest.approx(0.85),
                            "ours_at_least": 0}
    assert b1["diffprivlib"] == {"datasets": 1, "ours_mean": pytest.approx(0.81), "peer_mean": pytest.approx(0.65),
                                 "ours_at_least": 1}
    assert m1["dp_ebm"] == {"datasets": 0, "ours_mean": None, "peer_mean": None, "ours_at_least": 0}
    assert m1["diffprivlib"]["ours_at_least"] == 0 and b4["dp_ebm"]["ours_at_least"] == 1
    assert t["large_sets_eps_1"] == [{"dataset": "big", "n": 200_000, "ours": pytest.approx(0.81), "xgboost": 0.9,
                                      "gap": pytest.approx(0.09)}]
    md = peers.render_markdown(t)
    assert "| big (binary, 200,000) | 1 | 0.810 | **0.850** | 0.650 (random forest) | 0.900 |" in md
    assert "| big (binary, 200,000) | 4 | **0.890** | 0.860 | 0.700 (random forest) | 0.900 |" in md
    assert "| small (multiclass, 500) | 1 | 0.750 | n/a | **0.800** (random forest) | 0.950 |" in md
    assert peers._fmt(-44112573.39) == "-4.4e+07" and peers._fmt(-0.25) == "-0.250"


def test_dp_peers_ebm_inputs_give_the_schema_public_bounds_and_levels(peers):
    from fedsbdt.common.data import Dataset
    from fedsbdt.common.schema import Schema

    schema = Schema.from_dict({"name": "t", "task": "binary", "target": "y", "features": [
        {"name": "age", "type": "numeric", "range": [18.0, 90.0]},
        {"name": "site", "type": "categorical", "levels": ["a", "b", "c"]}]})
    ds = Dataset.from_arrays(np.array([[20.0, "c"], [30.0, "a"]], dtype=object), np.array([0.0, 1.0]), schema)
    frame, types, bounds = peers.ebm_inputs(ds)
    assert types == ["continuous", ["0", "1", "2"]]  # the schema's levels, not the two seen in the data
    assert frame["site"].tolist() == ["2", "0"] and frame["age"].tolist() == [20.0, 30.0]
    assert bounds.tolist() == [[18.0, 90.0], [0.0, 2.0]]


def test_dp_peers_bad_input_is_one_line_and_exit_2(peers, tmp_path, capsys):
    """Bad flags: argparse's usage and one error line, exit 2, before any data is loaded; a results file that
    is absent or broken: one line, exit 2, the file untouched."""
    for argv, why in ((["--datasets", "adult,nope"], "unknown dataset(s) nope"), (["--eps", "1,x"], "--eps"),
                      (["--eps", "0"], "ε must be > 0"), (["--reps", "0"], "--reps ≥ 1")):
        with pytest.raises(SystemExit) as e:
            peers.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and err[-1].startswith("dp_peers.py: error:") and why in err[-1], argv
    assert peers.main(["--table", "--out", str(tmp_path / "absent.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dp_peers.py: error:") and "no runs" in err[0]
    assert not (tmp_path / "absent.json").exists()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert peers.main(["--table", "--out", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not JSON" in err[0]
    assert broken.read_text() == "{not json"


def test_dp_peers_docs_table_is_the_results_file(peers):
    """docs/auto.md shows results/dp_peers.json's table as ``--table`` renders it, and that table is the one its
    runs give (neither was edited alone)."""
    payload = json.loads((ROOT / "benchmarks" / "results" / "dp_peers.json").read_text())
    table = peers.build_table(payload["runs"])
    assert table == payload["table"]
    assert peers.render_markdown(table) in (ROOT / "docs" / "auto.md").read_text()
