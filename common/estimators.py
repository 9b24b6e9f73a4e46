"""scikit-learn estimators around the centralised S-BDT engine (docs/sklearn.md).

:class:`SBDTRegressor` and :class:`SBDTClassifier` (binary) train a
differentially private model with :func:`fedsbdt.common.engine.train`.  Every S-BDT
hyperparameter is a constructor parameter with the name it has in
:class:`~fedsbdt.common.config.Hyperparameters` (``epsilon``, ``trees``, ``depth``, …).

**Public bounds are required.**  S-BDT draws split thresholds from public
feature ranges and scales regression labels by a public label range; taking
either from the training data would leak it without being paid for by ε.  So
``fit`` refuses to run unless you give them, either as a public schema::

    SBDTRegressor(schema="examples/abalone/schema.toml")

or explicitly::

    SBDTRegressor(feature_ranges=[(0, 1), (0, 2.5)], categorical={"sex": ["M", "F", "I"]},
                  label_range=(1, 29))

``feature_ranges`` is one ``(lo, hi)`` pair for every numeric column, a list
with one pair per column (``None`` for categorical columns), or a dict
``{column: (lo, hi)}``; columns are named by position or, for DataFrames, by
name.  ``categorical`` maps a column to its public levels (a list of values) or
to the number of level codes ``k`` (values ``0 … k−1``).  Values outside a
numeric range are refused (``out_of_range="error"``, the default without a
schema) or clipped to it (``"clip"``, a data-independent map that also clips
regression labels to ``label_range``).

The classifier's ``classes`` are public too; if you do not give them they are
read from ``y`` (the label vocabulary, e.g. ``[0, 1]``, is treated as public —
pass ``classes=[negative, positive]`` to avoid even that).  With public classes
a training set holding one class only is accepted.

**scikit-learn's estimator checks** (``check_estimator``) pass except the
ones listed by :func:`expected_failed_checks`, each failing because of
differential privacy: every ``fit`` draws fresh DP noise from a secure source
that cannot be seeded (so two fits never agree), and public bounds must be
given.  The tags ``regressor_tags.poor_score`` / ``classifier_tags.poor_score``
are set because DP noise on the checks' tiny data sets cannot reach their
score thresholds; ``non_deterministic`` is left ``False`` on purpose so that the
checks it would silently skip still run (and fail, listed, when they need two
fits to agree).
"""
from __future__ import annotations

import dataclasses
import inspect
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_array, check_consistent_length, check_is_fitted, column_or_1d, \
    validate_data

from fedsbdt.common import modes

from .config import Hyperparameters, builder_defaults, hyperparameter_names
from .schema import Feature, FileFormat, Schema


class PublicBoundsError(ValueError):
    """The estimator was asked to fit without (or with inconsistent) public bounds."""


# Checks of sklearn.utils.estimator_checks that cannot pass because of DP, and why.
_NOISE = ("every fit draws fresh differential-privacy noise from a secure, unseedable source, so two fits "
          "of the same data give different models")
_TWICE = _NOISE + "; the check fits twice ({}) and compares the predictions"
_COMMON_XFAIL = {
    "check_fit_idempotent": _TWICE.format("on the same data"),
    "check_supervised_y_2d": _TWICE.format("with y as a vector and as a column"),
}
_REGRESSOR_XFAIL = _COMMON_XFAIL | {
    "check_regressor_data_not_an_array": _TWICE.format("on numpy arrays and on array-likes"),
    "check_regressors_int": _TWICE.format("on integer and on float labels"),
}
_CLASSIFIER_XFAIL = _COMMON_XFAIL | {
    "check_classifier_data_not_an_array": _TWICE.format("on numpy arrays and on array-likes"),
}


def expected_failed_checks(estimator: BaseEstimator) -> dict[str, str]:
    """Checks of ``sklearn.utils.estimator_checks`` that fail because of DP, with the reason.

    Pass as ``check_estimator(est, expected_failed_checks=expected_failed_checks(est))`` or to
    ``parametrize_with_checks(..., expected_failed_checks=expected_failed_checks)``.
    """
    if isinstance(estimator, SBDTClassifier):
        return dict(_CLASSIFIER_XFAIL)
    if isinstance(estimator, SBDTRegressor):
        return dict(_REGRESSOR_XFAIL)
    return {}


# --------------------------------------------------------------------------- public bounds → schema


def _is_pair(x: Any) -> bool:
    return (isinstance(x, (tuple, list, np.ndarray)) and len(x) == 2
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in x))


