"""A TimberStrike-style dataset reconstruction by one curious site (benchmarks/reconstruction.py).

Di Gennaro, De Lucia, Longari, Zanero & Carminati, "TimberStrike: Dataset Reconstruction Attack Revealing
Privacy Leakage in Federated Tree-Based Systems" (arXiv:2506.07605): an honest-but-curious client of a
horizontally federated gradient-boosted tree ensemble reconstructs other clients' training records from the
released trees.  Written here from the paper's method (no code of theirs), for binary log-loss, on two kinds
of release:

* **XGBoost-style**: per leaf its value w = η·R/(H + λ) (R = Σ(y − p), H = Σ p(1 − p) over the leaf's records)
  and its cover H (XGBoost's ``sum_hessian``); split thresholds are data values (histogram cut points).
* **S-BDT (fedsbdt)**: per leaf only its value v = clamp((R̃)/(H̃ + λ), ±β) from the *noisy* subsampled sums
  (η applied at prediction), no cover; split thresholds are public random numbers.

The attack, in the paper's two phases:

1. **First-tree probing.**  Before the first tree every record has the same prediction p₀ (the base score),
   so its g and h depend on its label only.  A leaf's statistics then give how many records of each label
   fall in it: with the cover, exactly (n = H/(p₀(1 − p₀)), n₁ from R); the attacker subtracts its own
   records (it knows its data and replays the model) and is left with the other sites' label counts per leaf.
   Each such record starts as the leaf's box (the intervals of its decision path).
2. **Path refinement, tree by tree.**  Every reconstructed record carries its box, its label and its running
   prediction (so its g and h).  For the next tree, the attacker estimates each leaf's number of other-site
   records of each label from the leaf's statistics (minus its own) and assigns every record to one leaf its
   box can reach, honouring those counts (an optimal assignment, Hungarian, where the paper solves an integer
   program for the same consistency); the box shrinks to the intersection, the prediction moves by the leaf's
   value.  After the last tree each feature is the attacker's best point in its interval (the median of its
   own values there, else the interval's middle).

Without a cover (S-BDT), the number of other-site records in a leaf is not released; the attacker takes its
own records as a density estimate (n_others · its own share of the leaf) and uses the leaf value for the label
split — the best it can do with what it sees.

Scoring (the paper's, from TabLeak): a numeric feature is reconstructed if it lies within ``τ · std`` of the
true value (τ = 0.319, std over the victim's records); reconstructed and true records are paired by an optimal
one-to-one matching (Hungarian) minimising the number of features outside tolerance.  We report the fraction
of the victim's records with **every** feature within tolerance, and the paper's accuracy (the mean fraction
of features within tolerance).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

#: the paper's tolerance factor (TimberStrike's configs, after TabLeak): |x̂ − x| ≤ 0.319 · std of the feature
TOLERANCE = 0.319


@dataclass(frozen=True)
class ReleasedTree:
    """One tree as boxes: leaf j covers ``lo[j] ≤ x < hi[j]`` (every feature); ``out`` is what it adds to the
    margin, ``cover`` its Hessian sum (None when not released)."""

    lo: np.ndarray  # (L, F)
    hi: np.ndarray  # (L, F)
    out: np.ndarray  # (L,)
    cover: np.ndarray | None = None

    def leaf_of(self, X: np.ndarray) -> np.ndarray:
        inside = np.all((X[:, None, :] >= self.lo[None]) & (X[:, None, :] < self.hi[None]), axis=2)
        if not np.all(inside.sum(axis=1) == 1):
            raise ValueError("the leaves' boxes must partition the feature space")
        return np.argmax(inside, axis=1)


@dataclass(frozen=True)
class Release:
    """What the curious site sees: the trees, the initial margin and the public training constants."""

    trees: tuple[ReleasedTree, ...]
    init_margin: float
    eta: float  # leaf value = eta · raw value
    l2: float
    gamma: float = 1.0  # Poisson subsampling rate (sums are over a γ-subsample)
    grad_clip: float = np.inf
    hess_clip: float = np.inf
    noise_grad_std: float = 0.0  # std of the noise on a leaf's gradient sum (from the receipt's σ; 0: exact)
    noise_hess_std: float = 0.0  # std of the noise on a leaf's Hessian sum

    @property
    def has_cover(self) -> bool:
        return self.trees[0].cover is not None


def _heap_boxes(features, thresholds, depth: int, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    L = 1 << depth
    lo = np.full((L, n_features), -np.inf)
    hi = np.full((L, n_features), np.inf)
    for j in range(L):
        k = 0
        for level in range(depth):
            left = not (j >> (depth - 1 - level)) & 1
            f, t = int(features[k]), float(thresholds[k])
            if left:
                hi[j, f] = min(hi[j, f], t)
                k = 2 * k + 1
            else:
                lo[j, f] = max(lo[j, f], t)
                k = 2 * k + 2
    return lo, hi


def release_of_fedsbdt(model) -> Release:
    """A fedsbdt model (random trees, numeric features) as the curious site sees it: leaves only."""
    hp = model.hyperparameters
    if model.task != "binary" or model.is_categorical().any():
        raise ValueError("the reconstruction benchmark handles binary tasks on numeric features")
    F = model.schema.n_features
    trees = []
    for t in model.trees:
        lo, hi = _heap_boxes(t.features, t.thresholds, hp.depth, F)
        trees.append(ReleasedTree(lo, hi, hp.learning_rate * np.asarray(t.leaves, np.float64)))
    from fedsbdt.common.audit import NoiseModel

    noisy = "noise=off" not in str(model.privacy.get("randomness", ""))  # test randomness without noise says so
    nm = NoiseModel.for_model(model)
    return Release(tuple(trees), float(model.init_score), hp.learning_rate, hp.l2, hp.subsample, hp.grad_clip,
                   hp.hess_clip_for("binary"), nm.grad_std if noisy else 0.0, nm.hess_std if noisy else 0.0)


def release_of_xgboost(model_json: dict, n_features: int, eta: float, l2: float) -> Release:
    """An XGBoost ``binary:logistic`` model (``Booster.save_raw('json')``, parsed) trained with learning rate
    ``eta`` and L2 penalty ``l2`` (the training configuration every participant knows): leaves, covers, data
    thresholds (``x < split_condition`` goes left)."""
    learner = model_json["learner"]
    params = learner["gradient_booster"]["model"]
    base = float(str(learner["learner_model_param"]["base_score"]).strip("[]"))
    trees = []
    for t in params["trees"]:
        left, right = t["left_children"], t["right_children"]
        feat, cond, hess = t["split_indices"], t["split_conditions"], t["sum_hessian"]
        los, his, outs, covers = [], [], [], []
        stack = [(0, np.full(n_features, -np.inf), np.full(n_features, np.inf))]
        while stack:
            k, lo, hi = stack.pop()
            if left[k] == -1:
                los.append(lo), his.append(hi), outs.append(cond[k]), covers.append(hess[k])
                continue
            f, c = int(feat[k]), float(cond[k])
            lhi = hi.copy()
            lhi[f] = min(hi[f], c)
            rlo = lo.copy()
            rlo[f] = max(lo[f], c)
            stack.append((right[k], rlo, hi))
            stack.append((left[k], lo, lhi))
        trees.append(ReleasedTree(np.array(los), np.array(his), np.array(outs, np.float64),
                                  np.array(covers, np.float64)))
    return Release(tuple(trees), float(np.log(base / (1 - base))), float(eta), float(l2))


# --------------------------------------------------------------------------- the attack


def _gh(release: Release, y: np.ndarray, margin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = 1.0 / (1.0 + np.exp(-margin))
    return np.clip(y - p, -release.grad_clip, release.grad_clip), np.minimum(p * (1 - p), release.hess_clip)


def _round_counts(a: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer (label-1, label-0) counts from real estimates: n rounded ≥ 0, a rounded into [0, n]."""
    n_int = np.maximum(np.rint(n), 0).astype(np.int64)
    a_int = np.clip(np.rint(a), 0, n_int).astype(np.int64)
    return a_int, n_int - a_int


