"""Public data schema (design.md "Session" 1 and "Command line").

The schema is *public*: feature names, numeric ranges and category levels are
declared up front and never derived from private records (deriving them would
leak, design.md "Pitfalls").  It also describes how a file looks as it comes
(header, separator, missing-value marker, label mapping), so the UCI files are
read unchanged.

Example (``examples/abalone/schema.toml``)::

    name = "abalone"
    task = "regression"
    target = "Rings"
    label_range = [1, 29]
    columns = ["Sex", "Length", ..., "Rings"]   # file column order (no header)

    [format]
    header = false
    separator = ","

    [[features]]
    name = "Sex"
    type = "categorical"
    levels = ["M", "F", "I"]

    [[features]]
    name = "Length"
    type = "numeric"
    range = [0.0, 1.0]
    allow_missing = true   # optional: keep missing values (NaN), routed by default directions

``format.on_missing = "keep"`` allows missing values in every feature
(docs/missing-values.md); ``"drop"`` / ``"error"`` apply to the other columns.
"""
from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import TASKS


#: what a missing value does to its row: refuse the file, drop the row, or keep it (as NaN) in every feature;
#: features with ``allow_missing = true`` keep their missing values whatever this says (docs/missing-values.md)
ON_MISSING = ("error", "drop", "keep")


class SchemaError(ValueError):
    """The schema file itself is malformed or inconsistent."""


@dataclass(frozen=True)
class Feature:
    """One input feature: numeric with a public ``[lo, hi]`` range, or categorical with public levels."""

    name: str
    kind: str  # "numeric" | "categorical"
    lo: float = 0.0
    hi: float = 0.0
    levels: tuple[str, ...] = ()
    allow_missing: bool = False  # missing values kept (NaN) and routed by each split's default direction

    @property
    def is_categorical(self) -> bool:
        return self.kind == "categorical"

    def to_dict(self) -> dict[str, Any]:
        if self.is_categorical:
            d = {"name": self.name, "type": "categorical", "levels": list(self.levels)}
        else:
            d = {"name": self.name, "type": "numeric", "range": [self.lo, self.hi]}
        if self.allow_missing:  # only when set: schemas without missing values keep their digest
            d["allow_missing"] = True
        return d


