"""Federated evaluation: score-by-label histograms, their sensitivity and noise, metrics from noisy sums.

Pure functions (no I/O, no randomness of their own) used by the sites (one
site's integer vector and its noise scales) and the coordinator (metrics
computed from the noisy aggregate by post-processing).  The derivation is in
docs/federated-evaluation.md; in short:

**Vector layout.**  Binary classification, ``B`` public score bins of equal
width on [0, 1] (bin ``b`` holds scores in ``[b/B, (b+1)/B)``, score 1 in the
last bin)::

    [ n(b, y=0) for b < B | n(b, y=1) for b < B | Σ ℓ_q ]

with ``ℓ_q = round(Q · min(−ln p(y), L) / L)`` the record's log-loss clipped
to ``L = LOGLOSS_CLIP`` (probabilities below e^−L count as e^−L) and
quantised to ``Q = SUM_UNITS`` integer units.  Regression, residuals
``r = prediction − label`` clipped to ``[−R, R]`` with ``R`` a public clip, a quarter of the width of the
public label range by default (plan key ``evaluation.residual_clip``), ``B``
equal bins on ``[−R, R]``::

    [ n(b) for b < B | Σ round(Q·|r|/R) | Σ round(Q·(r/R)²) ]

Multi-class, ``K`` public classes (labels are class indices), the model's
class probabilities ``p_k`` in the same ``B`` score bins::

    [ for k < K: n_k(b, y=k) for b < B, n_k(b, y≠k) for b < B | C(y, ŷ) for y, ŷ < K | Σ ℓ_q ]

with ``n_k`` the one-vs-rest histogram of ``p_k``, ``C`` the K×K confusion
counts (true class × arg-max class, row-major) and ``ℓ_q`` as in the binary
case with ``p(y) = p_y``.

**Sensitivity.**  Adding or removing one record changes ``m`` coordinates
(classification m = 2: one count by 1, the loss sum by ≤ Q; regression m = 3:
one count by 1, each sum by ≤ Q; multi-class m = K + 2: one count of each of the
K one-vs-rest histograms by 1, one confusion cell by 1, the loss sum by ≤ Q).  Coordinate ``j`` gets discrete Gaussian
noise of scale ``S_j = √m · σ · Δ_j`` (Δ = 1 for counts, Q for sums), so the
normalised L2 sensitivity is ``Σ_j (Δ_j/S_j)² = m/(m σ²) = 1/σ²``: the
release is a Gaussian mechanism with noise multiplier σ (discrete Gaussian:
Canonne–Kamath–Steinke 2020, Thm. 8/Prop. 14, the same RDP ``α/(2σ²)``).

**Calibration.**  σ is the smallest noise multiplier whose RDP curve
``α/(2σ²)``, converted by Cor. 6 of the S-BDT paper (``fedsbdt.common.accountant``),
gives ε ≤ ε_eval at the plan's δ: one :class:`~fedsbdt.common.accountant.GaussianEvent`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: Log-loss clip L (nats): probabilities below e^−L ≈ 0.001 count as e^−L.
LOGLOSS_CLIP = math.log(1000.0)
#: Integer units per L (log-loss) or per R (regression sums) of one record's contribution.
SUM_UNITS = 1024
#: Default ε_eval (plan key ``evaluation.epsilon``); see docs/federated-evaluation.md "Choosing ε_eval".
DEFAULT_EPSILON = 0.1
#: Default number of public score / residual bins.
DEFAULT_BINS = 20
TASKS = ("binary", "regression", "multiclass")
#: the headline metrics of each task (what :func:`describe` shows, with their intervals)
HEADLINE = {"binary": ("auc", "accuracy", "logloss"), "regression": ("rmse", "mae"),
            "multiclass": ("macro_auc", "accuracy", "logloss")}
#: a 95 % interval at least this share of its metric's possible range wide says nothing about the model
TOO_WIDE = 0.5


class EvalError(ValueError):
    """An evaluation declaration or vector is impossible."""


@lru_cache(maxsize=64)
def eval_sigma(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier σ of one Gaussian release with (ε_eval, δ) by the RDP accountant (Cor. 6)."""
    from fedsbdt.common.accountant import GaussianEvent, _bisect_sigma, default_alpha_max, event_epsilon_rdp

    if not (math.isfinite(epsilon) and epsilon > 0) or not 0 < delta < 1:
        raise EvalError(f"ε_eval must be > 0 and δ in (0, 1), got ε_eval = {epsilon!r}, δ = {delta!r}")
    amax = default_alpha_max(epsilon, delta)
    return _bisect_sigma(lambda s: event_epsilon_rdp(GaussianEvent(s), delta, amax)[0], epsilon, lo=1e-4, hi=1e7)


