"""Export a fedsbdt model to XGBoost's JSON model format (docs/xgboost-export.md).

``xgboost.Booster(model_file=F).predict(xgboost.DMatrix(X))`` then returns
what :meth:`fedsbdt.common.model.Ensemble.predict` returns for the same matrix ``X``
(categorical columns as level codes 0, 1, …), up to float32 arithmetic.

The mapping, in brief:

* **Trees.**  Our complete heap-ordered trees become XGBoost node arrays in
  breadth-first order.  Every inner node stays an inner node, so the XGBoost
  tree has the same depth and leaf values.
* **Numeric splits.**  We go left iff ``x < t`` in float64; XGBoost goes left
  iff ``float32(x) < float32(split_condition)``.  We write
  ``c = ceil32(t)``, the smallest float32 ≥ t.  For every float32-representable
  input x there is no float32 strictly between t and c, so ``x < t ⇔ x < c``:
  such inputs take exactly our path.  A float64 input that is *not* a float32
  can change sides only if it lies within one float32 ulp of a threshold
  (XGBoost rounds it to float32 before comparing; no choice of c avoids that).
* **Categorical splits** (ours: left iff ``x == level``).  ``"native"``
  (default): XGBoost's categorical split with the one-category set
  ``{level}``; XGBoost sends categories *in* the set to the right child, so the
  children are swapped (XGBoost's left child is our "rest" subtree).  Works
  with a plain numeric ``DMatrix`` of level codes (no ``enable_categorical``)
  as long as the model carries no feature names, which is the default.
  ``"numeric"``: ordinary numeric splits on the level code with thresholds at
  ``level ± 0.5`` (for a middle level the "rest" subtree appears twice), for
  tools that do not understand categorical splits; exact for valid codes.
* **Missing values.**  A model whose schema allows missing values
  (docs/missing-values.md) has a default direction at every node; it becomes
  XGBoost's ``default_left`` (negated where children are swapped), and NaN in
  the ``DMatrix`` is XGBoost's missing value, so NaN rows take our path.
  Other models refuse NaN; there a missing value (NaN, or an implicit zero of
  a sparse matrix) is sent the way the value 0 goes, so sparse inputs predict
  like dense ones.
* **Leaf values and base score.**  Regression: our prediction is
  ``lo + (hi − lo)/2 · (init + η·Σ v + 1)``; we write ``base_score =
  lo + (hi − lo)/2 · (init + 1)`` and leaves ``(hi − lo)/2 · η · v`` under
  ``reg:squarederror``, so XGBoost's output is our prediction in label units.
  Binary: ``binary:logistic`` with ``base_score = sigmoid(init)`` (XGBoost
  turns it back into the margin ``init``) and leaves ``η · v``.
* **Covers** (``sum_hessian``) of the trained model are private statistics and
  are never released; we write the public, data-independent placeholder
  "number of leaves below this node" so that tools needing covers (e.g.
  ``pred_contribs``) run, with the meaning "every leaf weighted equally".

Accuracy: XGBoost stores leaf values and sums them in float32; the tests
reproduce its margins bit for bit with a float32 emulation of our trees, so
the only difference to our float64 prediction is float32 rounding — measured
≤ 6e-7 on Adult probabilities and ≤ 3.4e-7 of the label range on Abalone
(docs/xgboost-export.md).  Export needs no xgboost installation.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .files import write_atomic
from .model import Ensemble

CATEGORICAL_MODES = ("native", "numeric")
XGBOOST_FORMAT_VERSION = [2, 0, 0]  # the JSON schema we write; read by XGBoost ≥ 2.0 (tested with 3.2)
_NO_PARENT = 2147483647


class ExportError(ValueError):
    """The model cannot be exported as asked."""


# --------------------------------------------------------------------------- float32 thresholds


def ceil_float32(t: float) -> float:
    """The smallest float32 ``c ≥ t`` (as a Python float).

    For every float32 ``x``: ``x < t ⇔ x < c`` — there is no float32 in ``[t, c)``
    other than possibly ``c == t`` itself.  Values beyond the float32 range map
    to ±inf / ±FLT_MAX so the equivalence still holds for finite float32 x.
    """
    t = float(t)
    if math.isnan(t):
        raise ExportError("threshold is NaN")
    with np.errstate(over="ignore"):
        c = np.float32(t)
    if float(c) < t:
        c = np.nextafter(c, np.float32(np.inf))
    return float(c)


def _f32_repr(x: float) -> float:
    """``x`` rounded to float32, as a Python float (JSON then holds the float32 value exactly)."""
    return float(np.float32(x))


# --------------------------------------------------------------------------- tree construction


@dataclass
class _Node:
    """One XGBoost node before numbering.  Leaves have ``feature = -1``."""

    feature: int = -1
    condition: float = 0.0  # numeric: float32 threshold; leaf: value
    category: int | None = None  # native categorical split: the single category in the set (goes right)
    default_left: bool = False
    left: "_Node | None" = None
    right: "_Node | None" = None


@dataclass(frozen=True)
class _TreeSpec:
    features: np.ndarray
    thresholds: np.ndarray
    leaves: np.ndarray  # already folded into XGBoost units
    depth: int
    default_left: np.ndarray | None = None  # our default directions of missing values (None: as 0 goes)


def _build(spec: _TreeSpec, k: int, is_cat: np.ndarray, n_levels: list[int], mode: str) -> _Node:
    """Recursively turn heap node ``k`` of our tree into XGBoost nodes."""
    n_inner = 2**spec.depth - 1
    if k >= n_inner:
        return _Node(condition=float(spec.leaves[k - n_inner]))
    f = int(spec.features[k])
    t = float(spec.thresholds[k])
    if spec.default_left is not None:
        return _build_directed(spec, k, f, t, is_cat, n_levels, mode)
    if not is_cat[f]:
        c = ceil_float32(t)
        return _Node(feature=f, condition=c, default_left=0.0 < c,
                     left=_build(spec, 2 * k + 1, is_cat, n_levels, mode),
                     right=_build(spec, 2 * k + 2, is_cat, n_levels, mode))
    level, n_lev = int(t), n_levels[f]
    if level != t or not 0 <= level < n_lev:
        raise ExportError(f"tree node {k}: categorical threshold {t!r} is not a level code 0..{n_lev - 1}")
    if mode == "native":
        # XGBoost: category in the set → right.  Our "x == level" branch is therefore XGBoost's right child.
        return _Node(feature=f, condition=float(level), category=level, default_left=level != 0,
                     left=_build(spec, 2 * k + 2, is_cat, n_levels, mode),
                     right=_build(spec, 2 * k + 1, is_cat, n_levels, mode))
    eq = lambda: _build(spec, 2 * k + 1, is_cat, n_levels, mode)  # noqa: E731
    rest = lambda: _build(spec, 2 * k + 2, is_cat, n_levels, mode)  # noqa: E731
    if n_lev == 1:  # every valid code equals the only level
        return eq()
    if level == 0:  # codes ≥ 0: x == 0 ⇔ x < 0.5
        return _Node(feature=f, condition=0.5, default_left=True, left=eq(), right=rest())
    if level == n_lev - 1:  # x == last ⇔ x ≥ last − 0.5
        return _Node(feature=f, condition=level - 0.5, default_left=True, left=rest(), right=eq())
    inner = _Node(feature=f, condition=level + 0.5, default_left=False, left=eq(), right=rest())
    return _Node(feature=f, condition=level - 0.5, default_left=True, left=rest(), right=inner)


def _build_directed(spec: _TreeSpec, k: int, f: int, t: float, is_cat: np.ndarray, n_levels: list[int],
                    mode: str) -> _Node:
    """:func:`_build` for a node with an explicit default direction ``dl`` of missing values: XGBoost's
    ``default_left`` is ``dl`` where its left child is our left subtree and ``not dl`` where swapped."""
    dl = bool(spec.default_left[k])
    eq = lambda: _build(spec, 2 * k + 1, is_cat, n_levels, mode)  # noqa: E731
    rest = lambda: _build(spec, 2 * k + 2, is_cat, n_levels, mode)  # noqa: E731
    if not is_cat[f]:
        return _Node(feature=f, condition=ceil_float32(t), default_left=dl, left=eq(), right=rest())
    level, n_lev = int(t), n_levels[f]
    if level != t or not 0 <= level < n_lev:
        raise ExportError(f"tree node {k}: categorical threshold {t!r} is not a level code 0..{n_lev - 1}")
    if mode == "native":  # category in the set → XGBoost's right child, our "x == level" subtree
        return _Node(feature=f, condition=float(level), category=level, default_left=not dl, left=rest(),
                     right=eq())
    if level == 0 or n_lev == 1:  # codes ≥ 0: x == 0 ⇔ x < 0.5
        return _Node(feature=f, condition=level + 0.5, default_left=dl, left=eq(), right=rest())
    if level == n_lev - 1:  # x == last ⇔ x ≥ last − 0.5
        return _Node(feature=f, condition=level - 0.5, default_left=not dl, left=rest(), right=eq())
    inner = _Node(feature=f, condition=level + 0.5, default_left=dl, left=eq(), right=rest())
    return _Node(feature=f, condition=level - 0.5, default_left=not dl, left=rest(), right=inner)


def _leaf_count(node: _Node, memo: dict[int, float]) -> float:
    if node.feature < 0:
        memo[id(node)] = 1.0
        return 1.0
    n = _leaf_count(node.left, memo) + _leaf_count(node.right, memo)
    memo[id(node)] = n
    return n


def _tree_json(root: _Node, tree_id: int, n_features: int) -> dict[str, Any]:
    """Number the nodes breadth-first and write XGBoost's per-tree arrays."""
    order: list[_Node] = [root]
    parents = [_NO_PARENT]
    i = 0
    while i < len(order):
        node = order[i]
        if node.feature >= 0:
            for child in (node.left, node.right):
                order.append(child)
                parents.append(i)
        i += 1
    index = {id(n): j for j, n in enumerate(order)}
    covers: dict[int, float] = {}
    _leaf_count(root, covers)
    left, right, split_idx, cond, default_left, split_type, base_w = [], [], [], [], [], [], []
    cat_nodes, cat_values = [], []
    for j, node in enumerate(order):
        if node.feature < 0:
            left.append(-1)
            right.append(-1)
            split_idx.append(0)
            cond.append(_f32_repr(node.condition))
            default_left.append(0)
            split_type.append(0)
            base_w.append(_f32_repr(node.condition))
            continue
        left.append(index[id(node.left)])
        right.append(index[id(node.right)])
        split_idx.append(node.feature)
        cond.append(node.condition)
        default_left.append(1 if node.default_left else 0)
        split_type.append(1 if node.category is not None else 0)
        base_w.append(0.0)
        if node.category is not None:
            cat_nodes.append(j)
            cat_values.append(node.category)
    return {
        "base_weights": base_w,
        "categories": cat_values,
        "categories_nodes": cat_nodes,
        "categories_segments": list(range(len(cat_nodes))),
        "categories_sizes": [1] * len(cat_nodes),
        "default_left": default_left,
        "id": tree_id,
        "left_children": left,
        "loss_changes": [0.0] * len(order),
        "parents": parents,
        "right_children": right,
        "split_conditions": cond,
        "split_indices": split_idx,
        "split_type": split_type,
        "sum_hessian": [covers[id(n)] for n in order],
        "tree_param": {"num_deleted": "0", "num_feature": str(n_features), "num_nodes": str(len(order)),
                       "size_leaf_vector": "1"},
    }


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ExportSummary:
    """What was written: for the CLI's output and for tests."""

    path: str
    trees: int
    nodes: int
    objective: str
    base_score: float
    categorical: str
    notes: list[str] = field(default_factory=list)


