"""``fedsbdt audit``: the one-run privacy audit (docs/audit.md), registered by :mod:`fedsbdt.cli`.

    fedsbdt audit --data F --schema S --epsilon E [--sites N] [--canaries 1000] [--confidence 0.95]
                  [--report R.html] [--out AUDIT_MODEL] [hyperparameter flags] [--json]

Trains once on the data plus the canaries whose secret coin came up "in" — centrally, or with ``--sites N`` by a
federation of N sites in this process with the canaries at one site (fedsbdt.federated_audit, which
hands this command its runner) — and prints the audit's empirical ε_lower beside the receipt's ε.  The audit
model is trained on private data plus canaries: it is a test, never a model to release (``--out`` writes it
only for ``fedsbdt report``).
"""
from __future__ import annotations

import argparse

from fedsbdt.common import modes

from .audit import auditable_builders
from .cli import CliError, Progress, _load_data, add_hyperparameter_flags, emit, given_hyperparameters

#: what the audit takes for split settings it is not given: splits are public and data-independent, they never
#: change σ or ε, and fresh thresholds per tree (no grid) on any feature give the released model many more
#: distinct leaves, hence more equations per canary (docs/audit.md "Power")
AUDIT_SPLIT_DEFAULTS = {"cyclical": False, "split_candidates": 0}
MIN_CANARIES = 1000


def audit_hyperparameters_from_args(args: argparse.Namespace):
    from .config import Hyperparameters, builder_defaults

    given = given_hyperparameters(args)
    if not modes.tree_builder(given.get("tree_builder", modes.DEFAULT)).auditable:
        raise CliError(f"the audit supports {auditable_builders()}, not --tree-builder {given['tree_builder']}")
    return Hyperparameters().replace(**builder_defaults({**AUDIT_SPLIT_DEFAULTS, **given}))


def cmd_audit(args: argparse.Namespace) -> int:
    from .audit import AuditError, audit_hyperparameters, run_central_audit
    from .engine import calibration_for
    from .files import check_output_path
    from .randomness import SecureRandomness
    from .schema import Schema

    if args.sites is not None and args.sites < 2:
        raise CliError(f"--sites {args.sites}: a federation needs at least 2 sites (omit --sites for the central "
                       "audit)")
    federated = getattr(args, "federated_audit", None)
    if args.sites is not None and federated is None:
        raise CliError("--sites: the federated audit needs fedsbdt's server package (fedsbdt.server), which is "
                       "not installed")
    if args.canaries < MIN_CANARIES:
        raise CliError(f"--canaries {args.canaries}: the one-run audit needs at least {MIN_CANARIES} canaries")
    if not 0 < args.confidence < 1:
        raise CliError(f"--confidence {args.confidence:g}: must be in (0, 1), e.g. 0.95")
    if args.report is not None:
        from pathlib import Path

        if Path(args.report).suffix.lower() not in (".html", ".htm"):
            raise CliError(f"{args.report}: the report is an HTML page; name it *.html")
        check_output_path(args.report, "report")
    if args.out is not None:
        check_output_path(args.out, "model")
    schema = Schema.load(args.schema)
    if schema.task not in ("regression", "binary"):
        raise CliError(f"the audit supports regression and binary tasks, not {schema.task}")
    hp = audit_hyperparameters_from_args(args)
    try:
        hp = audit_hyperparameters(hp)
    except AuditError as e:
        raise CliError(str(e)) from None
    calibration_for(hp)  # an impossible budget fails here, before the data is read
    ds = _load_data(args, schema)
    quiet = args.quiet or args.json
    where = f", {args.sites} sites" if args.sites is not None else ""
    prog = Progress("audit", hp.total_rounds, quiet=quiet,
                    extra=f"ε={hp.epsilon:g}, {args.canaries} canaries{where}")
    try:
        if args.sites is not None:
            result, model = federated(ds, hp, args.sites, args.canaries, args.confidence, progress=prog,
                                      sampler=args.sampler)
        else:
            result, model = run_central_audit(ds, hp, args.canaries, args.confidence,
                                              SecureRandomness(sampler=args.sampler), progress=prog)
    except AuditError as e:
        raise CliError(str(e)) from None
    finally:
        prog.close()
    model.training["audit"] = result.to_dict()
    out = result.to_dict()
    if args.out is not None:
        model.save(args.out)
        out["model"] = str(args.out)
    if args.report is not None:
        from .files import write_atomic
        from .report import build_report

        write_atomic(args.report, build_report(model, model_name="audit model (data + canaries; not for release)"),
                     "report")
        out["report"] = str(args.report)
    emit(args, out, human_lines(result))
    return 0


def human_lines(r) -> str:
    pct = f"{100 * r.confidence:g}%"
    verdict = ("consistent with the claim" if r.below_claim else
               "ABOVE the claimed ε: the implementation leaks more than it claims (or the run was the rare "
               f"{100 * (1 - r.confidence):g}% case); investigate")
    run = (f"{r.trees} trees, {r.rows} rows" if r.mode == "central" else
           f"{r.trees} trees, {r.rows} rows dealt to {r.sites} sites, the canaries at {r.extra.get('canary_site')}")
    return (f"claimed      ε = {r.epsilon_claimed:.6g} (δ = {r.delta:.3g}), the privacy proof (receipt)\n"
            f"audit        ε_lower = {r.epsilon_lower:.4g} at {pct} confidence: {verdict}\n"
            f"guesses      {r.correct} of {r.guesses} correct (k+ = {r.k_plus} in, k− = {r.k_minus} out) on "
            f"{r.canaries} canaries ({r.included} in), {run}\n"
            f"power        {r.canaries} canaries can show at most ε_lower = {r.max_auditable:.3g}; a lower bound, "
            "not a proof (docs/audit.md)")


def register(sub) -> None:
    """Add ``audit`` to the ``fedsbdt`` subcommands."""
    from .config import SAMPLERS
    from .sources import add_source_flags

    a = sub.add_parser("audit", help="empirical lower bound on ε from one training run with canaries "
                                     "(Steinke, Nasr & Jagielski 2023; docs/audit.md)")
    a.add_argument("--data", required=True, metavar="SOURCE",
                   help="CSV or Parquet file described by the schema, or a database URL with --query")
    a.add_argument("--schema", required=True, metavar="FILE", help="public schema (TOML)")
    a.add_argument("--sites", type=int, metavar="N",
                   help="audit a federation: N ≥ 2 sites and a coordinator train in this process (secure "
                        "aggregation, each site's noise share), the canaries all at one site, the other records "
                        "dealt round-robin (default: none: the central audit)")
    a.add_argument("--canaries", type=int, default=MIN_CANARIES, metavar="M",
                   help=f"number of canary records, each in the training data by a secret fair coin "
                        f"(default: {MIN_CANARIES}; at least {MIN_CANARIES})")
    a.add_argument("--confidence", type=float, default=0.95, metavar="X",
                   help="confidence 1 − β of the lower bound (default: 0.95)")
    a.add_argument("--report", metavar="FILE", help="also write the HTML privacy report of the audit run, with "
                                                    "the audit's ε_lower beside the proof's ε (default: none)")
    a.add_argument("--out", metavar="FILE", help="also write the audit model (trained on the data plus canaries: "
                                                 "never release it) carrying its audit result (default: none)")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.add_argument("--quiet", action="store_true", help="no progress output")
    a.add_argument("--sampler", choices=SAMPLERS, default="ours", help="exact noise sampler (default: ours)")
    add_source_flags(a)
    add_hyperparameter_flags(a)
    a.set_defaults(func=cmd_audit, on_interrupt="nothing was written; run the same command again to audit")