@dataclass(frozen=True)
class EvalSpec:
    """The public declaration of one federated evaluation (from the plan: task, ε_eval, δ, bins, label range)."""

    task: str
    epsilon: float
    delta: float
    bins: int = DEFAULT_BINS
    label_range: tuple[float, float] | None = None
    residual_clip: float | None = None  # R (regression); None: a quarter of the label range's width
    classes: tuple[str, ...] = ()  # multiclass: the schema's K public class labels (class index = position)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise EvalError(f"federated evaluation supports the tasks {', '.join(TASKS)}, not {self.task!r}")
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or not 2 <= self.bins <= 1000 \
                or self.bins % 2:
            raise EvalError(f"evaluation.bins = {self.bins!r}: must be an even integer in 2..1000 (0.5 is then a "
                            "bin edge, so accuracy is exact)")
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) \
                or not (math.isfinite(self.epsilon) and 0 < self.epsilon <= 100):
            raise EvalError(f"evaluation.epsilon = {self.epsilon!r}: must be a number in (0, 100]")
        if self.task == "regression":
            lo, hi = self.label_range or (0.0, 0.0)
            if not hi > lo:
                raise EvalError("regression evaluation needs the schema's public label_range")
        if (self.task == "multiclass") != (len(self.classes) >= 3):
            raise EvalError("multi-class evaluation needs the schema's K ≥ 3 public classes (and only it takes them)")
        r = self.residual_clip
        if r is not None and (self.task != "regression" or isinstance(r, bool) or not isinstance(r, (int, float))
                              or not (math.isfinite(r) and r > 0)):
            raise EvalError(f"evaluation.residual_clip = {r!r}: a positive number, for regression only")

    # ------------------------------------------------------------------ layout

    @property
    def length(self) -> int:
        """Length of one site's vector."""
        if self.task == "multiclass":
            K = len(self.classes)
            return 2 * K * self.bins + K * K + 1
        return 2 * self.bins + 1 if self.task == "binary" else self.bins + 2

    @property
    def touched(self) -> int:
        """m: coordinates one record changes (one count per histogram, plus one or two clipped sums)."""
        if self.task == "multiclass":
            return len(self.classes) + 2  # K one-vs-rest counts, one confusion cell, the loss sum
        return 2 if self.task == "binary" else 3

    @property
    def _counts(self) -> int:
        """Number of leading count coordinates (Δ_j = 1); the rest are clipped sums (Δ_j = Q)."""
        if self.task == "multiclass":
            K = len(self.classes)
            return 2 * K * self.bins + K * K
        return 2 * self.bins if self.task == "binary" else self.bins

    def sensitivities(self) -> np.ndarray:
        """Δ_j: the largest change of coordinate j when one record is added or removed."""
        d = np.ones(self.length)
        d[self._counts:] = SUM_UNITS
        return d

    @property
    def sigma(self) -> float:
        """Noise multiplier σ of the release (ε_eval, δ)."""
        return eval_sigma(float(self.epsilon), float(self.delta))

    def noise_scales(self) -> np.ndarray:
        """Per-coordinate std S_j = √m·σ·Δ_j (integer units) of the discrete Gaussian a site adds."""
        return math.sqrt(self.touched) * self.sigma * self.sensitivities()

    def normalised_sensitivity(self) -> float:
        """√Σ_j-over-one-record (Δ_j/S_j)²: equals 1/σ (the Gaussian mechanism's noise multiplier σ)."""
        d, s = self.sensitivities(), self.noise_scales()
        per = (d / s) ** 2
        k = self._counts
        if self.task == "multiclass":  # one cell of each class's histogram, one confusion cell, the loss sum
            K, B = len(self.classes), self.bins
            hists = per[:2 * K * B].reshape(K, 2 * B).max(axis=1).sum()
            return math.sqrt(hists + per[2 * K * B:k].max() + per[k:].sum())
        worst = per[:k].max() + per[k:].sum()  # one count cell and every sum
        return math.sqrt(worst)

    def max_entry(self, records: int) -> int:
        """Largest entry of a site vector over ``records`` records (for the fixed-point capacity check)."""
        return SUM_UNITS * int(records)

    def to_dict(self) -> dict:
        return {"epsilon": float(self.epsilon), "delta": float(self.delta), "sigma": self.sigma,
                "bins": self.bins, **({"residual_clip": self._residual_range()} if self.task == "regression" else {}), "mechanism": "discrete Gaussian, one full share per site",
                "neighbours": "add/remove one held-out record"}

    # ------------------------------------------------------------------ one site's vector

    def _residual_range(self) -> float:
        """R: residuals are clipped to [−R, R] (public: the plan's residual_clip, or (hi − lo)/4)."""
        if self.residual_clip is not None:
            return float(self.residual_clip)
        lo, hi = self.label_range
        return (float(hi) - float(lo)) / 4.0

    def histogram(self, y: np.ndarray, pred: np.ndarray) -> np.ndarray:
        """One site's integer vector for labels ``y`` and predictions ``pred`` (probabilities / values;
        multi-class: class indices and the ``(n, K)`` class probabilities)."""
        y = np.asarray(y, dtype=np.float64)
        pred = np.asarray(pred, dtype=np.float64)
        if self.task == "multiclass":
            return self._multiclass_histogram(y, pred)
        if y.shape != pred.shape or y.ndim != 1:
            raise EvalError("labels and predictions must be vectors of the same length")
        if not np.isfinite(pred).all():
            raise EvalError("predictions must be finite")
        B = self.bins
        out = np.zeros(self.length, dtype=np.int64)
        if self.task == "binary":
            p = np.clip(pred, 0.0, 1.0)
            pos = y == 1
            b = np.minimum((p * B).astype(np.int64), B - 1)
            np.add.at(out, b + B * pos, 1)
            py = np.where(pos, p, 1.0 - p)
            loss = _clipped_logloss(py)
            out[2 * B] = int(np.rint(loss / LOGLOSS_CLIP * SUM_UNITS).sum())
        else:
            R = self._residual_range()
            r = np.clip(pred - y, -R, R)
            b = np.minimum(((r + R) / (2 * R) * B).astype(np.int64), B - 1)
            np.add.at(out, b, 1)
            out[B] = int(np.rint(np.abs(r) / R * SUM_UNITS).sum())
            out[B + 1] = int(np.rint((r / R) ** 2 * SUM_UNITS).sum())
        return out

    def _multiclass_histogram(self, y: np.ndarray, prob: np.ndarray) -> np.ndarray:
        K, B = len(self.classes), self.bins
        if y.ndim != 1 or prob.shape != (y.size, K):
            raise EvalError(f"multi-class evaluation needs class indices and an (n, {K}) probability matrix")
        if not np.isfinite(prob).all():
            raise EvalError("predictions must be finite")
        if not np.isin(y, np.arange(K)).all():
            raise EvalError(f"multi-class labels must be class indices 0..{K - 1}")
        yi = y.astype(np.int64)
        out = np.zeros(self.length, dtype=np.int64)
        p = np.clip(prob, 0.0, 1.0)
        b = np.minimum((p * B).astype(np.int64), B - 1)  # (n, K)
        k = np.arange(K)
        # class k's block: [n_k(b, y = k) | n_k(b, y ≠ k)]
        np.add.at(out, (2 * B * k[None, :] + B * (yi[:, None] != k[None, :]) + b).ravel(), 1)
        np.add.at(out, 2 * K * B + K * yi + np.argmax(prob, axis=1), 1)
        py = p[np.arange(y.size), yi]
        loss = _clipped_logloss(py)
        out[-1] = int(np.rint(loss / LOGLOSS_CLIP * SUM_UNITS).sum())
        return out

    # ------------------------------------------------------------------ metrics (post-processing)

    def metrics(self, total: np.ndarray) -> dict:
        """Aggregate metrics from a (noisy) summed vector.

        n, accuracy, the AUCs and the ratios use the raw noisy sums (unbiased: reading each negative noisy
        cell as 0 would add about 0.4 noise scales per empty bin and pull the AUC towards ½); the calibration
        curve, residual histogram and confusion counts read negative cells as 0.  Every metric is clamped to
        its possible range (post-processing); :meth:`intervals` gives their 95 % intervals.  Binary: n, AUC (pairs within a bin count ½), accuracy at 0.5, clipped log-loss, calibration curve
        (per bin: public bin midpoint, noisy count, observed positive rate).  Regression: n, RMSE, MAE (of
        residuals clipped to ±R), residual histogram (public edges, noisy counts).
        """
        v = np.asarray(total, dtype=np.float64)
        if v.shape != (self.length,):
            raise EvalError(f"an evaluation vector has {self.length} entries, got shape {v.shape}")
        B = self.bins
        if self.task == "multiclass":
            return self._multiclass_metrics(v)
        if self.task == "binary":
            neg = np.maximum(v[:B], 0.0)
            pos = np.maximum(v[B:2 * B], 0.0)
            auc = _noisy_auc(v[B:2 * B], v[:B])
            half = B // 2
            right, wrong = v[:half].sum() + v[B + half:2 * B].sum(), v[half:B].sum() + v[B:B + half].sum()
            n = max(right + wrong, 0.0)  # sums of the raw noisy counts: unbiased (clamping each cell is not)
            acc = _ratio(right, n)
            ll = None if n <= 0 else float(min(max(v[2 * B], 0.0) / SUM_UNITS / n, 1.0) * LOGLOSS_CLIP)
            curve = []
            for b in range(B):
                c = pos[b] + neg[b]
                curve.append({"bin": [b / B, (b + 1) / B], "count": float(c),
                              "observed": float(pos[b] / c) if c > 0 else None})
            return {"n": float(n), "auc": auc, "accuracy": acc, "logloss": ll, "calibration": curve}
        R = self._residual_range()
        h = np.maximum(v[:B], 0.0)
        n = max(float(v[:B].sum()), 0.0)  # the raw noisy counts' sum: unbiased (clamping each cell is not)
        mae = float(min(max(v[B], 0.0) / SUM_UNITS / n, 1.0) * R) if n > 0 else None  # each |r| ≤ R
        rmse = float(math.sqrt(min(max(v[B + 1], 0.0) / SUM_UNITS / n, 1.0)) * R) if n > 0 else None
        edges = np.linspace(-R, R, B + 1)
        return {"n": float(n), "rmse": rmse, "mae": mae,
                "residuals": [{"bin": [float(edges[b]), float(edges[b + 1])], "count": float(h[b])}
                              for b in range(B)]}

    def _multiclass_metrics(self, v: np.ndarray) -> dict:
        """Multi-class: n (confusion total), accuracy (confusion trace), one-vs-rest AUC per class and their
        mean (macro-AUC, over the classes whose AUC is defined), clipped log-loss, the noisy confusion counts."""
        K, B = len(self.classes), self.bins
        raw = v[2 * K * B:2 * K * B + K * K].reshape(K, K)
        conf = np.maximum(raw, 0.0)
        n = max(float(raw.sum()), 0.0)  # raw noisy sums: unbiased (clamping each cell is not)
        h = v[:2 * K * B].reshape(K, 2, B)  # [class k][y = k, y ≠ k][bin]
        aucs = [_noisy_auc(h[k, 0], h[k, 1]) for k in range(K)]
        defined = [a for a in aucs if a is not None]
        acc = _ratio(float(np.trace(raw)), n)
        ll = float(min(max(v[-1], 0.0) / SUM_UNITS / n, 1.0) * LOGLOSS_CLIP) if n > 0 else None
        return {"n": float(n), "macro_auc": float(np.mean(defined)) if defined else None, "accuracy": acc,
                "logloss": ll, "classes": list(self.classes), "auc_per_class": aucs,
                "confusion": conf.tolist()}

    def intervals(self, total: np.ndarray, sites: int, level: float = 0.95) -> dict:
        """Intervals at ``level`` (95 %) for the headline metrics of :meth:`metrics`, from the public noise scale.

        They cover the noise added for privacy, not the sampling error of the held-out records: the target is
        the metric the noiseless sum would give (= the pooled one within :meth:`resolution`).  Each of the
        ``sites`` summed vectors carries a full discrete Gaussian share of scale S_j (module docstring), so
        coordinate j of the released sum has noise variance ≤ sites · S_j², independent across coordinates;
        the discrete Gaussian is treated as the continuous one (its variance is below S², so the intervals
        are slightly conservative).  With z = Φ⁻¹((1 + level)/2):

        * ``n`` (a sum of c raw counts): n̂ ± z·√(c·v_count), exact.
        * ratios of two sums, accuracy = correct / n, log-loss ∝ Σℓ_q / n, MSE ∝ Σ(r/R)²_q / n, MAE ∝ Σ|r/R|_q / n:
          Fieller's interval {r : (A − rD)² ≤ z²·Var(A − rD)} (Fieller 1954), exact for Gaussian A, D
          whatever their correlation; it is the whole range when D = n is not clearly above 0.  RMSE is the
          square root of the MSE interval.
        * AUC (and each one-vs-rest AUC of the macro mean): the delta method at the released counts, Var =
          v_count·Σ_b (∂AUC/∂pos_b² + ∂AUC/∂neg_b²) — approximate (first order).

        Every interval is clamped to its metric's possible range; ``None`` where the metric is.  Pure:
        post-processing of the released sum and public constants."""
        from statistics import NormalDist

        v = np.asarray(total, dtype=np.float64)
        if v.shape != (self.length,):
            raise EvalError(f"an evaluation vector has {self.length} entries, got shape {v.shape}")
        if not (isinstance(sites, int) and sites >= 1) or not 0 < level < 1:
            raise EvalError(f"intervals need sites ≥ 1 and 0 < level < 1, got {sites!r}, {level!r}")
        z = NormalDist().inv_cdf((1 + level) / 2)
        var = sites * self.noise_scales() ** 2
        vc, vs = float(var[0]), float(var[-1])  # a count's and a clipped sum's noise variance
        B, Q, out = self.bins, SUM_UNITS, {}

        def ratio(a, d, va, vd, cov, f, lo=0.0, hi=1.0):
            r = _fieller(a, d, va, vd, cov, z)
            return [lo, hi] if r is None else [max(lo, min(hi, f(r[0]))), max(lo, min(hi, f(r[1])))]

        def per_unit(cap):  # sum units per record → the metric (clamped like :meth:`metrics`)
            return lambda r: min(max(r, 0.0) / Q, 1.0) * cap

        if self.task == "binary":
            half = B // 2
            right, wrong = v[:half].sum() + v[B + half:2 * B].sum(), v[half:B].sum() + v[B:B + half].sum()
            n, vn = right + wrong, 2 * B * vc
            out["accuracy"] = ratio(right, n, B * vc, vn, B * vc, float)
            out["logloss"] = ratio(v[2 * B], n, vs, vn, 0.0, per_unit(LOGLOSS_CLIP), hi=LOGLOSS_CLIP)
            out["auc"] = _auc_interval(v[B:2 * B], v[:B], vc, z)
        elif self.task == "regression":
            R = self._residual_range()
            n, vn = v[:B].sum(), B * vc
            out["mae"] = ratio(v[B], n, vs, vn, 0.0, per_unit(R), hi=R)
            out["rmse"] = ratio(v[B + 1], n, vs, vn, 0.0, lambda r: math.sqrt(per_unit(1.0)(r)) * R, hi=R)
        else:
            K = len(self.classes)
            conf = v[2 * K * B:2 * K * B + K * K].reshape(K, K)
            n, vn = conf.sum(), K * K * vc
            out["accuracy"] = ratio(np.trace(conf), n, K * vc, vn, K * vc, float)
            out["logloss"] = ratio(v[-1], n, vs, vn, 0.0, per_unit(LOGLOSS_CLIP), hi=LOGLOSS_CLIP)
            h = v[:2 * K * B].reshape(K, 2, B)  # raw counts: U and P·N are unbiased there (clamped are not)
            per = [_auc_interval(h[k, 0], h[k, 1], vc, z, sd_only=True) for k in range(K)]
            aucs = [_binned_auc(h[k, 0], h[k, 1]) for k in range(K)]
            ok = [(a, sd) for a, sd in zip(aucs, per) if a is not None and sd is not None]
            if len(ok) == K:
                mean = float(np.mean([a for a, _ in ok]))
                sd = math.sqrt(sum(sd * sd for _, sd in ok)) / K
                out["macro_auc"] = [max(0.0, mean - z * sd), min(1.0, mean + z * sd)]
            else:  # a class whose noisy count is not positive: no first-order interval
                out["macro_auc"] = [0.0, 1.0]
        half_n = z * math.sqrt(vn)
        out["n"] = [max(float(n) - half_n, 0.0), max(float(n) + half_n, 0.0)]
        return {k: (None if x is None else [float(x[0]), float(x[1])]) for k, x in out.items()}

    # ------------------------------------------------------------------ what the numbers mean

    def metric_range(self, key: str) -> tuple[float, float]:
        """The possible range of a headline metric (what :meth:`metrics` clamps it to)."""
        if key in ("rmse", "mae"):
            return 0.0, self._residual_range()
        return (0.0, LOGLOSS_CLIP) if key == "logloss" else (0.0, 1.0)

    def too_wide(self, intervals: dict) -> list[str]:
        """The headline metrics whose 95 % interval spans at least :data:`TOO_WIDE` of their possible range (or
        that have none): at this ε_eval and number of held-out records their released value means nothing."""
        out = []
        for k in HEADLINE[self.task]:
            iv, (lo, hi) = intervals.get(k), self.metric_range(k)
            if iv is None or iv[1] - iv[0] >= TOO_WIDE * (hi - lo):
                out.append(k)
        return out

    def clamped(self, total: np.ndarray) -> list[str]:
        """The headline metrics whose value from the noisy sums fell outside their possible range, so that
        :meth:`metrics` shows a bound (accuracy 1.0, log-loss 0.0, …): an artefact of the noise, not a fact."""
        v = np.asarray(total, dtype=np.float64)
        B, Q, out = self.bins, SUM_UNITS, []

        def outside(key: str, x: float | None) -> None:
            lo, hi = self.metric_range(key)
            if x is not None and not lo <= x <= hi:
                out.append(key)

        if self.task == "binary":
            half = B // 2
            right, wrong = v[:half].sum() + v[B + half:2 * B].sum(), v[half:B].sum() + v[B:B + half].sum()
            n = right + wrong
            pos, neg = v[B:2 * B], v[:B]
            outside("auc", _binned_auc(pos, neg) if pos.sum() > 0 and neg.sum() > 0 else None)
            if n > 0:
                outside("accuracy", right / n)
                outside("logloss", v[2 * B] / Q / n * LOGLOSS_CLIP)
        elif self.task == "regression":
            n, R = v[:B].sum(), self._residual_range()
            if n > 0:
                ms = v[B + 1] / Q / n
                outside("rmse", math.copysign(math.sqrt(abs(ms)), ms) * R)
                outside("mae", v[B] / Q / n * R)
        else:
            K = len(self.classes)
            conf = v[2 * K * B:2 * K * B + K * K].reshape(K, K)
            h = v[:2 * K * B].reshape(K, 2, B)
            aucs = [_binned_auc(h[k, 0], h[k, 1]) for k in range(K) if h[k, 0].sum() > 0 and h[k, 1].sum() > 0]
            if any(not 0 <= a <= 1 for a in aucs):
                out.append("macro_auc")
            n = conf.sum()
            if n > 0:
                outside("accuracy", np.trace(conf) / n)
                outside("logloss", v[-1] / Q / n * LOGLOSS_CLIP)
        return [k for k in HEADLINE[self.task] if k in out]

    def resolution(self, total: np.ndarray) -> dict:
        """How far the histogram metrics may be from the exact pooled ones (noiseless ``total``).

        AUC: pairs of a positive and a negative in the same bin count ½ whatever their order, so
        |AUC_hist − AUC_exact| ≤ ½·Σ_b P_b·N_b / (P·N).  Sums: each record's term is rounded to 1/(2Q).
        """
        v = np.asarray(total, dtype=np.float64)
        B = self.bins
        if self.task == "multiclass":  # macro-AUC: the mean of the per-class bounds
            K = len(self.classes)
            h = v[:2 * K * B].reshape(K, 2, B)
            per = [float(0.5 * (h[k, 0] * h[k, 1]).sum() / (h[k, 0].sum() * h[k, 1].sum())) for k in range(K)]
            return {"auc_per_class": per, "macro_auc": float(np.mean(per)), "logloss": LOGLOSS_CLIP / (2 * SUM_UNITS)}
        if self.task == "binary":
            neg, pos = v[:B], v[B:2 * B]
            auc = float(0.5 * (pos * neg).sum() / (pos.sum() * neg.sum()))
            return {"auc": auc, "logloss": LOGLOSS_CLIP / (2 * SUM_UNITS)}
        R = self._residual_range()
        return {"mae": R / (2 * SUM_UNITS), "mse": R * R / (2 * SUM_UNITS)}


