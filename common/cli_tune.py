"""``fedsbdt tune`` and ``fedsbdt auto``, registered by :mod:`fedsbdt.cli` (docs/auto.md).

    fedsbdt tune --data F --schema S --epsilon E --out M [--rows N] [--json]
    fedsbdt auto --schema S --epsilon E --rows N [--json]      # the auto settings, no data read

``tune`` is ``auto`` plus a budget-gated private check of a short public list (common/tuning.py): below
ε·n/K = 10³ it trains auto's setting on every record with all of ε (as ``fedsbdt train``); above, it probes
auto's setting and up to two alternatives at a small ε each and trains the best on every record with the
rest.  The receipt's ε covers the probes, the scoring, the selection, the final training and the row count,
and is ≤ E.  It releases the final model, its setting and the receipt only — no score and no ranking.  The
schema must name a stable ``id_column``: the held-out part is a keyed hash of each record's id.

``auto`` prints the rule's choice for public inputs — what a federation's plan should carry to match
``fedsbdt train`` (the same rule on the same public inputs gives the same settings).
"""
from __future__ import annotations

import argparse

from .cli_base import CliError, emit
from .cli_base import load_data as _load_data
from .files import check_output_path
from .ledger_cli import add_ledger_flags, central_run, charge_central, check_flags, lifetime_line
from .schema import Schema


def settings_line(s: dict) -> str:
    """One trial's tuned settings for people (``fedsbdt tune``, tuning plans)."""
    return (f"T={s['trees']} depth={s['depth']} γ={s['subsample']:g} η={s['learning_rate']:g} "
            f"{'cyclical' if s['cyclical'] else 'not cyclical'}")


def _tune_schema(args: argparse.Namespace):
    """The checked flags' schema (one-line errors before anything is read or spent)."""
    check_output_path(args.out, "model")
    check_flags(args)  # --population, --lifetime-delta
    if not args.epsilon > 0:
        raise CliError(f"--epsilon {args.epsilon:g}: must be > 0")
    if args.rows is not None and args.rows < 1:
        raise CliError(f"--rows {args.rows}: the declared row count must be ≥ 1")
    schema = Schema.load(args.schema)
    if not schema.id_column:
        raise CliError(f"{args.schema}: the schema names no id_column; tune holds out records by a keyed hash of "
                       "each record's stable id (row numbers would move other records when one is deleted): add "
                       "id_column = \"<column>\" naming a unique, stable record id (docs/auto.md)")
    return schema


def _tuning_record(schema, plan, choice, res, p: dict, eps_rows: float) -> dict:
    """The model's ``training.tuning`` record (what was searched and why; no score, no ranking); sets the
    receipt's guarantee line of a search in ``p``."""
    from .tuning import HOLDOUT_SHARE, MIN_BUDGET_LOG10, PROBE_SHARE

    b = choice.budget
    if plan.searches:
        p["guarantee"] = (f"({p['epsilon']:.6g}, {p['delta']:.3g})-differential privacy for every record (add/remove "
                          f"one record), covering the {len(plan.candidates)} probes (training and held-out score), "
                          "the selection, the final training" + (" and the row count" if eps_rows else "")
                          + " (RDP composition, docs/auto.md 'Private tuning')")
        how = (f"probed {len(plan.candidates)} public candidates (auto's own setting first), each trained at "
               f"ε={plan.epsilon_probe:.4g} on the training part and scored on the held-out part with noise "
               f"σ={plan.sigma_score:.4g}; the best trained on every record at ε={plan.epsilon_final:.4g}")
    else:
        how = (f"ε·n{'/K' if schema.n_classes else ''} = {10 ** b:.4g} is below 10^{MIN_BUDGET_LOG10:g}: too small "
               "to pay for a check, so auto's own setting was trained on every record with all of ε (what fedsbdt "
               "train does)")
    tuning = {
        "method": ("RDP composition of a public short list of probes and a final training on every record; only "
                   "the final model and its setting are released (no score, no ranking)") if plan.searches else
                  "fallback to auto (the budget is too small to check other settings)",
        "searched": plan.searches,
        "why": how,
        "min_budget_log10": MIN_BUDGET_LOG10, "budget_log10": b,
        "probe_share": PROBE_SHARE if plan.searches else 0.0,
        "epsilon_probe": plan.epsilon_probe, "sigma_score": plan.sigma_score,
        "epsilon_final": plan.epsilon_final, "order": plan.order, "epsilon_tuning": plan.epsilon,
        "score": "sum over held-out records of 1 − Brier (classification) or 1 − clipped squared scaled error "
                 "(regression), discrete Gaussian noise σ_score (sensitivity 1); not released",
        "holdout": f"records with BLAKE2b(key, id) mod {HOLDOUT_SHARE} = 0 (the schema's id column "
                   f"{schema.id_column!r}; key: a fresh secret of this run from the OS CSPRNG, not released)",
        "candidates": [dict(c) for c in plan.candidates], "settings": res.settings,
        "chosen_by": (f"auto's setting unless an alternative's noisy held-out score beats it by more than "
                      f"{plan.switch_margin:g} noise standard deviations of the difference") if plan.searches
                     else "auto's rule",
        "centre": {"mode": "auto", **choice.to_dict()},
    }
    return tuning


