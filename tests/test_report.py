"""The HTML privacy report: structure, values, self-containment, ledger interface, CLI."""
import json
import re
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pytest

from fedsbdt.cli import main
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.engine import train
from fedsbdt.common.model import Ensemble
from fedsbdt.common.rdp_filter import UNITS_PER_ROUND, filter_table
from fedsbdt.common.rdp_filter import exhausted_share as filter_exhausted_share
from fedsbdt.common.report import (ReportError, build_report, exhausted_share, ledger_plan, load_ledger, one_in,
                           posterior_bound, round_groups, summarise_ledger, write_report)

from conftest import ROOT, insecure


class Page(HTMLParser):
    """Sections (id → text), tables (section → rows of cells), images, links, scripts."""

    def __init__(self, text):
        super().__init__()
        self.sections, self.tables, self.images, self.external, self.tags = {}, {}, [], [], []
        self._section, self._row, self._cell = None, None, None
        self.title = ""
        self._in_title = self._in_svg = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "section":
            self._section = a["id"]
            self.sections[self._section] = ""
            self.tables[self._section] = []
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag in ("img", "svg"):
            self.images.append(a)
        elif tag == "title" and not self._in_svg:  # the page's title, not a chart's
            self._in_title = True
        if tag == "svg":
            self._in_svg = True
        for k in ("src", "href"):
            if k in a and not a[k].startswith("data:"):
                self.external.append(a[k])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._section:
            self.tables[self._section].append(self._row)
            self._row = None
        elif tag == "section":
            self._section = None
        elif tag == "title":
            self._in_title = False
        elif tag == "svg":
            self._in_svg = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self._section:
            self.sections[self._section] += data
        if self._cell is not None:
            self._cell += data

    def value(self, section, name):
        for row in self.tables[section]:
            if row and row[0] == name:
                return row[1]
        raise KeyError(name)


@pytest.fixture(scope="module")
def model(abalone):
    return train(abalone, Hyperparameters(epsilon=0.5, trees=20, depth=2, filter=True, extra_trees=5)).model


def test_structure_and_values(model):
    page = Page(build_report(model, model_name="abalone.json", model_sha256="ab" * 32))
    assert page.title == "Privacy report — abalone"
    assert list(page.sections) == ["summary", "guarantee", "accountant", "hyperparameters", "training",
                                   "importance", "schema", "about"]
    p = model.privacy
    assert page.value("accountant", "σ (sigma)") == f"{p['sigma']:.6g}"
    assert page.value("accountant", "α̂ (alpha)") == str(p["alpha"])
    assert page.value("accountant", "ρ(α̂) (rho)") == f"{p['rho']:.6g}"
    assert page.value("accountant", "ε (achieved)") == f"{p['epsilon']:.6g}"
    assert page.value("accountant", "δ") == "5e-08"
    assert page.value("accountant", "rounds accounted") == "20"
    assert page.value("accountant", "rounds completed") == "25"
    assert page.value("accountant", "accountant") == "rdp"
    assert page.value("hyperparameters", "depth") == "2"
    assert page.value("hyperparameters", "filter") == "yes"
    g = page.sections["guarantee"]
    assert "does not hold" not in g
    assert "differential privacy for every" in g and "for a patient" in g and "1 in 20 million" in g
    assert f"{np.exp(p['epsilon']):.3g}" in g  # e^ε in words
    assert "Centralised training" in page.sections["training"]
    assert "Length" in page.sections["schema"] and "[0.1, 0.8]" in page.sections["schema"]
    assert page.value("summary", "SHA-256") == "ab" * 32


def test_self_contained(model):
    text = build_report(model)
    page = Page(text)
    assert not page.external, page.external
    assert "script" not in page.tags and "link" not in page.tags and "<style>" in text
    assert page.images
    for img in page.images:  # inline SVG charts, labelled for screen readers
        assert set(img) >= {"role", "aria-label", "viewbox"} and img["role"] == "img" and img["aria-label"]
    assert "<img" not in text


def test_report_needs_no_plotting_library(model, tmp_path):
    """After the main install (no matplotlib) every command works: the report draws its own SVG charts."""
    m = tmp_path / "m.json"
    model.save(m)
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # any import of matplotlib now fails
            "from fedsbdt.cli import main\n"
            f"sys.exit(main(['report', '--model', {str(m)!r}, '--out', {str(tmp_path / 'r.html')!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    page = Page((tmp_path / "r.html").read_text())
    assert {i["aria-label"] for i in page.images} == {"epsilon over trees", "Feature importance (mean |SHAP contribution|)"}


