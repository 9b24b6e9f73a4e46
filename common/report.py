"""A privacy report for a trained model: one self-contained HTML page (``fedsbdt report``).

The page is what an ethics board files next to a model: the guarantee in
plain words, the accountant's numbers, the hyperparameters, the sites that
took part in every round (federated training) and — when a site passes its
own ledger — the share of that site's records that used up their individual
privacy budget.  CSS is inline and plots are inline SVG (common/svgplot.py, no plotting library), so the
file can be archived and opened anywhere without network access.

Pure functions: :func:`build_report` returns the HTML text;
:func:`write_report` loads the inputs and writes the file atomically.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import html
import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from fedsbdt import __version__

from fedsbdt.common import modes

from . import svgplot
from .files import write_atomic
from .model import Ensemble
from .rdp_filter import UNITS_PER_ROUND


class ReportError(ValueError):
    """An input of the report (model receipt or ledger) is missing or malformed."""


# --------------------------------------------------------------------------- ledger interface


def exhausted_share(spent: np.ndarray, budget_units: int) -> float:
    """Share of records that have reached their budget: they cannot afford one more worst-case round.

    ``spent`` holds each record's spent RDP in integer ledger units (see
    :mod:`fedsbdt.common.rdp_filter`); ``budget_units`` is the per-record budget
    ρ(α̂) in the same units (``T_regular · UNITS_PER_ROUND``).  This is the
    site's own statistic of private data; it is never sent anywhere.
    """
    spent = np.asarray(spent, dtype=np.int64)
    if spent.size == 0:
        return 0.0
    return float(np.mean(spent > int(budget_units) - UNITS_PER_ROUND))


def budget_units(privacy: dict[str, Any]) -> int:
    """The per-record filter budget in ledger units, from a model's privacy receipt."""
    try:
        rounds = int(privacy["rounds_accounted"])
    except (KeyError, TypeError, ValueError):
        raise ReportError("the model's privacy receipt lacks 'rounds_accounted'; is this a fedsbdt model?") from None
    return rounds * UNITS_PER_ROUND


