"""``auto``: hyperparameters that follow the privacy budget and the data size (docs/auto.md).

A pure rule from quantities that cost no privacy — ε, δ, the task, the number of classes K, the features
(count, types, level counts) — and the row count n, which the user declares public (``--rows N``) or which
is released by a discrete-Laplace count at a small accounted share of ε (:data:`ROWS_SHARE`).

The rule's main signal is the *budget per model*, ``b = log10(ε·n)`` (``ε·n/K`` for K classes: each class
tree sees the same noise with 1/K of the signal).  Leaf noise scales like ``1/ε`` and the leaf sums like
``n·γ/2^d``, so ``ε·n`` is what decides how many leaves (depth), trees, and how much of the data per tree
(γ) the noise can afford.  The public schema adds the *profile*: the task group (classification or
regression) and whether every feature is numeric — cyclical trees (one feature per tree, an additive model)
lose on numeric measurement data whose classes sit in regions of several features together (issue 39).

:data:`CURVES` holds, per profile, the mean gap of each candidate setting (:data:`CANDIDATES`) to the best of
the grid at each (dataset, ε) of the 70-dataset suite (benchmarks/suite.py), smoothed over neighbouring
budgets (benchmarks/auto_rule.py, Gaussian kernel in b, shrunk toward the task group's curve).  The rule
picks the setting with the smallest gap at b for a declared n; for a DP count, the smallest gap *expected
under the count's noise* (averaged over quantiles of the noise, :func:`count_points`), so a choice that
depends on which side of a band edge the noise fell is replaced by the one that is best across the count's
likely range (eq. (1) in docs/auto.md).  :func:`band_table` writes the rule for a declared n as bands of b
(docs/auto.md's table).  docs/auto.md has the leave-one-dataset-out and leave-one-kind-out evaluation.
Settings the rule does not vary are fixed with a reason each.
"""
from __future__ import annotations

import bisect
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

#: the candidate settings (benchmarks/auto_grid.py FOCUSED but g25): (trees, depth, γ, η, cyclical).  g01 is the
#: S-BDT paper's setting; g02, g04, g14, g17, g19, g21 were the band table's before issue 39; g09, g23, g24 and
#: g26–g28 their cyclical / non-cyclical twins; g18 the deeper non-cyclical one.  (g25, g21's cyclical twin, was
#: run on the 48 added datasets only; the first 22 lack it, so it is no candidate.)
CANDIDATES: dict[str, tuple[int, int, float, float, bool]] = {
    "g01": (100, 3, 0.1, 0.1, True), "g02": (50, 3, 0.1, 0.1, True), "g04": (20, 4, 1.0, 0.3, False),
    "g09": (100, 3, 0.1, 0.1, False), "g14": (200, 4, 0.2, 0.1, False), "g17": (300, 5, 0.3, 0.1, True),
    "g18": (300, 6, 0.3, 0.1, False), "g19": (500, 6, 0.3, 0.1, False), "g21": (1000, 6, 0.3, 0.1, False),
    "g23": (20, 4, 1.0, 0.3, True), "g24": (300, 5, 0.3, 0.1, False),
    "g26": (50, 3, 0.1, 0.1, False), "g27": (200, 4, 0.2, 0.1, True), "g28": (500, 6, 0.3, 0.1, True),
}
#: confidence of the DP row count's interval shown with the choice (docs/auto.md eq. (2))
COUNT_LEVEL = 0.95
#: points at which the rule averages a curve over the DP count's noise: equal-probability quantiles (eq. (1))
COUNT_POINTS = 17


def candidate(key: str) -> dict[str, Any]:
    """The settings of candidate ``key`` as hyperparameter keys."""
    t, d, g, eta, cyc = CANDIDATES[key]
    return dict(trees=t, depth=d, subsample=g, learning_rate=eta, cyclical=cyc)