def _fieller(a: float, d: float, va: float, vd: float, cov: float, z: float) -> tuple[float, float] | None:
    """Fieller's confidence set for a/d from Gaussian estimates: {r : (a − r·d)² ≤ z²(va − 2r·cov + r²·vd)}.

    The quadratic (d² − z²vd)·r² − 2(a·d − z²cov)·r + (a² − z²va) ≤ 0 is a bounded interval when
    d² > z²vd (d clearly away from 0); otherwise the set is unbounded and None is returned (the caller
    reports the metric's whole range)."""
    qa = d * d - z * z * vd
    if qa <= 0:
        return None
    qb = -2.0 * (a * d - z * z * cov)
    qc = a * a - z * z * va
    root = math.sqrt(max(qb * qb - 4 * qa * qc, 0.0))
    return (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)


def _auc_interval(pos: np.ndarray, neg: np.ndarray, vc: float, z: float, sd_only: bool = False):
    """Delta-method interval of the binned AUC (:func:`_binned_auc`) for independent count noise of variance
    ``vc`` per bin: AUC = U/(P·N), U = Σ_b pos_b·(below_b + neg_b/2); ∂U/∂pos_b = below_b + neg_b/2,
    ∂U/∂neg_b = above_b + pos_b/2.  Returns [lo, hi] clamped to [0, 1] (or, with ``sd_only``, the standard
    deviation); the whole range [0, 1] (sd: None) when the noisy P or N is not positive."""
    P, N = float(pos.sum()), float(neg.sum())
    if not (P > 0 and N > 0):
        return None if sd_only else [0.0, 1.0]
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])
    above = np.concatenate([np.cumsum(pos[::-1])[::-1][1:], [0.0]])
    U = float((pos * (below + 0.5 * neg)).sum())
    g_pos = (below + 0.5 * neg) / (P * N) - U / (P * P * N)
    g_neg = (above + 0.5 * pos) / (P * N) - U / (P * N * N)
    sd = math.sqrt(vc * float((g_pos ** 2).sum() + (g_neg ** 2).sum()))
    if sd_only:
        return sd
    auc = U / (P * N)
    return [max(0.0, auc - z * sd), min(1.0, auc + z * sd)]