def _column_index(key: Any, names: list[str] | None, m: int, what: str) -> int:
    """Resolve a column given by position or (DataFrame) name."""
    if isinstance(key, (numbers.Integral, np.integer)) and not isinstance(key, bool):
        if not 0 <= int(key) < m:
            raise PublicBoundsError(f"{what}: column {key} is out of range for {m} feature columns")
        return int(key)
    if isinstance(key, str):
        if names is None:
            raise PublicBoundsError(f"{what}: column {key!r} is named, but X has no column names "
                                    "(pass a pandas DataFrame or use column positions)")
        if key not in names:
            raise PublicBoundsError(f"{what}: no column named {key!r} in X (columns: {', '.join(names)})")
        return names.index(key)
    raise PublicBoundsError(f"{what}: columns are given by position (int) or name (str), got {key!r}")


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How raw X columns become the engine's numeric matrix."""

    schema: Schema
    levels: dict[int, tuple[Any, ...]]  # categorical column → its public level values (code = position)
    schema_mode: bool  # levels from a schema: strings are names, numbers are codes (as the data loader)


def _hint(kind: str) -> str:
    lab = "and label_range=(lo, hi) " if kind == "regression" else ""
    return (f"pass schema=<Schema or TOML path>, or feature_ranges=[(lo, hi), ...] (one public range per numeric "
            f"column, or a single (lo, hi) for all), categorical={{column: levels}} {lab}— ranges that hold "
            f"for the domain, decided without looking at the training data")


def _explicit_layout(est: "_SBDTBase", names: list[str] | None, m: int, task: str) -> _Layout:
    """A schema from explicit public bounds (``feature_ranges``, ``categorical``, ``label_range``)."""
    cname = type(est).__name__
    if est.feature_ranges is None and not (est.categorical and len(est.categorical) == m):
        raise PublicBoundsError(
            f"{cname} needs public bounds: fitting with ranges taken from the private training data would leak "
            f"it. {_hint(task)}")
    label_range = getattr(est, "label_range", None)
    if task == "regression":
        if label_range is None:
            raise PublicBoundsError(
                f"{cname} needs a public label_range=(lo, hi): scaling labels by the private training targets "
                f"would leak them. {_hint(task)}")
        if not _is_pair(label_range) or not float(label_range[0]) < float(label_range[1]):
            raise PublicBoundsError(f"label_range must be (lo, hi) with lo < hi, got {label_range!r}")
    levels: dict[int, tuple[Any, ...]] = {}
    for key, lv in dict(est.categorical or {}).items():
        j = _column_index(key, names, m, "categorical")
        if j in levels:
            raise PublicBoundsError(f"categorical: column {key!r} is given twice")
        if isinstance(lv, (numbers.Integral, np.integer)) and not isinstance(lv, bool):
            if int(lv) < 1:
                raise PublicBoundsError(f"categorical: column {key!r} needs at least one level")
            levels[j] = tuple(range(int(lv)))
        else:
            lv = tuple(lv)
            if not lv:
                raise PublicBoundsError(f"categorical: column {key!r} needs at least one level")
            if len({str(x) for x in lv}) != len(lv):
                raise PublicBoundsError(f"categorical: column {key!r} has duplicate levels")
            levels[j] = lv
    ranges: dict[int, tuple[float, float]] = {}
    fr = est.feature_ranges
    if fr is None:
        pass
    elif _is_pair(fr):
        ranges = {j: (float(fr[0]), float(fr[1])) for j in range(m) if j not in levels}
    elif isinstance(fr, dict):
        for key, pair in fr.items():
            ranges[_column_index(key, names, m, "feature_ranges")] = pair
    else:
        fr = list(fr)
        if len(fr) != m:
            raise PublicBoundsError(f"feature_ranges has {len(fr)} entries but X has {m} columns; give one (lo, hi) "
                                    "per column (None for categorical ones) or a single (lo, hi) for all")
        ranges = {j: p for j, p in enumerate(fr) if p is not None}
    feats = []
    for j in range(m):
        name = names[j] if names is not None else f"x{j}"
        if j in levels:
            if j in ranges and fr is not None and not _is_pair(fr):
                raise PublicBoundsError(f"column {name!r} is categorical and also has a numeric range")
            feats.append(Feature(name, "categorical", levels=tuple(str(x) for x in levels[j]),
                                 allow_missing=_allow_missing(est)))
            continue
        if j not in ranges:
            raise PublicBoundsError(f"column {name!r} has no public range. {_hint(task)}")
        pair = ranges[j]
        if not _is_pair(pair) or not (np.isfinite(pair).all() and float(pair[0]) < float(pair[1])):
            raise PublicBoundsError(f"column {name!r}: range must be (lo, hi) with finite lo < hi, got {pair!r}")
        feats.append(Feature(name, "numeric", float(pair[0]), float(pair[1]), allow_missing=_allow_missing(est)))
    oor = est.out_of_range or "error"
    if oor not in ("error", "clip"):
        raise PublicBoundsError(f"out_of_range must be 'error' or 'clip', got {oor!r}")
    schema = Schema(name="sklearn", task=task, target="y", features=tuple(feats),
                    label_range=(float(label_range[0]), float(label_range[1])) if task == "regression" else None,
                    positive=("1",) if task == "binary" else (), negative=("0",) if task == "binary" else (),
                    format=FileFormat(out_of_range=oor))
    return _Layout(schema, levels, False)


