"""``fedsbdt tune`` and ``fedsbdt auto``, registered by :mod:`fedsbdt.cli` (docs/auto.md).

    fedsbdt tune --data F --schema S --epsilon E --out M [--rows N] [--trials-mean 4] [--json]
    fedsbdt auto --schema S --epsilon E --rows N [--json]      # the auto settings, no data read

``tune`` is private hyperparameter tuning (Papernot & Steinke 2022, common/tuning.py): the receipt's ε
covers every trial, the scoring, the selection and the row count, and is ≤ E.  It releases the winning model,
its settings and the receipt only — never the number of trials, the trials, their scores or the winner's
position (Thm. 2 covers the best trial with K hidden), so it shows no progress and no timing either.  The
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


def cmd_tune(args: argparse.Namespace) -> int:
    from .accountant import AccountingError
    from .auto import AutoInputs, auto_settings, rows_epsilon
    from .randomness import SecureRandomness
    from .tuning import candidates, fresh_split_key, plan_tuning, tune_on

    schema = _tune_inputs(args)
    eps_rows = 0.0 if args.rows is not None else rows_epsilon(args.epsilon)
    budget = args.epsilon - eps_rows
    # the search space's centre: auto at a third of the budget for ~80% of the rows (the training part)
    guess_rows = int(0.8 * (args.rows or 10_000))
    centre = auto_settings(AutoInputs.for_schema(schema, budget / 3, args.delta, guess_rows)).settings
    try:  # refuse an impossible budget before reading the data or spending ε
        plan = plan_tuning(candidates(centre), budget, args.delta, args.trials_mean)
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
    choice = auto_settings(AutoInputs.for_schema(schema, plan.epsilon_trial, args.delta, int(0.8 * rows), source))
    if choice.settings != centre:  # recentre on the auto setting for the per-trial budget and the real n
        centre = choice.settings
        try:
            plan = plan_tuning(candidates(centre), budget, args.delta, args.trials_mean)
        except AccountingError as e:
            raise CliError(str(e)) from None
    # no progress and no timing: a count of finished trials, or the run's duration, would tell K
    res, space = tune_on(ds, centre, plan, randomness, key)
    m = res.model
    p = m.privacy
    p["epsilon"] = plan.epsilon + eps_rows
    p["target_epsilon"] = args.epsilon
    p["eps_rows"] = eps_rows
    p["guarantee"] = (f"({p['epsilon']:.6g}, {p['delta']:.3g})-differential privacy for every record (add/remove "
                      "one record), covering every tuning trial (training and held-out score), the selection of the "
                      "best trial" + (" and the row count" if eps_rows else "") + " (Papernot & Steinke 2022, Thm. 2; "
                      "the number of trials is not released)")
    tuning = _tuning_record(plan, schema, res.settings, space, choice)
    m.training["tuning"] = tuning
    # charged as stated, (ε, δ) (Papernot & Steinke give no RDP curve here), before the model is written
    life = charge_central(run, "tune", {"type": "approx", "epsilon": float(p["epsilon"]), "delta": float(p["delta"])})
    m.save(args.out)
    out = {"epsilon": p["epsilon"], "delta": p["delta"], "settings": res.settings, "epsilon_trial": plan.epsilon_trial,
           "model": str(args.out), "tuning": tuning}
    if life is not None:
        out["lifetime"] = life
    emit(args, out, _tune_text(args, plan, res.settings, p, rows, source, life))
    return 0


def _tune_inputs(args: argparse.Namespace):
    """The schema of ``fedsbdt tune``, after checking the output path, the ledger flags, ε and ``--rows``:
    the schema must name a stable record id (the held-out part is keyed on it)."""
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


def _tuning_record(plan, schema, settings: dict, space, choice) -> dict:
    """The model's ``training.tuning``: the method, its parameters and the chosen settings (never K, the other
    trials or the scores)."""
    from .tuning import HOLDOUT_SHARE, SHAPE

    return {
        "method": "Papernot & Steinke (ICLR 2022) Thm. 2: K ~ truncated negative binomial, shape η = 1 "
                  "(geometric), mean μ; only the best trial by its noisy held-out score is released (its model "
                  "and settings; K, the other trials, the scores and the winner's position are not)",
        "trials_distribution": {"name": "truncated negative binomial", "shape": SHAPE, "gamma": plan.gamma,
                                "mean": plan.mean_trials},
        "epsilon_trial": plan.epsilon_trial,
        "sigma_score": plan.sigma_score, "order": plan.order, "epsilon_tuning": plan.epsilon,
        "score": "sum over held-out records of 1 − Brier (classification) or 1 − clipped squared scaled error "
                 "(regression), discrete Gaussian noise σ_score (sensitivity 1); not released",
        "holdout": f"records with BLAKE2b(key, id) mod {HOLDOUT_SHARE} = 0 (the schema's id column "
                   f"{schema.id_column!r}; key: a fresh secret of this run from the OS CSPRNG, not released)",
        "candidates": space, "settings": settings,
        "chosen_by": "the trial with the highest noisy held-out score",
        "centre": {"mode": "auto", **choice.to_dict()},
    }


def _tune_text(args: argparse.Namespace, plan, settings: dict, p: dict, rows: int, source: str, life) -> str:
    """The line(s) ``fedsbdt tune`` prints for people (one with ``--quiet``)."""
    if args.quiet:  # the result, one line (errors and warnings still show)
        return (f"tuned privately: {settings_line(settings)}, (ε={p['epsilon']:.6g}, δ={p['delta']:.3g})-DP; "
                f"model written to {args.out}")
    n_words = f"n = {rows} ({'declared' if source == 'declared' else 'a DP count'})"
    lines = [f"tuned privately over a random number of trials (geometric, mean {plan.mean_trials}; how many ran, "
             f"the other trials and all scores are not released), {n_words}; each trial ε={plan.epsilon_trial:.4g}, "
             f"score noise σ={plan.sigma_score:.4g}",
             f"chosen: {settings_line(settings)}, the highest noisy held-out score",
             f"privacy: (ε={p['epsilon']:.6g}, δ={p['delta']:.3g}) for the whole tuning, target {args.epsilon:g}",
             f"model written to {args.out}" + lifetime_line(life, getattr(args, "ledger", None))]
    return "\n".join(lines)


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

    t = sub.add_parser("tune", help="private hyperparameter tuning around the auto settings (Papernot & Steinke "
                                    "2022); the receipt's ε covers every trial; releases only the winner; the "
                                    "schema needs an id_column")
    t.add_argument("--data", required=True, metavar="SOURCE",
                   help="CSV or Parquet file described by the schema, or a database URL with --query")
    t.add_argument("--schema", required=True, metavar="FILE", help="public schema (TOML)")
    t.add_argument("--epsilon", type=float, required=True, metavar="X", help="total ε of the whole tuning (all trials)")
    t.add_argument("--delta", type=float, default=5e-8, metavar="X", help="δ (default: 5e-08)")
    t.add_argument("--out", required=True, metavar="FILE", help="where to write the winning model (JSON)")
    t.add_argument("--rows", type=int, default=None, metavar="N",
                   help="declare the row count public (default: a DP count at 2%% of ε)")
    t.add_argument("--trials-mean", type=int, default=4, metavar="MU",
                   help="mean of the random number of trials (geometric; integer ≥ 2; default: 4)")
    t.add_argument("--sampler", choices=["ours", "opendp"], default="ours", help="exact noise sampler (default: ours)")
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.add_argument("--quiet", action="store_true",
                   help="no progress output (tune never shows progress: it would tell the number of trials), "
                        "and one line for the result (errors and warnings still show)")
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