# --- fitted by benchmarks/auto_rule.py --write (do not edit by hand) ---
FITTED_ON = ("70 public datasets (28 numeric-measurement, 10 numeric-other, 28 mixed, 4 categorical) × ε ∈ {0.1, 1, 4, 10} × 14 settings, one run per cell (the first 22 sets: four for g01–g21) (benchmarks/auto_rule.py; bands of b of width 2)")
#: profile thresholds: 'numeric' when the numeric share of the features is ≥ numeric_at (None: no split);
#: '-wide' appended when the feature count is ≥ wide_at (None: no split); joint: one split only,
#: 'numeric-wide' (both) against 'other'
PROFILE = {"numeric_at": None, "wide_at": None, "joint": False}
#: per profile "group/kind": (upper edges of the bands of b, {candidate: mean gap in each band})
CURVES: dict[str, tuple[tuple[float, ...], dict[str, tuple[float, ...]]]] = {
    "classification/all": (
        (1.0, 3.0, 5.0),
        {
            "g01": (0.0692, 0.0820, 0.0428, 0.0303),
            "g04": (0.1710, 0.0688, 0.0513, 0.0380),
            "g17": (0.1252, 0.0860, 0.0162, 0.0154),
            "g18": (0.0872, 0.0804, 0.0278, 0.0095),
            "g19": (0.1221, 0.0914, 0.0248, 0.0068),
            "g21": (0.1853, 0.1023, 0.0358, 0.0058),
            "g24": (0.0882, 0.0692, 0.0223, 0.0082),
            "g26": (0.0660, 0.0860, 0.0581, 0.0416),
            "g27": (0.1459, 0.0675, 0.0189, 0.0194),
            "g28": (0.1449, 0.0896, 0.0171, 0.0128),
        }),
    "regression/all": (
        (3.0, 5.0),
        {
            "g18": (0.1348, 0.0515, 0.0083),
            "g19": (0.1867, 0.0636, 0.0045),
            "g21": (0.2316, 0.1335, 0.0049),
            "g27": (0.0703, 0.0619, 0.0749),
            "g28": (0.1205, 0.0316, 0.0094),
        }),
}
# --- end of the fitted part ---


def profile_key(task: str, numeric_share: float, features: int, thresholds: tuple | None = None) -> str:
    """The rule's profile, ``"<group>/<kind>"``: the task group, and whether the schema is all-numeric (share of
    numeric features ≥ ``numeric_at``) and wide (≥ ``wide_at`` features); ``thresholds = (numeric_at, wide_at[,
    joint])`` defaults to :data:`PROFILE` (None in either place: no split on it).  ``joint``: one split only,
    ``numeric-wide`` (numeric *and* wide) against ``other``."""
    if thresholds is None:
        thresholds = (PROFILE["numeric_at"], PROFILE["wide_at"], PROFILE.get("joint", False))
    numeric_at, wide_at, joint = (tuple(thresholds) + (False,))[:3]
    numeric = numeric_at is not None and numeric_share >= numeric_at
    wide = wide_at is not None and features >= wide_at
    if joint:
        return f"{task_group(task)}/{'numeric-wide' if numeric and wide else 'other'}"
    kind = "all" if numeric_at is None else ("numeric" if numeric else "mixed")
    if wide_at is not None:
        kind += "-wide" if wide else "-narrow"
    return f"{task_group(task)}/{kind}"


def count_interval(rows: int, rows_epsilon: float, level: float = COUNT_LEVEL) -> tuple[int, int]:
    """The ``level`` interval of the true count around a discrete-Laplace count ``rows`` released at ε =
    ``rows_epsilon`` (sensitivity 1): P(|X| > k) = 2·e^{−ε(k+1)}/(1 + e^{−ε}) ≤ 1 − level gives
    k = ⌈ln(2/((1 − level)(1 + e^{−ε})))/ε⌉ − 1 (docs/auto.md eq. (2)); the lower end is at least 1."""
    if rows_epsilon <= 0:
        return rows, rows
    k = max(0, math.ceil(math.log(2.0 / ((1.0 - level) * (1.0 + math.exp(-rows_epsilon)))) / rows_epsilon) - 1)
    return max(rows - k, 1), rows + k


def count_points(rows: int, rows_epsilon: float, points: int = COUNT_POINTS) -> list[int]:
    """Row counts the true n may be, given a discrete-Laplace count ``rows`` at ε = ``rows_epsilon``: the
    ``points`` quantiles (j + ½)/points of the noise (continuous Laplace of scale 1/ε as the approximation,
    q ↦ −sign(q − ½)·ln(1 − 2|q − ½|)/ε), each at least 1; ``[rows]`` for a declared count.  Averaging a curve
    over them is its expected value under the count's noise (docs/auto.md eq. (1))."""
    if rows_epsilon <= 0:
        return [rows]
    out = []
    for j in range(points):
        q = (j + 0.5) / points - 0.5
        z = -math.copysign(1.0, q) * math.log(1 - 2 * abs(q)) / rows_epsilon if q else 0.0
        out.append(max(int(round(rows - z)), 1))
    return out


def curve_at(edges: tuple[float, ...], gaps: tuple[float, ...], b: float) -> float:
    """A fitted curve at ``b``: the value of the band of b (``edges`` are the bands' finite upper edges, so
    ``len(gaps) == len(edges) + 1``; b on an edge belongs to the band above it)."""
    return gaps[bisect.bisect_right(edges, b)]


