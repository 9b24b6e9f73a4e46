"""``auto``: hyperparameters that follow the privacy budget and the data size (docs/auto.md).

A pure rule from quantities that cost no privacy — ε, δ, the task, the number of classes K, the features
(count, types, level counts) — and the row count n, which the user declares public (``--rows N``) or which
is released by a discrete-Laplace count at a small accounted share of ε (:data:`ROWS_SHARE`).

The rule's one signal is the *budget per model*, ``b = log10(ε·n)`` (``ε·n/K`` for K classes: each class
tree sees the same noise with 1/K of the signal).  Leaf noise scales like ``1/ε`` and the leaf sums like
``n·γ/2^d``, so ``ε·n`` is what decides how many leaves (depth), trees, and how much of the data per tree
(γ) the noise can afford.  :data:`TABLES` maps bands of ``b`` to settings, one table per task group; it was fitted offline
(benchmarks/auto_rule.py) on the 22-dataset suite (benchmarks/suite.py) as, in each band, the grid
setting with the smallest mean gap to the best grid setting of each (dataset, ε); docs/auto.md has the
leave-one-dataset-out evaluation.  Settings the table does not vary are fixed with a reason each.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from fedsbdt.common import modes

from .schema import Schema

#: the share of ε spent on the DP row count when n is not declared public (pure ε-DP, discrete Laplace)
ROWS_SHARE = 0.02
#: keys the rule sets (any explicit flag or plan key overrides them)
AUTO_KEYS = ("trees", "depth", "subsample", "learning_rate", "cyclical", "split_candidates", "tree_builder",
             "init_share", "grad_clip", "l2")

#: per task group, (upper edge of b = log10(ε·n[/K]), settings): the first band whose edge exceeds b applies
#: (fitted by benchmarks/auto_rule.py on benchmarks/results/auto_grid*.jsonl; see docs/auto.md)
TABLES: dict[str, tuple[tuple[float, dict[str, Any]], ...]] = {
    "classification": (
        (1.0, dict(trees=100, depth=3, subsample=0.1, learning_rate=0.1, cyclical=True)),  # g01
        (2.5, dict(trees=20, depth=4, subsample=1.0, learning_rate=0.3, cyclical=False)),  # g04
        (5.5, dict(trees=300, depth=5, subsample=0.3, learning_rate=0.1, cyclical=True)),  # g17
        (math.inf, dict(trees=1000, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False)),  # g21
    ),
    "regression": (  # fitted on the grid with λ matched to the noise (auto_grid.py --l2-auto)
        (2.5, dict(trees=50, depth=3, subsample=0.1, learning_rate=0.1, cyclical=True)),  # g02
        (4.0, dict(trees=200, depth=4, subsample=0.2, learning_rate=0.1, cyclical=False)),  # g14
        (math.inf, dict(trees=500, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False)),  # g19
    ),
}
#: where TABLES come from (shown with the reason)
FITTED_ON = "22 public datasets × ε ∈ {0.1, 1, 4, 10} × 22 settings × 4 runs (benchmarks/auto_rule.py)"


@dataclass(frozen=True)
class AutoInputs:
    """What the rule may look at: public or privately released quantities only."""

    epsilon: float
    delta: float
    task: str
    classes: int  # K (0 unless multiclass)
    features: int
    categorical: int
    max_levels: int
    rows: int  # n: declared public, or a DP count
    rows_source: str = "declared"  # "declared" (public, --rows) or "dp-count" (released at ROWS_SHARE·ε)

    @classmethod
    def for_schema(cls, schema: Schema, epsilon: float, delta: float, rows: int,
                   rows_source: str = "declared") -> "AutoInputs":
        cats = [f for f in schema.features if f.is_categorical]
        return cls(float(epsilon), float(delta), schema.task, schema.n_classes, schema.n_features, len(cats),
                   max((len(f.levels) for f in cats), default=0), max(int(rows), 1), rows_source)


@dataclass(frozen=True)
class AutoChoice:
    settings: dict[str, Any]
    reasons: tuple[str, ...]
    inputs: AutoInputs
    budget: float  # b = log10(ε·n[/K])

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "reasons": list(self.reasons), "inputs": asdict(self.inputs),
                "budget_log10": self.budget, "fitted_on": FITTED_ON}


def task_group(task: str) -> str:
    """Regression trees get their own table: a leaf's Hessian sum is its noisy record count, so deep trees
    with small leaves blow up where classification trees do not (docs/auto.md)."""
    return "regression" if task == "regression" else "classification"


def budget_signal(epsilon: float, rows: int, classes: int = 0) -> float:
    """``b = log10(ε·n/max(K, 1))``: the rule's single signal (module doc)."""
    return math.log10(max(epsilon * max(rows, 1) / max(classes, 1), 1e-12))