@dataclass
class Reconstruction:
    lo: np.ndarray  # (m, F) boxes
    hi: np.ndarray
    y: np.ndarray  # (m,) labels
    margin: np.ndarray  # (m,) running predictions
    X: np.ndarray | None = None  # (m, F) point estimates, after :func:`finish`


def reconstruct(release: Release, X_own: np.ndarray, y_own: np.ndarray, n_others: int, public_lo: np.ndarray,
                public_hi: np.ndarray, time_limit: float = 2.0) -> Reconstruction:
    """The curious site's reconstruction of the other sites' records (see the module docstring)."""
    X_own, y_own = np.asarray(X_own, np.float64), np.asarray(y_own, np.float64)
    nA = len(y_own)
    g = release.gamma
    own_margin = np.full(nA, release.init_margin)
    rec: Reconstruction | None = None
    for t, tree in enumerate(release.trees):
        L = tree.out.size
        leafA = tree.leaf_of(X_own)
        gA, hA = _gh(release, y_own, own_margin)
        RA = np.bincount(leafA, gA, L)
        HA = np.bincount(leafA, hA, L)
        nA_leaf = np.bincount(leafA, minlength=L).astype(np.float64)
        u = tree.out / release.eta  # the raw leaf value R/(H + λ) (of the γ-subsample's sums)
        prior = n_others * nA_leaf / max(nA, 1)  # other-site records per leaf, from the attacker's own density
        if rec is None:
            m0 = np.full(1, release.init_margin)
            r1, _ = _gh(release, np.ones(1), m0)
            r0, h0 = _gh(release, np.zeros(1), m0)
            if tree.cover is not None:
                Ho = np.maximum(tree.cover - HA, 0.0)
                Ro = u * (tree.cover + release.l2) - RA
                n = Ho / h0[0]
            else:
                n = prior
                Ro = u * (g * (HA + n * h0[0]) + release.l2) / g - RA
            a = np.clip((Ro - n * r0[0]) / (r1[0] - r0[0]), 0, n)
            a_int, b_int = _round_counts(a, n)
            leaf_ids = np.concatenate([np.repeat(np.arange(L), a_int), np.repeat(np.arange(L), b_int)])
            labels = np.concatenate([np.ones(a_int.sum()), np.zeros(b_int.sum())])
            rec = Reconstruction(tree.lo[leaf_ids].copy(), tree.hi[leaf_ids].copy(), labels,
                                 np.full(labels.size, release.init_margin) + tree.out[leaf_ids])
        else:
            _refine(release, tree, rec, RA, HA, u, prior, public_lo, public_hi, time_limit)
        own_margin = own_margin + tree.out[leafA]
    return finish(rec, X_own, public_lo, public_hi, y_own)


