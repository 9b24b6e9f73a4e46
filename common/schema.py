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
    scale = "log"          # optional: split candidates equidistant in log(x − lo + 1), for skewed values
    # cuts = [0.1, 0.2, 0.5]  # optional instead: the public candidate thresholds themselves

Feature groups: one block declares many similar features with one type and range, by a list
(``names = ["lab_a", "lab_b"]``) or a pattern (``pattern = "lab_{1..36}"``, or ``"lab_{01..36}"`` zero-padded);
the schema holds (and its digest covers) the features one by one, as if written out.

Every key is checked: an unknown key anywhere (top level, ``[format]``, a feature) is refused with the key,
its place and the closest known key, never ignored.

``format.on_missing = "keep"`` allows missing values in every feature
(docs/missing-values.md); ``"drop"`` / ``"error"`` apply to the other columns.

A ``data_derived = ["range"]`` key (in a feature block, or at the top level for ``label_range``, ``positive``,
``negative``, ``classes``, ``task``) marks values that ``fedsbdt schema draft`` learned from a site's records.
Such a schema is a draft, not a schema: it is refused (naming the marked keys) until the operator replaces
the values with public knowledge and deletes the marks; only the draft command itself reads it
(``allow_data_derived=True``).  The marks are no part of the schema's content (nor of its digest).
"""
from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
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


#: every key a schema may hold at its top level; any other key is refused (a misspelt ``id_colum`` would
#: otherwise key the privacy ledger by row number without a word)
TOP_KEYS = ("name", "task", "target", "features", "columns", "id_column", "arrival_column", "label_range",
            "positive", "negative", "classes", "format", "data_derived")
#: the keys of one ``[[features]]`` block: exactly one of name / names / pattern, then its type's keys
FEATURE_KEYS = {"numeric": ("name", "names", "pattern", "type", "range", "allow_missing", "scale", "cuts",
                            "data_derived"),
                "categorical": ("name", "names", "pattern", "type", "levels", "allow_missing", "data_derived")}
#: where a numeric feature's public split candidates lie (docs/data-sources.md#split-candidates): equidistant on
#: the range ("linear", the default) or equidistant in log(x − lo + 1) ("log"); ``cuts`` lists them instead
SCALES = ("linear", "log")
#: at most this many declared cut points per feature (trees are walked on one-byte codes of the candidates)
MAX_CUTS = 255
#: the keys a ``data_derived`` mark may name: at the top level, and in a feature block
TOP_MARKABLE = ("task", "label_range", "positive", "negative", "classes")
FEATURE_MARKABLE = ("type", "range", "levels", "allow_missing")
#: features named one by one in the refusal of a drafted schema, then "and N more"
MARKS_SHOWN = 6
#: a feature group's pattern: ``lab_{1..36}`` or ``lab_{01..36}`` (zero-padded like the first bound)
_PATTERN = re.compile(r"^(?P<pre>[^{}]*)\{(?P<lo>\d+)\.\.(?P<hi>\d+)\}(?P<post>[^{}]*)$")
MAX_GROUP = 100_000


def _check_keys(table: dict[str, Any], known, place: str, source: str) -> None:
    """Refuse the first key of ``table`` that is not in ``known``, naming it, its place and the closest known key."""
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known keys: {', '.join(known)})"
            raise SchemaError(f"{source}: unknown key {key!r} {place}{hint}")


def _marks(table: dict[str, Any], markable: tuple[str, ...], place: str, source: str) -> list[str]:
    """The keys a table's ``data_derived`` list marks as learned from the records (``[]`` without marks); a mark
    that names no markable key is refused, as an unknown key is."""
    marks = table.get("data_derived", [])
    if not (isinstance(marks, list) and all(isinstance(m, str) for m in marks)):
        raise SchemaError(f"{source}: data_derived {place} must be a list of key names, got {marks!r}")
    for m in marks:
        if m not in markable:
            raise SchemaError(f"{source}: data_derived {place} names {m!r}, which is not one of "
                              f"{', '.join(markable)}")
    return list(dict.fromkeys(marks))


def data_derived_marks(d: dict[str, Any], source: str = "schema") -> tuple[list[str], list[str]]:
    """What a schema's parsed form still marks as data-derived, for people: (the top-level keys, e.g.
    ``label_range``; the features, e.g. ``age (range, allow_missing)``, a group by its first and last name)."""
    top, out = _marks(d, TOP_MARKABLE, "at the top level", source), []
    for i, f in enumerate(d.get("features") or []):
        if not isinstance(f, dict) or "data_derived" not in f:
            continue
        marks = _marks(f, FEATURE_MARKABLE, f"in features[{i}]", source)
        if not marks:
            continue
        if "name" in f:
            label = str(f["name"])
        elif isinstance(f.get("names"), list) and f["names"]:
            label = str(f["names"][0]) if len(f["names"]) == 1 else f"{f['names'][0]}…{f['names'][-1]}"
        else:
            label = str(f.get("pattern", f"features[{i}]"))
        out.append(f"{label} ({', '.join(marks)})")
    return top, out


def _refuse_data_derived(top: list[str], feats: list[str], source: str) -> None:
    """A drafted schema whose data-derived marks (:func:`data_derived_marks`) are still there: one line naming
    the marked keys."""
    if not (top or feats):
        return
    parts = list(top)
    if feats:
        shown = ", ".join(feats[:MARKS_SHOWN])
        more = f" and {len(feats) - MARKS_SHOWN} more" if len(feats) > MARKS_SHOWN else ""
        parts.append(f"feature{'s' if len(feats) > 1 else ''} {shown}{more}")
    verb = "is" if len(top) + len(feats) == 1 else "are"
    raise SchemaError(f"{source}: {', '.join(parts)} {verb} still marked data-derived by `fedsbdt schema draft`; "
                      "replace them with public knowledge (reference ranges, code lists) and delete the data_derived "
                      "marks (docs/data-sources.md#drafting-a-schema)")


def expand_pattern(pattern: str) -> list[str]:
    """The names of a feature group's ``pattern``: ``"lab_{1..3}"`` → lab_1, lab_2, lab_3; ``"x{08..10}"`` →
    x08, x09, x10 (a first bound with a leading zero pads every number to its width)."""
    m = _PATTERN.match(pattern)
    if m is None:
        raise ValueError(f"pattern {pattern!r} must look like 'prefix{{1..36}}suffix' (one numeric range in braces)")
    lo, hi = int(m["lo"]), int(m["hi"])
    if not lo <= hi or hi - lo >= MAX_GROUP:
        raise ValueError(f"pattern {pattern!r}: the range {{{m['lo']}..{m['hi']}}} must run upwards and name at most "
                         f"{MAX_GROUP} features")
    width = len(m["lo"]) if m["lo"].startswith("0") and len(m["lo"]) > 1 else 0
    return [f"{m['pre']}{k:0{width}d}{m['post']}" for k in range(lo, hi + 1)]


def _feature_block(f: Any, i: int, source: str) -> list["Feature"]:
    """The features of ``[[features]]`` block ``i``: one (``name``) or a group of similar features (``names``, a
    list, or ``pattern``) sharing one type, range or levels and ``allow_missing``."""
    if not isinstance(f, dict):
        raise SchemaError(f"{source}: features[{i}] must be a table")
    given = [k for k in ("name", "names", "pattern") if k in f]
    label = repr(f.get("name", f.get("pattern", f"features[{i}]")))
    if len(given) != 1:
        raise SchemaError(f"{source}: features[{i}] needs exactly one of 'name', 'names' (a list) or 'pattern' "
                          f"(e.g. 'lab_{{1..36}}'), got {', '.join(given) or 'none'}")
    kind = f.get("type")
    if kind not in FEATURE_KEYS:
        _check_keys(f, sorted(set(FEATURE_KEYS["numeric"] + FEATURE_KEYS["categorical"])), f"in features[{i}]",
                    source)
        if kind is None:
            raise SchemaError(f"{source}: missing required key 'features[{i}].type'")
        raise SchemaError(f"{source}: feature {label}: type must be 'numeric' or 'categorical', got {kind!r}")
    place = f"in features[{i}] ({label}, {kind})"
    _check_keys(f, FEATURE_KEYS[kind], place, source)
    if "name" in f:
        names = [f["name"]]
    elif "names" in f:
        names = f["names"]
        if not (isinstance(names, list) and names):
            raise SchemaError(f"{source}: features[{i}].names must be a non-empty list of feature names")
    else:
        if not isinstance(f["pattern"], str):
            raise SchemaError(f"{source}: features[{i}].pattern must be a string such as 'lab_{{1..36}}'")
        try:
            names = expand_pattern(f["pattern"])
        except ValueError as e:
            raise SchemaError(f"{source}: features[{i}]: {e}") from None
    if not all(isinstance(n, str) and n for n in names):
        raise SchemaError(f"{source}: features[{i}]: feature names must be non-empty strings, got {names!r}")
    label = repr(names[0]) if len(names) == 1 else f"{names[0]!r}…{names[-1]!r}"
    allow = f.get("allow_missing", False)
    if not isinstance(allow, bool):
        raise SchemaError(f"{source}: feature {label}: allow_missing must be true or false, got {allow!r}")
    if kind == "numeric":
        if "range" not in f:
            raise SchemaError(f"{source}: missing required key 'features[{i}].range'")
        rng = f["range"]
        if not (isinstance(rng, list) and len(rng) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng)):
            raise SchemaError(f"{source}: feature {label}: range must be [lo, hi]")
        lo, hi = float(rng[0]), float(rng[1])
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise SchemaError(f"{source}: feature {label}: range must satisfy lo < hi, got {rng}")
        scale, cuts = _placement(f, lo, hi, label, source)
        return [Feature(n, "numeric", lo, hi, allow_missing=allow, scale=scale, cuts=cuts) for n in names]
    if "levels" not in f:
        raise SchemaError(f"{source}: missing required key 'features[{i}].levels'")
    levels = f["levels"]
    if not (isinstance(levels, list) and levels and all(isinstance(x, str) for x in levels)):
        raise SchemaError(f"{source}: feature {label}: levels must be a non-empty list of strings")
    if len(set(levels)) != len(levels):
        raise SchemaError(f"{source}: feature {label}: duplicate levels")
    return [Feature(n, "categorical", levels=tuple(levels), allow_missing=allow) for n in names]


def _placement(f: dict[str, Any], lo: float, hi: float, label: str, source: str) -> tuple[str, tuple[float, ...]]:
    """A numeric block's public split-candidate placement: ``scale`` ("linear" or "log") and ``cuts`` (sorted,
    distinct, finite public thresholds inside ``[lo, hi]``, at most :data:`MAX_CUTS`), one of them at most."""
    scale = f.get("scale", "linear")
    if not isinstance(scale, str) or scale not in SCALES:
        raise SchemaError(f"{source}: feature {label}: scale must be 'linear' or 'log', got {scale!r}")
    if "cuts" not in f:
        return scale, ()
    cuts = f["cuts"]
    if "scale" in f:
        raise SchemaError(f"{source}: feature {label}: give either scale or cuts (cuts are the candidates "
                          "themselves), not both")
    if not (isinstance(cuts, list) and cuts
            and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in cuts)):
        raise SchemaError(f"{source}: feature {label}: cuts must be a non-empty list of numbers")
    c = [float(x) for x in cuts]
    if not all(math.isfinite(x) for x in c):
        raise SchemaError(f"{source}: feature {label}: cuts must be finite numbers, got {cuts}")
    if len(c) > MAX_CUTS:
        raise SchemaError(f"{source}: feature {label}: at most {MAX_CUTS} cuts, got {len(c)}")
    if any(b <= a for a, b in zip(c, c[1:])):
        raise SchemaError(f"{source}: feature {label}: cuts must be strictly increasing, got {cuts}")
    if c[0] < lo or c[-1] > hi:
        raise SchemaError(f"{source}: feature {label}: cuts must lie inside the range [{lo:g}, {hi:g}], got {cuts}")
    return scale, tuple(c)


@dataclass(frozen=True)
class Feature:
    """One input feature: numeric with a public ``[lo, hi]`` range, or categorical with public levels."""

    name: str
    kind: str  # "numeric" | "categorical"
    lo: float = 0.0
    hi: float = 0.0
    levels: tuple[str, ...] = ()
    allow_missing: bool = False  # missing values kept (NaN) and routed by each split's default direction
    scale: str = "linear"  # numeric: split candidates equidistant on the range, or in log(x − lo + 1) ("log")
    cuts: tuple[float, ...] = ()  # numeric: declared public candidate thresholds (empty: computed from scale)

    @property
    def is_categorical(self) -> bool:
        return self.kind == "categorical"

    @property
    def declares_candidates(self) -> bool:
        """True if the schema places this feature's split candidates itself (``scale = "log"`` or ``cuts``)."""
        return bool(self.cuts) or self.scale != "linear"

    def to_dict(self) -> dict[str, Any]:
        if self.is_categorical:
            d = {"name": self.name, "type": "categorical", "levels": list(self.levels)}
        else:
            d = {"name": self.name, "type": "numeric", "range": [self.lo, self.hi]}
        if self.allow_missing:  # only when set: schemas without missing values keep their digest
            d["allow_missing"] = True
        if self.scale != "linear":  # likewise: only when declared
            d["scale"] = self.scale
        if self.cuts:
            d["cuts"] = list(self.cuts)
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
    def from_dict(cls, d: dict[str, Any], source: str = "schema", allow_data_derived: bool = False) -> "Schema":
        """Validate a schema's parsed form; anything malformed raises :class:`SchemaError` and nothing else
        (a schema arrives inside plans, possibly from a hostile coordinator).  A draft that still carries
        ``data_derived`` marks is refused unless ``allow_data_derived`` (``fedsbdt schema draft``'s own check)."""
        try:
            if not isinstance(d, dict):
                raise SchemaError(f"{source}: a schema is a table of keys")
            schema = cls._from_dict(d, source)
            top, feats = data_derived_marks(d, source)  # checked either way: a misspelt mark is refused
            if not allow_data_derived:
                _refuse_data_derived(top, feats, source)
            return schema
        except SchemaError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as e:
            raise SchemaError(f"{source}: malformed schema ({type(e).__name__}: {e})") from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any], source: str) -> "Schema":
        """The checks, in order (the first failing one is reported): the task and the top-level keys, the
        features (:func:`_features_of`), the target, the [format] table (:func:`_format_of`), the column list
        (:func:`_columns_of`), the labels (:func:`_labels_of`) and the id and arrival columns
        (:func:`_special_columns`)."""
        task = _need(d, "task", source)
        if task not in TASKS:
            raise SchemaError(f"{source}: task must be one of {TASKS}, got {task!r}")
        _check_keys(d, TOP_KEYS, "at the top level", source)
        feats = _features_of(d, source)
        names = [f.name for f in feats]
        target = str(_need(d, "target", source))
        if target in names:
            raise SchemaError(f"{source}: the target {target!r} is also listed as a feature")
        fmt = _format_of(d, source)
        if fmt.on_missing == "keep":  # schema-wide shorthand for allow_missing = true on every feature
            feats = [replace(f, allow_missing=True) for f in feats]
        columns = _columns_of(d, names + [target], fmt, source)
        label_range, classes, positive, negative = _labels_of(d, task, source)
        id_column, arrival_column = _special_columns(d, columns, names + [target], source)
        return cls(
            name=str(d.get("name", "dataset")), task=task, target=target, features=tuple(feats),
            columns=columns, id_column=id_column, arrival_column=arrival_column, label_range=label_range, positive=positive,
            negative=negative, classes=classes, format=fmt,
        )

    @classmethod
    def load(cls, path: str | Path, allow_data_derived: bool = False) -> "Schema":
        """The schema in the TOML file ``path`` (a draft with ``data_derived`` marks is refused, see
        :meth:`from_dict`)."""
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SchemaError(f"schema file not found: {p}") from None
        except tomllib.TOMLDecodeError as e:
            raise SchemaError(f"{p}: not valid TOML: {e}") from None
        return cls.from_dict(raw, source=str(p), allow_data_derived=allow_data_derived)

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


