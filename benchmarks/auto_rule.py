"""Fit the ``auto`` rule (common/auto.py CURVES) on the grid; evaluate it leave-one-dataset-out (LODO) and
leave-one-kind-out (LOKO) against the rule it replaces, and under the DP row count's noise (docs/auto.md).

Reads ``results/auto_grid*.jsonl`` (benchmarks/auto_grid.py), the candidates ``auto.CANDIDATES`` only.  Scores are
higher-is-better (AUC, accuracy, R²), floored at what a constant predictor gets (AUC 0.5, R² 0) and averaged over
a cell's runs.  The *gap* of a setting on a (dataset, ε) cell is the best candidate's score there minus its own.

The rule (common/auto.py): per *profile* — the task group, split by the public schema's share of numeric
features and/or its feature count (``PARTITIONS``) — bands of the budget signal b = log10(ε·n/K) with edges
offset + k·width (``BAND_LAYOUTS``), and in each band the mean gap of every candidate over the profile's cells,
shrunk toward the task group's band mean by ``SHRINK`` pseudo-cells.  The rule picks the smallest gap averaged
over the row count's noise (one point when n is declared; auto.count_points).  The partition and the band
layout are chosen by an inner 5-fold cross-validation over the training datasets, so a held-out dataset (LODO)
or kind (LOKO) influences neither the gaps nor the layout.  "Old" is the rule before issue 39, fitted the same
way without a profile split (bands of b per task group) — and, fixed, ``OLD_TABLES`` as shipped before.

    python benchmarks/auto_rule.py            # evaluate; results/auto_rule.json, auto_rule.png
    python benchmarks/auto_rule.py --write    # ... and write the rule fitted on all datasets into common/auto.py
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402
from auto_grid import EPSILONS, RESULTS  # noqa: E402

from fedsbdt.common import auto  # noqa: E402

CANDIDATES = tuple(auto.CANDIDATES)
GROUPS = {"binary": "classification", "multiclass": "classification", "regression": "regression"}
FLOOR = {"binary": 0.5, "regression": 0.0, "multiclass": 0.0}
#: which grid run the rule is fitted on per task group: "l2" = λ matched to the leaf noise (auto_grid.py
#: --l2-auto, results/auto_grid*_l2_*.jsonl), "base" = λ = 1
VARIANT = {"classification": "base", "regression": "l2"}
#: profile thresholds tried: (numeric share at which a schema counts as numeric, feature count from which wide)
PARTITIONS = ((None, None),)
#: partitions tried and not kept: (1.0, None) numeric or mixed, (1.0, 10, True) numeric-and-wide or not, (1.0, 10)
#: both splits — each lost held out (docs/auto.md 'Evaluation'); `--partitions all` tries them again
TRIED = ((None, None), (1.0, None), (1.0, 10, True), (1.0, 10), (0.8, None), (1.0, 20))
#: pseudo-cells of the task group's curve in a profile's curve (shrinkage toward the group)
SHRINK = 2.0
#: a candidate stays in a profile's curves when it is within this of the best in some band (a shorter auto.py)
KEEP_WITHIN = 0.005
#: the band layouts of the old rule: (width, offset) of band edges offset + k·width, or one band
BAND_LAYOUTS = [(w, o) for w in (1.5, 2.0) for o in (0.0, 0.5, 1.0, 1.5) if o < w] + [(100.0, -50.0)]
#: the table shipped before issue 39 (common/auto.py TABLES then): upper edges of b and grid keys
OLD_TABLES = {"classification": ((1.0, "g01"), (2.5, "g04"), (5.5, "g17"), (math.inf, "g21")),
              "regression": ((2.5, "g02"), (4.0, "g14"), (math.inf, "g19"))}
INNER_FOLDS = 5
COUNT_DRAWS = 30


def load_rows() -> list[dict]:
    rows = []
    for f in sorted(RESULTS.glob("auto_grid*.jsonl")):
        variant = "l2" if "_l2" in f.name else "base"
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r["setting"] != "xgboost" and r["setting"] not in CANDIDATES:
                continue
            if r["setting"] == "xgboost" or VARIANT[GROUPS[r["task"]]] == variant:
                rows.append(r)
    return rows


def tables(rows):
    """(dataset, ε) -> candidate -> floored score (mean over runs); dataset meta; XGBoost scores; runs per cell."""
    acc = defaultdict(lambda: defaultdict(list))
    meta, xgb = {}, {}
    for r in rows:
        meta.setdefault(r["dataset"], r)
        s = max(r["score"], FLOOR[r["task"]]) if r["score"] == r["score"] else FLOOR[r["task"]]
        if r["setting"] == "xgboost":
            xgb[r["dataset"]] = s
        else:
            acc[(r["dataset"], r["epsilon"])][r["setting"]].append(s)
    score = {c: {g: float(np.mean(v)) for g, v in d.items()} for c, d in acc.items()}
    runs = {c: min(len(d[g]) for g in CANDIDATES) for c, d in acc.items() if all(g in d for g in CANDIDATES)}
    complete = {c: v for c, v in score.items() if c in runs}
    return complete, meta, xgb, runs


class Data:
    """The grid as arrays: per cell its dataset, ε, b, group, numeric share, features, gaps of every candidate."""

    def __init__(self, score, meta):
        self.cells = sorted(score)
        self.meta = meta
        m = [meta[d] for d, _ in self.cells]
        self.ds = np.array([d for d, _ in self.cells])
        self.eps = np.array([e for _, e in self.cells])
        self.n = np.array([x["n_train"] for x in m])
        self.k = np.array([max(x.get("classes", 0) or 1, 1) for x in m])
        self.b = np.log10(self.eps * self.n / self.k)
        self.task = np.array([x["task"] for x in m])
        self.group = np.array([GROUPS[t] for t in self.task])
        self.features = np.array([x["features"] for x in m])
        self.share = np.array([(x["features"] - x["categorical"]) / x["features"] for x in m])
        self.kind = np.array([suite.BY_NAME[d].kind for d in self.ds])
        S = np.array([[score[c][g] for g in CANDIDATES] for c in self.cells])
        self.score = S
        self.gaps = S.max(axis=1, keepdims=True) - S

        self._profiles = {}

    def profiles(self, part) -> np.ndarray:
        """Every cell's profile under the partition ``part`` (auto.profile_key), computed once."""
        if part not in self._profiles:
            self._profiles[part] = np.array([auto.profile_key(self.task[i], self.share[i], int(self.features[i]), part)
                                             for i in range(len(self.cells))])
        return self._profiles[part]

    def profile(self, i, part) -> str:
        return str(self.profiles(part)[i])


