"""``fedsbdt export`` and ``fedsbdt report``: ecosystem commands, registered by :mod:`fedsbdt.cli`.

    fedsbdt export --model M --format xgboost --out F [--categorical native|numeric] [--feature-names] [--json]
    fedsbdt report --model M --out R.html [--ledger L] [--site NAME] [--json]
    fedsbdt schema draft --data F|URL [--query Q] --target COL [--out S]   (common/schema_draft.py)

Both follow the CLI contract: ``--json`` prints one JSON object on stdout;
expected failures exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .cli import CliError, emit

log = logging.getLogger("fedsbdt.tools")


def cmd_export(args: argparse.Namespace) -> int:
    from .export_xgboost import ExportError, export_xgboost
    from .model import Ensemble

    model = Ensemble.load(args.model)
    try:
        s = export_xgboost(model, args.out, categorical=args.categorical, feature_names=args.feature_names)
    except ExportError as e:
        raise CliError(str(e)) from None
    log.debug("exported %d trees (%d nodes) to %s", s.trees, s.nodes, s.path,
             extra={"trees": s.trees, "nodes": s.nodes, "out": s.path})
    out = {"format": "xgboost", "out": s.path, "trees": s.trees, "nodes": s.nodes, "objective": s.objective,
           "base_score": s.base_score, "categorical": s.categorical}
    emit(args, out, f"wrote XGBoost model ({s.objective}, {s.trees} trees, {s.nodes} nodes) to {s.path}\n"
                    f"load it with xgboost.Booster(model_file={str(s.path)!r})")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import ReportError, write_report

    if Path(args.out).suffix.lower() not in (".html", ".htm"):
        raise CliError(f"{args.out}: the report is an HTML page; name it *.html")
    try:
        s = write_report(args.model, args.out, args.ledger, args.site, args.evaluation, args.reconstruction)
    except ReportError as e:
        raise CliError(str(e)) from None
    out = {"out": s.out, "epsilon": s.epsilon, "delta": s.delta, "sections": s.sections}
    if s.exhausted_share is not None:
        out["exhausted_share"] = s.exhausted_share
    emit(args, out, f"privacy report (ε={s.epsilon:.6g}, δ={s.delta:.3g}) written to {s.out}")
    return 0


def register(sub) -> None:
    """Add ``export`` and ``report`` to the ``fedsbdt`` subcommands."""
    x = sub.add_parser("export", help="write the model in another format (XGBoost JSON)")
    x.add_argument("--model", required=True, metavar="FILE", help="fedsbdt model file (JSON)")
    x.add_argument("--format", required=True, choices=["xgboost"], help="target format")
    x.add_argument("--out", required=True, metavar="FILE", help="output file, e.g. model.xgb.json")
    x.add_argument("--categorical", choices=["native", "numeric"], default="native",
                   help="categorical splits as XGBoost categorical splits (native) or as numeric splits on the "
                        "level code (numeric; for tools without categorical support) (default: native)")
    x.add_argument("--feature-names", action="store_true",
                   help="also store feature names (XGBoost then requires named DMatrix columns)")
    x.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    x.set_defaults(func=cmd_export)

    r = sub.add_parser("report", help="self-contained HTML privacy report of a model (for an ethics board)")
    r.add_argument("--model", required=True, metavar="FILE", help="fedsbdt model file (JSON)")
    r.add_argument("--out", required=True, metavar="FILE", help="output HTML file")
    r.add_argument("--ledger", metavar="FILE",
                   help="a site's ledger of spent units per record (.npy, .json or SQLite) (default: none: no "
                        "ledger section)")
    r.add_argument("--site", metavar="NAME", help="site name shown with the ledger (default: the ledger's file name)")
    r.add_argument("--evaluation", metavar="FILE",
                   help="the coordinator's evaluation.json: show the released federated metrics too (default: "
                        "none)")
    r.add_argument("--reconstruction", metavar="FILE",
                   help="results of benchmarks/reconstruction.py: show the reconstruction rates beside the proof's "
                        "ε and the audit's ε_lower (default: none)")
    r.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    r.set_defaults(func=cmd_report)

    from .schema_draft import register as register_schema

    register_schema(sub)  # fedsbdt schema draft