def _ratio(part: float, n: float) -> float | None:
    """part / n clamped to [0, 1] (None when n ≤ 0)."""
    return None if n <= 0 else float(min(max(part / n, 0.0), 1.0))


def _clipped_logloss(py: np.ndarray) -> np.ndarray:
    """Each record's log-loss −ln p(y) clipped to L = LOGLOSS_CLIP (probabilities below e^−L count as e^−L)."""
    return np.minimum(-np.log(np.maximum(py, math.exp(-LOGLOSS_CLIP))), LOGLOSS_CLIP)


def _noisy_auc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """The binned AUC of noisy counts: from the raw counts (U and P·N are unbiased there; clamping each cell
    at 0 pulls the AUC towards ½), clamped to [0, 1]; from the clamped counts when the raw P or N is not
    positive; None when even those have no positive and negative."""
    if pos.sum() > 0 and neg.sum() > 0:
        return min(max(_binned_auc(pos, neg), 0.0), 1.0)
    return _binned_auc(np.maximum(pos, 0.0), np.maximum(neg, 0.0))


def _binned_auc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """AUC from positive / negative counts per ascending score bin (pairs within a bin count ½)."""
    P, N = pos.sum(), neg.sum()
    if not (P > 0 and N > 0):
        return None
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])
    return float((pos * (below + 0.5 * neg)).sum() / (P * N))