# ---------------------------------------------------------------------- the checks of Schema._from_dict


def _need(d: dict[str, Any], key: str, source: str) -> Any:
    """``d[key]``, or a :class:`SchemaError` naming the missing required key."""
    if key not in d:
        raise SchemaError(f"{source}: missing required key '{key}'")
    return d[key]


def _features_of(d: dict[str, Any], source: str) -> list[Feature]:
    """The ``[[features]]`` tables as feature specs: a non-empty list, blocks expanded, names distinct."""
    raw_feats = _need(d, "features", source)
    if not isinstance(raw_feats, list) or not raw_feats:
        raise SchemaError(f"{source}: 'features' must be a non-empty list of [[features]] tables")
    feats = [f for i, block in enumerate(raw_feats) for f in _feature_block(block, i, source)]
    names = [f.name for f in feats]
    if len(set(names)) != len(names):
        raise SchemaError(f"{source}: duplicate feature names")
    return feats


def _format_of(d: dict[str, Any], source: str) -> FileFormat:
    """The ``[format]`` table: known keys only, ``on_missing`` and ``out_of_range`` among their choices."""
    fmt_d = d.get("format", {})
    if not isinstance(fmt_d, dict):
        raise SchemaError(f"{source}: 'format' must be a [format] table")
    _check_keys(fmt_d, tuple(FileFormat.__dataclass_fields__), "in [format]", source)
    fmt = FileFormat(**fmt_d)
    if fmt.on_missing not in ON_MISSING:
        raise SchemaError(f"{source}: format.on_missing must be one of {', '.join(map(repr, ON_MISSING))}, "
                          f"got {fmt.on_missing!r}")
    if fmt.out_of_range not in ("error", "clip"):
        raise SchemaError(f"{source}: format.out_of_range must be 'error' or 'clip'")
    return fmt


