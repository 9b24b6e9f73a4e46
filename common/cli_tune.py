"""``fedsbdt tune`` and ``fedsbdt auto``, registered by :mod:`fedsbdt.common.cli` (docs/auto.md).

    fedsbdt tune --data F --schema S --epsilon E --out M [--rows N] [--trials-mean 4] [--json]
    fedsbdt auto --schema S --epsilon E --rows N [--json]      # the auto settings, no data read

``tune`` is private hyperparameter tuning (Papernot & Steinke 2022, common/tuning.py): the receipt's ε
covers every trial, the scoring, the selection and the row count, and is ≤ E.  ``auto`` prints the rule's
choice for public inputs — what a federation's plan should carry to match ``fedsbdt train`` (the same
rule on the same public inputs gives the same settings).
"""
from __future__ import annotations

import argparse
import secrets

from .cli import CliError, Progress, _load_data, emit


def settings_line(s: dict) -> str:
    """One trial's tuned settings for people (``fedsbdt tune``, tuning plans)."""
    return (f"T={s['trees']} depth={s['depth']} γ={s['subsample']:g} η={s['learning_rate']:g} "
            f"{'cyclical' if s['cyclical'] else 'not cyclical'}")


def cmd_tune(args: argparse.Namespace) -> int:
    from .accountant import AccountingError
    from .auto import AutoInputs, auto_settings, rows_epsilon
    from .files import check_output_path
    from .randomness import SecureRandomness
    from .schema import Schema
    from .tuning import candidates, plan_tuning, tune_on

    check_output_path(args.out, "model")
    if not args.epsilon > 0:
        raise CliError(f"--epsilon {args.epsilon:g}: must be > 0")
    if args.rows is not None and args.rows < 1:
        raise CliError(f"--rows {args.rows}: the declared row count must be ≥ 1")
    schema = Schema.load(args.schema)
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
    ds = _load_data(args, schema)
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
    seed = args.seed if args.seed is not None else secrets.randbits(63)
    quiet = args.quiet or args.json
    prog = Progress("tune", 1, quiet=quiet, extra=f"ε={args.epsilon:g}")
    res, space = tune_on(ds, centre, plan, randomness, seed, progress=None if quiet else (lambda i, k: prog(i, k)))
    prog.close()
    m = res.model
    p = m.privacy
    p["epsilon"] = plan.epsilon + eps_rows
    p["target_epsilon"] = args.epsilon
    p["eps_rows"] = eps_rows
    p["guarantee"] = (f"({p['epsilon']:.6g}, {p['delta']:.3g})-differential privacy for every record (add/remove "
                      "one record), covering every tuning trial (training and held-out score), the selection of the "
                      "best trial" + (" and the row count" if eps_rows else "") + " (Papernot & Steinke 2022, Thm. 2)")
    tuning = {
        "method": "Papernot & Steinke (ICLR 2022) Thm. 2: K ~ truncated negative binomial, shape η = 1 "
                  "(geometric), mean μ; the best trial by its noisy held-out score is released",
        "mean_trials": plan.mean_trials, "trials_run": len(res.trials), "epsilon_trial": plan.epsilon_trial,
        "sigma_score": plan.sigma_score, "order": plan.order, "epsilon_tuning": plan.epsilon,
        "score": "sum over held-out records of 1 − Brier (classification) or 1 − clipped squared scaled error "
                 "(regression), discrete Gaussian noise σ_score (sensitivity 1)",
        "holdout": f"records with splitmix64(id ⊕ {seed}) mod 5 = 0 (public seed)", "holdout_seed": seed,
        "candidates": space, "trials": res.trials, "winner": res.winner + 1,
        "winner_settings": res.trials[res.winner]["settings"], "winner_noisy_score_sum": res.winner_score,
        "chosen_by": "the highest noisy held-out score among the trials (only the winner's score is released)",
        "centre": {"mode": "auto", **choice.to_dict()},
    }
    m.training["tuning"] = tuning
    m.save(args.out)
    out = {"epsilon": p["epsilon"], "delta": p["delta"], "trials": len(res.trials), "winner": res.winner + 1,
           "winner_settings": tuning["winner_settings"], "epsilon_trial": plan.epsilon_trial,
           "seconds": round(res.seconds, 3), "model": str(args.out), "tuning": tuning}
    if args.quiet:  # the result, one line (errors and warnings still show)
        emit(args, out, f"tuned over {len(res.trials)} trials on {ds.n} rows, winner trial {res.winner + 1}: "
                        f"(ε={p['epsilon']:.6g}, δ={p['delta']:.3g})-DP; model written to {args.out}")
        return 0
    lines = [f"tuned over {len(res.trials)} trials (random count, mean {plan.mean_trials}) on {ds.n} rows in "
             f"{res.seconds:.1f}s; each trial ε={plan.epsilon_trial:.4g}, score noise σ={plan.sigma_score:.4g}"]
    lines += [f"  trial {t['trial']}: {settings_line(t['settings'])}" for t in res.trials]
    lines.append(f"winner: trial {res.winner + 1} ({settings_line(tuning['winner_settings'])}), the highest noisy "
                 "held-out score")
    lines.append(f"privacy: (ε={p['epsilon']:.6g}, δ={p['delta']:.3g}) for the whole tuning, target {args.epsilon:g}")
    lines.append(f"model written to {args.out}")
    emit(args, out, "\n".join(lines))
    return 0


def cmd_auto(args: argparse.Namespace) -> int:
    from .auto import AutoInputs, auto_settings
    from .schema import Schema

    if args.rows < 1:
        raise CliError(f"--rows {args.rows}: the declared row count must be ≥ 1")
    if not args.epsilon > 0:
        raise CliError(f"--epsilon {args.epsilon:g}: must be > 0")
    schema = Schema.load(args.schema)
    choice = auto_settings(AutoInputs.for_schema(schema, args.epsilon, args.delta, args.rows))
    emit(args, choice.to_dict(), "\n".join([f"{k} = {v}" for k, v in choice.settings.items()]
                                           + [f"because: {r}" for r in choice.reasons]))
    return 0


def register(sub) -> None:
    from .sources import add_source_flags

    t = sub.add_parser("tune", help="private hyperparameter tuning around the auto settings (Papernot & Steinke "
                                    "2022); the receipt's ε covers every trial")
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
    t.add_argument("--seed", type=int, default=None, metavar="N", help="public seed of the held-out split (default: random)")
    t.add_argument("--sampler", choices=["ours", "opendp"], default="ours", help="exact noise sampler (default: ours)")
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.add_argument("--quiet", action="store_true",
                   help="no progress output, and one line for the result (errors and warnings still show)")
    add_source_flags(t)
    t.set_defaults(func=cmd_tune)

    a = sub.add_parser("auto", help="print the auto settings for public inputs (no data read; for plans)")
    a.add_argument("--schema", required=True, metavar="FILE", help="public schema (TOML)")
    a.add_argument("--epsilon", type=float, required=True, metavar="X", help="the training ε")
    a.add_argument("--delta", type=float, default=5e-8, metavar="X", help="δ (default: 5e-08)")
    a.add_argument("--rows", type=int, required=True, metavar="N", help="the public row count n")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.set_defaults(func=cmd_auto)
