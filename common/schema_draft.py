"""``fedsbdt schema draft``: a starting schema from a site's own records, every data-derived value marked.

    fedsbdt schema draft --data F|URL [--query Q | --query-file F] --target COL [--id-column C] [--out S]

A schema must be *public*: a numeric range or a level list learned from the records reveals them (the
minimum of a range is some patient's value; a rare level says that such a patient exists), and the random
split thresholds drawn inside a range would carry it into the model.  The draft saves typing, not thinking:
each value that came from the records carries a ``# data-derived`` comment, to be replaced with public
knowledge (a reference range, a code list) before the schema is shared or used (docs/data-sources.md), and
its table a ``data_derived = [...]`` key naming those keys, which the loader sees: ``train``, ``tune``,
``plan``, ``client`` and ``demo`` refuse the schema until the operator deletes the marks (common/schema.py).

Record ids: ``--id-column`` names the id column; without it, a column that holds a distinct whole number or
text in every row (or is named like ``patient_id`` and does) is drafted as the ``id_column``, not as a
feature, with a note; further id-like columns, and a person id that repeats, are left out with a note.

Types: a column whose values all read as numbers with more than ``--max-levels`` distinct values is numeric
(its range the minimum and maximum rounded outward to round numbers); any other column is categorical with its
most frequent levels (and ``"other"`` when there were more).  The task follows from the target: two values →
binary, up to ``--max-levels`` → multiclass, more numbers → regression.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tomllib
from types import SimpleNamespace

import numpy as np

from .cli import CliError, emit

MAX_LEVELS = 10
#: rows a table needs before a column is taken for a record id by its distinct values alone (not its name)
MIN_ID_ROWS = 20
MISSING_TEXT = ("", "na", "nan", "null", "none", "?")
NOTE = "data-derived: replace with public knowledge"
#: the line after a table's data-derived values: the key the loader sees (common/schema.py refuses it)
MARK = "  # delete this line once the values marked above are public knowledge"
#: names of a record id: ``id``, ``patient_id``, ``PersonID``, ``subject no``, ``mrn`` (after :func:`_snake`)
PERSON_ID = re.compile(r"^(?:(?:patient|person|subject|participant|member|record|row|case|visit|encounter|"
                       r"sample|study)_?(?:id|no|nr|num|number|key)|id|mrn|uuid|guid)$")
#: a generic id name: ``hospital_id``, ``pid`` (an id only if it is also distinct per row)
ANY_ID = re.compile(r"(?:^|_)id$|^[a-z]{1,3}id$")


def round_outward(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` widened to round numbers: multiples of the power of ten just below the span (0 stays the
    floor of non-negative data)."""
    span = hi - lo
    step = 10.0 ** math.floor(math.log10(span)) if span > 0 else 10.0 ** math.floor(math.log10(abs(lo) or 1.0))
    a, b = math.floor(lo / step) * step, math.ceil(hi / step) * step
    if b <= a:
        b = a + step
    clean = lambda x: float(f"{x:.12g}")  # noqa: E731 (no 0.30000000000000004)
    return clean(a), clean(b)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _column_values(frame, name: str):
    """(texts of the non-missing values, numbers or None if some value is not a number, any missing?)."""
    import pandas as pd

    col = frame[name]
    if col.dtype.kind in "iufb":
        v = col.to_numpy(dtype=np.float64)
        miss = np.isnan(v)
        vals = v[~miss]
        texts = pd.Series(vals).map(_num) if vals.size else pd.Series([], dtype=object)
        return texts, vals, bool(miss.any())
    s = col.astype(object)
    null = s.isna().to_numpy()
    text = s.where(~null, "").astype(str).str.strip()
    miss = null | text.str.lower().isin(MISSING_TEXT).to_numpy()
    text = text[~miss]
    nums = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64)
    return text, (None if np.isnan(nums).any() else nums), bool(miss.any())


def _snake(name: str) -> str:
    """``PatientID`` → ``patient_id``, ``Subject No.`` → ``subject_no``: a column name compared with id names."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def id_like(frame, name: str) -> str | None:
    """Why column ``name`` looks like a record id rather than a feature (None if it does not): a distinct whole
    number or text in every row; or a person id's name (``patient_id``) on a column whose values repeat."""
    texts, nums, missing = _column_values(frame, name)
    snake = _snake(name)
    named = bool(PERSON_ID.match(snake) or ANY_ID.search(snake))
    distinct = (not missing and len(frame) >= (2 if named else MIN_ID_ROWS)  # (few rows are often all distinct)
                and texts.nunique() == len(frame))
    whole = nums is None or bool(np.all(nums == np.round(nums)))
    if distinct and whole:
        kind = "text" if nums is None else "whole number"
        return f"a distinct {kind} in every row" + (" and is named like an id" if named else "")
    if PERSON_ID.match(snake):
        return ("named like a record id but " + ("missing in some rows" if missing else "repeating across rows")
                + ": an id keys the privacy ledger and must be distinct in every row")
    return None