def test_svg_charts_scale_their_data_into_the_frame():
    from fedsbdt.common import svgplot

    assert svgplot.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svgplot.nice_ticks(0, 7, integer=True) == [0, 2, 4, 6]
    svg = svgplot.line_chart([1, 2, 3], [0.1, 0.2, 0.3], "t", "x", "y", "ε", ref=0.3, ref_label="final")
    pts = [tuple(map(float, p.split(","))) for p in re.search(r'<polyline points="([^"]+)"', svg).group(1).split()]
    xs, ys = zip(*pts)
    assert xs[0] == svgplot.LEFT and xs[-1] == svgplot.WIDTH - svgplot.RIGHT  # x range fills the frame
    assert ys[0] > ys[1] > ys[2] >= svgplot.TOP  # larger values higher up, inside the frame
    assert ys[0] < svgplot.HEIGHT - svgplot.BOTTOM


def federated_training(n_trees=25):
    """What common/federation/release.py records for a federated run (public facts only)."""
    rounds = [{"tree": k, "round_id": k + 1 + (k >= 10), "sites": ["h1", "h2", "h3"] if k < 10 else ["h3", "h1"]}
              for k in range(n_trees)]
    return {"federated": True, "plan_sha256": "cd" * 32, "session_id": "cardio-1", "noise_mode": "distributed",
            "threshold": 2, "assumed_colluders": 0, "roster": ["h1", "h2", "h3"],
            "init": {"round_id": 0, "sites": ["h1", "h2", "h3"]}, "rounds": rounds}


def test_federated_rounds_are_rendered(model):
    fed = Ensemble(model.schema, model.hyperparameters, model.init_score, model.trees, dict(model.privacy),
                   federated_training())
    page = Page(build_report(fed))
    t = page.sections["training"]
    assert "Federated training" in t and "25 rounds with 3 site(s)" in t
    rows = [r for r in page.tables["training"] if len(r) == 4][1:]
    assert rows == [["1–10", "3", "h1, h2, h3", "—"], ["11–25", "2", "h1, h3", "h2"]]
    assert page.value("training", "threshold t") == "2"
    assert page.value("training", "plan SHA-256") == "cd" * 32
    assert page.value("training", "session") == "cardio-1"
    assert page.value("training", "roster") == "h1, h2, h3"
    # the collusion bound, exactly, in terms of the declared c (issue 10)
    who = page.value("training", "guarantee holds against")
    assert who.startswith("Holds if at most c = 0 of the 3 sites collude with the coordinator")
    slack = Ensemble(model.schema, model.hyperparameters, model.init_score, model.trees, dict(model.privacy),
                     {**federated_training(), "dropout_slack": 1})
    who = Page(build_report(slack, plots=False)).value("training", "guarantee holds against")
    assert "With 1 colluder it does not hold" in who
    assert any(i["aria-label"] == "sites alive per round" for i in page.images)
    assert round_groups([{"sites": ["b", "a"]}, {"sites": ["a", "b"]}, {"sites": []}]) == \
        [(1, 2, ["a", "b"]), (3, 3, [])]
    assert round_groups([{"tree": 0, "sites": ["a"]}, {"tree": 2, "sites": ["a"]}]) == [(1, 1, ["a"]), (3, 3, ["a"])]


def test_insecure_randomness_is_flagged(abalone):
    m = train(abalone, Hyperparameters(trees=3, depth=2), randomness=insecure()).model
    page = Page(build_report(m, plots=False))
    assert "guarantee below does not hold" in page.sections["guarantee"] and not page.images


def test_exhausted_share_matches_the_filter(model):
    hp = model.hyperparameters
    table = filter_table(model.privacy["alpha"], model.privacy["sigma"], hp.subsample, hp.r1, hp.trees)
    rng = np.random.default_rng(0)
    spent = rng.integers(0, table.budget_units + 1, 5000)
    spent[:10] = table.budget_units
    spent[10:20] = table.budget_units - UNITS_PER_ROUND  # can still afford exactly one worst-case round
    assert exhausted_share(spent, table.budget_units) == filter_exhausted_share(spent, table)
    assert exhausted_share(np.array([0, table.budget_units - UNITS_PER_ROUND + 1]), table.budget_units) == 0.5
    assert exhausted_share(np.zeros(0, np.int64), 10) == 0.0