def _schema_layout(est: "_SBDTBase", task: str) -> _Layout:
    """The layout from a user-given public :class:`Schema` (or TOML path)."""
    schema = est.schema if isinstance(est.schema, Schema) else Schema.load(Path(est.schema))
    if schema.task != task:
        raise PublicBoundsError(f"the schema {schema.name!r} is for task {schema.task!r}, but "
                                f"{type(est).__name__} does {task}")
    clash = [p for p in ("feature_ranges", "categorical", "label_range") if getattr(est, p, None) is not None]
    if clash:
        raise PublicBoundsError(f"give either schema or explicit bounds, not both (also got {', '.join(clash)})")
    fmt = schema.format
    if est.out_of_range is not None:
        if est.out_of_range not in ("error", "clip"):
            raise PublicBoundsError(f"out_of_range must be 'error' or 'clip', got {est.out_of_range!r}")
        fmt = dataclasses.replace(fmt, out_of_range=est.out_of_range)
    extra: dict[str, Any] = {"positive": ("1",), "negative": ("0",)} if task == "binary" else {}
    # File-layout fields (column order, record ids, arrival rounds) do not apply to in-memory X.
    extra |= {k: None for k in ("id_column", "arrival_column") if hasattr(schema, k)}
    if _allow_missing(est):
        extra["features"] = tuple(dataclasses.replace(f, allow_missing=True) for f in schema.features)
    schema = dataclasses.replace(schema, format=fmt, columns=(), **extra)
    levels = {j: f.levels for j, f in enumerate(schema.features) if f.is_categorical}
    return _Layout(schema, levels, True)


def _allow_missing(est: "_SBDTBase") -> bool:
    """``allow_missing`` (True: NaN in X is a missing value in every column, docs/missing-values.md)."""
    v = getattr(est, "allow_missing", False)
    if not isinstance(v, (bool, np.bool_)):
        raise PublicBoundsError(f"allow_missing must be True or False, got {v!r}")
    return bool(v)


def _refuse_missing(X: np.ndarray, schema: Schema) -> None:
    """NaN is allowed only in the columns whose feature keeps missing values."""
    for j, f in enumerate(schema.features):
        if not f.allow_missing and np.isnan(X[:, j]).any():
            raise ValueError(f"column {f.name!r} holds NaN, but its public bounds do not allow missing values "
                             "(pass allow_missing=True, or a schema with allow_missing = true for it)")


# --------------------------------------------------------------------------- X encoding


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _num_str(v: Any) -> str:
    """Canonical text of a level value: ``1``, ``1.0`` and ``"1"`` all read ``"1"``."""
    if isinstance(v, str):
        return v.strip()
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return str(int(f)) if f.is_integer() else str(f)


