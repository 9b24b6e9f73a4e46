"""Centralised S-BDT training (paper Alg. 2): one party, the full noise.

The federation runs the very same steps with the sums of many
:class:`~fedsbdt.common.boosting.LocalData` instead of one; see ``server/`` and
``client/``.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsbdt.common import modes

from .accountant import PrivacyCalibration
from .boosting import (Encoding, LocalData, init_noise_scales, init_score, leaf_noise_scales, leaf_values,
                       split_edges)
from .builders import TreeBuilder
from .candidates import dp_quantile_cuts
from .config import Hyperparameters
from .data import Dataset
from .fixedpoint import check_capacity
from .model import Ensemble, Tree
from .multiclass import check_supported, receipt_sensitivity
from .multiclass_boosting import local_data_for
from .rdp_filter import FilterTable, filter_table
from .randomness import SecureRandomness, prefetched_gaussian
from .schema import Schema

Progress = Callable[[int, int], None]


def calibration_for(hp: Hyperparameters) -> PrivacyCalibration:
    """The noise of every release for these hyperparameters: the tree builder's calibration
    (``Mode.calibrate``; random trees: Alg. 6, :func:`~fedsbdt.common.accountant.calibrate`; cached)."""
    return modes.training_mode(hp).calibrate(hp)


def tree_builder_for(hp: Hyperparameters, schema: Schema, cal: PrivacyCalibration) -> TreeBuilder:
    """The central builder of the mode ``hp.tree_builder`` names (``Mode.central_builder``), calibrated by ``cal``."""
    return modes.training_mode(hp).central_builder(schema, hp, cal)


def filter_for(hp: Hyperparameters, cal: PrivacyCalibration) -> FilterTable | None:
    if not hp.filter:
        return None
    return filter_table(cal.alpha, cal.sigma, hp.subsample, hp.r1, hp.trees)


def privacy_receipt(hp: Hyperparameters, cal: PrivacyCalibration, rounds_completed: int, noise_mode: str,
                    randomness: str, parties: list[str] | None = None) -> dict:
    """The public statement released with the model (design.md "Session" 5)."""
    return {
        "guarantee": (f"({cal.epsilon:.6g}, {cal.delta:.3g})-differential privacy for every record "
                      "(add/remove one record), covering the initial score"
                      + (", the quantile split candidates" if cal.eps_candidates > 0 else "")
                      + " and all released trees"),
        "epsilon": cal.epsilon,
        "target_epsilon": hp.epsilon,
        "delta": cal.delta,
        "accountant": cal.accountant,
        "sigma": cal.sigma,
        "alpha": cal.alpha,
        "rho": cal.rho,
        "eps_init": cal.eps_init,
        "eps_ds": cal.eps_ds,
        "subsample": cal.gamma,
        "rounds_accounted": cal.rounds,
        "rounds_completed": int(rounds_completed),
        "filter": bool(hp.filter),
        "tree_builder": hp.tree_builder,
        "eps_select": cal.eps_select,
        "selection": hp.selection,
        "sigma_select": cal.sigma_select,
        "sigma_sketch": cal.sigma_sketch,
        **modes.training_mode(hp).receipt_fields(hp, cal),
        "noise_mode": noise_mode,
        "randomness": randomness,
        "parties": list(parties or []),
        **({"eps_candidates": cal.eps_candidates, "candidate_placement": "quantile"} if cal.eps_candidates > 0
           else {}),
    }


@dataclass
class TrainResult:
    model: Ensemble
    local: LocalData
    seconds: float


def train(dataset: Dataset, hp: Hyperparameters, randomness=None, progress: Progress | None = None,
          arrival: np.ndarray | None = None) -> TrainResult:
    """Train S-BDT on one dataset with central noise.  Returns the model and the local state (ledger).

    ``arrival`` (default: the dataset's ``arrival_column``) is the round from which each record may be
    used: a non-IID stream whose late records train in the extra rounds (paper §6.6, §8.4)."""
    t0 = time.perf_counter()
    schema = dataset.schema
    randomness = randomness or SecureRandomness()
    if hp.seed is None:
        hp = hp.replace(seed=secrets.randbits(63))  # public split seed, recorded in the model
    if schema.task == "multiclass":
        check_supported(hp)
    cal = calibration_for(hp)
    table = filter_for(hp, cal)
    enc = Encoding.for_schema(hp, schema)
    arrival = dataset.arrival if arrival is None else arrival
    released = None
    if cal.eps_candidates > 0:  # DP quantile candidates first (Eq. C2, C3): the trees split on the released cuts
        schema, released = dp_quantile_cuts(dataset.X, schema, hp.split_candidates, cal.eps_candidates, randomness)
    local = local_data_for(schema, dataset.X, dataset.y, dataset.ids, hp, arrival,
                           edges=split_edges(schema, hp.split_candidates))
    check_capacity(max(enc.grad.bound_units, enc.hess.bound_units) * max(local.n, 1), 1,
                   float(leaf_noise_scales(hp, enc, cal.sigma).max()))

    score = 0.0
    if hp.init_share > 0:
        noisy = local.init_sums() + randomness.discrete_laplace(init_noise_scales(hp, enc, cal))
        score = init_score(noisy, schema.task, enc)
    local.set_init_score(score)

    model = Ensemble(dataset.schema, hp, score)
    if released is not None:
        model.training["candidates"] = released  # public: the post-processed ε_c-DP release
    scales = leaf_noise_scales(hp, enc, cal.sigma)
    total = hp.total_rounds
    noise = prefetched_gaussian(randomness, scales, total) if cal.sigma > 0 else None
    builder = tree_builder_for(hp, schema, cal)
    release_leaves = getattr(builder, "release_leaves", None)  # a builder with its own leaf release (DPBoost)
    for r in range(total):
        if hasattr(builder, "release_tree"):  # the builder releases whole trees, leaves included (Sarus)
            splits, leaf, values = builder.release_tree(r, local, randomness)
        else:
            splits = builder.splits(r, local, randomness)
            if release_leaves is not None:  # a builder with its own leaf release (DPBoost)
                leaf, values = release_leaves(r, local, splits, randomness)
            else:
                c = local.contribution(splits, r, randomness, table)
                local.commit(c)
                leaf, values = c.leaf, leaf_values(c.sums + next(noise), hp, enc)
        local.apply(leaf, values)
        model.trees.extend(Tree(splits.features, splits.thresholds, v, splits.default_left)
                           for v in np.reshape(values, (-1, hp.leaves)))
        if progress is not None:
            progress(r + 1, total)
    model.privacy = privacy_receipt(hp, cal, total, "central", randomness.describe())
    if enc.classes > 1:
        model.privacy.update(receipt_sensitivity(hp, enc))
    model.privacy.update(modes.training_mode(hp).release_receipt(cal, federated=False))
    return TrainResult(model, local, time.perf_counter() - t0)
