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

from fedsbdt.common import modes
from fedsbdt.common.engine import privacy_receipt
from fedsbdt.common.model import Ensemble, Tree
from fedsbdt.common.multiclass import receipt_sensitivity
from fedsbdt.common.splits import missing_directions

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
    model.privacy.update(modes.training_mode(plan.hyperparameters).release_receipt(cal, federated=True))
    model.training = training_record(plan, init, trees)
    if plan.eval_spec is not None:  # declared in the plan: every party adds the same entry
        model.privacy["evaluation"] = evaluation_declaration(plan)
    return model


def _default_left(plan: Plan, index: int):
    """Public random splits (random trees): the public default directions of tree ``index`` (a function of the
    plan's seed, so no message carries them).  Chosen splits (greedy trees) are selected with noisy level
    histograms in a federation, which count missing values on the right: all False.  None without missing
    values."""
    hp = plan.hyperparameters
    if not plan.schema.allows_missing:
        return None
    if not modes.training_mode(hp).public_splits:
        return np.zeros(2**hp.depth - 1, bool)
    return missing_directions(plan.schema, hp.seed, index, 2**hp.depth - 1)
def evaluation_declaration(plan: Plan) -> dict:
    """The federated evaluation's privacy terms, separate from the training ε (docs/federated-evaluation.md)."""
    d = plan.eval_spec.to_dict()
    d["records"] = "each site's held-out file (disjoint from its training records): a separate budget"
    return d


def evaluation_receipt(plan: Plan, total, round_id: int, sites: Sequence[str]) -> dict:
    """What the coordinator releases after an evaluation round: the noisy sum itself (the DP release; the sites
    get it with Finished and recompute this receipt from it), the metrics computed from it, and their terms.
    A function of the plan and the release only: every party that holds the sum writes the same receipt."""
    spec = plan.eval_spec
    intervals = spec.intervals(total, len(sites))  # 95 % intervals for the privacy noise (common/fed_eval.py)
    return {"epsilon_eval": float(plan.eval_epsilon), "delta_eval": float(plan.hyperparameters.delta),
            "sigma_eval": spec.sigma, "bins": plan.eval_bins, "training_epsilon": plan.stated_epsilon,
            "plan_sha256": plan.sha256, "round_id": int(round_id), "sites": sorted(sites),
            "sum": [int(x) for x in np.asarray(total, dtype=np.int64)],
            "metrics": spec.metrics(total), "intervals": intervals, "interval_level": 0.95,
            # what the numbers do not say: intervals too wide at this ε_eval and n, values clamped by the noise
            "too_wide": spec.too_wide(intervals), "clamped": spec.clamped(total)}


def model_bytes(model: Ensemble) -> bytes:
    return model.to_json().encode("utf-8")


def model_sha256(model: Ensemble) -> str:
    return hashlib.sha256(model_bytes(model)).hexdigest()


def model_content_sha256(model: Ensemble) -> str:
    """The digest of what a model predicts with — its initial score and its trees' splits and leaves — and
    nothing else (not its receipt or training record): an evaluation-only plan pins it, and every site
    compares the model rebuilt from the released trees with it (client/gate.py)."""
    h = hashlib.sha256(b"fedsbdt model content v1\n")
    h.update(np.float64(model.init_score).tobytes())
    scores = getattr(model, "init_scores", None)
    if scores is not None:
        h.update(np.asarray(scores, "<f8").tobytes())
    for t in model.trees:
        for a, dt in ((t.features, "<i8"), (t.thresholds, "<f8"), (t.leaves, "<f8")):
            v = np.ascontiguousarray(np.asarray(a, dt))
            h.update(len(v).to_bytes(8, "little") + v.tobytes())
    return h.hexdigest()


def released_from_model(plan: Plan, model: Ensemble, sha256: str) -> tuple[InitScoreMsg, list[TreeMsg]]:
    """An existing model's initial score and trees as released records, for an evaluation-only plan.

    Refuses (``ValueError``, one sentence) a model that is not the one the plan pins, or whose schema,
    hyperparameters or splits differ from the plan's (every site checks the splits again when it applies them).
    """
    from fedsbdt.common.splits import random_splits

    if plan.eval_model_sha256 is None:
        raise ValueError("the plan does not evaluate an existing model (no evaluation.model_sha256)")
    if sha256 != plan.eval_model_sha256:
        raise ValueError(f"the model file has SHA-256 {sha256}, the plan pins {plan.eval_model_sha256}")
    if model.schema.digest() != plan.schema.digest() or model.hyperparameters != plan.hyperparameters:
        raise ValueError("the model's schema or hyperparameters differ from the plan's")
    hp = plan.hyperparameters
    if len(model.trees) != hp.total_rounds:
        raise ValueError(f"the model has {len(model.trees)} trees, the plan's hyperparameters {hp.total_rounds}")
    trees = []
    for k, t in enumerate(model.trees):
        sp = random_splits(plan.schema, hp.depth, hp.seed, k, hp.cyclical, hp.split_candidates)
        if not (np.array_equal(t.features, sp.features) and np.array_equal(t.thresholds, sp.thresholds)):
            raise ValueError(f"tree {k} of the model does not use the plan's public random splits")
        trees.append(TreeMsg(k, 0, (), sp.features, sp.thresholds, np.asarray(t.leaves, dtype=np.float64)))
    if plan.eval_model_content_sha256 is not None and model_content_sha256(model) != plan.eval_model_content_sha256:
        raise ValueError("the model's trees are not the ones the plan pins (evaluation.model_content_sha256)")
    return InitScoreMsg(float(model.init_score), None, ()), trees
