"""DP peers beside ``auto``: InterpretML's DP-EBM and IBM diffprivlib at the same ε and δ, and non-private XGBoost.

For every suite dataset (benchmarks/suite.py; all rows unless ``--max-rows``) and ε, ``--reps`` runs (fresh noise
each) of

* **ours**: ``fedsbdt train --epsilon E`` as a user runs it — the CLI's own ``auto_hyperparameters`` (a DP row
  count at 2 % of ε, the rest to training, δ = 5e-8), then the central engine;
* **DP-EBM** (``interpret.privacy.DPExplainableBoosting{Classifier,Regressor}``, its defaults otherwise) with the
  same ε and δ, the schema's ranges as ``privacy_bounds``, categorical features as their public level lists
  (``feature_types``), and the label range as ``privacy_target_min/max`` (regression).  It has no multi-class
  model: those cells read "n/a";
* **diffprivlib** (the models of benchmarks/diffprivlib_compare.py, same public bounds, pure ε-DP): a random
  forest and a logistic regression (classification), a linear regression (regression);
* **XGBoost** (hist, 300 trees, depth 6; benchmarks/auto_grid.py's ``xgboost_score``), non-private, one run.

The same 80/20 split (auto_grid.py's public seed) for all of them; scores are higher-is-better: AUC (binary),
accuracy (multi-class), R² (regression).  diffprivlib needs scikit-learn < 1.8 and DP-EBM ``interpret-core``;
one environment with ``pip install -e '.[bench]' 'scikit-learn<1.8' diffprivlib`` runs everything.  Runs are
appended to results/dp_peers.json after each cell (a rerun skips what is there); ``--table`` averages the
runs per cell, marks where a peer beats ``auto`` and the gap to XGBoost, and prints the markdown table of
docs/auto.md.

    NUMBA_NUM_THREADS=1 nice python benchmarks/dp_peers.py --datasets adult,flights --eps 1,4 --reps 2
    python benchmarks/dp_peers.py --table
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import auto_grid  # noqa: E402
import suite  # noqa: E402
from _util import environment  # noqa: E402
from diffprivlib_compare import diffprivlib_models, public_bounds  # noqa: E402

OUT = HERE / "results" / "dp_peers.json"
EPSILONS = (1.0, 4.0)
PEERS = ("dp_ebm", "diffprivlib")
#: data sets with at least this many rows get the "gap to XGBoost at ε = 1" line
LARGE = 100_000


# --------------------------------------------------------------------------- the four methods


def ours(tr, te, eps: float) -> dict:
    """``fedsbdt train --epsilon eps`` with every other flag at its default (auto settings, DP row count)."""
    from fedsbdt.common.cli import auto_hyperparameters, build_parser
    from fedsbdt.common.engine import train
    from fedsbdt.common.randomness import SecureRandomness

    args = build_parser().parse_args(["train", "--data", "-", "--schema", "-", "--out", "-", "--epsilon", str(eps)])
    rnd = SecureRandomness(sampler=args.sampler)
    hp, _, eps_rows = auto_hyperparameters(args, tr.schema, tr.n, rnd)
    res = train(tr, hp, rnd)
    y = te.y.astype(int) if tr.schema.task == "multiclass" else te.y
    s = auto_grid.score(tr.schema.task, y, res.model.predict(te.X))
    p = res.model.privacy
    return {"score": s["score"], "epsilon_total": p["epsilon"] + eps_rows, "delta": p["delta"],
            "hp": {k: getattr(hp, k) for k in ("trees", "depth", "subsample", "learning_rate", "cyclical", "l2")}}


def ebm_inputs(ds) -> tuple[object, list, np.ndarray]:
    """DP-EBM's view of ``ds``: a frame (categorical as level-code strings), feature types (numeric
    'continuous', categorical its public level list) and the public bounds (F × 2)."""
    import pandas as pd

    cols, types = {}, []
    for j, f in enumerate(ds.schema.features):
        if f.is_categorical:
            cols[f.name] = ds.X[:, j].astype(int).astype(str)
            types.append([str(i) for i in range(len(f.levels))])
        else:
            cols[f.name] = ds.X[:, j].astype(float)
            types.append("continuous")
    lo, hi = public_bounds(ds.schema)
    return pd.DataFrame(cols), types, np.column_stack([lo, hi])


def dp_ebm(tr, te, eps: float, delta: float) -> dict:
    """InterpretML's DP-EBM at (ε, δ) with the schema's public bounds; binary and regression only."""
    from interpret.privacy import DPExplainableBoostingClassifier, DPExplainableBoostingRegressor

    task = tr.schema.task
    if task == "multiclass":
        return {"score": None, "note": "n/a: DP-EBM has no multi-class model"}
    Xtr, types, bounds = ebm_inputs(tr)
    Xte = ebm_inputs(te)[0]
    kw = dict(feature_types=types, epsilon=eps, delta=delta, privacy_bounds=bounds, n_jobs=1)
    if task == "binary":
        m = DPExplainableBoostingClassifier(**kw).fit(Xtr, tr.y.astype(int))
        return {"score": auto_grid.score(task, te.y, m.predict_proba(Xte)[:, 1])["score"]}
    lo, hi = tr.schema.label_range
    m = DPExplainableBoostingRegressor(**kw, privacy_target_min=lo, privacy_target_max=hi).fit(Xtr, tr.y)
    return {"score": auto_grid.score(task, te.y, m.predict(Xte))["score"]}


def diffprivlib(tr, te, eps: float) -> dict:
    """diffprivlib's models (diffprivlib_compare.diffprivlib_models) at ε; the best of them is the cell's score."""
    task = tr.schema.task
    lo, hi = public_bounds(tr.schema)
    Xtr, Xte = np.clip(tr.X.astype(float), lo, hi), np.clip(te.X.astype(float), lo, hi)
    ytr, yte = (tr.y.astype(int), te.y.astype(int)) if task != "regression" else (tr.y, te.y)
    classes = np.arange(tr.schema.n_classes) if task == "multiclass" else np.array([0, 1])
    models = diffprivlib_models(task, eps, lo, hi, classes=classes, y_bounds=tuple(tr.schema.label_range or (0, 1)))
    out = {}
    for key, m in models.items():
        try:
            m.fit(Xtr, ytr)
            pred = m.predict(Xte) if task == "regression" else m.predict_proba(Xte)
            out[key] = auto_grid.score(task, yte, pred[:, 1] if task == "binary" else pred)["score"]
        except Exception as e:  # noqa: BLE001 - a peer model that fails is reported, not fatal
            out[key], out[key + "_error"] = None, f"{type(e).__name__}: {e}"[:200]
    scores = {k: v for k, v in out.items() if k in models and v is not None}
    best = max(scores, key=scores.get) if scores else None
    return {"score": scores.get(best), "model": best, "models": out}


# --------------------------------------------------------------------------- runs


def load_results(path: Path) -> dict:
    """The results file's contents ({"runs": []} if absent); ValueError (one line) if it is not a results file."""
    if not path.exists():
        return {"runs": []}
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("runs"), list):
        raise ValueError(f"{path} has no list of runs")
    return payload


