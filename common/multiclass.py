"""Multi-class S-BDT: softmax loss, K class trees per round (docs/multiclass.md, docs/privacy.md "Multi-class").

The K classes are public (the schema's ``classes``); a record's label is its
class index y ∈ {0 … K−1}.  The model keeps one margin per class,
``F_k(x) = init_k + η·Σ_r v_{r,k}(x)``, and predicts ``softmax(F(x))``.

Every round releases K trees that share the round's *public random splits*
(:func:`fedsbdt.common.splits.random_splits` of (seed, round)): the splits are
data-independent, so sharing them costs no privacy, a record reaches the same
leaf in all K trees (one tree walk per round instead of K), and the
sensitivity argument below does not depend on the choice.

**Round vector** (length 2·K·L, class-major): block k is the binary/regression
layout ``[w_{k,0} … w_{k,L−1}, u_{k,0} … u_{k,L−1}]`` of class k's clipped
Hessian and gradient sums, so :func:`fedsbdt.common.boosting.leaf_values` turns each
block into class k's leaves.

**Gradients** of the softmax loss −log p_y on the margins, negated as in the
engine (g = −∂loss): ``g_k = 1[k = y] − p_k``, Hessian diagonal
``h_k = p_k(1 − p_k)``.  In fixed-point units (scale S = 2^scale_bits) we
round magnitudes *down*: ``gq_y = min(⌊(1−p_y)S⌋, g_u)``,
``gq_k = −min(⌊p_k S⌋, g_u)`` (k ≠ y), ``hq_k = min(⌊h_k S⌋, h_u)``, so
``Σ_{k≠y} |gq_k| ≤ S`` holds exactly (enforced, not only up to rounding).

**Joint sensitivity** (add/remove one record, Thm. in docs/privacy.md): one
record adds ``(hq_k, gq_k)`` to one leaf of each class tree, so the change of
the round vector has L2 norms ``‖Δ_g‖ ≤ G`` and ``‖Δ_h‖ ≤ H`` with

* ``G² = c² + min(c·S, (K−1)·c²)``, ``c = min(g_u, S)``
  (``|gq_y| ≤ c``; the others have ``Σ|gq_k| ≤ S`` and ``|gq_k| ≤ c``, so
  ``Σ gq_k² ≤ c·Σ|gq_k|``).  With g* ≥ 1: ``G = √2·S`` — the bound
  ``Σ_k |g_k| ≤ 2 ⇒ ‖g‖₂ ≤ √2``.  With g* = ½: ``G = √3·g*·S``.
* ``H² = S²·min(φ(c_h), K·c_h²)``, ``c_h = h_u/S``, where
  ``φ(c) = sup_p min(c, p(1−p))²/p`` (= 4/27 for c ≥ 2/9, else
  ``p₀(1−p₀)²`` with ``p₀(1−p₀) = c``): each term is ≤ p_k·φ(c) and Σ p_k = 1.

The leaf noise per coordinate is ``H·σ/√(2r1)`` (Hessian sums) and
``G·σ/√(2r2)`` (gradient sums) instead of the binary task's h*, g*, so the
whitened round vector has L2 sensitivity² ≤ 2r1/σ² + 2r2/σ² = 2/σ²: one
Poisson-subsampled Gaussian of noise multiplier σ/√2 per round
(:func:`round_event`) — the same event, and so the same calibration
(Alg. 6), as one binary tree.

**Initial score**: the record count and the K class counts
``[N, n_0 … n_{K−1}]``, discrete Laplace with scales 1/ε_ds and 1/ε_init
(one record changes N by 1 and exactly one class count by 1: L1
sensitivity 1 each, the same two pure-DP events as the binary initial
score); the margins are the centred log priors ``log p̃_k − mean_j log p̃_j``.
"""
from __future__ import annotations

import math

import numpy as np

from fedsbdt.common import modes

from .accountant import GaussianEvent, PoissonSampledEvent, PrivacyCalibration
from .config import ConfigError, Hyperparameters
from .schema import Schema

#: relative slack on the sensitivities: covers the float rounding of Σ_k p_k (≤ (K+2)·2^−53) with room
SLACK = 1.0 + 1e-9
#: smallest and largest prior probability of the initial score (as the binary task's 1e-3 … 1 − 1e-3)
PRIOR_CLIP = 1e-3