def test_ledger_formats_and_section(model, tmp_path):
    budget = model.privacy["rounds_accounted"] * UNITS_PER_ROUND
    spent = np.array([0, budget // 2, budget, budget, budget - 1])
    np.save(tmp_path / "a.npy", spent)
    (tmp_path / "b.json").write_text(json.dumps({"spent": spent.tolist()}))
    con = sqlite3.connect(tmp_path / "c.sqlite")
    con.execute("CREATE TABLE ledger (record_id INTEGER PRIMARY KEY, spent INTEGER)")
    con.executemany("INSERT INTO ledger VALUES (?, ?)", list(enumerate(spent.tolist())))
    con.commit()
    con.close()
    for name in ("a.npy", "b.json", "c.sqlite"):
        np.testing.assert_array_equal(load_ledger(tmp_path / name), spent)
    s = summarise_ledger(spent, model.privacy, "hospital-a")
    assert s.exhausted_share == 0.6 and s.records == 5
    page = Page(build_report(model, s))
    assert "ledger" in page.sections and "hospital-a" in page.sections["ledger"]
    assert "60.0%" in page.sections["ledger"] and "do not publish" in page.sections["ledger"]
    con = sqlite3.connect(tmp_path / "c.sqlite")  # the site database of client/ledger.py also has a meta table
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
    con.execute("INSERT INTO meta VALUES ('plan_sha256', ?)", (b"ef" * 32,))
    con.commit()
    con.close()
    assert ledger_plan(tmp_path / "c.sqlite") == "ef" * 32 and ledger_plan(tmp_path / "a.npy") is None
    fed = Ensemble(model.schema, model.hyperparameters, model.init_score, model.trees, dict(model.privacy),
                   federated_training())
    fed.save(tmp_path / "fed.json")
    with pytest.raises(ReportError, match="belongs to plan efefefef"):
        write_report(tmp_path / "fed.json", tmp_path / "r.html", tmp_path / "c.sqlite")
    plain = Ensemble(model.schema, model.hyperparameters.replace(filter=False), model.init_score, model.trees,
                     dict(model.privacy), model.training)
    plain.save(tmp_path / "plain.json")
    with pytest.raises(ReportError, match="without the individual Rényi filter"):
        write_report(tmp_path / "plain.json", tmp_path / "r.html", tmp_path / "a.npy")
    assert not (tmp_path / "r.html").exists()
    (tmp_path / "bad.json").write_text('{"spent": [1.5, 2]}')
    with pytest.raises(ReportError, match="integers"):
        load_ledger(tmp_path / "bad.json")
    with pytest.raises(ReportError, match="not found"):
        load_ledger(tmp_path / "none.npy")
    with pytest.raises(ReportError, match="unknown ledger format"):
        (tmp_path / "a.txt").write_text("1 2 3")
        load_ledger(tmp_path / "a.txt")


def test_plain_language_numbers():
    assert posterior_bound(0.5, 1.0) == pytest.approx(np.e / (1 + np.e))
    assert posterior_bound(0.1, 0.0) == pytest.approx(0.1)
    assert one_in(5e-8) == "1 in 20 million" and one_in(1e-5) == "1 in 100 thousand"


def test_cli_report(model, tmp_path, capsys):
    src = tmp_path / "m.json"
    model.save(src)
    led = tmp_path / "site.npy"
    np.save(led, np.zeros(10, np.int64))
    out = tmp_path / "r.html"
    assert main(["report", "--model", str(src), "--out", str(out), "--ledger", str(led), "--site", "H1",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["exhausted_share"] == 0.0 and "ledger" in res["sections"] and res["epsilon"] <= 0.5
    page = Page(out.read_text(encoding="utf-8"))
    assert "H1" in page.sections["ledger"]
    assert main(["report", "--model", str(src), "--out", str(tmp_path / "r.pdf")]) == 2
    assert "HTML" in capsys.readouterr().err
    (tmp_path / "nor.json").write_text(json.dumps({**model.to_dict(), "privacy": {}}))
    assert main(["report", "--model", str(tmp_path / "nor.json"), "--out", str(out)]) == 2
    assert "no privacy receipt" in capsys.readouterr().err


def test_python_m_cli_reports_command_module_errors_cleanly(model, tmp_path):
    """CliError raised by fedsbdt.common.cli_tools is caught when the CLI runs as ``python -m fedsbdt.cli``."""
    src = tmp_path / "m.json"
    model.save(src)
    p = subprocess.run([sys.executable, "-m", "fedsbdt.cli", "report", "--model", str(src), "--out",
                        str(tmp_path / "r.pdf")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""
    assert p.stderr.strip() == f"fedsbdt report: error: {tmp_path / 'r.pdf'}: the report is an HTML page; name it *.html"