def cmd_tune(args: argparse.Namespace) -> int:
    from .accountant import AccountingError
    from .auto import rows_epsilon
    from .randomness import SecureRandomness
    from .tuning import fresh_split_key, plan_for, tune_on

    schema = _tune_schema(args)
    eps_rows = 0.0 if args.rows is not None else rows_epsilon(args.epsilon)
    budget = args.epsilon - eps_rows
    try:  # refuse an impossible budget before reading the data or spending ε
        plan, choice = plan_for(schema, budget, args.delta, args.rows or 10_000)
    except AccountingError as e:
        raise CliError(str(e).replace(f"ε = {budget:g}", f"ε = {args.epsilon:g}")) from None
    randomness = SecureRandomness(sampler=args.sampler)
    key = fresh_split_key()  # drawn before the data is read: independent of it, never released
    ds = _load_data(args, schema)
    # --ledger: the lifetime cap before anything is drawn, at the whole budget (the receipt's ε is at most that)
    run = central_run(args, ds.ids, schema.id_column, {"type": "approx", "epsilon": float(args.epsilon),
                                                        "delta": float(args.delta)}, args.delta)
    source = "declared"
    rows = args.rows
    if rows is None:
        import numpy as np

        rows = max(ds.n + int(randomness.discrete_laplace(np.array([1.0 / eps_rows]))[0]), 1)
        source = "dp-count"
        try:
            plan, choice = plan_for(schema, budget, args.delta, rows, source)
        except AccountingError as e:
            raise CliError(str(e)) from None
    res = tune_on(ds, plan, randomness, key)
    m = res.model
    p = m.privacy
    # the fallback is one training run: its own receipt; a search: eq. T1's total
    p["epsilon"] = (p["epsilon"] if not plan.searches else plan.epsilon) + eps_rows
    p["target_epsilon"] = args.epsilon
    p["eps_rows"] = eps_rows
    tuning = _tuning_record(schema, plan, choice, res, p, eps_rows)
    how = tuning["why"]
    m.training["tuning"] = tuning
    # charged as stated, (ε, δ), before the model is written
    life = charge_central(run, "tune", {"type": "approx", "epsilon": float(p["epsilon"]), "delta": float(p["delta"])})
    m.save(args.out)
    out = {"epsilon": p["epsilon"], "delta": p["delta"], "settings": res.settings, "searched": plan.searches,
           "epsilon_final": plan.epsilon_final, "model": str(args.out), "tuning": tuning}
    if life is not None:
        out["lifetime"] = life
    if args.quiet:  # the result, one line (errors and warnings still show)
        emit(args, out, f"tuned privately: {settings_line(res.settings)}"
                        f"{'' if plan.searches else ' (auto: budget too small to search)'}, "
                        f"(ε={p['epsilon']:.6g}, δ={p['delta']:.3g})-DP; model written to {args.out}")
        return 0
    n_words = f"n = {rows} ({'declared' if source == 'declared' else 'a DP count'})"
    lines = [f"{n_words}; {how}",
             f"chosen: {settings_line(res.settings)}" + (" by the noisy held-out scores (auto's setting unless an "
                                                         "alternative beat it by the noise margin)" if plan.searches
                                                         else " (auto)"),
             f"privacy: (ε={p['epsilon']:.6g}, δ={p['delta']:.3g}) for the whole tuning, target {args.epsilon:g}",
             f"model written to {args.out}" + lifetime_line(life, getattr(args, "ledger", None))]
    emit(args, out, "\n".join(lines))
    return 0