def profiles_of(part) -> list[str]:
    """Every profile a partition can give (so a held-out dataset of an unseen kind still has curves)."""
    if len(part) > 2 and part[2]:  # joint: numeric and wide, or not
        return [f"{g}/{k}" for g in ("classification", "regression") for k in ("numeric-wide", "other")]
    kinds = ["all"] if part[0] is None else ["numeric", "mixed"]
    if part[1] is not None:
        kinds = [k + s for k in kinds for s in ("-wide", "-narrow")]
    return [f"{g}/{k}" for g in ("classification", "regression") for k in kinds]


def fit_curves(D: Data, idx: np.ndarray, part, layout) -> dict:
    """Step curves per profile from the cells ``idx``: bands of b with edges offset + k·width (``layout``), in each
    the mean gap of every candidate over the profile's cells, shrunk toward the task group's band mean by
    ``SHRINK`` pseudo-cells (a band without group cells takes the nearest band that has some)."""
    w, o = layout
    prof = D.profiles(part)[idx]
    out = {}
    for grp in ("classification", "regression"):
        gi = idx[D.group[idx] == grp]
        if gi.size == 0:
            gi = idx
        kb = np.floor((D.b[gi] - o) / w).astype(int)
        ks = list(range(int(kb.min()), int(kb.max()) + 1))
        have = sorted(set(kb.tolist()))
        group_mean = {}
        for k in ks:
            near = min(have, key=lambda j: (abs(j - k), j))
            group_mean[k] = D.gaps[gi[kb == near]].mean(axis=0)
        edges = tuple(float(round(o + w * (k + 1), 6)) for k in ks[:-1])
        for p in profiles_of(part):
            if not p.startswith(grp + "/"):
                continue
            pi = idx[prof == p]
            kp = np.floor((D.b[pi] - o) / w).astype(int)
            rows = []
            for k in ks:
                cells = pi[kp == k]
                rows.append((D.gaps[cells].sum(axis=0) + SHRINK * group_mean[k]) / (len(cells) + SHRINK))
            curve = np.round(np.array(rows), 4)  # bands × candidates
            keep = [j for j in range(len(CANDIDATES)) if np.any(curve[:, j] <= curve.min(axis=1) + KEEP_WITHIN)]
            out[p] = (edges, {CANDIDATES[j]: tuple(float(x) for x in curve[:, j]) for j in keep})
    return out