def save_results(path: Path, payload: dict) -> None:
    """Write ``payload`` whole (a temporary file renamed over the old one: never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload | {"environment": environment()}, indent=1) + "\n")
    tmp.replace(path)


def run(names: list[str], epsilons: list[float], reps: int, max_rows: int | None, path: Path) -> None:
    from fedsbdt.common.config import Hyperparameters

    delta = Hyperparameters.delta
    payload = load_results(path)
    done = {(r["dataset"], r["epsilon"], r["rep"], r["method"]) for r in payload["runs"]}
    warnings.filterwarnings("ignore")
    for name in names:
        ds = suite.load(name, max_rows=max_rows)
        tr, te = auto_grid.split(ds)
        meta = {"dataset": name, "task": ds.schema.task, "n": ds.n, "n_train": tr.n}
        cells = [(None, 0, "xgboost")] + [(e, r, m) for e in epsilons for r in range(reps)
                                          for m in ("ours", *PEERS)]
        for eps, rep, method in cells:
            if (name, eps, rep, method) in done:
                continue
            t0 = time.perf_counter()
            try:
                if method == "xgboost":
                    r = {"score": auto_grid.xgboost_score(ds, tr, te)["score"]}
                elif method == "ours":
                    r = ours(tr, te, eps)
                elif method == "dp_ebm":
                    r = dp_ebm(tr, te, eps, delta)
                else:
                    r = diffprivlib(tr, te, eps)
            except Exception as e:  # noqa: BLE001 - recorded, the other cells go on
                r = {"score": None, "error": f"{type(e).__name__}: {e}"[:300]}
            row = {**meta, "epsilon": eps, "delta": None if method in ("xgboost", "diffprivlib") else delta,
                   "rep": rep, "method": method, **r, "seconds": round(time.perf_counter() - t0, 2)}
            payload["runs"].append(row)
            save_results(path, payload)
            print(f"{name} ε={eps} rep={rep} {method}: {r['score']} ({row['seconds']}s)", file=sys.stderr,
                  flush=True)


# --------------------------------------------------------------------------- table


def _mean(values: list) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def build_table(runs: list[dict]) -> dict:
    """Per (dataset, ε): each method's mean over its runs (None where it has no score), the peers that beat
    ``ours``, and per dataset XGBoost's score; plus, at ε = 1 on every set of ≥ :data:`LARGE` rows, ours'
    gap to XGBoost."""
    by: dict = {}
    meta: dict = {}
    for r in runs:
        meta.setdefault(r["dataset"], {k: r[k] for k in ("task", "n", "n_train")})
        by.setdefault((r["dataset"], r["epsilon"], r["method"]), []).append(r)
    cells = []
    for name, m in meta.items():
        xgb = _mean([r["score"] for r in by.get((name, None, "xgboost"), [])])
        for eps in sorted({e for (n, e, _) in by if n == name and e is not None}):
            cell = {"dataset": name, **m, "epsilon": eps, "xgboost": xgb}
            for method in ("ours", *PEERS):
                rs = by.get((name, eps, method), [])
                scores = [r["score"] for r in rs if r["score"] is not None]
                cell[method] = _mean(scores)
                cell[method + "_runs"] = len(scores)
                cell[method + "_range"] = [min(scores), max(scores)] if scores else None
            dpl = by.get((name, eps, "diffprivlib"), [])
            models = sorted({k for r in dpl for k in r.get("models", {}) if not k.endswith("_error")})
            cell["diffprivlib_models"] = {k: _mean([r["models"].get(k) for r in dpl]) for k in models}
            cell["diffprivlib"] = max((v for v in cell["diffprivlib_models"].values() if v is not None),
                                      default=None)
            cell["peers_ahead"] = [p for p in PEERS if cell["ours"] is not None and cell[p] is not None
                                   and cell[p] > cell["ours"]]
            cell["xgboost_minus_ours"] = (None if xgb is None or cell["ours"] is None
                                          else round(xgb - cell["ours"], 4))
            cells.append(cell)
    losses = [{"dataset": c["dataset"], "epsilon": c["epsilon"], "peer": p, "ours": c["ours"], "peer_score": c[p]}
              for c in cells if c["epsilon"] >= 1 for p in c["peers_ahead"]]
    large = [{"dataset": c["dataset"], "n": c["n"], "ours": c["ours"], "xgboost": c["xgboost"],
              "gap": c["xgboost_minus_ours"]} for c in cells if c["epsilon"] == 1.0 and c["n"] >= LARGE]
    return {"cells": cells, "summary": summarise(cells), "losses_at_eps_ge_1": losses, "large_sets_eps_1": large}


def summarise(cells: list[dict]) -> list[dict]:
    """Per ε and task, over the data sets where both have a score: ours' and each peer's mean, and on how many
    sets ours is at least as good (per task: an R² of −10⁶ must not average with AUCs)."""
    out = []
    for eps, task in sorted({(c["epsilon"], c["task"]) for c in cells}):
        row: dict = {"epsilon": eps, "task": task}
        for peer in PEERS:
            both = [c for c in cells if (c["epsilon"], c["task"]) == (eps, task) and c["ours"] is not None
                    and c[peer] is not None]
            row[peer] = {"datasets": len(both), "ours_mean": _mean([c["ours"] for c in both]),
                         "peer_mean": _mean([c[peer] for c in both]),
                         "ours_at_least": sum(c["ours"] >= c[peer] for c in both)}
        out.append(row)
    return out


def _fmt(v: float | None, mark: bool = False) -> str:
    """A score to three decimals (an R² below −1 in short scientific form), bold if ``mark``; "n/a" if None."""
    if v is None:
        return "n/a"
    text = f"{v:.3f}" if v >= -1 else f"{v:.2g}"
    return f"**{text}**" if mark else text


def render_markdown(table: dict) -> str:
    """One row per (dataset, ε): ours, DP-EBM, diffprivlib (its best model), XGBoost; the best private score
    in bold."""
    lines = ["| data (task, n) | ε | ours (auto) | DP-EBM | diffprivlib (best model) | XGBoost (non-private) |",
             "|---|---|---|---|---|---|"]
    for c in table["cells"]:
        private = [v for v in (c["ours"], c["dp_ebm"], c["diffprivlib"]) if v is not None]
        best = max(private, default=None)
        dpl = c["diffprivlib"]
        model = next((k for k, v in c["diffprivlib_models"].items() if v == dpl), None) if dpl is not None else None
        dpl_text = _fmt(dpl, dpl == best) + (f" ({model.replace('_', ' ')})" if model else "")
        lines.append(f"| {c['dataset']} ({c['task']}, {c['n']:,}) | {c['epsilon']:g} | {_fmt(c['ours'], c['ours'] == best)} "
                     f"| {_fmt(c['dp_ebm'], c['dp_ebm'] == best)} | {dpl_text} | {_fmt(c['xgboost'])} |")
    return "\n".join(lines) + "\n"


def table_command(path: Path) -> dict:
    payload = load_results(path)
    if not payload["runs"]:
        raise ValueError(f"{path} has no runs; run the benchmark first")
    t = build_table(payload["runs"])
    payload["table"] = t
    save_results(path, payload)
    print(render_markdown(t))
    for x in t["losses_at_eps_ge_1"]:
        print(f"behind a peer: {x['dataset']} ε={x['epsilon']:g}: {x['peer']} {x['peer_score']:.3f} "
              f"> ours {x['ours']:.3f}")
    for x in t["large_sets_eps_1"]:
        print(f"ε=1, {x['dataset']} ({x['n']:,} rows): XGBoost {x['xgboost']:.3f} − ours {x['ours']:.3f} = {x['gap']:.3f}")
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dp_peers.py", description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(e.name for e in suite.ENTRIES))
    ap.add_argument("--eps", default=",".join(f"{e:g}" for e in EPSILONS))
    ap.add_argument("--reps", type=int, default=2, help="runs per (dataset, ε) and private method")
    ap.add_argument("--max-rows", type=int, default=None, help="cap every data set (public-seed subsample)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--table", action="store_true", help="only average the runs there and print the table")
    a = ap.parse_args(argv)
    names = a.datasets.split(",")
    unknown = [n for n in names if n not in suite.BY_NAME]
    if unknown:
        ap.error(f"unknown dataset(s) {', '.join(unknown)}; the suite has {', '.join(suite.BY_NAME)}")
    try:
        epsilons = [float(e) for e in a.eps.split(",")]
    except ValueError:
        ap.error(f"--eps {a.eps!r}: a comma-separated list of numbers")
    if any(not e > 0 for e in epsilons) or a.reps < 1 or (a.max_rows is not None and a.max_rows < 10):
        ap.error("ε must be > 0, --reps ≥ 1 and --max-rows ≥ 10")
    try:
        if not a.table:
            run(names, epsilons, a.reps, a.max_rows, Path(a.out))
        table_command(Path(a.out))
    except ValueError as e:  # a results file that is absent, empty or not ours: one line, nothing written
        print(f"dp_peers.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