def cmd_auto(args: argparse.Namespace) -> int:
    """Every key the rule sets for these public inputs, λ included (:func:`resolve`, as ``train --rows N`` and
    ``plan --rows N`` apply it), and the ``fedsbdt plan`` flags that pin exactly these settings."""
    from .auto import resolve

    if args.rows < 1:
        raise CliError(f"--rows {args.rows}: the declared row count must be ≥ 1")
    if not args.epsilon > 0:
        raise CliError(f"--epsilon {args.epsilon:g}: must be > 0")
    schema = Schema.load(args.schema)
    _, choice = resolve({"epsilon": args.epsilon, "delta": args.delta}, schema, args.rows)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool)
                     else f"--{'' if v else 'no-'}{k.replace('_', '-')}" for k, v in choice.settings.items())
    emit(args, choice.to_dict() | {"plan_flags": flags},
         "\n".join([f"{k} = {v}" for k, v in choice.settings.items()]
                   + [f"because: {r}" for r in choice.reasons]
                   + [f"fedsbdt plan --rows {args.rows} --epsilon {args.epsilon:g}"
                      + ("" if args.delta == 5e-8 else f" --delta {args.delta:g}")
                      + f" pins these settings (or pass them: {flags})"]))
    return 0


def register(sub) -> None:
    from .sources import add_source_flags

    t = sub.add_parser("tune", help="auto plus a private check of a short list of settings when the budget "
                                    "affords it (else auto itself); the receipt's ε covers every probe; releases "
                                    "only the final model; the schema needs an id_column")
    t.add_argument("--data", required=True, metavar="SOURCE",
                   help="CSV or Parquet file described by the schema, or a database URL with --query")
    t.add_argument("--schema", required=True, metavar="FILE", help="public schema (TOML)")
    t.add_argument("--epsilon", type=float, required=True, metavar="X",
                   help="total ε of the whole tuning (every probe and the final training)")
    t.add_argument("--delta", type=float, default=5e-8, metavar="X", help="δ (default: 5e-08)")
    t.add_argument("--out", required=True, metavar="FILE", help="where to write the winning model (JSON)")
    t.add_argument("--rows", type=int, default=None, metavar="N",
                   help="declare the row count public (default: a DP count at 2%% of ε)")
    t.add_argument("--sampler", choices=["ours", "opendp"], default="ours", help="exact noise sampler (default: ours)")
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.add_argument("--quiet", action="store_true",
                   help="one line for the result (errors and warnings still show)")
    add_source_flags(t)
    add_ledger_flags(t, "tuning")
    t.set_defaults(func=cmd_tune)

    a = sub.add_parser("auto", help="print the auto settings for public inputs (no data read; for plans)")
    a.add_argument("--schema", required=True, metavar="FILE", help="public schema (TOML)")
    a.add_argument("--epsilon", type=float, required=True, metavar="X", help="the training ε")
    a.add_argument("--delta", type=float, default=5e-8, metavar="X", help="δ (default: 5e-08)")
    a.add_argument("--rows", type=int, required=True, metavar="N", help="the public row count n")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.set_defaults(func=cmd_auto)
