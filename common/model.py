"""The released model: initial score, trees and privacy receipt, as versioned JSON.

Serialisation is canonical (sorted keys, fixed separators, floats in their
shortest round-trip form) so every party of a federation writes a
byte-identical file for the same model.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsbdt import __version__

from . import kernels
from .config import Hyperparameters
from .files import write_atomic
from .schema import Schema

FORMAT = "fedsbdt-model"
VERSION = 1


class ModelError(ValueError):
    """A model file is missing, malformed or of an unsupported version."""


def scale_labels(y: np.ndarray, label_range: tuple[float, float]) -> np.ndarray:
    """Public affine map of regression labels from ``[lo, hi]`` to ``[−1, 1]``."""
    lo, hi = label_range
    return 2.0 * (np.asarray(y, dtype=np.float64) - lo) / (hi - lo) - 1.0


def unscale_labels(z: np.ndarray, label_range: tuple[float, float]) -> np.ndarray:
    lo, hi = label_range
    return (np.asarray(z, dtype=np.float64) + 1.0) * (hi - lo) / 2.0 + lo


@dataclass
class Tree:
    features: np.ndarray  # int32 (2^d − 1)
    thresholds: np.ndarray  # float64 (2^d − 1)
    leaves: np.ndarray  # float64 (2^d), already clamped to ±β
    default_left: np.ndarray | None = None  # bool (2^d − 1): where a missing value goes; None: right everywhere


def _tree_dict(t: Tree) -> dict[str, Any]:
    d = {"features": t.features.astype(int).tolist(), "thresholds": [float(x) for x in t.thresholds],
         "leaves": [float(x) for x in t.leaves]}
    if t.default_left is not None:  # only trees of schemas with missing values carry it
        d["default_left"] = [bool(x) for x in t.default_left]
    return d


def _default_left(t: dict[str, Any], n_inner: int, i: int, source: str) -> np.ndarray | None:
    v = t.get("default_left")
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) == n_inner and all(isinstance(x, bool) for x in v)):
        raise ModelError(f"{source}: tree {i}: default_left must be {n_inner} booleans")
    return np.asarray(v, dtype=bool)


@dataclass
class Ensemble:
    schema: Schema
    hyperparameters: Hyperparameters
    init_score: float = 0.0  # multiclass: a tuple of K margins (one per public class)
    trees: list[Tree] = field(default_factory=list)
    privacy: dict[str, Any] = field(default_factory=dict)  # the privacy receipt
    training: dict[str, Any] = field(default_factory=dict)  # public per-round facts (sites alive, …)
    software: str = __version__  # the fedsbdt release that wrote the model

    @property
    def task(self) -> str:
        return self.schema.task

    @property
    def depth(self) -> int:
        return self.hyperparameters.depth

    def is_categorical(self) -> np.ndarray:
        return np.array([f.is_categorical for f in self.schema.features], dtype=bool)

    # ------------------------------------------------------------------ prediction

    def stacked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n_inner = 2**self.depth - 1
        if not self.trees:
            return (np.zeros((0, n_inner), np.int32), np.zeros((0, n_inner)), np.zeros((0, 2**self.depth)))
        return (np.stack([t.features for t in self.trees]).astype(np.int32),
                np.stack([t.thresholds for t in self.trees]),
                np.stack([t.leaves for t in self.trees]))

    def predict_margin(self, X: np.ndarray) -> np.ndarray:
        """Raw score ``init + η·Σ_t v_t(x)`` (regression: in the scaled label space; multiclass: ``(n, K)``)."""
        if self.task == "multiclass":
            return multiclass_margins(self, X)
        f, th, lv = self.stacked()
        return kernels.predict_margin(X, f, th, lv, self.is_categorical(), self.depth,
                                      self.hyperparameters.learning_rate, self.init_score,
                                      default_left=self.stacked_default_left())

    def stacked_default_left(self) -> np.ndarray | None:
        """T × nodes default directions of missing values, or None if no tree has any (NaN goes right)."""
        if not any(t.default_left is not None for t in self.trees):
            return None
        n_inner = 2**self.depth - 1
        return np.stack([np.zeros(n_inner, bool) if t.default_left is None else np.asarray(t.default_left, bool)
                         for t in self.trees])

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Regression: predicted label in original units.  Binary: probability of the positive class.
        Multiclass: ``(n, K)`` class probabilities (softmax of the margins)."""
        return self.from_margin(self.predict_margin(X))

    def from_margin(self, m: np.ndarray) -> np.ndarray:
        """:meth:`predict` of raw scores ``m`` (:meth:`predict_margin`'s form; e.g. averaged over ensembles)."""
        if self.task == "multiclass":
            from .multiclass import softmax
            return softmax(m)
        if self.task == "regression":
            return unscale_labels(m, self.schema.label_range)
        return 1.0 / (1.0 + np.exp(-m))

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "fedsbdt_version": self.software,
            "schema": self.schema.to_dict(),
            "hyperparameters": self.hyperparameters.to_dict(),
            "privacy": self.privacy,
            "training": self.training,
            "init_score": ([float(x) for x in np.broadcast_to(self.init_score, (self.schema.n_classes,))]
                           if self.task == "multiclass"
                           else float(self.init_score)),
            "trees": [_tree_dict(t) for t in self.trees],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + rename) so a crash never leaves half a model."""
        write_atomic(path, self.to_json(), "model")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> "Ensemble":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ModelError(f"{source}: not a fedsbdt model file (missing format = {FORMAT!r})")
        if d.get("version") != VERSION:
            raise ModelError(f"{source}: model format version {d.get('version')!r} is not supported "
                             f"(this fedsbdt reads version {VERSION})")
        try:
            schema = Schema.from_dict(d["schema"], source=f"{source} (schema)")
            hp = Hyperparameters.from_dict(d["hyperparameters"])
            n_inner, n_leaves = 2**hp.depth - 1, 2**hp.depth
            trees = []
            for i, t in enumerate(d["trees"]):
                tr = Tree(np.asarray(t["features"], dtype=np.int32), np.asarray(t["thresholds"], dtype=np.float64),
                          np.asarray(t["leaves"], dtype=np.float64), _default_left(t, n_inner, i, source))
                if tr.features.shape != (n_inner,) or tr.thresholds.shape != (n_inner,) or \
                        tr.leaves.shape != (n_leaves,):
                    raise ModelError(f"{source}: tree {i} does not have depth {hp.depth}")
                if tr.features.size and (tr.features.min() < 0 or tr.features.max() >= schema.n_features):
                    raise ModelError(f"{source}: tree {i} uses a feature index outside the schema")
                if not (np.isfinite(tr.thresholds).all() and np.isfinite(tr.leaves).all()):
                    raise ModelError(f"{source}: tree {i} holds non-finite numbers")
                trees.append(tr)
            if schema.task == "multiclass":
                init = tuple(float(x) for x in d["init_score"])
                if len(init) != schema.n_classes or len(trees) % schema.n_classes:
                    raise ModelError(f"{source}: a {schema.n_classes}-class model needs {schema.n_classes} initial "
                                     "scores and a multiple of that many trees")
            else:
                init = float(d["init_score"])
            if not all(math.isfinite(x) for x in np.atleast_1d(init)):
                raise ModelError(f"{source}: non-finite initial score")
            return cls(schema, hp, init, trees, dict(d.get("privacy", {})), dict(d.get("training", {})),
                       str(d.get("fedsbdt_version", "unknown")))
        except KeyError as e:
            raise ModelError(f"{source}: missing field {e}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, ModelError):
                raise
            raise ModelError(f"{source}: malformed model: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Ensemble":
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModelError(f"model file not found: {p}") from None
        except UnicodeDecodeError:
            raise ModelError(f"{p}: not a text (JSON) file") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelError(f"{p}: not valid JSON ({e})") from None
        return cls.from_dict(d, source=str(p))


def multiclass_margins(model: Ensemble, X: np.ndarray) -> np.ndarray:
    """``(n, K)`` margins: tree ``r·K + k`` of round r belongs to class k (XGBoost's ``multi:softprob`` order)."""
    K = model.schema.n_classes
    f, th, lv = model.stacked()
    init = np.broadcast_to(np.asarray(model.init_score, np.float64), (K,))
    dl = model.stacked_default_left()  # missing values: each class tree's default directions
    return np.stack([kernels.predict_margin(X, f[k::K], th[k::K], lv[k::K], model.is_categorical(), model.depth,
                                            model.hyperparameters.learning_rate, float(init[k]),
                                            default_left=None if dl is None else dl[k::K])
                     for k in range(K)], axis=1)