def folded_values(model: Ensemble) -> tuple[float, float, str]:
    """``(base_score, leaf multiplier, objective)``: how η, init and label unscaling fold into XGBoost.

    XGBoost leaf value = multiplier · our leaf value; XGBoost's raw output is
    base_score (regression) or logit(base_score) (binary) plus the leaf sum.
    """
    eta = model.hyperparameters.learning_rate
    if model.task == "multiclass":  # softmax is shift-invariant: base_score 0.5 is added to every class
        return 0.5, eta, "multi:softprob"
    if model.task == "regression":
        lo, hi = model.schema.label_range
        half = (hi - lo) / 2.0
        return lo + half * (model.init_score + 1.0), half * eta, "reg:squarederror"
    return 1.0 / (1.0 + math.exp(-model.init_score)), eta, "binary:logistic"


def _initial_offsets(model: Ensemble) -> np.ndarray:
    """Per tree, a constant added to its leaves: multiclass folds class k's initial margin into its first tree."""
    out = np.zeros(len(model.trees))
    if model.task == "multiclass":
        out[:model.schema.n_classes] = np.asarray(model.init_score, np.float64)
    return out


def to_xgboost_dict(model: Ensemble, categorical: str = "native", feature_names: bool = False) -> dict[str, Any]:
    """The XGBoost JSON document (a dict) for ``model``.

    ``categorical``: ``"native"`` (XGBoost categorical splits) or ``"numeric"``
    (level-code thresholds at ±0.5).  ``feature_names``: also write the schema's
    feature names; XGBoost then insists that every ``DMatrix`` carries the
    same names (a plain numpy matrix is refused), so the default is off.
    """
    if categorical not in CATEGORICAL_MODES:
        raise ExportError(f"categorical must be one of {CATEGORICAL_MODES}, got {categorical!r}")
    base, mult, objective = folded_values(model)
    if not 0.0 < base < 1.0 and objective == "binary:logistic":
        raise ExportError(f"initial score {model.init_score!r} is too extreme for XGBoost's base_score")
    is_cat = model.is_categorical()
    K = model.schema.n_classes  # multiclass: tree r·K + k is class k's tree of round r (multi:softprob)
    n_levels = [len(f.levels) for f in model.schema.features]
    m = model.schema.n_features
    trees = []
    offsets = _initial_offsets(model)
    for i, t in enumerate(model.trees):
        spec = _TreeSpec(t.features, t.thresholds, np.asarray(t.leaves, np.float64) * mult + offsets[i], model.depth,
                         t.default_left)
        trees.append(_tree_json(_build(spec, 0, is_cat, n_levels, categorical), i, m))
    if categorical == "native":
        types = ["c" if c else "float" for c in is_cat]
    else:
        types = ["float"] * m
    attributes = {
        "fedsbdt_format": "fedsbdt-model export",
        "fedsbdt_schema_digest": model.schema.digest(),
        "fedsbdt_privacy": json.dumps(model.privacy, sort_keys=True),
        "fedsbdt_categorical": categorical,
    }
    return {
        "learner": {
            "attributes": attributes,
            "feature_names": model.schema.feature_names if feature_names else [],
            "feature_types": types if (feature_names or categorical == "native") else [],
            "gradient_booster": {
                "model": {
                    "gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(len(trees))},
                    "iteration_indptr": list(range(0, len(trees) + 1, max(K, 1))),
                    "tree_info": [i % max(K, 1) for i in range(len(trees))],
                    "trees": trees,
                },
                "name": "gbtree",
            },
            "learner_model_param": {"base_score": repr(_f32_repr(base)), "boost_from_average": "0",
                                    "num_class": str(K), "num_feature": str(m), "num_target": "1"},
            "objective": ({"name": objective, "softmax_multiclass_param": {"num_class": str(K)}} if K else
                          {"name": objective, "reg_loss_param": {"scale_pos_weight": "1"}}),
        },
        "version": list(XGBOOST_FORMAT_VERSION),
    }


def export_xgboost(model: Ensemble, path: str | Path, categorical: str = "native",
                   feature_names: bool = False) -> ExportSummary:
    """Write ``model`` as an XGBoost JSON model file (atomically) and summarise what was written."""
    doc = to_xgboost_dict(model, categorical, feature_names)
    p = Path(path)
    if p.suffix.lower() not in (".json", ""):
        raise ExportError(f"{p}: XGBoost infers the format from the extension; use a .json file name")
    write_atomic(p, json.dumps(doc, separators=(",", ":"), allow_nan=False), "XGBoost model")
    trees = doc["learner"]["gradient_booster"]["model"]["trees"]
    notes = []
    if categorical == "native" and model.is_categorical().any():
        notes.append("categorical splits use XGBoost's categorical encoding; pass level codes 0..k-1")
    return ExportSummary(str(p), len(trees), sum(len(t["left_children"]) for t in trees),
                         doc["learner"]["objective"]["name"], float(doc["learner"]["learner_model_param"]
                                                                    ["base_score"]), categorical, notes)
