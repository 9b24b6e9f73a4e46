"""``fedsbdt schema draft``: a starting schema from a site's own records, every data-derived value marked.

    fedsbdt schema draft --data F|URL [--query Q | --query-file F] --target COL [--id-column C] [--out S]

A schema must be *public*: a numeric range or a level list learned from the records reveals them (the
minimum of a range is some patient's value; a rare level says that such a patient exists), and the random
split thresholds drawn inside a range would carry it into the model.  The draft saves typing, not thinking:
each value that came from the records carries a ``# data-derived`` comment, to be replaced with public
knowledge (a reference range, a code list) before the schema is shared or used (docs/data-sources.md).

Types: a column whose values all read as numbers with more than ``--max-levels`` distinct values is numeric
(its range the minimum and maximum rounded outward to round numbers); any other column is categorical with its
most frequent levels (and ``"other"`` when there were more).  The task follows from the target: two values →
binary, up to ``--max-levels`` → multiclass, more numbers → regression.
"""
from __future__ import annotations

import argparse
import json
import math
import tomllib
from types import SimpleNamespace

import numpy as np

from .cli import CliError, emit

MAX_LEVELS = 10
MISSING_TEXT = ("", "na", "nan", "null", "none", "?")
NOTE = "data-derived: replace with public knowledge"


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


def draft(frame, target: str, id_column: str | None = None, name: str = "dataset",
          max_levels: int = MAX_LEVELS, source: str = "", header_format: bool = False) -> str:
    """The draft schema (TOML text with comments) for the table ``frame``."""
    cols = [str(c) for c in frame.columns]
    for c, what in ((target, "--target"), (id_column, "--id-column")):
        if c is not None and c not in cols:
            raise CliError(f"{what} {c!r} is not a column of the data (columns: {', '.join(cols)})")
    out = [f"# Drafted by `fedsbdt schema draft` from {source or 'the data'}.",
           "# Every value marked data-derived came from this site's records: replace each with public knowledge",
           "# (clinical reference ranges, the code list's levels) before the schema is shared or used: a range",
           "# or level list learned from the data reveals its records (docs/data-sources.md#drafting-a-schema).",
           f"name = {json.dumps(name)}"]
    texts, nums, _ = _column_values(frame, target)
    levels = texts.value_counts()
    if nums is not None and levels.size > max_levels:
        lo, hi = round_outward(float(nums.min()), float(nums.max()))
        out += ['task = "regression"  # data-derived (the target holds many numbers)', f"target = {json.dumps(target)}",
                f"label_range = [{_num(lo)}, {_num(hi)}]  # {NOTE} (the target's range, rounded outward)"]
    elif levels.size == 2:
        vals = sorted(levels.index)
        pos, neg = (["1"], ["0"]) if vals == ["0", "1"] else ([levels.index[-1]], [levels.index[0]])
        out += ['task = "binary"  # data-derived (the target has two values)', f"target = {json.dumps(target)}",
                f"positive = {json.dumps(pos)}  # {NOTE} (check which value means the outcome)",
                f"negative = {json.dumps(neg)}  # {NOTE}"]
    elif 2 < levels.size <= max_levels:
        out += ['task = "multiclass"  # data-derived (the target has a few values)', f"target = {json.dumps(target)}",
                f"classes = {json.dumps(sorted(levels.index))}  # {NOTE}"]
    else:
        raise CliError(f"--target {target!r}: {levels.size} distinct values that are not all numbers; a target "
                       "has 2 values (binary), up to --max-levels (multiclass) or numbers (regression)")
    out.append(f"id_column = {json.dumps(id_column)}" if id_column else
               "# id_column = \"...\"  # set the record id column (e.g. person_id): the privacy ledger's key")
    if header_format:
        out += ["", "[format]", "header = true", 'separator = ","']
    for c in cols:
        if c in (target, id_column):
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
        else:
            kept = sorted(levels.index[: max_levels - 1] if levels.size > max_levels else levels.index)
            if levels.size > max_levels:
                kept.append("other")
            note = (f" (its {max_levels - 1} most frequent values and \"other\": map the rest to \"other\" in the "
                    "query)" if levels.size > max_levels else " (the values seen here)")
            out += ['type = "categorical"  # data-derived', f"levels = {json.dumps(kept)}  # {NOTE}{note}"]
        if missing:
            out.append(f"allow_missing = true  # {NOTE} (missing values were seen)")
    return "\n".join(out) + "\n"


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
    if args.out:
        check_output_path(args.out, "schema")
    source = source_from_args(args)
    frame, is_csv = read_table(source)
    text = draft(frame, args.target, args.id_column, args.name, args.max_levels, str(source), is_csv)
    schema = Schema.from_dict(tomllib.loads(text), source="the drafted schema")  # never write one that fails
    if args.out:
        write_atomic(args.out, text, "schema")
        emit(args, {"out": str(args.out), "task": schema.task, "features": schema.n_features, "rows": len(frame)},
             f"drafted a {schema.task} schema with {schema.n_features} features from {len(frame)} rows: "
             f"{args.out}\nreplace every value marked data-derived with public knowledge before you use it")
    elif args.json:
        emit(args, {"schema": text, "task": schema.task, "features": schema.n_features, "rows": len(frame)}, "")
    else:
        print(text, end="")
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
    d.add_argument("--id-column", metavar="COLUMN", help="the record id column (not a feature; default: none)")
    d.add_argument("--name", default="dataset", metavar="NAME", help="the schema's name (default: dataset)")
    d.add_argument("--max-levels", type=int, default=MAX_LEVELS, metavar="N",
                   help=f"at most this many levels per categorical feature, \"other\" included; a numeric column "
                        f"with at most this many values is drafted as categorical (default: {MAX_LEVELS})")
    d.add_argument("--out", metavar="FILE", help="write the schema here (default: print it)")
    d.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_source_flags(d)
    d.set_defaults(func=cmd_schema_draft)