def describe(metrics: dict, intervals: dict | None = None, epsilon_eval: float | None = None,
             too_wide: list[str] | tuple = (), clamped: list[str] | tuple = ()) -> str:
    """The headline metrics for people.  With intervals, the 95 % interval is the headline and the noisy point
    estimate comes after it (marked where it was clamped to its range); metrics whose interval is too wide to
    mean anything at this ε_eval and n are named in a sentence of their own::

        95 % intervals for the privacy noise: auc [0.8797, 0.8993], accuracy [0.8149, 0.8273], … (point
        estimates: auc 0.8895, …; n ≈ 14835 [14680, 14990])

    Without intervals (older receipts): ``n≈1503 accuracy=0.8780 …``."""
    keys = (("macro_auc", "accuracy", "logloss") if "macro_auc" in metrics
            else ("auc", "accuracy", "logloss") if "auc" in metrics else ("rmse", "mae"))
    iv = intervals or {}
    if not iv:
        return " ".join([f"n≈{metrics['n']:.0f}"] + [f"{k}={metrics[k]:.4f}" if metrics[k] is not None else f"{k}=n/a"
                                                     for k in keys])

    def interval(k: str) -> str:
        x = iv.get(k)
        return f"{k} [{x[0]:.4f}, {x[1]:.4f}]" if x else f"{k} n/a"

    def point(k: str) -> str:
        if metrics[k] is None:
            return f"{k} n/a"
        return f"{k} {metrics[k]:.4f}" + (" (clamped to its range: a noise artefact)" if k in clamped else "")

    n = f"n ≈ {metrics['n']:.0f}" + (f" [{iv['n'][0]:.0f}, {iv['n'][1]:.0f}]" if iv.get("n") else "")
    line = (f"95 % intervals for the privacy noise: {', '.join(interval(k) for k in keys)} (noisy point estimates: "
            f"{', '.join(point(k) for k in keys)}; {n})")
    wide = [k for k in keys if k in too_wide]
    if wide:
        at = f"at ε_eval = {epsilon_eval:g} and {n}" if epsilon_eval is not None else f"at this ε_eval and {n}"
        what = ("these intervals are" if len(wide) == len(keys) else
                f"the interval{'s' if len(wide) > 1 else ''} of {', '.join(wide)} {'are' if len(wide) > 1 else 'is'}")
        line += (f". {at[0].upper()}{at[1:]}, {what} too wide to mean anything (at least half of the possible range): "
                 "raise ε_eval or hold out more records (docs/federated-evaluation.md, \"Choosing ε_eval\")")
    return line