def check_supported(hp: Hyperparameters) -> None:
    """Refuse what multi-class training does not do (one clear line each)."""
    if not modes.training_mode(hp).multiclass:
        supported = [name for name, m in modes.tree_builders().items() if m.multiclass]
        raise ConfigError(f"tree_builder = {hp.tree_builder!r} does not support task = 'multiclass' (its splits "
                          f"and their sensitivity are per single tree); use tree_builder = "
                          f"{' or '.join(map(repr, supported))}")
    if hp.filter:
        raise ConfigError("the individual Rényi filter does not support task = 'multiclass' yet (a record's cost "
                          "would depend on its whole K-vector of gradients); drop --filter")


# --------------------------------------------------------------------------- sensitivity (pure)


def phi(c: float) -> float:
    """``sup_{0<p≤1} min(c, p(1−p))²/p``: the bound on ``h_k²/p_k`` for a Hessian clipped at c."""
    if c >= 2.0 / 9.0:
        return 4.0 / 27.0  # p(1−p)² at p = 1/3
    p0 = (1.0 - math.sqrt(1.0 - 4.0 * c)) / 2.0
    return p0 * (1.0 - p0) ** 2


def gradient_sensitivity(classes: int, g_units: int, scale: float) -> float:
    """``G`` (units): L2 norm bound of one record's clipped gradient K-vector (module doc)."""
    c = float(min(g_units, scale))
    return math.sqrt(c * c + min(c * scale, (classes - 1) * c * c)) * SLACK


def hessian_sensitivity(classes: int, h_units: int, scale: float) -> float:
    """``H`` (units): L2 norm bound of one record's clipped Hessian K-vector (module doc)."""
    c = h_units / scale
    return scale * math.sqrt(min(phi(c), classes * c * c)) * SLACK


def leaf_noise_scales(hp: Hyperparameters, enc, sigma: float, shares: int = 1) -> np.ndarray:
    """Per-coordinate noise std (units) of the 2·K·L round vector: block ``[H·σ/√(2r1)]*L + [G·σ/√(2r2)]*L``."""
    K, L = enc.classes, hp.leaves
    G = gradient_sensitivity(K, enc.grad.bound_units, enc.scale)
    H = hessian_sensitivity(K, enc.hess.bound_units, enc.scale)
    sh = H * sigma / math.sqrt(2.0 * hp.r1) / math.sqrt(shares)
    sg = G * sigma / math.sqrt(2.0 * hp.r2) / math.sqrt(shares)
    return np.tile(np.concatenate([np.full(L, sh), np.full(L, sg)]), K)


def receipt_sensitivity(hp: Hyperparameters, enc) -> dict:
    """What the privacy receipt adds for a K-class model: K and the joint per-round sensitivities."""
    return {"classes": enc.classes,
            "joint_sensitivity": {
                "gradient_l2": gradient_sensitivity(enc.classes, enc.grad.bound_units, enc.scale) / enc.scale,
                "hessian_l2": hessian_sensitivity(enc.classes, enc.hess.bound_units, enc.scale) / enc.scale,
                "event": "one Poisson-subsampled Gaussian per round for all K class trees (docs/privacy.md)"}}


def round_event(gamma: float, sigma: float) -> PoissonSampledEvent:
    """The DP event of one round's K-tree release: whitened L2 sensitivity √2/σ, i.e. a Gaussian of noise
    multiplier σ/√2 at sensitivity 1, on a Poisson subsample of rate γ (same as one binary tree)."""
    return PoissonSampledEvent(gamma, GaussianEvent(sigma / math.sqrt(2.0)))


# --------------------------------------------------------------------------- gradients and sums (pure)