def _columns_of(d: dict[str, Any], used: list[str], fmt: FileFormat, source: str) -> tuple[str, ...]:
    """The column order: distinct names holding every ``used`` column (features and target); required when
    the file has no header."""
    columns = tuple(str(c) for c in d.get("columns", ()))
    if columns:
        missing = [c for c in used if c not in columns]
        if missing:
            raise SchemaError(f"{source}: columns list lacks {missing}")
        if len(set(columns)) != len(columns):
            raise SchemaError(f"{source}: duplicate names in 'columns'")
    elif not fmt.header:
        raise SchemaError(f"{source}: a file without header needs 'columns' (the column order)")
    return columns


def _labels_of(d: dict[str, Any], task: str, source: str):
    """The task's label space as ``(label_range, classes, positive, negative)``: a regression's ``[lo, hi]``,
    a multiclass task's ≥ 3 distinct public classes, or a binary task's disjoint positive and negative labels."""
    if task != "multiclass" and "classes" in d:
        raise SchemaError(f"{source}: 'classes' is for task = 'multiclass' (this schema's task is {task!r})")
    if task == "regression":
        lr = _need(d, "label_range", source)
        if not (isinstance(lr, list) and len(lr) == 2 and float(lr[0]) < float(lr[1])):
            raise SchemaError(f"{source}: label_range must be [lo, hi] with lo < hi")
        return (float(lr[0]), float(lr[1])), (), (), ()
    if task == "multiclass":
        classes = _need(d, "classes", source)
        if not (isinstance(classes, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                                  for x in classes)):
            raise SchemaError(f"{source}: classes must be a list of the public class labels")
        classes = tuple(str(x) for x in classes)
        if len(classes) < 3:
            raise SchemaError(f"{source}: a multiclass task needs at least 3 public classes, got "
                              f"{len(classes)} (use task = 'binary' for two)")
        if len(set(classes)) != len(classes):
            raise SchemaError(f"{source}: duplicate class labels in 'classes'")
        return None, classes, (), ()
    positive = tuple(str(x) for x in d.get("positive", ["1"]))
    negative = tuple(str(x) for x in d.get("negative", ["0"]))
    if set(positive) & set(negative):
        raise SchemaError(f"{source}: a label is listed as both positive and negative")
    return None, (), positive, negative


def _special_columns(d: dict[str, Any], columns: tuple[str, ...], used: list[str], source: str):
    """``(id_column, arrival_column)``: each absent or a column name in ``columns`` (when listed); the arrival
    column is none of the ``used`` ones (features and target)."""
    id_column = d.get("id_column")
    if id_column is not None and not isinstance(id_column, str):
        raise SchemaError(f"{source}: id_column must be a column name (a string), got {id_column!r}")
    if id_column is not None and columns and id_column not in columns:
        raise SchemaError(f"{source}: id_column {id_column!r} is not in columns")
    arrival_column = d.get("arrival_column")
    if arrival_column is not None:
        if columns and arrival_column not in columns:
            raise SchemaError(f"{source}: arrival_column {arrival_column!r} is not in columns")
        if arrival_column in used:
            raise SchemaError(f"{source}: arrival_column {arrival_column!r} must not be a feature or the target")
    return id_column, arrival_column