def describe_receipt(receipt: dict) -> str:
    """:func:`describe` of an evaluation receipt (``evaluation.json``): its metrics, intervals, ε_eval and what is
    too wide or clamped; or why nothing was released."""
    if "metrics" not in receipt:
        return f"not released ({receipt.get('failed', 'no evaluation')})"
    return describe(receipt["metrics"], receipt.get("intervals"), receipt.get("epsilon_eval"),
                    receipt.get("too_wide", ()), receipt.get("clamped", ()))


def exact_metrics(spec: EvalSpec, y: np.ndarray, pred: np.ndarray) -> dict:
    """The pooled metrics on all records at once, with the same public clipping (the oracle for tests)."""
    from fedsbdt.common.metrics import accuracy, auc

    y = np.asarray(y, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.float64)
    if spec.task == "multiclass":  # one-vs-rest AUC per class, arg-max accuracy, clipped log-loss
        yi = y.astype(np.int64)
        p = np.clip(pred, 0.0, 1.0)
        aucs = [auc((yi == k).astype(float), p[:, k]) for k in range(len(spec.classes))]
        py = p[np.arange(y.size), yi]
        ll = float(_clipped_logloss(py).mean())
        return {"n": float(y.size), "macro_auc": float(np.mean(aucs)), "auc_per_class": aucs,
                "accuracy": float(np.mean(np.argmax(pred, axis=1) == yi)), "logloss": ll}
    if spec.task == "binary":
        p = np.clip(pred, 0.0, 1.0)
        py = np.where(y == 1, p, 1.0 - p)
        ll = float(_clipped_logloss(py).mean())
        return {"n": float(y.size), "auc": auc(y, p), "accuracy": accuracy(y, p), "logloss": ll}
    R = spec._residual_range()
    r = np.clip(pred - y, -R, R)
    return {"n": float(y.size), "rmse": float(np.sqrt(np.mean(r * r))), "mae": float(np.mean(np.abs(r)))}