def pick_point(curves: dict, D: Data, i: int, part, b: float | None = None) -> str:
    """The rule's choice for cell i at b (default: the cell's own b, n declared)."""
    return auto.choose(curves[D.profile(i, part)], [D.b[i] if b is None else b])


def pick_old(D: Data, i: int, b: float | None = None) -> str:
    b = D.b[i] if b is None else b
    return next(k for edge, k in OLD_TABLES[D.group[i]] if b < edge)


def gap(D: Data, i: int, key: str) -> float:
    return float(D.gaps[i, CANDIDATES.index(key)])


def _folds(datasets: list[str]) -> list[list[str]]:
    return [datasets[j::INNER_FOLDS] for j in range(min(INNER_FOLDS, len(datasets)))]


def choose_layout(D: Data, datasets: list[str], partitions=None):
    """Inner cross-validation over ``datasets`` (INNER_FOLDS folds, datasets dealt in name order): the (partition,
    band layout) with the smallest mean gap of the picks on the held-out folds."""
    best = None
    folds = _folds(datasets)
    for part in (PARTITIONS if partitions is None else partitions):
        for layout in BAND_LAYOUTS:
            gs = []
            for fold in folds:
                tr = np.flatnonzero(np.isin(D.ds, datasets) & ~np.isin(D.ds, fold))
                te = np.flatnonzero(np.isin(D.ds, fold))
                curves = fit_curves(D, tr, part, layout)
                gs += [gap(D, i, pick_point(curves, D, i, part)) for i in te]
            m = float(np.mean(gs))
            if best is None or m < best[0] - 1e-12:
                best = (m, part, layout)
    return best[1], best[2]


def held_out(D: Data, groups: dict[str, list[str]]) -> dict:
    """For each held-out set of datasets: the new rule (partition and bands chosen by the inner cross-validation)
    and the old one (no profile split: bands of b per task group only), both fitted on the rest."""
    datasets = sorted(set(D.ds))
    out = {}
    for name, test in groups.items():
        train = [d for d in datasets if d not in test]
        tr = np.flatnonzero(np.isin(D.ds, train))
        if tr.size == 0:
            continue
        part, layout = choose_layout(D, train)
        old_layout = choose_layout(D, train, [(None, None)])[1]
        out[name] = {"curves": fit_curves(D, tr, part, layout), "part": part, "layout": layout,
                     "old_curves": fit_curves(D, tr, (None, None), old_layout), "old_layout": old_layout,
                     "test": test}
    return out


def summarise(rows: list[dict], keys=("gap_new", "gap_old_refit", "gap_old_shipped", "gap_paper")) -> dict:
    out = {}
    for e in [*EPSILONS, "all"]:
        cs = [c for c in rows if e == "all" or c["epsilon"] == e]
        if not cs:
            continue
        out[str(e)] = {k: {"mean": float(np.mean([c[k] for c in cs])),
                           "within_0.01": float(np.mean([c[k] <= 0.01 for c in cs])), "cells": len(cs)}
                       for k in keys}
    return out


