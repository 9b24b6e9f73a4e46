"""Fit the ``auto`` rule (common/auto.py TABLE) on the grid and evaluate it leave-one-dataset-out (docs/auto.md).

Reads ``results/auto_grid*.jsonl`` (benchmarks/auto_grid.py).  The rule maps bands of the budget signal
``b = log10(ε·n/max(K, 1))`` to one of the 20 grid settings: in each band, the setting with the smallest
mean gap to the best grid setting of each (dataset, ε) cell in the band.  The band width and offset are
chosen by an inner leave-one-dataset-out over the training datasets, so the held-out dataset influences
neither the choice of bands nor the settings.

Scores are higher-is-better (AUC, accuracy, R²), floored at what a constant predictor gets (AUC 0.5, R² 0)
so a diverged run at ε = 0.1 does not dominate a mean.  Writes ``results/auto_rule.json`` and
``results/auto_rule.png`` and prints the TABLE fitted on all datasets.

    python benchmarks/auto_rule.py
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto_grid import EPSILONS, GRID, RESULTS, settings  # noqa: E402

#: rule families tried by the inner leave-one-dataset-out: bands of b, ("bands", width, offset) with edges at
#: offset + k·width (or one band), where each band takes the setting with the smallest mean gap over its cells;
#: or ("kernel", h): at b, the setting with the smallest mean gap over the group's cells weighted by
#: exp(−½((b_cell − b)/h)²) — a smoothed band that does not jump with which cells fall on which side of an edge
LAYOUTS = ([("bands", w, o) for w in (1.0, 1.5, 2.0) for o in (0.0, 0.5, 1.0, 1.5) if o < w] + [("bands", 100.0, -50.0)]
           + [("kernel", h) for h in (0.25, 0.5, 0.75, 1.0)])
#: the b grid on which a kernel rule is written out as a band table (common/auto.py TABLES)
B_GRID = np.round(np.arange(0.0, 8.0001, 0.05), 2)
#: the rule keeps one band table per group: regression trees behave differently (a leaf's Hessian sum is its
#: noisy record count, so small leaves blow up) from classification trees
GROUPS = {"binary": "classification", "multiclass": "classification", "regression": "regression"}
FLOOR = {"binary": 0.5, "regression": 0.0, "multiclass": 0.0}


#: which grid run the rule is fitted on per task group: "l2" = λ matched to the leaf noise (auto_grid.py
#: --l2-auto, results/auto_grid_l2_*.jsonl), "base" = λ = 1
VARIANT = {"classification": "base", "regression": "l2"}


def load_rows() -> list[dict]:
    rows = []
    for f in sorted(RESULTS.glob("auto_grid*.jsonl")):
        variant = "l2" if "_l2" in f.name else "base"
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            grp = GROUPS[r["task"]]
            if r["setting"] == "xgboost" or VARIANT[grp] == variant:
                rows.append(r)
    return rows


def tables(rows):
    """(dataset, ε) -> setting -> floored score, averaged over repetitions; dataset meta; XGBoost scores."""
    acc = defaultdict(lambda: defaultdict(list))
    meta, xgb = {}, {}
    for r in rows:
        meta[r["dataset"]] = r
        s = max(r["score"], FLOOR[r["task"]]) if r["score"] == r["score"] else FLOOR[r["task"]]
        if r["setting"] == "xgboost":
            xgb[r["dataset"]] = s
        else:
            acc[(r["dataset"], r["epsilon"])][r["setting"]].append(s)
    score = {c: {g: float(np.mean(v)) for g, v in d.items()} for c, d in acc.items()}
    complete = {k: v for k, v in score.items() if all(g in v for g in GRID)}
    return complete, meta, xgb


def signal(meta: dict, ds: str, eps: float) -> float:
    m = meta[ds]
    return math.log10(eps * m["n_train"] / max(m.get("classes", 0) or 1, 1))


def band(b: float, layout) -> int:
    _, w, o = layout
    return math.floor((b - o) / w)


def group(meta, ds) -> str:
    return GROUPS[meta[ds]["task"]]


def fit(cells, score, meta, layout):
    """The rule fitted on ``cells``: a function (group, b) -> grid key (module doc, :data:`LAYOUTS`)."""
    if layout[0] == "kernel":
        h = layout[1]
        by_group = defaultdict(list)
        for c in cells:
            best = max(score[c].values())
            by_group[group(meta, c[0])].append((signal(meta, *c), [best - score[c][g] for g in GRID]))

        def pick(grp: str, b: float) -> str:
            cs = by_group.get(grp) or [x for v in by_group.values() for x in v]
            w = np.exp(-0.5 * ((np.array([x[0] for x in cs]) - b) / h) ** 2)
            mean_gap = w @ np.array([x[1] for x in cs]) / w.sum()
            return list(GRID)[int(np.argmin(mean_gap))]

        return pick
    by = defaultdict(list)
    for c in cells:
        by[(group(meta, c[0]), band(signal(meta, *c), layout))].append(c)
    rule = {}
    for key, cs in by.items():
        gaps = {g: np.mean([max(score[c].values()) - score[c][g] for c in cs]) for g in GRID}
        rule[key] = min(gaps, key=gaps.get)

    def pick(grp: str, b: float) -> str:
        """The band's setting; a band without training cells takes the nearest band of its group."""
        k = band(b, layout)
        if (grp, k) in rule:
            return rule[(grp, k)]
        same = [(g, j) for g, j in rule if g == grp] or list(rule)  # a group without cells: any group's bands
        return rule[min(same, key=lambda gj: (abs(gj[1] - k), gj[1], gj[0]))]

    return pick