def _encode_column(values: np.ndarray, levels: tuple[Any, ...], schema_mode: bool, name: str,
                   allow_missing: bool = False) -> np.ndarray:
    """Categorical values → float level codes; unknown values are refused, naming the column.

    Explicit levels (``categorical={col: levels}``): a value is matched to the level with the same
    canonical text.  Schema levels (as :func:`fedsbdt.common.data.Dataset.from_arrays`): strings are level
    names, numbers are level codes ``0 … k−1``.
    """
    k = len(levels)
    if schema_mode:
        by_name = {str(lv): float(i) for i, lv in enumerate(levels)}

        def code(v: Any) -> float | None:
            if _is_number(v):
                f = float(v)
                return f if f.is_integer() and 0 <= f < k else None
            return by_name.get(str(v).strip())
    else:
        by_text = {_num_str(lv): float(i) for i, lv in enumerate(levels)}

        def code(v: Any) -> float | None:
            return by_text.get(_num_str(v))
    if allow_missing:  # None and NaN are missing values (NaN codes), routed by the default directions
        inner = code

        def code(v: Any) -> float | None:
            return np.nan if v is None or v is pd.NA or (_is_number(v) and v != v) else inner(v)
    codes = np.array([code(v) for v in values], dtype=object)
    bad = np.flatnonzero(np.equal(codes, None))
    if bad.size:
        shown = ", ".join(repr(values[i]) for i in bad[:5])
        allowed = ", ".join(repr(x) for x in levels[:20]) + (", …" if k > 20 else "")
        codes_txt = f" or level codes 0..{k - 1}" if schema_mode else ""
        raise ValueError(f"column {name!r}: unknown categor{'y' if bad.size == 1 else 'ies'} {shown} in "
                         f"{bad.size} row(s) (public levels: {allowed}{codes_txt})")
    return codes.astype(np.float64)


def _frame_names(X: Any) -> list[str] | None:
    if isinstance(X, pd.DataFrame):
        return [str(c) for c in X.columns]
    return None


# --------------------------------------------------------------------------- estimators


def _estimator_init(bounds: str):
    """The estimators' ``__init__``: every hyperparameter under its :class:`~fedsbdt.common.config.Hyperparameters`
    name with its default, then the public bounds (``schema``, ``feature_ranges``, ``categorical``, ``bounds``
    — ``label_range`` for regression, ``classes`` for classification —, ``out_of_range``, ``allow_missing``),
    all keyword-only and stored unchanged, as scikit-learn's ``get_params``/``clone`` expect.

    One definition for both estimators (it was written out twice); scikit-learn reads the parameters from the
    ``__signature__`` given here (``inspect.signature``), and a name not in it is a TypeError as for any
    keyword-only signature."""
    kw = inspect.Parameter.KEYWORD_ONLY
    hyper = [inspect.Parameter(f.name, kw, default=f.default) for f in dataclasses.fields(Hyperparameters)]
    public = [inspect.Parameter(name, kw, default=default) for name, default in (
        ("schema", None), ("feature_ranges", None), ("categorical", None), (bounds, None), ("out_of_range", None),
        ("allow_missing", False))]
    signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                   *hyper, *public])

    def __init__(self, **params):
        bound = signature.bind(self, **params)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            if name != "self":
                setattr(self, name, value)

    __init__.__signature__ = signature
    return __init__


