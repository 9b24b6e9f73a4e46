"""Every mode, central and federated, in one table per setting and dataset, beside the papers (docs/modes.md).

Two settings, both at ε = 1, 2, 4, 6, 8, 10:

* ``fig4`` — Sarus' Fig. 4 (Grislain & Gonzalvez 2021): 20 trees, depth 6, λ = 0.1, η = 0.3, g* = 1; Adult test
  error % and Abalone test RMSE, the paper's numbers beside ours; (ε, δ) rows at δ = 5e-8 (``sarus.DELTA``).
* ``fig2`` — DPBoost's Fig. 2 (Li et al., AAAI'20): 50 trees in one ensemble, depth 6, λ = 0.1, η = 0.1,
  g* = 1; the paper gives plots only; (ε, δ) rows at δ = 1/n_train (``dpboost.py``'s convention).

Each mode keeps its own mechanism's settings inside a setting: Sarus subsamples 0.1 with min_child_weight 50,
DPBoost gives each record one tree of the ensemble (no subsampling), S-BDT runs its defaults (100 trees).

Running the script measures the two *central cross rows* no other benchmark has — DPBoost mode in the Fig. 4
setting and Sarus mode (pure and RDP-calibrated) in the Fig. 2 setting — on the same splits as
``sarus.py`` / ``dpboost.py`` (Adult: adult.data / adult.test; Abalone: public 70/30 shuffles, run r uses
``SPLIT_SEED + r``), saves ``results/modes_central.json``, then builds the table (``--table`` alone only
builds it) from whichever of these are in the results directory:

    sarus.json (Sarus central, S-BDT central at Fig. 4)      dpboost.json (DPBoost and S-BDT central at Fig. 2)
    modes_central.json (the cross rows)                      sarus_federated.json (Sarus federated at Fig. 4)
    dpboost_federated.json (DPBoost federated at Fig. 2)     modes_federated.json (the other federated cells:
                                                             benchmarks/modes_federated.py)

A row without its input says "not run".  Writes ``modes.json``, ``modes.md`` (the markdown tables) and
``modes.png`` (one panel per setting × dataset; dashed lines federated, black markers the paper).

Run:  python benchmarks/modes.py [--runs 3] [--quick]   (~10 min on 2 loaded cores; --quick ~1 min)
      python benchmarks/modes.py --table [--results-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from _util import RESULTS, environment, summary  # noqa: E402  (puts the repo on sys.path)

import dpboost  # noqa: E402  (benchmarks/dpboost.py)
import sarus  # noqa: E402  (benchmarks/sarus.py)
from fedsbdt.common.modes.sarus import SARUS_DEFAULTS  # noqa: E402

EPSILONS = sarus.EPSILONS
#: the keys a setting fixes for every mode that takes them (the rest is each mode's own)
SHARED_KEYS = ("trees", "depth", "l2", "learning_rate", "grad_clip")
FIG4 = {k: SARUS_DEFAULTS[k] for k in SHARED_KEYS}
FIG2 = {k: dpboost.FIG2[k] for k in SHARED_KEYS}
SETTINGS = {
    "fig4": {"title": "Sarus' Fig. 4 setting",
             "setting": (f"{FIG4['trees']} trees, depth {FIG4['depth']}, λ = {FIG4['l2']}, η = {FIG4['learning_rate']}, "
                         f"g* = {FIG4['grad_clip']:g}; Sarus subsample 0.1, min_child_weight 50; DPBoost one "
                         f"ensemble of {FIG4['trees']} trees; S-BDT its defaults; (ε, δ) rows at δ = {sarus.DELTA:g}")},
    "fig2": {"title": "DPBoost's Fig. 2 setting",
             "setting": (f"{FIG2['trees']} trees in one ensemble, depth {FIG2['depth']}, λ = {FIG2['l2']}, "
                         f"η = {FIG2['learning_rate']}, g* = {FIG2['grad_clip']:g}; Sarus subsample 0.1, "
                         "min_child_weight 50; S-BDT its defaults; (ε, δ) rows at δ = 1/n_train")},
}
DATASETS = {"adult": "Adult, test error %", "abalone": "Abalone, test RMSE (years)"}
#: table rows: key → (label, federated?)
ROWS = {
    "paper": ("paper", False),
    "sarus_pure": ("Sarus, central, the paper's accounting", False),
    "sarus_rdp": ("Sarus, central, our RDP ledger", False),
    "sarus_federated": ("Sarus, federated (3 sites)", True),
    "dpboost": ("DPBoost, central", False),
    "dpboost_federated": ("DPBoost, federated (3 sites)", True),
    "sbdt": ("S-BDT, central (defaults)", False),
    "sbdt_federated": ("S-BDT, federated (3 sites, defaults)", True),
}
#: the central cross rows this script measures: (setting, mode) → keys beyond ε, δ, seed
CROSS = {
    ("fig4", "dpboost"): {**dpboost.FIG2, **FIG4, "ensemble_trees": FIG4["trees"]},
    ("fig2", "sarus_pure"): {**sarus.MODES["sarus_pure"], **FIG2},
    ("fig2", "sarus_rdp"): {k: v for k, v in {**sarus.MODES["sarus_rdp"], **FIG2}.items() if k != "delta"},
}
PAPER_NOTE = {"fig4": "Sarus Fig. 4 (5 trials)",
              "fig2": "DPBoost Fig. 2: plots only, no numbers in the text"}
NO_SBDT_FEDERATED = ("S-BDT federated is left out: no results file has it at these settings (federation.json: "
                     "ε = 1 with 1000 trees and the paper's ε = 0.02 setting; greedy_federated.json: greedy trees "
                     "at ε = 1); benchmarks/modes_federated.py measures it into modes_federated.json.")


# ----------------------------------------------------------------------------------------------- measuring

def cross_keys(setting: str, mode: str, epsilon: float, n_train: int, seed: int) -> dict:
    """Training keys of one central cross-row run: δ by the setting's convention (pure Sarus rows have none)."""
    keys = {**CROSS[(setting, mode)], "epsilon": epsilon, "seed": seed}
    if mode != "sarus_pure":
        keys["delta"] = sarus.DELTA if setting == "fig4" else 1.0 / n_train
    return keys