def auto_settings(inp: AutoInputs) -> AutoChoice:
    """The ``auto`` hyperparameters for these inputs, with the reason for each (pure; docs/auto.md)."""
    b = budget_signal(inp.epsilon, inp.rows, inp.classes)
    group = task_group(inp.task)
    lo = -math.inf
    for edge, row in TABLES[group]:
        if b < edge:
            break
        lo = edge
    per = "ε·n/K" if inp.classes else "ε·n"
    band = (f"[{lo:g}, {edge:g})" if math.isfinite(edge) else f"≥ {lo:g}") if math.isfinite(lo) else f"< {edge:g}"
    s = dict(row)
    reasons = [
        f"{per} = {10 ** b:.4g} (log10 {b:.2f}, n = {inp.rows} {'declared public' if inp.rows_source == 'declared' else 'from a DP count'}) "
        f"is in the {group} band {band}: on the suite the setting T={s['trees']}, depth {s['depth']}, γ={s['subsample']:g}, "
        f"η={s['learning_rate']:g}, {'cyclical' if s['cyclical'] else 'all features per tree'} had the smallest mean "
        f"gap to the best of 22 settings there ({FITTED_ON})",
    ]
    if s["cyclical"]:
        reasons.append("cyclical trees fit one feature per tree (an additive model): if your outcome depends on "
                       "features together, pass --no-cyclical or let fedsbdt tune try it (docs/auto.md 'Cyclical "
                       "trees and interactions')")
    s["split_candidates"] = 32
    reasons.append("32 equidistant split candidates: benchmarks/defaults.py found no gain from more (docs/choosing-"
                   "epsilon.md 'Split settings')")
    s["tree_builder"] = modes.DEFAULT
    reasons.append(f"{modes.DEFAULT} trees (S-BDT): splits cost no privacy, so all of ε goes to the leaves; greedy trees lost "
                   "to them on the suite's budgets (docs/greedy.md)")
    s["init_share"] = 0.1
    reasons.append("10% of ε for the initial score (the paper's share): the prior/mean it releases is a count, "
                   "cheap at any ε·n")
    if inp.task == "binary":
        s["grad_clip"] = 1.0
        reasons.append("g* = 1 for a binary task: |y − p| ≤ 1 is never clipped, so the minority class's large "
                       "gradients are not cut and the probabilities stay calibrated (the paper's g* = 0.5 shifted "
                       "the mean probability toward the majority class: flights 0.165 against a base rate of 0.239, "
                       "0.235 with g* = 1, AUC equal or better; docs/auto.md 'Calibration')")
    else:
        s["grad_clip"] = 0.5
        reasons.append("g* = 0.5 (the paper's clip) for regression and multi-class tasks")
    return AutoChoice(s, tuple(reasons), inp, b)


def settings_text(s: dict[str, Any]) -> str:
    """The rule's keys of ``s`` (settings or hyperparameters) on one line for people, λ included."""
    parts = [f"T={s['trees']}", f"depth {s['depth']}", f"γ={s['subsample']:g}", f"η={s['learning_rate']:g}",
             "cyclical" if s["cyclical"] else "not cyclical"]
    parts += [f"{name}={s[k]:g}" for k, name in (("grad_clip", "g*"), ("l2", "λ"), ("init_share", "init share"))
              if s.get(k) is not None]
    parts += [f"{s['split_candidates']} split candidates"] if "split_candidates" in s else []
    parts += [f"{s['tree_builder']} trees"] if "tree_builder" in s else []
    return ", ".join(parts)


def noise_matched_l2(hp, task: str) -> float:
    """λ = the noise std of a leaf's Hessian sum, ``h*·σ_leaf/√(2·r1)`` (at least 1): a leaf whose record count
    is below the noise is shrunk instead of divided by a near-zero (or clipped-to-zero) noisy Hessian.  σ_leaf
    comes from the accountant for these hyperparameters, so the choice costs no privacy."""
    from .engine import calibration_for

    cal = calibration_for(hp)
    if cal.sigma <= 0:
        return float(hp.l2)
    return round(max(1.0, hp.hess_clip_for(task) * cal.sigma / math.sqrt(2.0 * hp.r1)), 3)


def rows_epsilon(epsilon: float) -> float:
    """ε of the DP row count when n is not declared: :data:`ROWS_SHARE` of the total."""
    return ROWS_SHARE * epsilon


SETTINGS_MODES = ("auto", "paper")


def resolve(given: dict[str, Any], schema: Schema, rows: int | None, rows_source: str = "declared",
            mode: str = "auto") -> tuple[dict[str, Any], AutoChoice | None]:
    """Plan keys for a run: the explicit ``given`` keys win over ``auto`` (or over today's paper defaults
    with ``mode = 'paper'``, which leaves every key not given at :class:`Hyperparameters`' default).

    ``given["epsilon"]`` (default 1) is the *training* ε — the caller subtracts what the DP row count spent.
    Builder defaults (greedy, DPBoost, Sarus) still apply for keys not given (config.builder_defaults)."""
    from .config import Hyperparameters, builder_defaults

    if mode not in SETTINGS_MODES:
        raise ValueError(f"settings must be one of {SETTINGS_MODES}, got {mode!r}")
    keys = builder_defaults(given)
    if mode == "paper":
        return keys, None
    eps = float(keys.get("epsilon", Hyperparameters.epsilon))
    delta = float(keys.get("delta", Hyperparameters.delta))
    choice = auto_settings(AutoInputs.for_schema(schema, eps, delta, rows or 1, rows_source))
    chosen = {k: v for k, v in choice.settings.items() if k not in keys}
    if schema.task == "multiclass" or keys.get("tree_builder", modes.DEFAULT) != modes.DEFAULT:
        chosen.pop("tree_builder", None)
    overridden = sorted(k for k in choice.settings if k in keys)
    reasons = choice.reasons
    merged = {**chosen, **keys}
    if "l2" in keys:
        overridden.append("l2")
    else:  # λ follows the noise of the run as it will be trained (explicit flags included)
        chosen["l2"] = merged["l2"] = noise_matched_l2(Hyperparameters.from_dict(merged), schema.task)
        reasons += (f"λ = {chosen['l2']:g}: the noise std of a leaf's Hessian sum at this run's σ (at least 1), so "
                    "leaves with fewer records than the noise are shrunk, not blown up (docs/auto.md 'Leaf "
                    "regularisation')",)
    if overridden:
        reasons += (f"given explicitly (override auto): {', '.join(overridden)}",)
    choice = AutoChoice(dict(chosen), reasons, choice.inputs, choice.budget)
    return merged, choice