def id_columns(frame, target: str, id_column: str | None) -> tuple[str | None, str, dict[str, str]]:
    """(the id column, why it was chosen, {the other id-like columns left out: why}): ``--id-column`` if given,
    else the first distinct id-like column, those named like a person id first."""
    found = {c: why for c in map(str, frame.columns) if c not in (target, id_column)
             for why in [id_like(frame, c)] if why is not None}
    if id_column is not None:
        return id_column, "--id-column", found
    usable = sorted((c for c, why in found.items() if why.startswith("a distinct")),
                    key=lambda c: (not PERSON_ID.match(_snake(c)), not ANY_ID.search(_snake(c))))
    if not usable:
        return None, "", found
    chosen = usable[0]
    return chosen, found.pop(chosen), found


def draft(frame, target: str, id_column: str | None = None, name: str = "dataset",
          max_levels: int = MAX_LEVELS, source: str = "", header_format: bool = False) -> str:
    """The draft schema (TOML text with comments) for the table ``frame``."""
    return draft_parts(frame, target, id_column, name, max_levels, source, header_format)[0]


def draft_parts(frame, target: str, id_column: str | None = None, name: str = "dataset",
                max_levels: int = MAX_LEVELS, source: str = "",
                header_format: bool = False) -> tuple[str, str | None, dict[str, str]]:
    """(the draft schema's TOML text, its id column, {id-like columns left out of the features: why})."""
    cols = [str(c) for c in frame.columns]
    for c, what in ((target, "--target"), (id_column, "--id-column")):
        if c is not None and c not in cols:
            raise CliError(f"{what} {c!r} is not a column of the data (columns: {', '.join(cols)})")
    id_column, id_why, left_out = id_columns(frame, target, id_column)
    out = [f"# Drafted by `fedsbdt schema draft` from {source or 'the data'}.",
           "# Every value marked data-derived came from this site's records: replace each with public knowledge",
           "# (clinical reference ranges, the code list's levels) before the schema is shared or used: a range",
           "# or level list learned from the data reveals its records (docs/data-sources.md#drafting-a-schema).",
           "# Each table lists those keys in `data_derived = [...]`: train, tune, plan, client and demo refuse",
           "# this schema until every data_derived line is deleted (once its values are public knowledge).",
           f"name = {json.dumps(name)}"]
    texts, nums, _ = _column_values(frame, target)
    levels = texts.value_counts()
    if nums is not None and levels.size > max_levels:
        lo, hi = round_outward(float(nums.min()), float(nums.max()))
        out += ['task = "regression"  # data-derived (the target holds many numbers)', f"target = {json.dumps(target)}",
                f"label_range = [{_num(lo)}, {_num(hi)}]  # {NOTE} (the target's range, rounded outward)",
                'data_derived = ["label_range"]' + MARK]
    elif levels.size == 2:
        vals = sorted(levels.index)
        pos, neg = (["1"], ["0"]) if vals == ["0", "1"] else ([levels.index[-1]], [levels.index[0]])
        out += ['task = "binary"  # data-derived (the target has two values)', f"target = {json.dumps(target)}",
                f"positive = {json.dumps(pos)}  # {NOTE} (check which value means the outcome)",
                f"negative = {json.dumps(neg)}  # {NOTE}", 'data_derived = ["positive", "negative"]' + MARK]
    elif 2 < levels.size <= max_levels:
        out += ['task = "multiclass"  # data-derived (the target has a few values)', f"target = {json.dumps(target)}",
                f"classes = {json.dumps(sorted(levels.index))}  # {NOTE}", 'data_derived = ["classes"]' + MARK]
    else:
        raise CliError(f"--target {target!r}: {levels.size} distinct values that are not all numbers; a target "
                       "has 2 values (binary), up to --max-levels (multiclass) or numbers (regression)")
    if id_column is None:
        out.append("# id_column = \"...\"  # set the record id column (e.g. person_id): the privacy ledger's key")
    elif id_why == "--id-column":
        out.append(f"id_column = {json.dumps(id_column)}")
    else:
        out.append(f"id_column = {json.dumps(id_column)}  # detected: {id_why}; the privacy ledger's key, not a "
                   "feature (--id-column COLUMN chooses another)")
    out += [f"# left out: {json.dumps(c)} looks like a record id ({why}), not a feature; add it by hand if it is one"
            for c, why in left_out.items()]
    if header_format:
        out += ["", "[format]", "header = true", 'separator = ","']
    if not [c for c in cols if c not in (target, id_column) and c not in left_out]:
        ids = ", ".join(repr(c) for c in [id_column, *left_out] if c is not None)
        raise CliError(f"no column is left for a feature: besides the target {target!r} the data holds only record "
                       f"ids ({ids}: a distinct value in every row)")
    for c in cols:
        if c in (target, id_column) or c in left_out:
            continue
        texts, nums, missing = _column_values(frame, c)
        levels = texts.value_counts()
        out += ["", "[[features]]", f"name = {json.dumps(c)}"]
        if levels.size == 0:
            raise CliError(f"column {c!r} holds no values; leave it out of the query (or the file)")
        if nums is not None and levels.size > max_levels:
            lo, hi = round_outward(float(nums.min()), float(nums.max()))
            out += ['type = "numeric"  # data-derived', f"range = [{_num(lo)}, {_num(hi)}]  # {NOTE} "
                                                         "(this site's minimum and maximum, rounded outward)"]
            marks = ["range"]
        else:
            kept = sorted(levels.index[: max_levels - 1] if levels.size > max_levels else levels.index)
            if levels.size > max_levels:
                kept.append("other")
            note = (f" (its {max_levels - 1} most frequent values and \"other\": map the rest to \"other\" in the "
                    "query)" if levels.size > max_levels else " (the values seen here)")
            out += ['type = "categorical"  # data-derived', f"levels = {json.dumps(kept)}  # {NOTE}{note}"]
            marks = ["levels"]
        if missing:
            out.append(f"allow_missing = true  # {NOTE} (missing values were seen)")
            marks.append("allow_missing")
        out.append(f"data_derived = {json.dumps(marks)}{MARK}")
    return "\n".join(out) + "\n", id_column, left_out


