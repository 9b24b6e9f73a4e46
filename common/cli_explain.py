"""``fedsbdt explain``: which features the released model uses, and why it predicts what it does (common/explain.py).

    fedsbdt explain --model M [--data F|URL [--query Q]] [--contributions OUT.csv] [--top N] [--json]

Post-processing of the released model: it costs no privacy.  With ``--data`` the importance is the mean
absolute contribution over those records (e.g. a site's own held-out file; nothing leaves the machine) and
``--contributions`` writes every record's contributions; without it, over a sample of the schema's public
feature box.
"""
from __future__ import annotations

import argparse

from .cli import CliError, emit
from .sources import add_source_flags

def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import BOX_POINTS, contributions, importance, public_box_sample
    from .files import check_output_path, write_atomic
    from .model import Ensemble

    if args.contributions is not None and args.data is None:
        raise CliError("--contributions needs --data (the records whose predictions to explain)")
    if args.contributions is not None:
        check_output_path(args.contributions, "contributions")
    if args.top is not None and args.top < 1:
        raise CliError(f"--top {args.top}: must be at least 1")
    model = Ensemble.load(args.model)
    if args.data is None:
        X, over, ds = public_box_sample(model, BOX_POINTS), "public box", None
    else:
        from .cli import _load_for_prediction

        ds, id_col = _load_for_prediction(args, model.schema)
        if ds.n == 0:
            raise CliError(f"{args.data}: no records to explain")
        X, over = ds.X, "data"
    imp = importance(model, X, over)
    if args.contributions is not None:
        write_atomic(args.contributions, _contributions_csv(model, contributions(model, X), ds, id_col),
                     "contributions")
    top = len(imp.features) if args.top is None else min(args.top, len(imp.features))
    rows = [{"feature": f, "mean_abs_contribution": v, "share": s}
            for f, v, s in zip(imp.features[:top], imp.mean_abs[:top], imp.share[:top])]
    where = (f"{imp.points} records of {args.data}" if over == "data" else
             f"{imp.points} points drawn uniformly from the schema's public feature box (not any population; "
             "give --data for your records)")
    out = {"importance": rows, "units": imp.units, "over": over, "points": imp.points, "model": str(args.model)}
    if args.contributions is not None:
        out["contributions"] = str(args.contributions)
    width = max(len(r["feature"]) for r in rows) if rows else 7
    lines = [f"feature importance: mean |SHAP contribution| to the {imp.units}, over {where}",
             f"{'feature':<{width}}  {'mean |contribution|':>19}  share"]
    lines += [f"{r['feature']:<{width}}  {r['mean_abs_contribution']:>19.4g}  {r['share']:6.1%}" for r in rows]
    if args.contributions is not None:
        lines.append(f"wrote every record's contributions to {args.contributions}")
    emit(args, out, "\n".join(lines))
    return 0


def _contributions_csv(model, c, ds, id_col) -> str:
    import pandas as pd

    names = [f.name for f in model.schema.features]
    frame = pd.DataFrame({id_col: ds.id_values} if id_col else {"id": ds.ids})
    if c.values.ndim == 3:
        for k, cls in enumerate(model.schema.classes):
            for j, name in enumerate(names):
                frame[f"{name}@{cls}"] = c.values[:, k, j]
            frame[f"bias@{cls}"] = c.bias[k]
    else:
        for j, name in enumerate(names):
            frame[name] = c.values[:, j]
        frame["bias"] = c.bias[0]
    return frame.to_csv(index=False)


def register(sub) -> None:
    """Add ``explain`` to the ``fedsbdt`` subcommands."""
    x = sub.add_parser("explain", help="feature importance and per-record contributions (SHAP) of a model; "
                                       "post-processing, no privacy cost")
    x.add_argument("--model", required=True, metavar="FILE", help="fedsbdt model file (JSON)")
    x.add_argument("--data", metavar="SOURCE",
                   help="records to explain (CSV or Parquet in the model's schema, label optional, or a database "
                        "URL with --query) (default: none: the importance over a sample of the schema's public "
                        "feature box)")
    x.add_argument("--contributions", metavar="FILE",
                   help="with --data: write every record's contributions as CSV (id, one column per feature "
                        "(per feature@class for multi-class), bias; they add up to the prediction's label, "
                        "log-odds or class margin) (default: none)")
    x.add_argument("--top", type=int, metavar="N", help="show the N most important features (default: all)")
    x.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_source_flags(x)
    x.set_defaults(func=cmd_explain)