def softmax(margins: np.ndarray) -> np.ndarray:
    m = np.asarray(margins, np.float64)
    e = np.exp(m - m.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def grad_hess_units(pred: np.ndarray, y: np.ndarray, scale: float, g_units: int,
                    h_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Clipped negative softmax gradients and Hessian diagonals (n × K int64 units), magnitudes rounded down.

    Guarantees per record: ``|gq_y| ≤ min(g_u, S)``, ``|gq_k| ≤ g_u`` and ``Σ_{k≠y} |gq_k| ≤ S``,
    ``0 ≤ hq_k ≤ h_u`` and ``hq_k ≤ p_k(1−p_k)·S``."""
    p = softmax(pred)
    n, K = p.shape
    yi = np.asarray(y).astype(np.int64)
    rows = np.arange(n)
    S = float(scale)
    mag = np.minimum(np.floor(p * S), g_units)
    mag[rows, yi] = 0.0
    # Σ_k p_k may exceed 1 by a few ulp: trim any excess over S from the largest other entry (never seen)
    excess = mag.sum(axis=1) - S
    over = np.flatnonzero(excess > 0)
    if over.size:
        j = np.argmax(mag[over], axis=1)
        mag[over, j] -= excess[over]
    gq = -mag
    gq[rows, yi] = np.minimum(np.floor((1.0 - p[rows, yi]) * S), min(g_units, S))
    hq = np.minimum(np.floor(p * (1.0 - p) * S), h_units)
    return gq.astype(np.int64), hq.astype(np.int64)


def leaf_sums(leaf: np.ndarray, gq: np.ndarray, hq: np.ndarray, selected: np.ndarray, n_leaves: int) -> np.ndarray:
    """The 2·K·L round vector (class-major blocks ``[w_k, u_k]``) of the selected records (exact int64 sums)."""
    leaf = np.asarray(leaf, np.int64)[selected]
    K = gq.shape[1]
    out = np.zeros((K, 2, n_leaves), np.int64)
    for k in range(K):
        np.add.at(out[k, 0], leaf, np.asarray(hq[selected, k], np.int64))
        np.add.at(out[k, 1], leaf, np.asarray(gq[selected, k], np.int64))
    return out.reshape(-1)


def leaf_values(noisy_sums: np.ndarray, hp: Hyperparameters, enc) -> np.ndarray:
    """DPLeaf (Alg. 5 line 6) per class block: ``(K, L)`` leaf values clamped to ±β."""
    from . import kernels

    L = hp.leaves
    blocks = np.asarray(noisy_sums, np.int64).reshape(enc.classes, 2 * L)
    return np.stack([kernels.leaf_values(b, L, enc.hess.scale, enc.grad.scale, hp.l2, hp.leaf_clip)
                     for b in blocks])


# --------------------------------------------------------------------------- initial score (pure)


def init_noise_scales(classes: int, cal: PrivacyCalibration) -> np.ndarray:
    """Discrete-Laplace scales for ``[N, n_0 … n_{K−1}]``: 1/ε_ds, then 1/ε_init per class count."""
    return np.concatenate([[1.0 / cal.eps_ds], np.full(classes, 1.0 / cal.eps_init)])


def init_score(noisy: np.ndarray, classes: int) -> np.ndarray:
    """Centred log priors from the noisy ``[N, n_0 … n_{K−1}]`` (post-processing)."""
    noisy = np.asarray(noisy, np.float64)
    count = max(float(noisy[0]), 1.0)
    p = np.clip(noisy[1:1 + classes] / count, PRIOR_CLIP, 1.0 - PRIOR_CLIP)
    logp = np.log(p)
    return logp - logp.mean()


def init_sums(y: np.ndarray, present: np.ndarray, classes: int) -> np.ndarray:
    """``[N, n_0 … n_{K−1}]`` over the records present at the start."""
    yi = np.asarray(y).astype(np.int64)[present]
    return np.concatenate([[int(present.sum())], np.bincount(yi, minlength=classes)]).astype(np.int64)


def round_vector_len(schema: Schema, hp: Hyperparameters) -> int:
    return 2 * hp.leaves * max(schema.n_classes, 1)


def init_vector_len(schema: Schema) -> int:
    return schema.n_classes + 1 if schema.task == "multiclass" else 2


# --------------------------------------------------------------------------- metrics (pure)


def log_loss(y: np.ndarray, prob: np.ndarray, eps: float = 1e-15) -> float:
    """Mean −log p_y (probabilities clipped to [eps, 1])."""
    yi = np.asarray(y).astype(np.int64)
    p = np.clip(np.asarray(prob, np.float64)[np.arange(yi.size), yi], eps, 1.0)
    return float(-np.mean(np.log(p)))


def macro_auc(y: np.ndarray, prob: np.ndarray) -> float:
    """Mean one-vs-rest AUC over the classes present with both outcomes (NaN if none)."""
    from .metrics import auc

    yi = np.asarray(y).astype(np.int64)
    aucs = [auc((yi == k).astype(float), prob[:, k]) for k in range(prob.shape[1])]
    aucs = [a for a in aucs if not math.isnan(a)]
    return float(np.mean(aucs)) if aucs else float("nan")


def evaluate(y: np.ndarray, prob: np.ndarray) -> dict:
    yi = np.asarray(y).astype(np.int64)
    return {"n": int(yi.size), "accuracy": float(np.mean(np.argmax(prob, axis=1) == yi)),
            "macro_auc": macro_auc(yi, prob), "log_loss": log_loss(yi, prob)}