def load_ledger(path: str | Path) -> np.ndarray:
    """A site's spent units per record from ``.npy``, ``.json`` or a SQLite ledger (``.sqlite``/``.db``).

    JSON: a list of integers, or an object with a ``"spent"`` list.  SQLite:
    the first table with an integer column named ``spent`` or ``spent_units``
    (the federation's site ledger ``ledger-<plan hash>.sqlite``, table
    ``ledger``; see client/ledger.py).
    """
    p = Path(path)
    if not p.exists():
        raise ReportError(f"ledger file not found: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
        elif suffix == ".json":
            d = json.loads(p.read_text(encoding="utf-8"))
            arr = np.asarray(d["spent"] if isinstance(d, dict) else d)
        elif suffix in (".sqlite", ".sqlite3", ".db"):
            arr = _ledger_from_sqlite(p)
        else:
            raise ReportError(f"{p}: unknown ledger format {suffix!r}; use .npy, .json or .sqlite")
    except (ValueError, KeyError, OSError, sqlite3.Error) as e:
        if isinstance(e, ReportError):
            raise
        raise ReportError(f"{p}: not a readable ledger ({type(e).__name__}: {e})") from None
    arr = np.asarray(arr)
    if arr.ndim != 1 or arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f" and not np.isfinite(arr).all()):
        raise ReportError(f"{p}: a ledger is a flat list of spent units per record (integers)")
    if arr.dtype.kind == "f" and not (arr == np.round(arr)).all():
        raise ReportError(f"{p}: ledger units are integers; found fractional values")
    if (arr < 0).any():
        raise ReportError(f"{p}: ledger holds negative spent units")
    return arr.astype(np.int64)


def _ledger_from_sqlite(p: Path) -> np.ndarray:
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for t in sorted(tables, key=lambda name: name != "ledger"):  # the site ledger's table first
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
            for c in ("spent", "spent_units"):
                if c in cols:
                    return np.asarray([r[0] for r in con.execute(f'SELECT "{c}" FROM "{t}"')], dtype=np.int64)
        raise ReportError(f"{p}: no table with a 'spent' column (tables: {', '.join(tables) or 'none'})")
    finally:
        con.close()


def ledger_plan(path: str | Path) -> str | None:
    """The plan hash a SQLite site ledger records in its ``meta`` table (``None`` if it records none)."""
    p = Path(path)
    if p.suffix.lower() not in (".sqlite", ".sqlite3", ".db"):
        return None
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'plan_sha256'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        con.close()
    if row is None:
        return None
    v = row[0]
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class LedgerSummary:
    """What the report says about one site's ledger."""

    site: str
    records: int
    budget_units: int
    exhausted_share: float
    used_fraction: np.ndarray = field(repr=False)  # spent / budget per record, in [0, ∞)


def summarise_ledger(spent: np.ndarray, privacy: dict[str, Any], site: str = "this site") -> LedgerSummary:
    b = budget_units(privacy)
    spent = np.asarray(spent, dtype=np.int64)
    return LedgerSummary(site, int(spent.size), b, exhausted_share(spent, b), spent / float(b))


# --------------------------------------------------------------------------- plain-language numbers


def posterior_bound(prior: float, epsilon: float) -> float:
    """Largest belief an observer can reach that a record was used, starting from ``prior`` (ignoring δ)."""
    odds = prior / (1.0 - prior) * math.exp(epsilon)
    return odds / (1.0 + odds)


def one_in(delta: float) -> str:
    """``5e-8`` → ``"1 in 20 million"``."""
    if not delta > 0:
        return "0"
    n = 1.0 / delta
    for unit, name in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"), (1e3, "thousand")):
        if n >= unit:
            return f"1 in {n / unit:.3g} {name}"
    return f"1 in {n:.3g}"


def epsilon_curve(privacy: dict[str, Any], points: int = 40, depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ε after r accounted trees for a grid of r up to the total, by the receipt's tree builder
    (``Mode.epsilon_curve``: random trees' subsampled-RDP accountant at the model's σ; greedy trees' ``depth``
    levels charged by the same event ledger as in training; Sarus trees by the model's own accountant)."""
    return _mode(privacy).epsilon_curve(privacy, points, depth)


def _mode(privacy: dict[str, Any]):
    """The registered mode of a receipt's ``tree_builder`` (a model of an unregistered mode is refused)."""
    try:
        return modes.tree_builder(privacy.get("tree_builder", modes.DEFAULT))
    except modes.UnknownMode as e:
        raise ReportError(f"the model's {e}") from None


def round_groups(rounds: list[dict[str, Any]]) -> list[tuple[int, int, list[str]]]:
    """Consecutive trees with the same site set, as ``(first, last, sites)`` (1-based tree numbers)."""
    out: list[tuple[int, int, list[str]]] = []
    for k, r in enumerate(rounds):
        i = int(r["tree"]) + 1 if isinstance(r.get("tree"), int) else k + 1
        sites = sorted(str(s) for s in (r.get("sites") or []))
        if out and out[-1][2] == sites and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i, sites)
        else:
            out.append((i, i, sites))
    return out


# --------------------------------------------------------------------------- plots


def plot_epsilon(rs: np.ndarray, eps: np.ndarray, final: float) -> str:
    return svgplot.line_chart(rs, eps, "epsilon over trees", "accounted trees r", "ε",
                              "ε after r trees (RDP bound)", ref=final, ref_label=f"released ε = {final:.4g}")


def plot_sites(rounds: list[dict[str, Any]], threshold: int | None = None) -> str:
    n = [len(r.get("sites") or []) for r in rounds]
    return svgplot.step_chart(n, "sites alive per round", "tree", "sites alive", "sites alive",
                              ref=threshold, ref_label=f"threshold t = {threshold}")


def plot_ledger(used: np.ndarray) -> str:
    return svgplot.histogram(used, 40, 0.0, 1.0, "histogram of spent budget",
                             "share of the individual budget ρ(α̂) spent", "records")


# --------------------------------------------------------------------------- HTML


_CSS = """
body{font-family:Georgia,'DejaVu Serif',serif;max-width:54em;margin:2em auto;padding:0 1em;color:#1b1b1b;
line-height:1.5}
h1{font-size:1.6em;border-bottom:3px solid #1f5f8b;padding-bottom:.3em}
h2{font-size:1.25em;color:#1f5f8b;margin-top:2em;border-bottom:1px solid #ccd}
table{border-collapse:collapse;margin:.8em 0;font-size:.95em}
th,td{border:1px solid #ccd;padding:.25em .7em;text-align:left;vertical-align:top}
th{background:#eef2f7;font-weight:normal}
td.num{font-family:'DejaVu Sans Mono',monospace;text-align:right}
.summary{background:#eef6ee;border-left:5px solid #2e7d32;padding:.8em 1em;margin:1em 0}
.note{background:#fff8e1;border-left:5px solid #f9a825;padding:.6em 1em;margin:1em 0}
.muted{color:#666;font-size:.9em}
svg{max-width:100%;height:auto;display:block;margin:.5em 0}
code{font-family:'DejaVu Sans Mono',monospace;font-size:.9em}
@media print{body{margin:0;max-width:none}h2{page-break-after:avoid}}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: Any) -> str:
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.6g}"
    if x is None:
        return "—"
    return str(x)


def _table(rows: Iterable[tuple[str, Any, str]], head: tuple[str, ...] = ("quantity", "value", "meaning"),
           cls: str = "") -> str:
    out = [f'<table class="{_e(cls)}"><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for name, value, meaning in rows:
        out.append(f'<tr><th>{_e(name)}</th><td class="num">{_e(_num(value))}</td><td>{_e(meaning)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{_e(sid)}"><h2>{_e(title)}</h2>{body}</section>'


def _delta_words(delta: float) -> str:
    if delta == 0:
        return ("<p><strong>δ = 0</strong>: pure differential privacy — the bound above never fails (the Sarus "
                "paper's accounting, docs/sarus.md).</p>")
    return f"""<p><strong>δ = {_e(f"{delta:.3g}")}</strong> ({_e(one_in(delta))}) is the probability that this bound is allowed to
fail. It should be far below one over the number of records n, so that it cannot be spent on exposing someone;
this δ is at least 100 times below 1/n for every data set of up to {_e(f"{0.01 / delta:,.0f}")} records.</p>"""


def _guarantee(p: dict[str, Any], task: str) -> str:
    eps, delta = float(p["epsilon"]), float(p["delta"])
    factor = math.exp(eps)
    priors = (0.01, 0.1, 0.5)
    rows = "".join(f'<tr><td class="num">{q:.0%}</td><td class="num">{posterior_bound(q, eps):.1%}</td></tr>'
                   for q in priors)
    warn = ""
    if "insecure" in str(p.get("randomness", "")).lower():
        warn = ('<div class="note"><strong>Warning:</strong> this model was trained with the deterministic, '
                "insecure test randomness. The guarantee below does not hold. Do not release this model.</div>")
    ev = p.get("evaluation") or {}
    total = ""
    if ev.get("epsilon") is not None:  # a federated evaluation: its own budget on the held-out records
        e_eval = float(ev["epsilon"])
        total = (f"<p>The federated evaluation adds <strong>ε_eval = {_e(_num(e_eval))}</strong> for every held-out "
                 f"record (see below). <strong>In total ε + ε_eval = {_e(_num(eps + e_eval))}</strong>: the budget "
                 "every site accepted (its --max-epsilon must allow it), and what a record in both a site's training "
                 "and held-out file would lose.</p>")
    return warn + f"""
<div class="summary"><p><strong>({_e(_num(eps))}, {_e(f"{delta:.3g}")})-differential privacy for every
{"training " if total else ""}record</strong>, covering the initial score and every released tree.</p>{total}</div>
<p><strong>What this means for a patient.</strong> The model was trained with random noise calibrated so that
it would look almost the same whether or not any one patient's record had been used. Whatever anyone
concludes from the model — the published trees, their predictions, this report — the probability of any
conclusion changes by at most a factor of <strong>e<sup>ε</sup> = {factor:.3g}</strong> when one record is
added or removed. No one, including the people who trained the model, can tell with confidence from the model
whether a particular patient took part.</p>
<p>Concretely: someone who, before seeing the model, believed with some probability that your record was used
can, after studying the model, believe it with at most (ignoring the tiny δ below):</p>
<table><tr><th>belief before</th><th>largest belief after</th></tr>{rows}</table>
{_delta_words(delta)}
<p><strong>What it does not promise.</strong> The guarantee is per record. A patient with several records
(for example at two hospitals) is protected with roughly ε per record. Differential privacy protects
whether a person took part; it does not hide facts that are true of the population as a whole, which is what
a {_e("regression" if task == "regression" else "classification")} model is meant to learn. The public schema
(feature names, value ranges, categories) is not protected: it was declared public before training.</p>
"""


def _accountant(p: dict[str, Any], curve: str | None) -> str:
    mode = _mode(p)
    rows = [
        ("guarantee", p.get("guarantee", ""), "the statement released with the model"),
        ("ε (achieved)", p.get("epsilon"), "total privacy loss of the released model"),
        ("ε (target)", p.get("target_epsilon"), "what was asked for; achieved ε ≤ target"),
        ("δ", p.get("delta"), "probability the ε bound may fail"),
        ("accountant", p.get("accountant"), "rdp: Rényi DP (paper Alg. 6); pld: privacy-loss distributions"),
        *[r for r in (  # 0 where they do not apply (Laplace leaves of DPBoost and Sarus; the PLD accountant)
            ("σ (sigma)", p.get("sigma"), "leaf noise scale σ_leaf (unweighted)"),
            ("α̂ (alpha)", p.get("alpha"), "Rényi order at which ε is attained"),
            ("ρ(α̂) (rho)", p.get("rho"), "per-record Rényi budget of the trees at α̂")) if r[1] != 0],
        ("rounds accounted", p.get("rounds_accounted"), "trees charged by the accountant"),
        ("rounds completed", p.get("rounds_completed"), "trees in the released model"),
        ("γ (subsample)", p.get("subsample"), "Poisson sampling rate per tree"),
        ("ε_init", p.get("eps_init"), "budget of the initial score (label mean)"),
        ("ε_ds", p.get("eps_ds"), "budget of the record count used by the initial score"),
        ("individual filter", p.get("filter"), "records stop taking part once their own budget is used"),
        ("tree builder", mode.name, mode.summary),
        *mode.report_rows(p),
        *([("σ_select", p.get("sigma_select"), "noise of the level histograms the splits were chosen from "
            "(a Gaussian release per tree level)")] if p.get("selection") == "histogram" else []),
        *([("classes K", p.get("classes"), "multiclass: K class trees per round, released together"),
           ("joint sensitivity", "gradients {gradient_l2:.4g}, Hessians {hessian_l2:.4g} (L2)".format(
               **p["joint_sensitivity"]), "one record's largest change across the K trees of a round; the "
            "noise is scaled to it and a round is charged as one Gaussian release")]
          if "joint_sensitivity" in p else []),
        ("noise mode", p.get("noise_mode"), "central: one party added all noise; distributed: each site a share"),
        ("randomness", p.get("randomness"), "source of noise and subsampling"),
    ]
    body = _table(rows)
    if curve:
        note = (" The curve uses the RDP accountant; the PLD accountant's released ε is tighter."
                if p.get("accountant") == "pld" else "")
        body += ("<p>How the privacy loss accumulated over the trees (every tree costs the same; "
                 f"the initial score is charged up front).{_e(note)}</p>" + curve)
    return body


def _evaluation(p: dict[str, Any], receipt: dict[str, Any] | None) -> str:
    """The federated evaluation: its own ε_eval on the held-out files, apart from the training ε."""
    e = p["evaluation"]
    rows = [("ε_eval", e.get("epsilon"), "budget of the evaluation release, charged to each site's held-out file"),
            ("δ_eval", e.get("delta"), "probability the ε_eval bound may fail"),
            ("σ_eval", e.get("sigma"), "noise multiplier of the score histograms (each site adds a full share)"),
            ("bins", e.get("bins"), "public score (classification) or residual (regression) bins"),
            ("records", e.get("records"), "")]
    body = (f"<p>After training, each site evaluated the model on its own held-out records; only the sum of "
            f"their noisy histograms was revealed. That release has its own guarantee, "
            f"<strong>ε_eval = {_e(_num(e.get('epsilon')))}</strong> for every held-out record, separate from the "
            f"training guarantee (ε = {_e(_num(p.get('epsilon')))}) because the held-out records are not training "
            "records (docs/federated-evaluation.md)"
            + ("" if e.get("epsilon") is None else "; together <strong>ε + ε_eval = "
               f"{_e(_num(float(p['epsilon']) + float(e['epsilon'])))}</strong>, the total each site accepted")
            + ".</p>" + _table(rows))
    if receipt is not None and "metrics" in receipt:
        m = receipt["metrics"]
        keys = [k for k in ("n", "auc", "macro_auc", "accuracy", "logloss", "rmse", "mae") if k in m]
        iv = receipt.get("intervals") or {}
        wide, clamped = set(receipt.get("too_wide", ())), set(receipt.get("clamped", ()))

        def ci(k: str) -> str:
            x = iv.get(k)
            return f"95 % interval {x[0]:.4g} – {x[1]:.4g}" if x else "no interval"

        def point(k: str) -> str:
            note = ("; too wide to mean anything at this ε_eval and n" if k in wide else "") + (
                "; the point estimate is clamped to the metric's range (a noise artefact)" if k in clamped else "")
            return f"noisy point estimate {_num(m[k])}{note}"

        body += ("<p>Released metrics (computed from the noisy aggregate; sites "
                 f"{_e(', '.join(receipt.get('sites', [])))}). The headline is each metric's 95 % interval for "
                 "the noise added for privacy, computed from the public noise scale (it does not cover the sampling "
                 "error of the held-out records); the noisy point estimate follows it:</p>"
                 + _table([(k, ci(k), point(k)) for k in keys], head=("metric", "95 % interval", "point estimate")))
        if wide:
            n = f"{m['n']:.0f}"
            body += (f'<div class="note"><strong>Too wide to mean anything:</strong> at ε_eval = '
                     f"{_e(_num(receipt.get('epsilon_eval')))} and about {_e(n)} held-out records the "
                     f"intervals of {_e(', '.join(k for k in keys if k in wide))} span at least half of their "
                     "possible range, so these released values say nothing about the model. A larger ε_eval or more "
                     "held-out records narrow them.</div>")
    return body


def _hyperparameters(hp: dict[str, Any]) -> str:
    from .cli import _HELP

    return _table(((k, v, _HELP.get(k, "")) for k, v in sorted(hp.items())), head=("name", "value", "meaning"))


def _settings(model: Ensemble) -> str | None:
    """How the hyperparameters were chosen: the auto rule's reasons, or the private tuning's trials."""
    t = model.training
    body = ""
    if t.get("settings"):
        body += "<p>Chosen by the <strong>auto</strong> rule (docs/auto.md) from public inputs:</p><ul>" + "".join(
            f"<li>{_e(r)}</li>" for r in t["settings"].get("reasons", [])) + "</ul>"
    tu = t.get("tuning")
    if tu and "searched" in tu:  # fedsbdt tune (central, common/tuning.py): only the final model is released
        rows = [(f"candidate {i + 1}" + (" (auto)" if i == 0 else ""),
                 ", ".join(f"{k}={v}" for k, v in sorted(c.items())),
                 "chosen" if c == tu.get("settings") else "") for i, c in enumerate(tu.get("candidates", []))]
        body += (f"<p>Chosen by <strong>private tuning</strong>: {_e(tu.get('method', ''))}. {_e(tu.get('why', ''))}; "
                 f"the model is {_e(tu.get('chosen_by', ''))}. The receipt's ε covers every probe, the scoring, the "
                 "selection and the final training; the probes' scores are not released.</p>"
                 + _table(rows, head=("candidate", "settings (public)", "")))
    elif tu:  # a federated tuning plan (common/federation/tuning.py): K public, every trial released and composed
        rows = [(f"trial {x['trial']}", ", ".join(f"{k}={v}" for k, v in sorted(x["settings"].items())),
                 "winner" if x["trial"] == tu.get("winner") else "") for x in tu.get("trials", [])]
        how = (f"{len(rows)} trial plans, each at ε = {_e(_num(tu.get('epsilon_trial')))}; the winner is "
               f"{_e(tu.get('chosen_by', ''))}. The receipt's ε covers every trial's training; the "
               "evaluations were charged to the sites' held-out files.")
        body += (f"<p>Chosen by <strong>federated tuning</strong>: {_e(tu.get('method', ''))}. {how}</p>"
                 + _table(rows, head=("trial", "settings", "")))
    return body or None


def _training(model: Ensemble, sites_svg: str | None) -> str:
    rounds = model.training.get("rounds")
    parties = list(model.privacy.get("parties") or [])
    if not rounds:
        who = f" ({', '.join(parties)})" if parties else ""
        return (f"<p><strong>Centralised training</strong>{_e(who)}: one party held all records and added the "
                f"full noise itself. {len(model.trees)} trees were released.</p>")
    t = model.training
    all_sites = sorted({str(s) for r in rounds for s in (r.get("sites") or [])})
    roster = [str(s) for s in (t.get("roster") or all_sites)]
    rows = "".join(
        f'<tr><td class="num">{a}{"" if a == b else "–" + str(b)}</td><td class="num">{len(s)}</td>'
        f"<td>{_e(', '.join(s)) or '—'}</td><td>{_e(', '.join(x for x in roster if x not in s)) or '—'}</td></tr>"
        for a, b, s in round_groups(rounds))
    body = (f"<p><strong>Federated training</strong> over {len(rounds)} rounds with {len(all_sites)} site(s): "
            f"{_e(', '.join(all_sites))}. Each released tree is the noisy sum of the sites alive in that round; "
            "the coordinator saw only masked vectors and that noisy sum. A site in a round's sum carried no data "
            "there once its records had been charged every release the plan schedules for them (failed rounds it "
            "had answered spend them): its receipt (<code>fedsbdt client --json</code>: trees_with_data, "
            "trees_without_data) and the coordinator's summary say how many.</p>")
    facts = [(label, t[key], meaning) for key, label, meaning in (
        ("session_id", "session", "the plan's session id"),
        ("plan_sha256", "plan SHA-256", "fingerprint of the public plan every site checked"),
        ("noise_mode", "noise mode", "distributed: every site added a noise share; central: the coordinator"),
        ("threshold", "threshold t", "every released sum covers at least t sites"),
        ("assumed_colluders", "assumed colluders c",
         "the guarantee holds if at most c sites collude with the coordinator (2t > n + c)"),
        ("dropout_slack", "dropout slack s", "sites that may drop out of a round without restarting it"),
    ) if t.get(key) is not None]
    who = _who(t)
    if who:
        facts.append(("guarantee holds against", who, "the collusion bound, exactly (docs/threat-model.md)"))
    if t.get("roster"):
        facts.append(("roster", ", ".join(roster), f"{len(roster)} site(s) in the plan"))
    init = t.get("init")
    if isinstance(init, dict) and init.get("sites") is not None:
        facts.append(("initial score sites", ", ".join(str(s) for s in init["sites"]),
                      "sites whose records entered the initial score"))
    if facts:
        body += _table(facts)
    if sites_svg:
        body += sites_svg
    body += (f"<table><tr><th>trees</th><th>sites alive</th><th>which</th><th>absent</th></tr>{rows}</table>")
    return body


def _who(t: dict[str, Any]) -> str | None:
    """The collusion bound of a federated run: recorded in the model, or derived from its plan facts."""
    if t.get("guarantee"):
        return str(t["guarantee"])
    keys = ("threshold", "assumed_colluders", "noise_mode", "roster")
    if any(t.get(k) is None for k in keys):
        return None
    from .guarantee import collusion_guarantee

    return collusion_guarantee(len(t["roster"]), int(t["threshold"]), int(t["assumed_colluders"]),
                               int(t.get("dropout_slack") or 0), str(t["noise_mode"]))


def _ledger(s: LedgerSummary, svg: str | None) -> str:
    body = (f"<p>Of <strong>{s.records}</strong> records at <strong>{_e(s.site)}</strong>, "
            f"<strong>{s.exhausted_share:.1%}</strong> reached their individual privacy budget "
            "(they cannot afford one more worst-case round and took part in no further trees). "
            "The others contributed less than the worst case, which the accountant assumed for everyone.</p>")
    body += _table([("records", s.records, "records in the site's ledger"),
                    ("exhausted share", s.exhausted_share, "share of records at their budget"),
                    ("budget (ledger units)", s.budget_units, "ρ(α̂) in ledger units (T_regular · 2^30)"),
                    ("median share spent", float(np.median(s.used_fraction)) if s.records else 0.0,
                     "half of the records spent at most this share of their budget")])
    if svg:
        body += svg
    body += ('<div class="note">This section describes the site\'s own private data. It is for the site\'s '
             "governance; do not publish it with the model.</div>")
    return body


def _schema(model: Ensemble) -> str:
    s = model.schema
    rows = []
    for f in s.features:
        if f.is_categorical:
            rows.append((f.name, "categorical", ", ".join(f.levels)))
        else:
            rows.append((f.name, "numeric", f"[{f.lo:g}, {f.hi:g}]"))
    tr = "".join(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td>{_e(c)}</td></tr>" for a, b, c in rows)
    target = (f"label range [{s.label_range[0]:g}, {s.label_range[1]:g}]" if s.task == "regression"
              else f"public classes: {', '.join(s.classes)}" if s.task == "multiclass"
              else f"positive: {', '.join(s.positive)}; negative: {', '.join(s.negative)}")
    return (f"<p>Declared public before training (never computed from records): task <code>{_e(s.task)}</code>, "
            f"target <code>{_e(s.target)}</code> ({_e(target)}), schema digest <code>{_e(s.digest()[:16])}…</code>."
            f"</p><table><tr><th>feature</th><th>type</th><th>public range / levels</th></tr>{tr}</table>")


#: greedy models small enough to read tree by tree (the reason a clinician picks them) are drawn
MAX_DRAWN_TREES = 50
MAX_DRAWN_DEPTH = 4


def draws_trees(model: Ensemble) -> bool:
    """Does the report draw the trees?  Greedy models of at most 50 trees of depth ≤ 4."""
    return (modes.training_mode(model.hyperparameters).drawn_trees and 0 < len(model.trees) <= MAX_DRAWN_TREES
            and model.depth <= MAX_DRAWN_DEPTH)


def _node_label(model: Ensemble, feature: int, threshold: float) -> str:
    f = model.schema.features[int(feature)]
    if f.is_categorical:
        level = int(threshold)
        return f"{f.name} = {f.levels[level] if 0 <= level < len(f.levels) else level}"
    return f"{f.name} < {threshold:.4g}"


def tree_svg(model: Ensemble, index: int) -> str:
    """One tree as inline SVG: inner nodes "feature < threshold" (left branch: yes), leaves with values."""
    t = model.trees[index]
    d = model.depth
    leaves = 2**d
    w_leaf, h_level, box_h = 112, 64, 26
    width, height = leaves * w_leaf, (d + 1) * h_level
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="tree {index + 1}" '
             'font-family="sans-serif" font-size="11">']

    def pos(level: int, q: int) -> tuple[float, float]:
        span = width / 2**level
        return span * (q + 0.5), level * h_level + box_h / 2 + 4

    for level in range(d):
        for q in range(2**level):
            x, y = pos(level, q)
            for side in (0, 1):
                cx, cy = pos(level + 1, 2 * q + side)
                parts.append(f'<line x1="{x:.0f}" y1="{y:.0f}" x2="{cx:.0f}" y2="{cy:.0f}" stroke="#999"/>')
                parts.append(f'<text x="{(x + cx) / 2 + (-8 if side == 0 else 8):.0f}" y="{(y + cy) / 2:.0f}" '
                             f'text-anchor="middle" fill="#666" font-size="9">{"yes" if side == 0 else "no"}</text>')
    for level in range(d):
        for q in range(2**level):
            k = 2**level - 1 + q
            x, y = pos(level, q)
            label = _e(_node_label(model, t.features[k], t.thresholds[k]))
            bw = min(width / 2**level - 6, 7 * len(label) + 10)
            parts.append(f'<rect x="{x - bw / 2:.0f}" y="{y - box_h / 2:.0f}" width="{bw:.0f}" height="{box_h}" '
                         f'rx="4" fill="#eef3fb" stroke="#4a6fa5"/><text x="{x:.0f}" y="{y + 4:.0f}" '
                         f'text-anchor="middle">{label}</text>')
    for q in range(leaves):
        x, y = pos(d, q)
        v = float(t.leaves[q])
        parts.append(f'<rect x="{x - 34:.0f}" y="{y - box_h / 2:.0f}" width="68" height="{box_h}" rx="4" '
                     f'fill="{"#e7f5e9" if v >= 0 else "#fbeaea"}" stroke="#888"/><text x="{x:.0f}" '
                     f'y="{y + 4:.0f}" text-anchor="middle">{v:+.4f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _trees(model: Ensemble) -> str:
    hp = model.hyperparameters
    what = ("the margin (log-odds)" if model.task == "binary" else "the scaled label")
    how = ("as the best split on noisy histograms of the gradients (a Gaussian release per tree level)"
           if hp.selection == "histogram" else
           "by the exponential mechanism (a noisy choice favouring splits that explain the gradient best)")
    body = (f"<p>Each of the {len(model.trees)} trees below was grown greedily: every split was chosen among the "
            f"public candidate thresholds {how}, and every leaf value is a noisy Newton step. A record goes left "
            f"(<em>yes</em>) when the test holds. The prediction is {_e(what)}: the initial score "
            f"{model.init_score:+.4f} plus η = {hp.learning_rate:g} times the leaf reached in every tree. "
            "All of it is public output of the DP mechanisms; nothing here is computed from records.</p>")
    for i in range(len(model.trees)):
        body += f'<figure><figcaption>Tree {i + 1}</figcaption>{tree_svg(model, i)}</figure>'
    return body


def _importance(model: Ensemble, plots: bool) -> str:
    from .explain import BOX_POINTS, importance, public_box_sample
    from .svgplot import bar_chart

    imp = importance(model, public_box_sample(model, BOX_POINTS), "public box")
    rows = [(f, v, f"{s:.1%} of the total") for f, v, s in zip(imp.features, imp.mean_abs, imp.share)]
    body = (f"<p>How much each feature moves the model's output ({_e(imp.units)}): the mean absolute SHAP "
            f"contribution over {imp.points} points drawn uniformly from the public schema's feature box — a "
            "description of the released model, computed from it alone (no records, no privacy cost). Over your "
            "own records, and per prediction: <code>fedsbdt explain --model M --data F --contributions "
            "out.csv</code> (docs/explain.md).</p>")
    if plots:
        body += bar_chart(imp.features, imp.mean_abs, "Feature importance (mean |SHAP contribution|)",
                          f"mean |contribution| to the {imp.units}")
    return body + _table(rows, head=("feature", "mean |contribution|", "share"))


def build_report(model: Ensemble, ledger: LedgerSummary | None = None, model_name: str = "model",
                 model_sha256: str | None = None, generated: _dt.datetime | None = None, plots: bool = True,
                 evaluation: dict[str, Any] | None = None, reconstruction: dict[str, Any] | None = None) -> str:
    """The report as one self-contained HTML document (string)."""
    p = model.privacy
    missing = [k for k in ("epsilon", "delta", "sigma", "accountant") if k not in p]
    if missing:
        raise ReportError(f"{model_name}: the model carries no privacy receipt ({', '.join(missing)} missing)")
    generated = generated or _dt.datetime.now(_dt.timezone.utc)
    curve = None
    if plots:
        rs, eps = epsilon_curve(p, depth=model.depth)
        curve = plot_epsilon(rs, eps, float(p["epsilon"])) if rs.size else None
    rounds = model.training.get("rounds")
    sites_svg = plot_sites(rounds, model.training.get("threshold")) if plots and rounds else None
    ledger_svg = plot_ledger(ledger.used_fraction) if plots and ledger is not None and ledger.records else None
    ident = [("model", model_name, "file this report describes"),
             ("SHA-256", model_sha256 or "—", "fingerprint of the model file"),
             ("task", model.task, ""), ("trees", len(model.trees), "released trees"),
             ("software", f"fedsbdt {model.software}", f"wrote the model (this report: fedsbdt {__version__})"),
             ("generated", generated.strftime("%Y-%m-%d %H:%M UTC"), "")]
    sections = [
        _section("summary", "Model", _table(ident, head=("", "", ""))),
        _section("guarantee", "The guarantee in plain words", _guarantee(p, model.task)),
        _section("accountant", "Privacy accounting", _accountant(p, curve)),
        _section("hyperparameters", "Hyperparameters", _hyperparameters(model.hyperparameters.to_dict())
                 + (_settings(model) or "")),
        _section("training", "Training and participating sites", _training(model, sites_svg)),
    ]
    if p.get("evaluation"):
        sections.append(_section("evaluation", "Federated evaluation", _evaluation(p, evaluation)))
    if ledger is not None:
        sections.append(_section("ledger", f"Site ledger: {ledger.site}", _ledger(ledger, ledger_svg)))
    if model.training.get("audit"):  # fedsbdt audit: the empirical ε_lower beside the proof's ε (docs/audit.md)
        sections.append(_section("audit", "Privacy audit (one training run)", audit_html(model.training["audit"])))
    if reconstruction is not None:  # benchmarks/reconstruction.py's rates beside the proof's ε (docs/reconstruction.md)
        sections.append(_section("reconstruction", "Reconstruction attack (benchmark)", reconstruction_html(
            reconstruction, float(p["epsilon"]), model.training.get("audit"))))
    if model.trees:
        sections.append(_section("importance", "Feature importance", _importance(model, plots)))
    if draws_trees(model):
        sections.append(_section("trees", "The trees", _trees(model)))
    sections.append(_section("schema", "Public schema", _schema(model)))
    sections.append(_section("about", "About this report", (
        "<p class=\"muted\">Generated by fedsbdt from the model file and its privacy receipt. It contains no "
        "patient records. " + _e(modes.training_mode(model.hyperparameters).algorithm) + "</p>")))
    title = f"Privacy report — {model.schema.name}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1>" + "".join(sections) + "</body></html>\n")


@dataclass(frozen=True)
class ReportSummary:
    out: str
    epsilon: float
    delta: float
    sections: list[str]
    exhausted_share: float | None = None


def write_report(model_path: str | Path, out: str | Path, ledger_path: str | Path | None = None,
                 site: str | None = None, evaluation_path: str | Path | None = None,
                 reconstruction_path: str | Path | None = None) -> ReportSummary:
    """Load the model (and ledger), write the HTML report atomically, summarise it."""
    mp = Path(model_path)
    model = Ensemble.load(mp)
    sha = hashlib.sha256(mp.read_bytes()).hexdigest()
    ledger = None
    if ledger_path is not None and not model.hyperparameters.filter:
        raise ReportError(f"{mp} was trained without the individual Rényi filter: no record has a budget of its "
                          "own (every record is accounted for the worst case in every round), so a ledger says "
                          "nothing; leave out --ledger")
    if ledger_path is not None:
        spent = load_ledger(ledger_path)
        theirs, ours = ledger_plan(ledger_path), model.training.get("plan_sha256")
        if theirs and ours and theirs != ours:
            raise ReportError(f"{ledger_path}: this ledger belongs to plan {theirs[:16]}…, the model to plan "
                              f"{ours[:16]}…; pass the ledger of the session that trained this model")
        ledger = summarise_ledger(spent, model.privacy, site or Path(ledger_path).stem)
    receipt = None
    if evaluation_path is not None:
        receipt = _evaluation_receipt(evaluation_path, model, sha)
    reconstruction = None
    if reconstruction_path is not None:
        reconstruction = _reconstruction_result(reconstruction_path)
    text = build_report(model, ledger, model_name=mp.name, model_sha256=sha, evaluation=receipt,
                        reconstruction=reconstruction)
    o = write_atomic(out, text, "report")
    secs = ["summary", "guarantee", "accountant", "hyperparameters", "training"] \
        + (["evaluation"] if model.privacy.get("evaluation") else []) + (["ledger"] if ledger else []) \
        + (["audit"] if model.training.get("audit") else []) + (["reconstruction"] if reconstruction else []) \
        + (["trees"] if draws_trees(model) else []) + ["schema", "about"]
    return ReportSummary(str(o), float(model.privacy["epsilon"]), float(model.privacy["delta"]), secs,
                         ledger.exhausted_share if ledger else None)


def _reconstruction_result(path: str | Path) -> dict[str, Any]:
    """benchmarks/reconstruction.py's results file, validated (one line if it is not one)."""
    import json

    from .audit import AuditError, check_reconstruction

    try:
        return check_reconstruction(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as e:
        msg = str(e) if isinstance(e, AuditError) else f"not readable ({type(e).__name__}: {e})"
        raise ReportError(f"{path}: {msg}") from None


def _evaluation_receipt(path: str | Path, model: Ensemble, sha: str) -> dict[str, Any]:
    """The coordinator's evaluation.json for this model (refused if it belongs to another model)."""
    import json

    try:
        receipt = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: not a readable evaluation receipt ({e})") from None
    if not isinstance(receipt, dict) or receipt.get("model_sha256") != sha:
        raise ReportError(f"{path}: this evaluation receipt belongs to another model (its model_sha256 differs)")
    if not model.privacy.get("evaluation"):
        raise ReportError(f"{path}: the model's privacy receipt declares no federated evaluation")
    return receipt


# --------------------------------------------------------------------------- audit and reconstruction sections


def audit_html(a: dict) -> str:
    """The report's audit section from a stored :meth:`AuditResult.to_dict`: the audit's
    ε_lower beside the proof's ε, what was measured, and what it does and does not show."""
    conf = float(a.get("confidence", 0.95))
    below = a.get("epsilon_lower", 0.0) <= a.get("epsilon_claimed", 0.0)
    rows = [("ε (proof)", a.get("epsilon_claimed"), "the receipt's guarantee: an upper bound, proven"),
            ("ε_lower (audit)", a.get("epsilon_lower"),
             f"measured: an (ε, δ)-DP training run shows more than this with probability ≤ {1 - conf:.3g}"),
            ("confidence", conf, "1 − β of the lower bound"),
            ("δ", a.get("delta"), "the δ both are stated for"),
            ("canaries", a.get("canaries"), "records the auditor added, each by a secret fair coin"),
            ("guesses", a.get("guesses"), "canaries the attack guessed (the others: abstained)"),
            ("correct", a.get("correct"), "guesses that matched the auditor's coins"),
            ("most it can show", a.get("max_auditable"), "ε_lower if every canary were guessed right")]
    verdict = ("The audit's lower bound is below the proof's ε, as it must be for a correct implementation."
               if below else "The audit's lower bound is ABOVE the proof's ε: either the implementation leaks more "
               f"than it claims, or this run is the rare {100 * (1 - conf):.3g}% case. Investigate before release.")
    return (f"<p>An attacker who knows the data, the canaries and the released model tried to tell which canaries "
            f"were trained on (Steinke, Nasr &amp; Jagielski, one-run audit). {_e(verdict)} A small ε_lower "
            "means this attack could not see more; it is a lower bound, not a proof (docs/audit.md).</p>"
            + _table(rows))


#: the arms of benchmarks/reconstruction.py, in the order the report lists them, with what each one is
RECONSTRUCTION_ARMS = (
    ("baseline", "no model: the attacker's own records as its guess"),
    ("fedsbdt_eps_0.1", "fedsbdt, ε = 0.1"),
    ("fedsbdt_eps_1", "fedsbdt, ε = 1"),
    ("fedsbdt_eps_10", "fedsbdt, ε = 10"),
    ("fedsbdt_no_noise", "fedsbdt without noise (not a release: what the noise protects)"),
    ("xgboost", "non-private federated XGBoost (reference)"),
)


def reconstruction_html(d: dict, epsilon: float, audit: dict | None = None) -> str:
    """The report's reconstruction section: the proof's ε, the audit's ε_lower (if the model carries one) and
    the share of a victim site's records a curious site reconstructed, beside the non-private reference."""
    from .audit import check_reconstruction

    d = check_reconstruction(d)
    summary, tol = d["summary"], d.get("tolerance", {})
    known = [(a, what) for a, what in RECONSTRUCTION_ARMS if a in summary]
    known += [(a, a) for a in summary if a not in dict(RECONSTRUCTION_ARMS)]
    eps_arms = {a: float(a.rsplit("_", 1)[1]) for a, _ in known if a.startswith("fedsbdt_eps_")}
    near = min(eps_arms, key=lambda a: abs(math.log(eps_arms[a] / epsilon)), default=None) if epsilon > 0 else None

    def pct(arm: str, metric: str) -> str:
        v = summary[arm].get(metric)
        if not isinstance(v, dict) or v.get("mean") is None:
            return "—"
        lo, hi = v.get("min", v["mean"]), v.get("max", v["mean"])
        return f"{100 * v['mean']:.1f}%" + (f" ({100 * lo:.1f}–{100 * hi:.1f})" if hi > lo else "")

    def row(a: str, what: str) -> str:
        mark = " ← nearest this model's ε" if a == near else ""
        cells = "".join(f'<td class="num">{_e(pct(a, m))}</td>' for m in ("records", "features", "exact_values"))
        return f"<tr><th>{_e(what + mark)}</th>{cells}</tr>"

    rows = "".join(row(a, what) for a, what in known)
    lower = "not audited" if not audit else f"{float(audit.get('epsilon_lower', 0.0)):.3g} (at " \
        f"{100 * float(audit.get('confidence', 0.95)):g}% confidence)"
    head = ("<table><tr><th>ε (proof)</th><th>ε_lower (audit)</th><th>victim records reconstructed, this ε</th>"
            "<th>… non-private reference</th></tr>"
            f"<tr><td class=\"num\">{_e(f'{epsilon:.6g}')}</td><td class=\"num\">{_e(lower)}</td>"
            f"<td class=\"num\">{_e(pct(near, 'records') if near else '—')}</td>"
            f"<td class=\"num\">{_e(pct('xgboost', 'records') if 'xgboost' in summary else '—')}</td></tr></table>")
    return (f"<p>A reconstruction attack in the style of TimberStrike (Di Gennaro et al. 2025): one honest-but-"
            f"curious site of a {_e(d.get('sites', 3))}-site federation uses the released trees and its own records "
            f"to reconstruct another site's records ({_e(d.get('data', 'benchmark data'))}). A record counts as "
            f"reconstructed when every feature lies within {_e(tol.get('tau', 0.319))} standard deviations of the "
            "true value after an optimal pairing; \"features\" is the paper's accuracy (the share of features "
            "within tolerance); \"exact values\" the share of the victim's values that the release states "
            "verbatim as split thresholds. fedsbdt's thresholds are drawn from the public seed before any data "
            "is read, so they can state none. These are benchmark measurements on public data "
            "(benchmarks/reconstruction.py), not measurements of this model's data; range over runs in "
            "brackets (docs/reconstruction.md).</p>" + head
            + "<table><tr><th>release seen by the curious site</th><th>victim records reconstructed</th>"
              "<th>features within tolerance</th><th>exact values</th></tr>" + rows + "</table>")