def _refine(release: Release, tree: ReleasedTree, rec: Reconstruction, RA, HA, u, prior, public_lo,
            public_hi, time_limit: float) -> float:
    """Route every reconstructed record through ``tree``: an integer program over groups of interchangeable
    records (same label, box and prediction), as the paper's, solved by HiGHS (scipy.optimize.milp).

    Unknowns: how many records of group G go to each leaf j their box reaches (x_Gj ≥ 0, Σ_j x_Gj = |G|).
    With the cover (XGBoost): per leaf, Σ_G x_Gj·g_G = R_j and Σ_G x_Gj·h_G = H_j, the other sites' sums (the
    leaf's minus the attacker's own), up to slack; minimise the slack.  Without it (S-BDT): Σ_G x_Gj·g_G ≈ R̂_j
    (from the noisy value, weighted by its noise) and Σ_G x_Gj ≈ the attacker's density estimate of the
    leaf's count.  Ties go to the leaf that holds more of the group's box."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    L = tree.out.size
    gam = release.gamma
    gi, hi_ = _gh(release, rec.y, rec.margin)
    key = np.column_stack([rec.y, rec.lo, rec.hi, rec.margin])
    _, group, size = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    first = np.zeros(size.size, np.int64)
    first[group[::-1]] = np.arange(group.size)[::-1]
    glo, ghi, gg, gh = rec.lo[first], rec.hi[first], gi[first], hi_[first]
    reach = np.all(np.maximum(glo[:, None, :], tree.lo[None]) < np.minimum(ghi[:, None, :], tree.hi[None]), axis=2)
    clo, chi = np.maximum(glo, public_lo), np.minimum(ghi, public_hi)
    width = np.maximum(chi - clo, 1e-12)
    frac = np.clip((np.minimum(chi[:, None, :], tree.hi[None]) - np.maximum(clo[:, None, :], tree.lo[None]))
                   / width[:, None, :], 1e-6, 1)
    G_idx, J_idx = np.nonzero(reach)
    nv = G_idx.size
    tie = -np.log(np.prod(frac[G_idx, J_idx], axis=1))  # prefer the leaf holding more of the box
    if tree.cover is not None:
        targets = [(np.maximum(tree.cover - HA, 0.0), gh[G_idx], 4.0),  # H, weight 4 (h ≤ 1/4)
                   (u * (tree.cover + release.l2) - RA, gg[G_idx], 1.0)]  # R
        tie_w = 1e-9
    else:
        n_hat = prior
        h_bar = float(np.mean(gh)) if gh.size else 0.0
        g_bar = float(np.mean(np.abs(gg))) if gg.size else 0.0
        r_hat = u * (gam * (HA + n_hat * h_bar) + release.l2) / gam - RA
        # what R̂ can be off by: the leaf noise, the unknown count (taken from the prior), the secret subsample
        r_std = np.sqrt((release.noise_grad_std ** 2 + (u * release.noise_hess_std) ** 2) / gam ** 2
                        + (u * h_bar) ** 2 * np.maximum(n_hat, 1.0) + (1 - gam) / gam * np.maximum(n_hat, 1.0)
                        * g_bar ** 2) + 1e-9
        targets = [(n_hat, np.ones(nv), 1.0 / np.sqrt(np.maximum(n_hat, 1.0))), (r_hat, gg[G_idx], 1.0 / r_std)]
        tie_w = 1e-6
    # variables: x (nv), then per target: s⁺ (L), s⁻ (L)
    nt = len(targets)
    c = np.concatenate([tie_w * tie] + [np.tile(np.broadcast_to(w, (L,)), 2) for _, _, w in targets])
    rows, cols, vals, lo_b, hi_b = [], [], [], [], []
    rows.append(G_idx), cols.append(np.arange(nv)), vals.append(np.ones(nv))  # Σ_j x_Gj = |G|
    lo_b.append(size.astype(np.float64)), hi_b.append(size.astype(np.float64))
    r0 = size.size
    for k, (t, coef, _) in enumerate(targets):
        base = nv + 2 * L * k
        rows += [r0 + J_idx, r0 + np.arange(L), r0 + np.arange(L)]
        cols += [np.arange(nv), base + np.arange(L), base + L + np.arange(L)]
        vals += [coef, -np.ones(L), np.ones(L)]
        lo_b.append(t), hi_b.append(t)
        r0 += L
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(r0, nv + 2 * L * nt)).tocsr()
    ub = np.concatenate([size[G_idx].astype(np.float64), np.full(2 * L * nt, np.inf)])
    integrality = np.concatenate([np.ones(nv), np.zeros(2 * L * nt)])
    res = milp(c, constraints=LinearConstraint(A, np.concatenate(lo_b), np.concatenate(hi_b)),
               bounds=Bounds(np.zeros(c.size), ub), integrality=integrality,
               options={"time_limit": time_limit, "disp": False})
    slack = np.inf if res.x is None else float(res.x[nv:] @ c[nv:]) / max(float(np.sum(size)), 1.0)
    if res.x is None:  # no integer point in time: each group to the leaf holding most of its box
        x = np.zeros(nv)
        best = {}
        for v in np.argsort(tie):
            best.setdefault(G_idx[v], v)
        for G, v in best.items():
            x[v] = size[G]
    else:
        x = np.rint(res.x[:nv])
    # hand out each group's counts to its (interchangeable) members
    choice = np.empty(rec.y.size, np.int64)
    members = np.argsort(group, kind="stable")
    starts = np.concatenate([[0], np.cumsum(size)])
    for G in range(size.size):
        vs = np.flatnonzero(G_idx == G)
        counts = x[vs].astype(np.int64)
        leaves = np.repeat(J_idx[vs], counts)
        if leaves.size < size[G]:  # rounding: the rest to the leaf holding most of the box
            leaves = np.concatenate([leaves, np.full(size[G] - leaves.size, J_idx[vs][np.argmin(tie[vs])])])
        choice[members[starts[G]:starts[G + 1]]] = leaves[:size[G]]
    rec.lo = np.maximum(rec.lo, tree.lo[choice])
    rec.hi = np.minimum(rec.hi, tree.hi[choice])
    rec.margin = rec.margin + tree.out[choice]
    return slack


def finish(rec: Reconstruction, X_own: np.ndarray, public_lo: np.ndarray, public_hi: np.ndarray,
           y_own: np.ndarray | None = None) -> Reconstruction:
    """Point estimates: every reconstructed record takes one of the attacker's own records (each used about
    equally often; an optimal assignment preferring records of the same label that lie in or near its box) and
    moves it into its box (each feature clipped to the box's interval within the public range).  Where the box
    says nothing, the attacker's own data fills in; where it is narrow, the box decides."""
    X_own = np.asarray(X_own, np.float64)
    m, F = rec.lo.shape
    lo = np.clip(rec.lo, public_lo, public_hi)
    hi = np.clip(rec.hi, public_lo, public_hi)
    scale = np.maximum(public_hi - public_lo, 1e-12)
    below = np.maximum(lo[:, None, :] - X_own[None], 0) / scale
    above = np.maximum(X_own[None] - hi[:, None, :], 0) / scale
    cost = np.sqrt(((below + above) ** 2).sum(axis=2))
    if y_own is not None:
        cost = cost + (rec.y[:, None] != np.asarray(y_own)[None]) * 0.05
    reps = -(-m // X_own.shape[0])
    r, c = linear_sum_assignment(np.tile(cost, (1, reps)))
    pick = c % X_own.shape[0]
    top = np.where(np.isfinite(rec.hi) & (rec.hi <= public_hi), np.nextafter(hi, -np.inf), hi)  # [lo, hi)
    X = np.empty((m, F))
    X[r] = np.clip(X_own[pick], lo[r], np.maximum(top[r], lo[r]))
    rec.X = X
    return rec


# --------------------------------------------------------------------------- scoring


def exact_values(thresholds: list[np.ndarray], X_victim: np.ndarray, X_own: np.ndarray) -> float:
    """Share of the victim's feature values (cells) that the release states exactly as a split threshold of that
    feature while the attacker holds no such value itself: values it learns were in another site's data
    (compared in float32, XGBoost's precision).  ``thresholds[f]``: the thresholds of feature f."""
    hits = 0
    for f, th in enumerate(thresholds):
        known = np.setdiff1d(np.asarray(th, np.float32), np.asarray(X_own[:, f], np.float32))
        hits += int(np.isin(np.asarray(X_victim[:, f], np.float32), known).sum())
    return hits / X_victim.size


def tolerances(X_victim: np.ndarray, tau: float = TOLERANCE) -> np.ndarray:
    """Per numeric feature: τ · the standard deviation of the victim's values (numpy's population std)."""
    return tau * np.std(np.asarray(X_victim, np.float64), axis=0)


@dataclass(frozen=True)
class Score:
    records: float  # fraction of the victim's records with every feature within tolerance
    features: float  # the paper's accuracy: mean fraction of the victim's features within tolerance
    matched: int  # victim records paired with a reconstructed one


def score(X_rec: np.ndarray, X_true: np.ndarray, victim: np.ndarray, tol: np.ndarray) -> Score:
    """Pair reconstructed and true records one to one (Hungarian, minimising features outside tolerance) and
    score the victim's records (``victim``: boolean over ``X_true``; an unpaired one counts as all wrong)."""
    X_rec, X_true = np.asarray(X_rec, np.float64), np.asarray(X_true, np.float64)
    F = X_true.shape[1]
    wrong = (np.abs(X_rec[:, None, :] - X_true[None, :, :]) > tol[None, None, :]).sum(axis=2)
    r, c = linear_sum_assignment(wrong)
    per_true = np.full(X_true.shape[0], F)
    per_true[c] = wrong[r, c]
    v = per_true[np.asarray(victim, bool)]
    return Score(float(np.mean(v == 0)), float(np.mean(1 - v / F)), int(np.isin(np.flatnonzero(victim), c).sum()))