def measure(runs: int, epsilons=EPSILONS) -> dict:
    """Train every central cross-row cell ``runs`` times (fresh DP noise; for Abalone a fresh split per run)."""
    splits_of = {"fig4": sarus.datasets, "fig2": dpboost.datasets}
    out = {"runs": runs, "epsilons": list(epsilons), "cross": {f"{s}/{m}": k for (s, m), k in CROSS.items()},
           "settings": {s: {} for s in SETTINGS}}
    for (setting, mode) in CROSS:
        for name in DATASETS:
            splits = [splits_of[setting](name, r) for r in range(runs)]
            cells = out["settings"][setting].setdefault(name, {})[mode] = []
            for eps in epsilons:
                vals, secs = [], []
                for r, (tr, te) in enumerate(splits):
                    err, s, priv = dpboost.fit(tr, te, cross_keys(setting, mode, eps, tr.n, 1000 + r))
                    vals.append(err)
                    secs.append(s)
                block = priv.get("dpboost", {})
                cell = summary(vals) | {
                    "epsilon": eps, "values": vals, "train_seconds_mean": float(np.mean(secs)),
                    "released_epsilon": priv["epsilon"], "released_delta": priv["delta"],
                    "pure": bool(block["pure"]) if block else priv["delta"] == 0,
                    "eps_paper": block["epsilon_paper"] if block else priv["eps_paper"]}
                cells.append(cell)
                print(f"{setting} {name:8s} {mode:10s} ε={eps:<4g} {cell['mean']:.3f} ± {cell['se']:.3f} "
                      f"({cell['train_seconds_mean']:.1f} s per run)", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------------------------------ building tables

def _cell(c: dict, delta: float | None) -> dict:
    """One table cell from a results cell: mean ± SE recomputed from its ``values`` when it has them."""
    mean, se, runs = c.get("mean"), c.get("se"), c.get("runs")
    if c.get("values"):
        s = summary(c["values"])
        mean, se, runs = s["mean"], s["se"], s["runs"]
    se = None if se is None or runs < 2 or not math.isfinite(se) else float(se)
    return {"mean": float(mean), "se": se, "runs": int(runs), "delta": None if delta is None else float(delta)}


def _from_list(cells: list) -> dict:
    """Cells of sarus.py / sarus_federated.py / modes_central.json: a list with ``epsilon`` per cell."""
    return {float(c["epsilon"]): _cell(c, 0.0 if c.get("pure") else c.get("released_delta")) for c in cells}


def _dpboost_central(payload: dict, name: str, mode: str) -> dict:
    """dpboost.py's Fig. 2 cells (keyed by ε as a string; δ = 1/n_train, 0 where the receipt says pure)."""
    d = payload["fig2"][name]
    delta = 1.0 / d["train_rows"]
    receipts = d.get("dpboost_receipts", {})
    return {float(e): _cell(c, 0.0 if mode == "dpboost" and receipts.get(e, {}).get("pure") else delta)
            for e, c in d[mode].items()}


def _dpboost_federated(payload: dict, name: str) -> dict:
    """dpboost_federated.py's cells: one training (``error``) or several (``values``) per ε."""
    d = payload["results"][name]
    out = {}
    for e, row in d["rows"].items():
        c = row["federated_dpboost"]
        out[float(e)] = _cell({"values": c["values"] if "values" in c else [c["error"]]}, d["delta"])
    return out


def _sarus_federated_in(payload: dict, name: str) -> dict:
    return _from_list(payload["results"][name]["sarus_federated"])


def _modes_federated(setting: str, key: str) -> tuple:
    """A row of modes_federated.py's cells (the layout of modes_central.json)."""
    return "modes_federated.json", lambda p, n: _from_list(p["settings"][setting][n][key])


#: where each row of each setting comes from: (file, extractor) — None: no benchmark measures it
SOURCES = {
    "fig4": {
        "sarus_pure": ("sarus.json", lambda p, n: _from_list(p["results"][n]["sarus_pure"])),
        "sarus_rdp": ("sarus.json", lambda p, n: _from_list(p["results"][n]["sarus_rdp"])),
        "sarus_federated": ("sarus_federated.json", _sarus_federated_in),
        "dpboost": ("modes_central.json", lambda p, n: _from_list(p["settings"]["fig4"][n]["dpboost"])),
        "dpboost_federated": _modes_federated("fig4", "dpboost_federated"),
        "sbdt": ("sarus.json", lambda p, n: _from_list(p["results"][n]["sbdt"])),
        "sbdt_federated": _modes_federated("fig4", "sbdt_federated"),
    },
    "fig2": {
        "sarus_pure": ("modes_central.json", lambda p, n: _from_list(p["settings"]["fig2"][n]["sarus_pure"])),
        "sarus_rdp": ("modes_central.json", lambda p, n: _from_list(p["settings"]["fig2"][n]["sarus_rdp"])),
        "sarus_federated": _modes_federated("fig2", "sarus_federated"),
        "dpboost": ("dpboost.json", lambda p, n: _dpboost_central(p, n, "dpboost")),
        "dpboost_federated": ("dpboost_federated.json", _dpboost_federated),
        "sbdt": ("dpboost.json", lambda p, n: _dpboost_central(p, n, "sbdt")),
        "sbdt_federated": _modes_federated("fig2", "sbdt_federated"),
    },
}


class TableInputError(ValueError):
    """A results file exists but is not valid JSON."""


def _read(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TableInputError(f"{path}: not a readable JSON results file ({e})") from None


def privacy_label(cells: dict) -> str:
    """'pure ε-DP' when every measured cell has δ = 0, else the (ε, δ) of the row (never pure by default: a
    cell whose file does not record δ makes the row say so)."""
    deltas = {c["delta"] for c in cells.values() if c is not None}
    if not deltas:
        return ""
    if None in deltas:
        return "δ not recorded"
    if deltas == {0.0}:
        return "pure ε-DP (δ = 0)"
    pure = [f"{e:g}" for e, c in cells.items() if c is not None and c["delta"] == 0]
    positive = sorted(d for d in deltas if d > 0)
    text = "(ε, δ = " + " / ".join(f"{d:.2g}" for d in positive) + ")"
    return text + (f"; pure at ε = {', '.join(pure)}" if pure else "")


def build_tables(results_dir: Path) -> dict:
    """The rows of every setting × dataset from the JSON files in ``results_dir``; a row whose input is missing
    (file absent, dataset or row not in it) has ``cells`` of None and a ``note`` saying why."""
    tables = {}
    for setting, spec in SETTINGS.items():
        tables[setting] = {"title": spec["title"], "setting": spec["setting"], "epsilons": list(EPSILONS),
                           "datasets": {}}
        for name, metric in DATASETS.items():
            rows = []
            for key, (label, federated) in ROWS.items():
                row = {"key": key, "label": label, "federated": federated, "source": None, "note": ""}
                cells, note = _row_cells(results_dir, setting, key, name)
                if key == "sbdt_federated" and not cells:
                    continue  # shown only when measured: NO_SBDT_FEDERATED says why it is absent
                row["cells"] = {str(e): cells.get(e) for e in EPSILONS}
                row["note"] = note
                row["source"] = None if key == "paper" or SOURCES[setting][key] is None else SOURCES[setting][key][0]
                row["privacy"] = "pure ε-DP (paper's composition)" if key == "paper" and cells else \
                    privacy_label({e: cells.get(e) for e in EPSILONS})
                rows.append(row)
            tables[setting]["datasets"][name] = {"metric": metric, "rows": rows}
    return tables


def _row_cells(results_dir: Path, setting: str, key: str, name: str) -> tuple[dict, str]:
    if key == "paper":
        if setting != "fig4":
            return {}, PAPER_NOTE[setting]
        return {e: {"mean": float(v), "se": None, "runs": 5, "delta": 0.0, "paper": True}
                for e, v in zip(EPSILONS, sarus.PAPER[name])}, PAPER_NOTE[setting]
    source = SOURCES[setting][key]
    if source is None:
        return {}, "not run: no benchmark measures this row in this setting"
    file, extract = source
    payload = _read(results_dir / file)
    if payload is None and file == "sarus_federated.json":  # sarus_federated.py also adds its row to sarus.json
        fallback = _read(results_dir / "sarus.json")
        if fallback is not None and "sarus_federated" in fallback.get("results", {}).get(name, {}):
            return extract(fallback, name), ""
    if payload is None:
        return {}, f"not run: no {file}"
    try:
        return extract(payload, name), ""
    except KeyError:
        return {}, f"not run: {file} has no {key} row for {name}"


def has_sbdt_federated(tables: dict) -> bool:
    return any(r["key"] == "sbdt_federated" for s in tables.values() for t in s["datasets"].values()
               for r in t["rows"])


def format_cell(cell: dict | None, digits: int = 2) -> str:
    """``mean ± SE (runs)``; one run: ``mean (1)``; the paper's values as printed; missing: ``not run``."""
    if cell is None:
        return "not run"
    if cell.get("paper"):
        return f"{cell['mean']:g}"
    se = "" if cell["se"] is None else f" ± {cell['se']:.{digits}f}"
    return f"{cell['mean']:.{digits}f}{se} ({cell['runs']})"


def render_markdown(tables: dict) -> str:
    lines = ["# Every mode beside the papers", "",
             "Each cell: mean ± standard error over the runs (number of runs in brackets; one run has no SE); "
             "`not run`: no results for that row at that ε. Pure ε-DP rows have δ = 0; the others are (ε, δ)-DP "
             "at the δ in the privacy column. Dashed lines in modes.png are federated rows.", ""]
    for setting in tables.values():
        for name, table in setting["datasets"].items():
            lines += [f"## {setting['title']} — {table['metric']}", "", setting["setting"], "",
                      "| row | privacy | " + " | ".join(f"ε = {e:g}" for e in setting["epsilons"]) + " |",
                      "|---|---|" + "---|" * len(setting["epsilons"])]
            notes = []
            for row in table["rows"]:
                label = row["label"]
                if row["key"] == "paper":
                    label = f"paper: {row['note']}"
                    if all(c is None for c in row["cells"].values()):
                        lines.append(f"| {label} | | " + " | ".join("—" for _ in setting["epsilons"]) + " |")
                        continue
                elif row["note"]:
                    notes.append(f"{row['label']}: {row['note']}")
                lines.append(f"| {label} | {row['privacy']} | " +
                             " | ".join(format_cell(row["cells"][str(e)]) for e in setting["epsilons"]) + " |")
            lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    if not has_sbdt_federated(tables):
        lines += [NO_SBDT_FEDERATED, ""]
    return "\n".join(lines)


def plot(tables: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"sarus_pure": "C0", "sarus_rdp": "C1", "sarus_federated": "C1", "dpboost": "C2",
               "dpboost_federated": "C2", "sbdt": "C3", "sbdt_federated": "C3"}
    panels = [(s, n) for s in tables for n in tables[s]["datasets"]]
    fig, axes = plt.subplots(len(tables), len(DATASETS), figsize=(11, 4 * len(tables)), squeeze=False)
    for ax, (setting, name) in zip(axes.flat, panels):
        table = tables[setting]["datasets"][name]
        for row in table["rows"]:
            pts = [(float(e), c) for e, c in row["cells"].items() if c is not None]
            if not pts:
                if row["key"] == "paper":
                    ax.text(0.02, 0.02, f"paper: {row['note']}", transform=ax.transAxes, fontsize=7)
                continue
            x = [e for e, _ in pts]
            y = [c["mean"] for _, c in pts]
            if row["key"] == "paper":
                ax.plot(x, y, "kx", markersize=9, mew=2, label=f"paper ({row['note']})")
                continue
            se = [c["se"] or 0.0 for _, c in pts]
            ax.errorbar(x, y, yerr=se, color=colours[row["key"]], linestyle="--" if row["federated"] else "-",
                        marker="o", markersize=4, capsize=3, label=f"{row['label']} [{row['privacy']}]")
        ax.set_title(f"{tables[setting]['title']}: {name.capitalize()}", fontsize=10)
        ax.set_xlabel("ε")
        ax.set_ylabel(table["metric"].split(", ", 1)[1])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_tables(results_dir: Path, png: bool = True) -> dict:
    """Build the tables from ``results_dir`` and write modes.json, modes.md and (``png``) modes.png there."""
    tables = build_tables(results_dir)
    (results_dir / "modes.json").write_text(json.dumps(
        {"tables": tables, "note": "" if has_sbdt_federated(tables) else NO_SBDT_FEDERATED, "environment": environment()}, indent=2) + "\n")
    (results_dir / "modes.md").write_text(render_markdown(tables))
    if png:
        plot(tables, results_dir / "modes.png")
    return tables


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per central cross-row cell (default 3)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 run at ε ∈ {1, 10}, saved as modes_central-quick.json (the table ignores it)")
    ap.add_argument("--table", action="store_true", help="only build the table from the results files")
    ap.add_argument("--results-dir", type=Path, default=RESULTS,
                    help="where the input JSON files are and the table goes (default benchmarks/results)")
    ap.add_argument("--no-png", action="store_true", help="skip modes.png (it needs matplotlib: the bench extra)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be ≥ 1")
    if not args.results_dir.is_dir():
        ap.error(f"--results-dir {args.results_dir}: not a directory")
    if not args.no_png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("modes.png needs matplotlib (pip install -e '.[bench]'), or pass --no-png")
    if not args.table:
        t0 = time.perf_counter()
        payload = measure(1, (1.0, 10.0)) if args.quick else measure(args.runs)
        payload["wall_seconds"] = time.perf_counter() - t0
        path = args.results_dir / ("modes_central-quick.json" if args.quick else "modes_central.json")
        path.write_text(json.dumps(payload | {"environment": environment()}, indent=2) + "\n")
        print(f"wrote {path} in {payload['wall_seconds']:.0f} s", file=sys.stderr)
    try:
        tables = write_tables(args.results_dir, png=not args.no_png)
    except TableInputError as e:
        print(f"modes.py: error: {e}", file=sys.stderr)
        return 2
    print(render_markdown(tables))
    print(f"wrote modes.json, modes.md{'' if args.no_png else ', modes.png'} in {args.results_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