def choose(curves: tuple[tuple[float, ...], dict[str, tuple[float, ...]]], budgets: list[float]) -> str:
    """The candidate with the smallest mean gap over the budgets ``budgets`` (the b of each of
    :func:`count_points`; one b for a declared n) — eq. (1) of docs/auto.md; ties: the first in the curves'
    order."""
    edges, by_key = curves
    return min(by_key, key=lambda k: sum(curve_at(edges, by_key[k], b) for b in budgets) / len(budgets))


def band_table(profile: str) -> list[tuple[float, str]]:
    """The rule for a declared n as bands: (upper edge of b, candidate), neighbours with the same candidate
    merged, the last edge ∞."""
    edges, by_key = CURVES[profile]
    keys = [min(by_key, key=lambda k: by_key[k][i]) for i in range(len(edges) + 1)]
    ups = [*edges, math.inf]
    return [(ups[i], keys[i]) for i in range(len(keys)) if i == len(keys) - 1 or keys[i + 1] != keys[i]]


def rule_table() -> str:
    """The rule for a declared n as a Markdown table (docs/auto.md's ``table:auto``, checked by the tests)."""
    rows = ["| profile | band of log10(ε·n/K) | trees | depth | γ | η | cyclical | candidate |",
            "|---|---|---|---|---|---|---|---|"]
    for p in sorted(CURVES):
        lo = None
        for edge, key in band_table(p):
            s = candidate(key)
            if lo is None:
                band = "all" if math.isinf(edge) else f"< {edge:g}"
            else:
                band = f"≥ {lo:g}" if math.isinf(edge) else f"{lo:g} – {edge:g}"
            rows.append(f"| {p} | {band} | {s['trees']} | {s['depth']} | {s['subsample']:g} | {s['learning_rate']:g} "
                        f"| {'yes' if s['cyclical'] else 'no'} | {key} |")
            lo = edge
    return "\n".join(rows)


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
    rows_epsilon: float = 0.0  # ε of the DP count (0 when declared)

    def __post_init__(self):
        if self.rows_source not in ("declared", "dp-count"):
            raise ValueError(f"rows_source must be 'declared' or 'dp-count', got {self.rows_source!r}")
        if not (self.features >= 1 and 0 <= self.categorical <= self.features):
            raise ValueError(f"features = {self.features}, categorical = {self.categorical}: need 0 ≤ categorical "
                             "≤ features, features ≥ 1")
        if self.rows_epsilon < 0 or (self.rows_source == "declared") != (self.rows_epsilon == 0):
            raise ValueError(f"rows_epsilon = {self.rows_epsilon}: > 0 exactly for a DP count")

    @property
    def numeric_share(self) -> float:
        """Share of numeric features in the public schema (zero privacy cost)."""
        return (self.features - self.categorical) / self.features

    @classmethod
    def for_schema(cls, schema: Schema, epsilon: float, delta: float, rows: int,
                   rows_source: str = "declared", rows_epsilon: float | None = None) -> "AutoInputs":
        """``rows_epsilon`` defaults, for a DP count, to what ``fedsbdt train`` spends: :data:`ROWS_SHARE` of the
        total, when ``epsilon`` is the rest (the training ε)."""
        cats = [f for f in schema.features if f.is_categorical]
        if rows_epsilon is None:
            rows_epsilon = epsilon * ROWS_SHARE / (1 - ROWS_SHARE) if rows_source == "dp-count" else 0.0
        return cls(float(epsilon), float(delta), schema.task, schema.n_classes, schema.n_features, len(cats),
                   max((len(f.levels) for f in cats), default=0), max(int(rows), 1), rows_source,
                   float(rows_epsilon))


@dataclass(frozen=True)
class AutoChoice:
    settings: dict[str, Any]
    reasons: tuple[str, ...]
    inputs: AutoInputs
    budget: float  # b = log10(ε·n[/K]) at the (declared or counted) n
    budget_range: tuple[float, float] = (math.nan, math.nan)  # the b interval the choice averaged over
    profile: str = ""
    key: str = ""  # the candidate chosen (CANDIDATES)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "reasons": list(self.reasons), "inputs": asdict(self.inputs),
                "budget_log10": self.budget, "budget_log10_range": list(self.budget_range),
                "profile": self.profile, "candidate": self.key, "fitted_on": FITTED_ON}


def task_group(task: str) -> str:
    """Regression trees get their own curves: a leaf's Hessian sum is its noisy record count, so deep trees
    with small leaves blow up where classification trees do not (docs/auto.md)."""
    return "regression" if task == "regression" else "classification"


