"""The public release: the model file every party builds from the plan and the released trees.

The coordinator and every site call :func:`build_model` with the same public
inputs — the plan, the initial-score record and the tree records — so they
write byte-identical model files (the model's JSON is canonical).  A site
compares the SHA-256 of its own file with the hash the coordinator announces.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from common.engine import privacy_receipt
from common.model import Ensemble, Tree
from common.multiclass import receipt_sensitivity
from common.splits import missing_directions

from .plan import Plan
from .wire import InitScoreMsg, TreeMsg


def training_record(plan: Plan, init: InitScoreMsg | None, trees: Sequence[TreeMsg]) -> dict:
    """Public facts of the run: plan hash, noise mode, threshold, and per round ``{tree, round_id, sites}``."""
    return {
        "federated": True,
        "plan_sha256": plan.sha256,
        "session_id": plan.session_id,
        "noise_mode": plan.noise,
        "threshold": plan.threshold,
        "assumed_colluders": plan.assumed_colluders,
        "dropout_slack": plan.dropout_slack,
        "guarantee": plan.guarantee,
        "roster": list(plan.site_ids),
        "init": None if init is None else {"round_id": init.round_id, "sites": list(init.sites)},
        "rounds": [t.record() for t in trees],
    }


def parties(init: InitScoreMsg | None, trees: Sequence[TreeMsg]) -> list[str]:
    out: set[str] = set(init.sites) if init is not None else set()
    for t in trees:
        out.update(t.sites)
    return sorted(out)


def build_model(plan: Plan, init: InitScoreMsg | None, trees: Sequence[TreeMsg]) -> Ensemble:
    cal = plan.calibration()
    model = Ensemble(plan.schema, plan.hyperparameters, 0.0 if init is None else init.value)
    L = plan.hyperparameters.leaves  # multiclass: a round's K class trees share its splits
    model.trees = [Tree(t.features.astype("int32"), t.thresholds.astype("float64"), v, _default_left(plan, t.index))
                   for t in trees for v in t.leaves.astype("float64").reshape(-1, L)]
    model.privacy = privacy_receipt(plan.hyperparameters, cal, len(trees), plan.noise, plan.randomness_description(),
                                    parties(init, trees))
    if plan.encoding.classes > 1:
        model.privacy.update(receipt_sensitivity(plan.hyperparameters, plan.encoding))
    model.training = training_record(plan, init, trees)
    return model


def _default_left(plan: Plan, index: int):
    """Random trees: the public default directions of tree ``index`` (a function of the plan's seed, so no
    message carries them).  Greedy trees select with noisy level histograms in a federation, which count
    missing values on the right: all False.  None without missing values."""
    hp = plan.hyperparameters
    if not plan.schema.allows_missing:
        return None
    if hp.tree_builder != "random":
        return np.zeros(2**hp.depth - 1, bool)
    return missing_directions(plan.schema, hp.seed, index, 2**hp.depth - 1)


def model_bytes(model: Ensemble) -> bytes:
    return model.to_json().encode("utf-8")


def model_sha256(model: Ensemble) -> str:
    return hashlib.sha256(model_bytes(model)).hexdigest()