def table_of(pick, grp: str) -> list[tuple[float, str]]:
    """The rule written as bands: (upper edge of b, grid key), the last edge ∞ (scanned on :data:`B_GRID`)."""
    keys = [pick(grp, b) for b in B_GRID]
    out = [(float(B_GRID[i]), keys[i - 1]) for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
    return out + [(math.inf, keys[-1])]


def gap_of(pick, cells, score, meta) -> list[float]:
    return [max(score[c].values()) - score[c][pick(group(meta, c[0]), signal(meta, *c))] for c in cells]


def choose_layout(datasets, score, meta) -> tuple:
    """Inner leave-one-dataset-out over ``datasets``: the layout with the smallest mean held-out gap."""
    best = None
    for layout in LAYOUTS:
        gaps = []
        for d in datasets:
            train = [c for c in score if c[0] in datasets and c[0] != d]
            test = [c for c in score if c[0] == d]
            gaps += gap_of(fit(train, score, meta, layout), test, score, meta)
        m = float(np.mean(gaps))
        if best is None or m < best[0]:
            best = (m, layout)
    return best[1]


def main() -> None:
    rows = load_rows()
    score, meta, xgb = tables(rows)
    datasets = sorted({c[0] for c in score if all((c[0], e) in score for e in EPSILONS)})
    score = {c: v for c, v in score.items() if c[0] in datasets}
    print(f"{len(datasets)} datasets with all of ε ∈ {EPSILONS} complete: {', '.join(datasets)}", file=sys.stderr)
    cells_out = []
    for d in datasets:  # outer leave-one-dataset-out
        others = [x for x in datasets if x != d]
        layout = choose_layout(others, score, meta)
        pick_of = fit([c for c in score if c[0] != d], score, meta, layout)
        # the best single setting on the others (a rule without any signal) and today's default g01
        single = min(GRID, key=lambda g: np.mean([max(score[c].values()) - score[c][g] for c in score
                                                   if c[0] != d]))
        for e in EPSILONS:
            c = (d, e)
            best_key = max(score[c], key=score[c].get)
            pick = pick_of(group(meta, d), signal(meta, d, e))
            cells_out.append({
                "dataset": d, "task": meta[d]["task"], "n_train": meta[d]["n_train"], "epsilon": e,
                "signal": signal(meta, d, e), "auto": pick, "auto_score": score[c][pick],
                "grid_best": best_key, "grid_best_score": score[c][best_key],
                "gap_auto": score[c][best_key] - score[c][pick],
                "gap_single": score[c][best_key] - score[c][single],
                "gap_default": score[c][best_key] - score[c]["g01"], "default_score": score[c]["g01"],
                "xgboost": xgb.get(d), "gap_xgboost_auto": (xgb[d] - score[c][pick]) if d in xgb else None,
                "layout": layout})
    summary = {}
    for e in [*EPSILONS, "all"]:
        cs = [c for c in cells_out if e == "all" or c["epsilon"] == e]
        summary[str(e)] = {k: {"mean": float(np.mean([c[k] for c in cs])), "worst": float(np.max([c[k] for c in cs])),
                               "worst_dataset": max(cs, key=lambda c: c[k])["dataset"],
                               "within_0.01": int(sum(c[k] <= 0.01 for c in cs)), "cells": len(cs)}
                           for k in ("gap_auto", "gap_single", "gap_default", "gap_xgboost_auto")}
    layout = choose_layout(datasets, score, meta)
    final = fit(list(score), score, meta, layout)
    table = {grp: [(edge, settings(key), key) for edge, key in table_of(final, grp)]
             for grp in sorted(set(GROUPS.values()))}
    out = {"datasets": datasets, "grid": {k: settings(k) for k in GRID}, "epsilons": list(EPSILONS),
           "cells": cells_out, "summary": summary, "final_layout": layout,
           "final_table": {g: [{"upper_edge": t[0], "setting": t[2], **t[1]} for t in ts] for g, ts in table.items()}}
    (RESULTS / "auto_rule.json").write_text(json.dumps(out, indent=1) + "\n")
    for e, s in summary.items():
        print(f"ε={e:>4}: auto gap mean {s['gap_auto']['mean']:.4f} worst {s['gap_auto']['worst']:.4f} "
              f"({s['gap_auto']['worst_dataset']}), within 0.01: {s['gap_auto']['within_0.01']}/{s['gap_auto']['cells']}"
              f" | single best {s['gap_single']['mean']:.4f} | default {s['gap_default']['mean']:.4f} "
              f"| XGBoost − auto mean {s['gap_xgboost_auto']['mean']:.4f}")
    print("TABLE (fitted on all datasets, layout", layout, "):")
    for grp, ts in table.items():
        print(f"  {grp!r}: (")
        for i, (edge, s, key) in enumerate(ts):
            e = "math.inf" if i == len(ts) - 1 else f"{edge:g}"
            print(f"    ({e}, dict(trees={s['trees']}, depth={s['depth']}, subsample={s['subsample']}, "
                  f"learning_rate={s['learning_rate']}, cyclical={s['cyclical']})),  # {key}")
        print("  ),")
    shipped(score, meta, xgb)
    plot(cells_out, datasets)


def shipped(score, meta, xgb) -> None:
    """The rule as shipped (common/auto.py, fitted on all datasets, with g* and λ), run by
    ``auto_grid.py --settings auto --out results/auto_verify.jsonl``, against the grid's best and XGBoost."""
    f = RESULTS / "auto_verify.jsonl"
    if not f.exists():
        return
    runs = defaultdict(list)  # (dataset, ε) -> the shipped rule's runs (--rep), averaged like the grid's
    for r in (json.loads(line) for line in f.read_text().splitlines() if line.strip()):
        if (r["dataset"], r["epsilon"]) in score:
            runs[(r["dataset"], r["epsilon"])].append(r)
    out = []
    for c, rs in runs.items():
        s = float(np.mean([max(r["score"], FLOOR[r["task"]]) for r in rs]))
        out.append({"dataset": c[0], "epsilon": c[1], "runs": len(rs), "auto_score": s,
                    "grid_best": max(score[c].values()), "gap": max(score[c].values()) - s,
                    "old_default": score[c]["g01"], "xgboost": xgb.get(c[0]),
                    "xgboost_minus_auto": xgb[c[0]] - s if c[0] in xgb else None, "hp": rs[0].get("hp")})
    summ = {}
    for e in [*EPSILONS, "all"]:
        cs = [c for c in out if e == "all" or c["epsilon"] == e]
        if cs:
            summ[str(e)] = {"mean_gap": float(np.mean([c["gap"] for c in cs])),
                            "worst_gap": float(np.max([c["gap"] for c in cs])),
                            "mean_gain_over_old_default": float(np.mean([c["auto_score"] - c["old_default"] for c in cs])),
                            "mean_xgboost_minus_auto": float(np.mean([c["xgboost_minus_auto"] for c in cs])),
                            "cells": len(cs)}
            print(f"shipped auto ε={e}: gap to grid best mean {summ[str(e)]['mean_gap']:+.4f} worst "
                  f"{summ[str(e)]['worst_gap']:+.4f}; over the old default {summ[str(e)]['mean_gain_over_old_default']:+.4f}; "
                  f"XGBoost − auto {summ[str(e)]['mean_xgboost_minus_auto']:+.4f} ({len(cs)} cells)")
    (RESULTS / "auto_shipped.json").write_text(json.dumps({"cells": out, "summary": summ}, indent=1) + "\n")


def plot(cells, datasets) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(EPSILONS), figsize=(16, 5), sharey=True)
    x = np.arange(len(datasets))
    for ax, e in zip(axes, EPSILONS):
        cs = {c["dataset"]: c for c in cells if c["epsilon"] == e}
        ax.bar(x - 0.3, [cs[d]["gap_auto"] for d in datasets], 0.3, label="auto (LODO) − grid best")
        ax.bar(x, [cs[d]["gap_default"] for d in datasets], 0.3, label="old default − grid best")
        ax.bar(x + 0.3, [cs[d]["gap_xgboost_auto"] or 0 for d in datasets], 0.3, label="XGBoost − auto")
        ax.axhline(0.01, color="k", lw=0.6, ls="--")
        ax.set_title(f"ε = {e:g}")
        ax.set_xticks(x, datasets, rotation=90, fontsize=7)
    axes[0].set_ylabel("score gap (AUC / accuracy / R²)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "auto_rule.png", dpi=90)


if __name__ == "__main__":
    main()