def budget_signal(epsilon: float, rows: int, classes: int = 0) -> float:
    """``b = log10(ε·n/max(K, 1))``: the rule's budget signal (module doc)."""
    return math.log10(max(epsilon * max(rows, 1) / max(classes, 1), 1e-12))


#: one choice the fitted curves do not make, kept by hand with its evidence: classification on an all-numeric
#: schema of ≥ WIDE features, where the curves pick a cyclical setting at b ≥ 3, takes its non-cyclical twin one
#: level deeper (g18).  On the suite all 6 such datasets with cells at b ≥ 3 preferred g18 to g17 (bdims, bfi,
#: cells, city_weather, dengue, digits; mean gap 0.010 against 0.017 over 17 cells at b in [3, 5)), while 11 of
#: the 14 narrower all-numeric sets preferred cyclical g17; an outside check on held-back numeric sets of
#: 10–57 features (telescope image moments, pen and letter features, satellite pixels, word frequencies) found
#: non-cyclical trees better in 12 of 12 cells (docs/auto.md 'Cyclical trees and numeric data').
WIDE = 10
NUMERIC_WIDE = {"from_budget": 3.0, "key": "g18"}


def numeric_wide_override(inp: "AutoInputs", key: str, b: float) -> str | None:
    """``NUMERIC_WIDE['key']`` where the override above applies to the curves' choice ``key`` at ``b``, else None."""
    if (task_group(inp.task) == "classification" and inp.numeric_share >= 1 and inp.features >= WIDE
            and CANDIDATES[key][4] and b >= NUMERIC_WIDE["from_budget"]):
        return NUMERIC_WIDE["key"]
    return None


def auto_settings(inp: AutoInputs) -> AutoChoice:
    """The ``auto`` hyperparameters for these inputs, with the reason for each (pure; docs/auto.md)."""
    b = budget_signal(inp.epsilon, inp.rows, inp.classes)
    lo_n, hi_n = count_interval(inp.rows, inp.rows_epsilon)
    b_lo, b_hi = budget_signal(inp.epsilon, lo_n, inp.classes), budget_signal(inp.epsilon, hi_n, inp.classes)
    profile = profile_key(inp.task, inp.numeric_share, inp.features)
    key = choose(CURVES[profile], [budget_signal(inp.epsilon, n, inp.classes)
                                   for n in count_points(inp.rows, inp.rows_epsilon)])
    fitted, override = key, numeric_wide_override(inp, key, b)
    key = override or key
    s = candidate(key)
    per = "ε·n/K" if inp.classes else "ε·n"
    if inp.rows_source == "declared":
        where = f"n = {inp.rows} declared public"
        span = f"at log10 {b:.2f}"
    else:
        where = (f"n = {inp.rows} from a DP count at ε = {inp.rows_epsilon:.3g}, {COUNT_LEVEL:.0%} interval "
                 f"[{lo_n}, {hi_n}]")
        span = (f"averaged over the count's noise (log10 {b_lo:.2f} … {b_hi:.2f}), so the choice does not hang on "
                "which side of a band edge the noise fell")
    numeric = "every feature numeric" if inp.numeric_share >= 1 else f"{inp.numeric_share:.0%} of the features numeric"
    reasons = [
        f"{per} = {10 ** b:.4g} (log10 {b:.2f}, {where}); {inp.features} features, {numeric}: profile {profile}. "
        f"On the suite the setting {settings_text(candidate(fitted))} ({fitted}) had the smallest mean gap to the "
        f"best of {len(CANDIDATES)} settings {span} ({FITTED_ON})",
    ]
    if override:
        reasons.append(f"all {inp.features} features numeric (≥ {WIDE}): {settings_text(s)} ({key}) instead, not "
                       f"cyclical and one level deeper than {fitted} — on the suite's wide all-numeric sets and an "
                       "outside check's, trees on all features beat cyclical ones (common/auto.py NUMERIC_WIDE, "
                       "docs/auto.md 'Cyclical trees and numeric data')")
    if s["cyclical"]:
        reasons.append("cyclical trees fit one feature per tree (an additive model): if your outcome depends on "
                       "features together, pass --no-cyclical or let fedsbdt tune try it (docs/auto.md 'Cyclical "
                       "trees and numeric data')")
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
    return AutoChoice(s, tuple(reasons), inp, b, (b_lo, b_hi), profile, key)


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
    choice = AutoChoice(dict(chosen), reasons, choice.inputs, choice.budget, choice.budget_range, choice.profile,
                        choice.key)
    return merged, choice