class _SBDTBase(BaseEstimator):
    """Shared fit/encode logic.  Subclasses set ``__init__`` (:func:`_estimator_init`) and ``_task``."""

    _task = "regression"

    # ---------------------------------------------------------------- parameters

    def _hyperparameters(self) -> Hyperparameters:
        kw = {name: getattr(self, name) for name in hyperparameter_names()}
        for name in ("trees", "extra_trees", "depth", "split_candidates", "scale_bits", "seed", "ensemble_trees",
                     "min_child_weight"):
            if isinstance(kw[name], np.integer):
                kw[name] = int(kw[name])
        for name, v in kw.items():
            if isinstance(v, np.floating):
                kw[name] = float(v)
            if isinstance(v, np.bool_):
                kw[name] = bool(v)
        # parameters left at their defaults take the tree builder's (``Mode.defaults``; config.builder_defaults)
        defaults = Hyperparameters()
        return Hyperparameters(**builder_defaults({k: v for k, v in kw.items() if v != getattr(defaults, k)
                                                   or k == "tree_builder"}))

    def _layout(self, X: Any, m: int) -> _Layout:
        if self.schema is not None:
            return _schema_layout(self, self._task)
        return _explicit_layout(self, _frame_names(X), m, self._task)

    # ---------------------------------------------------------------- X

    def _select_columns(self, X: Any, reset: bool) -> Any:
        """With a schema and a DataFrame, pick the schema's feature columns in schema order."""
        if isinstance(X, pd.DataFrame) and self.schema is not None:
            if reset:
                schema = self.schema if isinstance(self.schema, Schema) else Schema.load(Path(self.schema))
            else:
                schema = self._layout_.schema
            names = schema.feature_names
            missing = [n for n in names if n not in X.columns]
            if missing:
                raise ValueError(f"X lacks the schema's feature column(s) {', '.join(map(repr, missing))}")
            return X[names]
        return X

    def _encode(self, X: Any, reset: bool) -> np.ndarray:
        """Validate X (sklearn conventions) and return the float matrix the trees see."""
        X = self._select_columns(X, reset)
        layout: _Layout | None = None if reset else self._layout_
        if reset:
            shape = getattr(X, "shape", None)
            m = shape[1] if shape is not None and len(shape) == 2 else None
            if m is None:  # let sklearn produce its usual message for 1-D / odd input
                X_checked = check_array(X, dtype=None, ensure_all_finite=False)
                m = X_checked.shape[1]
            layout = self._layout(X, m)
        nan = "allow-nan" if layout.schema.allows_missing else True
        if not layout.levels:
            out = validate_data(self, X, reset=reset, dtype=np.float64, ensure_all_finite=nan)
        else:
            validate_data(self, X, reset=reset, skip_check_array=True)
            raw = check_array(X, dtype=None, ensure_all_finite=False)
            if raw.shape[1] != layout.schema.n_features:
                raise ValueError(f"X has {raw.shape[1]} features, but {type(self).__name__} is expecting "
                                 f"{layout.schema.n_features} features as input")
            out = np.empty(raw.shape, dtype=np.float64)
            for j, f in enumerate(layout.schema.features):
                col = raw[:, j]
                if j in layout.levels:
                    out[:, j] = _encode_column(col, layout.levels[j], layout.schema_mode, f.name, f.allow_missing)
                else:
                    try:
                        out[:, j] = np.asarray(col, dtype=np.float64)
                    except (TypeError, ValueError):
                        raise ValueError(f"column {f.name!r} is numeric in the public bounds but holds "
                                         "non-numeric values; declare it in categorical={...}") from None
            out = check_array(out, dtype=np.float64, ensure_all_finite=nan)
        if layout.schema.allows_missing:
            _refuse_missing(out, layout.schema)
        if reset:
            self._layout_ = layout
        return out

    # ---------------------------------------------------------------- fit

    def _fit_internal(self, X: Any, y01_or_raw: np.ndarray, Xm: np.ndarray, randomness: Any) -> None:
        from .data import Dataset
        from .engine import train

        hp = self._hyperparameters()
        layout = self._layout_
        y = y01_or_raw
        if self._task == "regression" and layout.schema.format.out_of_range == "clip":
            y = np.clip(y, *layout.schema.label_range)
        ds = Dataset.from_arrays(Xm, y, layout.schema, source="X")
        res = train(ds, hp, randomness=randomness)
        self.model_ = res.model
        self.schema_ = layout.schema
        self.privacy_ = dict(res.model.privacy)
        self.fit_seconds_ = res.seconds

    def _margin(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        return self.model_.predict_margin(self._encode(X, reset=False))

    def save_model(self, path: str | Path) -> None:
        """Write the fitted model as a fedsbdt model file (for ``fedsbdt evaluate/report/export``)."""
        check_is_fitted(self, "model_")
        self.model_.save(path)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = bool(getattr(self, "allow_missing", False))
        tags.input_tags.sparse = False
        tags.input_tags.categorical = True
        tags.non_deterministic = False  # see the module docstring: keep every check running
        return tags


class SBDTRegressor(RegressorMixin, _SBDTBase):
    """Differentially private gradient-boosted trees for regression (S-BDT, central noise).

    Parameters: every S-BDT hyperparameter under its :class:`~fedsbdt.common.config.Hyperparameters`
    name (``epsilon``, ``delta``, ``trees``, ``depth``, ``subsample``, ``learning_rate``, …) plus the
    public bounds: ``schema`` (a :class:`~fedsbdt.common.schema.Schema` or TOML path) *or* ``feature_ranges``,
    ``categorical`` and ``label_range``; ``out_of_range`` (``"error"``/``"clip"``, default: the schema's
    setting, else ``"error"``).  ``fit`` without public bounds raises :class:`PublicBoundsError`.
    ``allow_missing=True``: NaN (or None) in ``X`` is a missing value in every column, sent at every
    split the tree's default direction (docs/missing-values.md); else only the columns a schema marks
    ``allow_missing`` may hold NaN.
    ``tree_builder`` names any registered mode (``fedsbdt.common.modes.tree_builders()``; docs/plugins.md):
    keys left at their defaults then take the mode's defaults (greedy trees, docs/greedy.md: ``subsample`` 1
    and 32 ``split_candidates``; DPBoost, docs/dpboost.md: ``ensemble_trees`` = T_e).

    Fitted attributes: ``model_`` (:class:`~fedsbdt.common.model.Ensemble`), ``privacy_`` (the privacy receipt),
    ``schema_``, ``n_features_in_`` (and ``feature_names_in_`` for DataFrames).

    scikit-learn estimator checks expected to fail because of DP (see docs/sklearn.md):
    ``check_fit_idempotent`` and ``check_pipeline_consistency`` — each fit draws fresh DP noise from an
    unseedable secure source, so two fits never give the same model.  ``regressor_tags.poor_score`` is
    set: DP noise keeps the checks' tiny data sets below their R² threshold.
    """

    _task = "regression"

    __init__ = _estimator_init('label_range')

    def fit(self, X, y, *, randomness=None):
        """Train on ``X`` (array or DataFrame) and labels ``y``.  ``randomness``: tests only (default: secure)."""
        self._hyperparameters()  # fail fast on invalid hyperparameters, before touching data
        Xm = self._encode(X, reset=True)
        y = column_or_1d(y, warn=True)
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")
        check_consistent_length(Xm, y)
        self._fit_internal(X, y, Xm, randomness)
        return self

    def predict(self, X) -> np.ndarray:
        """Predicted labels in the original units."""
        from .model import unscale_labels

        return unscale_labels(self._margin(X), self.model_.schema.label_range)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.regressor_tags.poor_score = True
        return tags


class SBDTClassifier(ClassifierMixin, _SBDTBase):
    """Differentially private gradient-boosted trees for binary classification (S-BDT, central noise).

    Parameters as :class:`SBDTRegressor` (without ``label_range``) plus ``classes``: the public pair
    ``[negative, positive]``; when ``None`` the two classes are read from ``y`` (sorted; the second is
    positive).  Only binary targets are supported.

    Fitted attributes: ``model_``, ``privacy_``, ``schema_``, ``classes_``, ``n_features_in_``.

    scikit-learn estimator checks expected to fail because of DP (see docs/sklearn.md):
    ``check_fit_idempotent`` and ``check_pipeline_consistency`` (fresh, unseedable DP noise per fit).
    ``classifier_tags.poor_score`` is set and ``classifier_tags.multi_class`` is ``False``.
    """

    _task = "binary"

    __init__ = _estimator_init('classes')

    def fit(self, X, y, *, randomness=None):
        """Train on ``X`` (array or DataFrame) and binary labels ``y``.  ``randomness``: tests only."""
        self._hyperparameters()
        Xm = self._encode(X, reset=True)
        y = column_or_1d(y, warn=True)
        check_consistent_length(Xm, y)
        if self.classes is not None:
            classes = np.asarray(list(self.classes))
            if classes.shape != (2,) or classes[0] == classes[1]:
                raise ValueError(f"classes must be two distinct public labels [negative, positive], "
                                 f"got {self.classes!r}")
            unknown = ~np.isin(y, classes)
            if unknown.any():
                raise ValueError(f"y holds {int(unknown.sum())} label(s) outside the public classes "
                                 f"{classes.tolist()}, e.g. {y[unknown][0]!r}")
        else:
            y_type = type_of_target(y, input_name="y", raise_unknown=True)
            if y_type not in ("binary", "multiclass"):
                raise ValueError(f"Only binary classification is supported. The type of the target is {y_type}.")
            classes = np.unique(y)
            if classes.size > 2:
                raise ValueError(f"Only binary classification is supported. The type of the target is {y_type} "
                                 f"({classes.size} classes).")
            if classes.size < 2:
                raise ValueError("y holds only one class; pass the public classes=[negative, positive] to train "
                                 "on data where one class is absent")
        self.classes_ = classes
        y01 = (y == classes[1]).astype(np.float64)
        self._fit_internal(X, y01, Xm, randomness)
        return self

    def decision_function(self, X) -> np.ndarray:
        """The margin (log-odds of the positive class ``classes_[1]``)."""
        return self._margin(X)

    def predict_proba(self, X) -> np.ndarray:
        """``[P(classes_[0]), P(classes_[1])]`` per row."""
        p = 1.0 / (1.0 + np.exp(-self._margin(X)))
        return np.column_stack([1.0 - p, p])

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` where the positive-class probability is ≥ 1/2, else ``classes_[0]``."""
        positive = self._margin(X) >= 0.0
        return self.classes_[positive.astype(int)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.classifier_tags.poor_score = True
        return tags