def read_table(source):
    """The whole table of a file or a query, as text-preserving columns (drafting is a one-off read)."""
    import pandas as pd

    from .data import DataError
    from .schema import FileFormat

    if isinstance(source, str):
        from pathlib import Path

        p = Path(source)
        if not p.is_file():
            raise DataError(f"data file not found: {p}")
        if p.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(p), False
        try:
            return pd.read_csv(p, dtype=str, keep_default_na=False, na_filter=False), True
        except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
            raise DataError(f"{p}: not a readable CSV file with a header ({type(e).__name__}: {e})") from None
    from .sqlread import _batches

    frames = list(_batches(source, SimpleNamespace(format=FileFormat(), columns=(), features=(), target=None, id_column=None)))
    if not frames:
        raise DataError(f"{source}: the query returned no rows")
    return pd.concat(frames, ignore_index=True), False


def cmd_schema_draft(args: argparse.Namespace) -> int:
    from .files import check_output_path, write_atomic
    from .schema import Schema
    from .sources import source_from_args

    if args.max_levels < 2:
        raise CliError("--max-levels must be at least 2")
    to_file = args.out not in (None, "-")  # `--out -`: standard output, as without --out
    if to_file:
        check_output_path(args.out, "schema")
    source = source_from_args(args)
    frame, is_csv = read_table(source)
    text, id_column, left_out = draft_parts(frame, args.target, args.id_column, args.name, args.max_levels,
                                            str(source), is_csv)
    schema = Schema.from_dict(tomllib.loads(text), source="the drafted schema",  # never write one that fails
                              allow_data_derived=True)
    found = {"task": schema.task, "features": schema.n_features, "rows": len(frame), "id_column": id_column,
             "left_out": sorted(left_out)}
    ids = "" if id_column is None or args.id_column else f"\nid column: {id_column!r} (detected: not a feature)"
    ids += "".join(f"\nleft out: {c!r} looks like a record id" for c in left_out)
    if to_file:
        write_atomic(args.out, text, "schema")
        emit(args, {"out": str(args.out), **found},
             f"drafted a {schema.task} schema with {schema.n_features} features from {len(frame)} rows: "
             f"{args.out}{ids}\nreplace every value marked data-derived with public knowledge and delete the "
             "data_derived lines: train, tune, plan, client and demo refuse the schema until then")
    elif args.json:
        emit(args, {"schema": text, **found}, "")
    else:
        sys.stdout.write(text)
    return 0


def register(sub) -> None:
    from .sources import add_source_flags

    s = sub.add_parser("schema", help="schema tools: draft a starting schema from a site's own data")
    ssub = s.add_subparsers(dest="schema_command", metavar="SUBCOMMAND")
    ssub.required = True
    d = ssub.add_parser("draft", help="a starting schema from this site's data; every data-derived value is "
                                      "marked, to be replaced with public knowledge")
    d.add_argument("--data", required=True, metavar="SOURCE", help="CSV (with a header) or Parquet file, or a database URL with "
                                                 "--query")
    d.add_argument("--target", required=True, metavar="COLUMN", help="the label column (its values set the task)")
    d.add_argument("--id-column", metavar="COLUMN",
                   help="the record id column (not a feature) (default: detected: a column with a distinct whole "
                        "number or text in every row, e.g. patient_id; none if there is no such column)")
    d.add_argument("--name", default="dataset", metavar="NAME", help="the schema's name (default: dataset)")
    d.add_argument("--max-levels", type=int, default=MAX_LEVELS, metavar="N",
                   help=f"at most this many levels per categorical feature, \"other\" included; a numeric column "
                        f"with at most this many values is drafted as categorical (default: {MAX_LEVELS})")
    d.add_argument("--out", metavar="FILE", help="write the schema here; - prints it (default: print it)")
    d.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_source_flags(d)
    d.set_defaults(func=cmd_schema_draft)