@dataclass(frozen=True)
class FileFormat:
    header: bool = True
    separator: str = ","
    missing: str | None = None  # marker such as "?"
    on_missing: str = "error"  # "error" | "drop" | "keep" (every feature allows missing values)
    comment: str | None = None  # lines starting with this are skipped (Adult's test file: "|")
    out_of_range: str = "error"  # "error" | "clip" (numeric values outside the public range)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Schema:
    name: str
    task: str  # "regression" | "binary"
    target: str
    features: tuple[Feature, ...]
    columns: tuple[str, ...] = ()  # file column order; required when the file has no header
    id_column: str | None = None  # stable record id (ledger key); default: data row number
    arrival_column: str | None = None  # non-IID streams: boosting round from which a record is available
    label_range: tuple[float, float] | None = None  # regression: public label range, scaled to [-1, 1]
    positive: tuple[str, ...] = ()  # binary: label strings meaning 1
    negative: tuple[str, ...] = ()  # binary: label strings meaning 0
    classes: tuple[str, ...] = ()  # multiclass: the K ≥ 3 public class labels (class index = position)
    format: FileFormat = field(default_factory=FileFormat)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "schema") -> "Schema":
        """Validate a schema's parsed form; anything malformed raises :class:`SchemaError` and nothing else
        (a schema arrives inside plans, possibly from a hostile coordinator)."""
        try:
            if not isinstance(d, dict):
                raise SchemaError(f"{source}: a schema is a table of keys")
            return cls._from_dict(d, source)
        except SchemaError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as e:
            raise SchemaError(f"{source}: malformed schema ({type(e).__name__}: {e})") from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any], source: str) -> "Schema":
        def need(key: str, where: dict[str, Any] = d, ctx: str = "") -> Any:
            if key not in where:
                raise SchemaError(f"{source}: missing required key '{ctx}{key}'")
            return where[key]

        task = need("task")
        if task not in TASKS:
            raise SchemaError(f"{source}: task must be one of {TASKS}, got {task!r}")
        feats = []
        raw_feats = need("features")
        if not isinstance(raw_feats, list) or not raw_feats:
            raise SchemaError(f"{source}: 'features' must be a non-empty list of [[features]] tables")
        for i, f in enumerate(raw_feats):
            ctx = f"features[{i}]."
            name = str(need("name", f, ctx))
            kind = need("type", f, ctx)
            if kind == "numeric":
                rng = need("range", f, ctx)
                if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(x, (int, float)) for x in rng)):
                    raise SchemaError(f"{source}: feature {name!r}: range must be [lo, hi]")
                lo, hi = float(rng[0]), float(rng[1])
                if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                    raise SchemaError(f"{source}: feature {name!r}: range must satisfy lo < hi, got {rng}")
                feats.append(Feature(name, "numeric", lo, hi))
            elif kind == "categorical":
                levels = need("levels", f, ctx)
                if not (isinstance(levels, list) and levels and all(isinstance(x, str) for x in levels)):
                    raise SchemaError(f"{source}: feature {name!r}: levels must be a non-empty list of strings")
                if len(set(levels)) != len(levels):
                    raise SchemaError(f"{source}: feature {name!r}: duplicate levels")
                feats.append(Feature(name, "categorical", levels=tuple(levels)))
            else:
                raise SchemaError(f"{source}: feature {name!r}: type must be 'numeric' or 'categorical', got {kind!r}")
            allow = f.get("allow_missing", False)
            if not isinstance(allow, bool):
                raise SchemaError(f"{source}: feature {name!r}: allow_missing must be true or false, got {allow!r}")
            if allow:
                feats[-1] = replace(feats[-1], allow_missing=True)
        names = [f.name for f in feats]
        if len(set(names)) != len(names):
            raise SchemaError(f"{source}: duplicate feature names")
        target = str(need("target"))
        if target in names:
            raise SchemaError(f"{source}: the target {target!r} is also listed as a feature")
        fmt_d = dict(d.get("format", {}))
        unknown = set(fmt_d) - set(FileFormat.__dataclass_fields__)
        if unknown:
            raise SchemaError(f"{source}: unknown [format] key(s): {', '.join(sorted(unknown))}")
        fmt = FileFormat(**fmt_d)
        if fmt.on_missing not in ON_MISSING:
            raise SchemaError(f"{source}: format.on_missing must be one of {', '.join(map(repr, ON_MISSING))}, "
                              f"got {fmt.on_missing!r}")
        if fmt.on_missing == "keep":  # schema-wide shorthand for allow_missing = true on every feature
            feats = [replace(f, allow_missing=True) for f in feats]
        if fmt.out_of_range not in ("error", "clip"):
            raise SchemaError(f"{source}: format.out_of_range must be 'error' or 'clip'")
        columns = tuple(str(c) for c in d.get("columns", ()))
        if columns:
            missing = [c for c in names + [target] if c not in columns]
            if missing:
                raise SchemaError(f"{source}: columns list lacks {missing}")
            if len(set(columns)) != len(columns):
                raise SchemaError(f"{source}: duplicate names in 'columns'")
        elif not fmt.header:
            raise SchemaError(f"{source}: a file without header needs 'columns' (the column order)")
        label_range = None
        if task != "multiclass" and "classes" in d:
            raise SchemaError(f"{source}: 'classes' is for task = 'multiclass' (this schema's task is {task!r})")
        classes: tuple[str, ...] = ()
        positive: tuple[str, ...] = ()
        negative: tuple[str, ...] = ()
        if task == "regression":
            lr = need("label_range")
            if not (isinstance(lr, list) and len(lr) == 2 and float(lr[0]) < float(lr[1])):
                raise SchemaError(f"{source}: label_range must be [lo, hi] with lo < hi")
            label_range = (float(lr[0]), float(lr[1]))
        elif task == "multiclass":
            classes = need("classes")
            if not (isinstance(classes, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                                      for x in classes)):
                raise SchemaError(f"{source}: classes must be a list of the public class labels")
            classes = tuple(str(x) for x in classes)
            if len(classes) < 3:
                raise SchemaError(f"{source}: a multiclass task needs at least 3 public classes, got "
                                  f"{len(classes)} (use task = 'binary' for two)")
            if len(set(classes)) != len(classes):
                raise SchemaError(f"{source}: duplicate class labels in 'classes'")
        else:
            positive = tuple(str(x) for x in d.get("positive", ["1"]))
            negative = tuple(str(x) for x in d.get("negative", ["0"]))
            if set(positive) & set(negative):
                raise SchemaError(f"{source}: a label is listed as both positive and negative")
        id_column = d.get("id_column")
        if id_column is not None and columns and id_column not in columns:
            raise SchemaError(f"{source}: id_column {id_column!r} is not in columns")
        arrival_column = d.get("arrival_column")
        if arrival_column is not None:
            if columns and arrival_column not in columns:
                raise SchemaError(f"{source}: arrival_column {arrival_column!r} is not in columns")
            if arrival_column in names + [target]:
                raise SchemaError(f"{source}: arrival_column {arrival_column!r} must not be a feature or the target")
        return cls(
            name=str(d.get("name", "dataset")), task=task, target=target, features=tuple(feats),
            columns=columns, id_column=id_column, arrival_column=arrival_column, label_range=label_range, positive=positive,
            negative=negative, classes=classes, format=fmt,
        )

    @classmethod
    def load(cls, path: str | Path) -> "Schema":
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SchemaError(f"schema file not found: {p}") from None
        except tomllib.TOMLDecodeError as e:
            raise SchemaError(f"{p}: not valid TOML: {e}") from None
        return cls.from_dict(raw, source=str(p))

    # ------------------------------------------------------------------ views

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "task": self.task, "target": self.target}
        if self.columns:
            d["columns"] = list(self.columns)
        if self.id_column:
            d["id_column"] = self.id_column
        if self.arrival_column:
            d["arrival_column"] = self.arrival_column
        if self.label_range is not None:
            d["label_range"] = list(self.label_range)
        if self.task == "binary":
            d["positive"], d["negative"] = list(self.positive), list(self.negative)
        if self.task == "multiclass":
            d["classes"] = list(self.classes)
        d["format"] = self.format.to_dict()
        d["features"] = [f.to_dict() for f in self.features]
        return d

    def digest(self) -> str:
        """SHA-256 of the canonical JSON form (what sites compare against a plan)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def n_classes(self) -> int:
        """K for a multiclass task, else 0."""
        return len(self.classes)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def allows_missing(self) -> bool:
        """True if some feature keeps missing values (NaN), so trees need default directions."""
        return any(f.allow_missing for f in self.features)