def evaluate(D: Data, fits: dict, xgb: dict) -> list[dict]:
    rows = []
    for name, f in fits.items():
        for i in np.flatnonzero(np.isin(D.ds, f["test"])):
            new = pick_point(f["curves"], D, i, f["part"])
            old = pick_point(f["old_curves"], D, i, (None, None))
            shipped = pick_old(D, i)
            best = CANDIDATES[int(np.argmin(D.gaps[i]))]
            rows.append({"fold": name, "dataset": str(D.ds[i]), "kind": str(D.kind[i]), "task": str(D.task[i]),
                         "epsilon": float(D.eps[i]), "n_train": int(D.n[i]), "b": round(float(D.b[i]), 3),
                         "profile": D.profile(i, f["part"]), "new": new, "old_refit": old, "old_shipped": shipped,
                         "grid_best": best, "grid_best_score": float(D.score[i].max()),
                         "new_score": float(D.score[i, CANDIDATES.index(new)]),
                         "gap_new": gap(D, i, new), "gap_old_refit": gap(D, i, old),
                         "gap_old_shipped": gap(D, i, shipped), "gap_paper": gap(D, i, "g01"),
                         "xgboost": xgb.get(str(D.ds[i])),
                         "xgboost_minus_new": (xgb[str(D.ds[i])] - float(D.score[i, CANDIDATES.index(new)])
                                               if str(D.ds[i]) in xgb else None)})
    return rows


def count_robustness(D: Data, fits: dict, draws: int = COUNT_DRAWS, seed: int = 39) -> dict:
    """Each held-out cell under the DP row count (ROWS_SHARE of its ε, discrete Laplace, the rest for the trees):
    the expected gap, and the *instability* — the share of draws whose choice differs from the most frequent
    one — of the new rule (averaged over the count's noise, auto.count_points), the new curves at the noisy
    count alone, and the old table at the noisy count."""
    rng = np.random.default_rng(seed)
    out = defaultdict(lambda: defaultdict(list))
    for f in fits.values():
        for i in np.flatnonzero(np.isin(D.ds, f["test"])):
            e = float(D.eps[i])
            er = auto.ROWS_SHARE * e
            a = math.exp(-er)  # discrete Laplace: the difference of two geometric variables
            noise = rng.geometric(1 - a, draws) - rng.geometric(1 - a, draws)
            e_train, k, true_n = e - er, int(D.k[i]), int(D.n[i])
            prof = f["curves"][D.profile(i, f["part"])]
            picks = defaultdict(list)
            for z in noise:
                c = max(true_n + int(z), 1)
                b_c = auto.budget_signal(e_train, c, k)
                picks["new"].append(auto.choose(prof, [auto.budget_signal(e_train, n, k)
                                                       for n in auto.count_points(c, er)]))
                picks["new_point"].append(auto.choose(prof, [b_c]))
                picks["old_shipped"].append(pick_old(D, i, b_c))
            for rule, ks in picks.items():
                mode = max(set(ks), key=ks.count)
                for key in (str(e), "all"):
                    out[key][rule + "_gap"].append(float(np.mean([gap(D, i, x) for x in ks])))
                    out[key][rule + "_unstable"].append(float(np.mean([x != mode for x in ks])))
    return {e: {k: float(np.mean(v)) for k, v in d.items()} for e, d in out.items()}


def final_fit(D: Data):
    datasets = sorted(set(D.ds))
    part, layout = choose_layout(D, datasets)
    return part, layout, fit_curves(D, np.arange(len(D.cells)), part, layout)


