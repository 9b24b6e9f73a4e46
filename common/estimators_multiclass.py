"""scikit-learn estimator for K ≥ 3 public classes (docs/multiclass.md, docs/sklearn.md).

:class:`SBDTMulticlassClassifier` takes every parameter of
:class:`~fedsbdt.common.estimators.SBDTClassifier`; ``classes`` is the list of the
K ≥ 3 public class labels (from the schema's ``classes`` when a schema is
given; read from ``y`` otherwise, which treats the label vocabulary as
public).  ``predict_proba`` has K columns in the order of ``classes_``.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_consistent_length, column_or_1d

from .estimators import SBDTClassifier, _Layout


class SBDTMulticlassClassifier(SBDTClassifier):
    """Differentially private gradient-boosted trees for K ≥ 3 classes (softmax, K trees per round).

    Fitted attributes: ``model_``, ``privacy_``, ``schema_``, ``classes_``, ``n_features_in_``.
    """

    _task = "multiclass"

    def _public_classes(self, y: np.ndarray) -> np.ndarray:
        if self.schema is not None:
            declared = self._layout_.schema.classes
            if self.classes is not None and [str(c) for c in self.classes] != list(declared):
                raise ValueError(f"classes {list(self.classes)!r} differ from the schema's public classes "
                                 f"{list(declared)!r}")
            return np.asarray(declared)
        if self.classes is not None:
            classes = np.asarray(list(self.classes))
        else:
            type_of_target(y, input_name="y", raise_unknown=True)
            classes = np.unique(y)
        if classes.ndim != 1 or classes.size < 3 or len({str(c) for c in classes}) != classes.size:
            raise ValueError(f"SBDTMulticlassClassifier needs at least 3 distinct public classes, got "
                             f"{classes.tolist()!r} (use SBDTClassifier for two)")
        return classes

    def _layout(self, X, m: int) -> _Layout:
        layout = super()._layout(X, m)
        if self.schema is None:  # explicit bounds: the class labels become the schema's classes (index names)
            k = len(self.classes) if self.classes is not None else 0
            layout = dataclasses.replace(layout, schema=dataclasses.replace(
                layout.schema, classes=tuple(str(i) for i in range(k))))
        return layout

    def fit(self, X, y, *, randomness=None):
        """Train on ``X`` and labels ``y`` from the public classes.  ``randomness``: tests only."""
        self._hyperparameters()
        Xm = self._encode(X, reset=True)
        y = column_or_1d(y, warn=True)
        check_consistent_length(Xm, y)
        classes = self._public_classes(y)
        names = np.array([str(c) for c in classes])
        index = {s: i for i, s in enumerate(names)}
        yi = np.array([index.get(str(v), -1) for v in y])
        if (yi < 0).any():
            raise ValueError(f"y holds {int((yi < 0).sum())} label(s) outside the public classes "
                             f"{classes.tolist()}, e.g. {y[yi < 0][0]!r}")
        if self.schema is None:
            self._layout_ = dataclasses.replace(self._layout_, schema=dataclasses.replace(
                self._layout_.schema, classes=tuple(str(i) for i in range(classes.size))))
        self.classes_ = classes
        self._fit_internal(X, np.asarray(self._layout_.schema.classes)[yi], Xm, randomness)
        return self

    def decision_function(self, X) -> np.ndarray:
        """The ``(n, K)`` margins (softmax logits), columns in the order of ``classes_``."""
        return self._margin(X)

    def predict_proba(self, X) -> np.ndarray:
        from .multiclass import softmax

        return softmax(self._margin(X))

    def predict(self, X) -> np.ndarray:
        return self.classes_[np.argmax(self._margin(X), axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = True
        return tags