def write_rule(part, layout, curves, n_datasets: int, n_kinds: str, runs: str) -> None:
    """Replace the fitted block of common/auto.py with these curves."""
    path = Path(__file__).resolve().parents[1] / "common" / "auto.py"  # the checkout's, not the installed copy
    src = path.read_text()
    lines = [f'FITTED_ON = ("{n_datasets} public datasets ({n_kinds}) × ε ∈ {{0.1, 1, 4, 10}} × '
             f'{len(CANDIDATES)} settings, {runs} (benchmarks/auto_rule.py; bands of b of width {layout[0]:g})")',
             "#: profile thresholds: 'numeric' when the numeric share of the features is ≥ numeric_at (None: no split);",
             "#: '-wide' appended when the feature count is ≥ wide_at (None: no split); joint: one split only,",
             "#: 'numeric-wide' (both) against 'other'",
             f'PROFILE = {{"numeric_at": {part[0]!r}, "wide_at": {part[1]!r}, '
             f'"joint": {bool(len(part) > 2 and part[2])!r}}}',
             '#: per profile "group/kind": (upper edges of the bands of b, {candidate: mean gap in each band})',
             "CURVES: dict[str, tuple[tuple[float, ...], dict[str, tuple[float, ...]]]] = {"]
    for p, (bs, by) in sorted(curves.items()):
        lines.append(f'    "{p}": (')
        lines.append(f"        {tuple(bs)!r},")
        lines.append("        {")
        for k, g in by.items():
            lines.append(f'            "{k}": ({", ".join(f"{x:.4f}" for x in g)}),')
        lines.append("        }),")
    lines.append("}")
    block = "\n".join(lines) + "\n"
    new = re.sub(r"(# --- fitted by benchmarks/auto_rule.py --write \(do not edit by hand\) ---\n).*?"
                 r"(# --- end of the fitted part ---)", lambda m: m.group(1) + block + m.group(2), src, flags=re.S)
    path.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the rule fitted on all datasets into common/auto.py")
    ap.add_argument("--quick", action="store_true", help="skip LODO (LOKO and the final fit only)")
    a = ap.parse_args()
    score, meta, xgb, runs = tables(load_rows())
    datasets = sorted({c[0] for c in score if all((c[0], e) in score for e in EPSILONS)})
    score = {c: v for c, v in score.items() if c[0] in datasets}
    D = Data(score, meta)
    kinds = {k: sorted({d for d in datasets if suite.BY_NAME[d].kind == k}) for k in suite.KINDS}
    print(f"{len(datasets)} datasets complete over {len(CANDIDATES)} candidates × {EPSILONS}: "
          + ", ".join(f"{k} {len(v)}" for k, v in kinds.items()), file=sys.stderr)
    results = {"datasets": datasets, "kinds": kinds, "candidates": {k: auto.candidate(k) for k in CANDIDATES},
               "runs_per_cell": {f"{d}|{e}": r for (d, e), r in runs.items() if d in datasets}}
    for name, groups in ([] if a.quick else [("lodo", {d: [d] for d in datasets})]) + [
            ("loko", {k: v for k, v in kinds.items() if v})]:
        fits = held_out(D, groups)
        rows = evaluate(D, fits, xgb)
        summ = summarise(rows)
        rob = count_robustness(D, fits)
        results[name] = {"cells": rows, "summary": summ, "count_robustness": rob,
                         "layouts": {k: {"partition": f["part"], "bands": f["layout"], "old_bands": f["old_layout"]}
                                     for k, f in fits.items()}}
        misses = sorted((c for c in rows if c["gap_new"] > 0.01), key=lambda c: -c["gap_new"])
        results[name]["misses"] = [{k: c[k] for k in ("dataset", "kind", "epsilon", "b", "new", "grid_best",
                                                      "gap_new", "gap_old_refit")} for c in misses]
        print(f"{name}: {len(misses)} of {len(rows)} cells miss by > 0.01; worst: " + "; ".join(
            f"{c['dataset']} ε={c['epsilon']:g} {c['new']}→{c['grid_best']} {c['gap_new']:.3f}" for c in misses[:8]))
        xg = {}
        for e in [*EPSILONS, "all"]:
            cs = [c for c in rows if c["kind"] == "numeric-measurement" and c["xgboost_minus_new"] is not None
                  and (e == "all" or c["epsilon"] == e)]
            if cs:
                xg[str(e)] = {"xgboost_minus_new": float(np.mean([c["xgboost_minus_new"] for c in cs])),
                              "xgboost_minus_grid_best": float(np.mean([c["xgboost"] - c["grid_best_score"] for c in cs])),
                              "cells": len(cs)}
        results[name]["xgboost_numeric"] = xg
        print(f"{name} XGBoost − new on numeric-measurement sets: " + ", ".join(
            f"ε={e} {v['xgboost_minus_new']:+.4f} (grid best {v['xgboost_minus_grid_best']:+.4f})" for e, v in xg.items()))
        if name == "loko":
            results[name]["by_kind"] = {k: summarise([c for c in rows if c["kind"] == k]) for k in kinds
                                        if any(c["kind"] == k for c in rows)}
        for e, s in summ.items():
            print(f"{name} ε={e:>4}: new {s['gap_new']['mean']:.4f} ({s['gap_new']['within_0.01']:.0%} ≤ 0.01) | "
                  f"old refit {s['gap_old_refit']['mean']:.4f} ({s['gap_old_refit']['within_0.01']:.0%}) | "
                  f"old shipped {s['gap_old_shipped']['mean']:.4f} ({s['gap_old_shipped']['within_0.01']:.0%}) | "
                  f"paper g01 {s['gap_paper']['mean']:.4f}")
        for e, r in sorted(rob.items()):
            print(f"{name} DP count ε={e}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(r.items())))
        if name == "loko":
            for k, sk in results[name]["by_kind"].items():
                s = sk["all"]
                print(f"loko held out {k}: new {s['gap_new']['mean']:.4f} ({s['gap_new']['within_0.01']:.0%}) | "
                      f"old refit {s['gap_old_refit']['mean']:.4f} | old shipped {s['gap_old_shipped']['mean']:.4f}")
    part, layout, curves = final_fit(D)
    results["final"] = {"partition": part, "bands": layout, "curves": {p: {"edges": list(e), "gaps": by}
                                                                       for p, (e, by) in curves.items()}}
    print(f"final: partition {part}, bands {layout}", file=sys.stderr)
    if a.write:
        nk = ", ".join(f"{len(v)} {k}" for k, v in kinds.items() if v)
        write_rule(part, layout, curves, len(datasets), nk,
                   "one run per cell (the first 22 sets: four for g01–g21)")
        import importlib

        importlib.reload(auto)
        for i in range(len(D.cells)):  # the module as written picks what the fit picks
            assert auto.choose(auto.CURVES[D.profile(i, part)], [D.b[i]]) == pick_point(curves, D, i, part)
        print(auto.rule_table())
    (RESULTS / "auto_rule.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    if "lodo" in results:
        plot(results["lodo"]["cells"], datasets)


def plot(cells, datasets) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(EPSILONS), 1, figsize=(18, 12), sharex=True)
    x = np.arange(len(datasets))
    for ax, e in zip(axes, EPSILONS):
        cs = {c["dataset"]: c for c in cells if c["epsilon"] == e}
        ax.bar(x - 0.3, [cs[d]["gap_new"] for d in datasets], 0.3, label="new rule (LODO) − grid best")
        ax.bar(x, [cs[d]["gap_old_refit"] for d in datasets], 0.3, label="old rule refitted (LODO) − grid best")
        ax.bar(x + 0.3, [cs[d]["gap_paper"] for d in datasets], 0.3, label="paper g01 − grid best")
        ax.axhline(0.01, color="k", lw=0.6, ls="--")
        ax.set_ylabel(f"gap, ε = {e:g}")
    axes[-1].set_xticks(x, datasets, rotation=90, fontsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "auto_rule.png", dpi=80)


if __name__ == "__main__":
    main()
