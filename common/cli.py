"""The ``fedsbdt`` command line (design.md "Command line" — a contract other tools rely on).

``--json`` prints exactly one JSON object on stdout and nothing else there;
human-readable output and progress go to stderr.  Expected failures (bad
input, impossible privacy parameters) exit with status 2 and one clear line.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import sys
import threading
from typing import Any

from fedsbdt import __version__

from fedsbdt.common import modes

# the helpers every command module shares (re-exported: CliError, emit, … are part of this module's API)
from .cli_base import EXIT_USAGE, CliError, Progress, emit, with_state_lock  # noqa: F401
from .cli_base import load_data as _load_data
from .config import CANDIDATE_PLACEMENTS, SAMPLERS, SELECTIONS, ConfigError, Hyperparameters, builder_defaults


# --------------------------------------------------------------------------- hyperparameter flags

_HELP = {
    "epsilon": "total privacy budget ε of the released model",
    "delta": "δ of the (ε, δ) guarantee",
    "trees": "T_regular: accounted boosting rounds",
    "extra_trees": "T_extra: extra rounds (free with --filter, accounted otherwise)",
    "depth": "tree depth d (2^d leaves)",
    "subsample": "γ: Poisson subsampling rate per tree",
    "learning_rate": "η",
    "l2": "λ: leaf regularisation",
    "leaf_clip": "β: leaf values are clamped to [−β, β]",
    "grad_clip": "g*: gradient clip",
    "hess_clip": "h*: Hessian clip (default: 1 for regression, 0.25 for binary and multiclass)",
    "label_clip": "m*: label clip of the initial score",
    "r1": "Hessian share of the leaf noise budget (r2 = 1 − r1)",
    "init_share": "ε_init/ε: share of ε for the initial score (0 disables it)",
    "eps_ds": "ε_ds: budget for the dataset size of the initial score",
    "accountant": "rdp (paper; needed by --filter), pld (dp-accounting, tighter) or, for sarus trees, pure "
                  "(the Sarus paper's pure-DP composition, δ = 0)",
    "filter": "individual Rényi filter (extra rounds reuse unspent budget)",
    "cyclical": "cyclical feature interactions: one feature per tree, in turn (--no-cyclical when features interact)",
    "split_candidates": "N equidistant threshold candidates (0 = uniform over the range)",
    "seed": "public seed of the random splits (never used for noise or subsampling) (default: random)",
    "scale_bits": "fixed-point scale 2^k",
    "min_child_weight": "sarus: N, the child-weight clamp of gains and leaves (paper: 50)",
    "selection_share": "greedy: share of the trees' budget for node selection (rest: leaf release)",
    "selection": "greedy: exponential (mechanism on exact gains) or histogram (arg max of noisy histograms)",
    "sketch_share": "greedy: budget share of the adaptive Hessian sketch (0 = uniform grid; paper 0.1)",
    "ensemble_trees": "dpboost: T_e, trees per ensemble (0 = all trees in one ensemble)",
    "candidate_placement": "numeric split candidates: schema (equidistant, or the schema's scale/cuts; free) or "
                           "quantile (DP quantiles of the records, central random trees; docs/data-sources.md)",
    "candidate_share": "quantile: ε_c/ε, the share of ε for the quantile histograms",
}


def add_hyperparameter_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hyperparameters (plan keys with '-' for '_'; the defaults shown are the paper's, "
                             "which --settings auto (train, plan, demo) replaces for the keys not given)")
    defaults = Hyperparameters()
    for f in dataclasses.fields(Hyperparameters):
        flag = "--" + f.name.replace("_", "-")
        d = getattr(defaults, f.name)
        help_ = _HELP.get(f.name, f.name)
        if "(default" not in help_:
            help_ += f" (default: {d})"
        if f.type == "bool":
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif f.name == "accountant":
            g.add_argument(flag, dest=f.name, choices=["rdp", "pld", "pure"], default=None, help=help_)
        elif f.name == "tree_builder":
            g.add_argument(flag, dest=f.name, choices=list(modes.tree_builders()), default=None,
                           help=tree_builder_help(d))
        elif f.name == "selection":
            g.add_argument(flag, dest=f.name, choices=list(SELECTIONS), default=None, help=help_)
        elif f.name == "candidate_placement":
            g.add_argument(flag, dest=f.name, choices=list(CANDIDATE_PLACEMENTS), default=None, help=help_)
        elif f.type in ("int", "int | None"):
            g.add_argument(flag, dest=f.name, type=int, default=None, metavar="N", help=help_)
        else:
            g.add_argument(flag, dest=f.name, type=float, default=None, metavar="X", help=help_)


def tree_builder_help(default: str) -> str:
    """``--tree-builder``'s help: every registered tree builder with its summary (the registry is the source)."""
    return "; ".join(f"{name}: {m.summary}" + (" (its own defaults for keys not given)" if m.defaults else "")
                     for name, m in modes.tree_builders().items()) + f" (default: {default})"


def add_settings_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--settings", choices=["auto", "paper"], default="auto",
                   help="auto (default): settings that follow ε, the task, the features and n for random trees "
                        "(docs/auto.md); paper: the S-BDT paper's defaults shown below (also what any other "
                        "--tree-builder takes, with its own defaults). Any hyperparameter flag overrides either")
    p.add_argument("--rows", type=int, default=None, metavar="N",
                   help="declare the row count n public for auto (default: a DP count at 2%% of ε)")


def given_hyperparameters(args: argparse.Namespace) -> dict[str, Any]:
    """The hyperparameter flags the user set (plan keys)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(Hyperparameters)
            if getattr(args, f.name, None) is not None}


def hyperparameters_from_args(args: argparse.Namespace, base: Hyperparameters | None = None) -> Hyperparameters:
    base = base or Hyperparameters()
    return base.replace(**builder_defaults(given_hyperparameters(args)))


# --------------------------------------------------------------------------- commands


def settings_mode(args: argparse.Namespace, given: dict[str, Any]) -> str:
    """``auto`` is fitted for S-BDT's random trees: a run that names another builder (greedy, DPBoost, Sarus)
    takes that builder's own defaults, as with ``--settings paper``."""
    mode = getattr(args, "settings", "paper")
    return "paper" if given.get("tree_builder", modes.DEFAULT) != modes.DEFAULT else mode


def auto_hyperparameters(args: argparse.Namespace, schema, n: int, randomness) -> tuple[Hyperparameters, Any, float]:
    """``--settings auto`` (default): the rule of common/auto.py fills every key not given; n is ``--rows`` if
    declared, else a discrete-Laplace count at ROWS_SHARE·ε (returned as its ε, spent from the total)."""
    from .auto import resolve, rows_epsilon

    given = given_hyperparameters(args)
    mode = settings_mode(args, given)
    total = float(given.get("epsilon", Hyperparameters.epsilon))
    eps_rows, rows, source = 0.0, getattr(args, "rows", None), "declared"
    if mode == "auto" and rows is None:
        import numpy as np

        eps_rows = rows_epsilon(total)
        noise = int(randomness.discrete_laplace(np.array([1.0 / eps_rows]))[0])
        rows, source = max(n + noise, 1), "dp-count"
    keys, choice = resolve({**given, "epsilon": total - eps_rows}, schema, rows, source, mode)
    return Hyperparameters.from_dict(keys), choice, eps_rows


def add_rows_receipt(model, eps_rows: float, total: float) -> None:
    """The DP row count of ``auto`` in the receipt: pure ε_rows-DP, composed by adding ε (basic composition)."""
    if eps_rows <= 0:
        return
    p = model.privacy
    p["eps_rows"] = eps_rows
    p["epsilon"] = p["epsilon"] + eps_rows
    p["target_epsilon"] = total
    p["guarantee"] = (f"({p['epsilon']:.6g}, {p['delta']:.3g})-differential privacy for every record "
                      "(add/remove one record), covering the row count of the auto settings, the initial score"
                      + (", the quantile split candidates" if p.get("eps_candidates", 0) > 0 else "")
                      + " and all released trees")


def cmd_train(args: argparse.Namespace) -> int:
    from .engine import calibration_for, train
    from .files import check_output_path
    from .randomness import SecureRandomness
    from .schema import Schema

    check_output_path(args.out, "model")  # before any work (and before any privacy is spent)
    from .ledger_cli import check_flags

    check_flags(args)  # --population, --lifetime-delta
    schema = Schema.load(args.schema)
    if getattr(args, "rows", None) is not None and args.rows < 1:
        raise CliError(f"--rows {args.rows}: the declared row count must be ≥ 1")
    given = given_hyperparameters(args)
    if settings_mode(args, given) == "auto":  # fail fast on an impossible budget before the data is read
        from .auto import resolve

        calibration_for(Hyperparameters.from_dict(resolve(given, schema, args.rows or 1)[0]))
    randomness = SecureRandomness(sampler=args.sampler)
    ds = _load_data(args, schema)
    hp, choice, eps_rows = auto_hyperparameters(args, schema, ds.n, randomness)
    cal = calibration_for(hp)  # fail fast on impossible budgets, before any work
    from .ledger_cli import central_run, charge_central, lifetime_line
    from .lifetime import central_event

    # --ledger: the lifetime cap first (the run's RDP events where its receipt has them, else its (ε, δ))
    run = central_run(args, ds.ids, schema.id_column, central_event(hp, cal, eps_rows), cal.delta)
    quiet = args.quiet or (args.json and getattr(args, "log_format", "text") != "json")
    prog = Progress("train", hp.total_rounds, quiet=quiet, extra=f"ε={cal.epsilon + eps_rows:.4g}",
                    fields={"epsilon": cal.epsilon + eps_rows})
    try:
        res = train(ds, hp, randomness, progress=prog)
    finally:
        prog.close()
    add_rows_receipt(res.model, eps_rows, hp.epsilon + eps_rows)
    if choice is not None:
        res.model.training["settings"] = {"mode": "auto", **choice.to_dict()}
    life = charge_central(run, "train")  # committed before the model is written
    res.model.save(args.out)
    p = res.model.privacy
    out = {"epsilon": p["epsilon"], "delta": p["delta"], "sigma": p["sigma"], "alpha": p["alpha"],
           "trees": len(res.model.trees), "seconds": round(res.seconds, 4), "rows": ds.n, "dropped": ds.dropped,
           "model": str(args.out), "settings": settings_mode(args, given), "hyperparameters": hp.to_dict()}
    if choice is not None:
        out["auto"] = choice.to_dict()
    if life is not None:
        out["lifetime"] = life
    if hp.filter:
        from .engine import filter_for
        from .rdp_filter import exhausted_share

        out["filter_budget_reached"] = exhausted_share(res.local.spent, filter_for(hp, cal))
    noise = f" σ={p['sigma']:.6g}" if p["sigma"] > 0 else ""  # DPBoost and Sarus release with Laplace noise
    why = ""
    if choice is not None:
        s = hp
        why = (f"\nauto settings: {s.trees} trees, depth {s.depth}, γ={s.subsample:g}, η={s.learning_rate:g}, "
               f"{'cyclical' if s.cyclical else 'not cyclical'}, {s.tree_builder} trees\n  because: "
               + "\n  because: ".join(choice.reasons))
    if args.quiet:  # the result, one line: no settings, no reasons (errors and warnings still come)
        emit(args, out, f"trained {len(res.model.trees)} trees on {ds.n} rows{dropped_text(ds.dropped)}: "
                        f"(ε={p['epsilon']:.6g}, δ={p['delta']:.3g})-DP; model written to {args.out}")
        return 0
    emit(args, out, f"trained {len(res.model.trees)} trees on {ds.n} rows{dropped_text(ds.dropped)} in "
                    f"{res.seconds:.2f}s\n"
                    f"privacy: (ε={p['epsilon']:.6g}, δ={p['delta']:.3g}) accountant={p['accountant']}{noise} "
                    f"{hp.tree_builder} trees{why}\nmodel written to {args.out}"
                    + lifetime_line(life, getattr(args, "ledger", None)))
    return 0


def evaluate_model(model, ds) -> dict[str, Any]:
    from .metrics import accuracy, auc, rmse

    pred = model.predict(ds.X)
    if model.task == "multiclass":
        from .multiclass import evaluate
        return evaluate(ds.y, pred)
    if model.task == "regression":
        return {"n": ds.n, "rmse": rmse(ds.y, pred)}
    return {"n": ds.n, "auc": auc(ds.y, pred), "accuracy": accuracy(ds.y, pred)}


def dropped_text(dropped: int) -> str:
    """`` (N rows with a missing value dropped)``, or nothing (train, evaluate, predict and demo say it alike)."""
    from .data import rows

    return f" ({rows(dropped)} with a missing value dropped)" if dropped else ""


def baseline(model, ds) -> dict[str, Any]:
    """What a model must beat on ``ds``: the best constant prediction for these very labels (an optimistic
    baseline: it knows the file's label mean / majority class).  Regression: the mean predictor's RMSE;
    binary and multiclass: the majority class's accuracy (AUC 0.5)."""
    import numpy as np

    y = np.asarray(ds.y, dtype=np.float64)
    if model.task == "regression":
        return {"predictor": "mean", "value": float(y.mean()), "rmse": float(np.sqrt(np.mean((y - y.mean()) ** 2)))}
    if model.task == "multiclass":
        counts = np.bincount(y.astype(np.int64), minlength=len(model.schema.classes))
        k = int(counts.argmax())
        return {"predictor": "majority class", "value": model.schema.classes[k], "accuracy": float(counts[k] / y.size)}
    positive = float(y.mean())
    label = model.schema.positive[0] if positive > 0.5 else model.schema.negative[0]
    return {"predictor": "majority class", "value": label, "accuracy": max(positive, 1.0 - positive), "auc": 0.5}


def beats_baseline(res: dict[str, Any], base: dict[str, Any]) -> bool:
    """A lower RMSE than the mean predictor, or a higher accuracy than the majority class (strictly)."""
    if "rmse" in base:
        return res["rmse"] < base["rmse"]
    return res["accuracy"] > base["accuracy"]


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .model import Ensemble

    model = Ensemble.load(args.model)
    ds = _load_data(args, model.schema)
    res = evaluate_model(model, ds)
    base = baseline(model, ds)
    beats = beats_baseline(res, base)
    human = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items())
    human += dropped_text(ds.dropped)
    metric = "rmse" if "rmse" in base else "accuracy"
    human += (f"\nbaseline: always predicting the {base['predictor']} ({base['value']:.6g})" if metric == "rmse"
              else f"\nbaseline: always predicting the {base['predictor']} {base['value']!r}")
    human += f" gives {metric}={base[metric]:.6g}"
    if not beats:
        human += f"\nthe model does not beat this baseline ({metric} {res[metric]:.6g} vs {base[metric]:.6g})"
    emit(args, {**res, "dropped": ds.dropped, "baseline": base, "beats_baseline": beats}, human)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    import pandas as pd

    from .files import check_output_path, write_atomic
    from .model import Ensemble

    check_output_path(args.out, "predictions")
    model = Ensemble.load(args.model)
    if args.threshold is not None and model.task != "binary":
        raise CliError(f"--threshold is for binary models (this model's task is {model.task})")
    threshold = 0.5 if args.threshold is None else args.threshold
    if not 0.0 <= threshold <= 1.0:
        raise CliError(f"--threshold {threshold:g}: must be a probability in [0, 1]")
    keep = kept_columns(args.keep)
    outputs = ["prediction"] + (["probability"] if model.task == "binary" else
                                [f"probability_{k}" for k in model.schema.classes])
    for c in keep:
        if c in outputs:
            raise CliError(f"--keep {c!r}: the predictions file has a column {c!r} already")
    ds, id_col = _load_for_prediction(args, model.schema, keep)
    pred = model.predict(ds.X)
    frame = pd.DataFrame({id_col: ds.id_values} if id_col else {"id": ds.ids})
    for c, values in ds.carried:  # --keep: input columns as written, beside the id
        if c in frame.columns:
            raise CliError(f"--keep {c!r}: the predictions file has a column {c!r} already (the id)")
        frame[c] = values
    if model.task == "regression":
        frame["prediction"] = pred
    elif model.task == "multiclass":
        for k, c in enumerate(model.schema.classes):
            frame[f"probability_{c}"] = pred[:, k]
        frame["prediction"] = [model.schema.classes[k] for k in pred.argmax(axis=1)]
    else:
        frame["probability"] = pred
        schema = model.schema  # the schema's own labels (e.g. yes/no, >50K/<=50K), not 0/1
        frame["prediction"] = [schema.positive[0] if q >= threshold else schema.negative[0] for q in pred]
    write_atomic(args.out, frame.to_csv(index=False), "predictions")
    out = {"n": ds.n, "dropped": ds.dropped, "out": str(args.out), "id": id_col or "row number"}
    if keep:
        out["kept"] = list(keep)
    if model.task == "binary":
        out["threshold"] = threshold
    emit(args, out, f"wrote {ds.n} predictions to {args.out}{dropped_text(ds.dropped)}"
                    + ("" if id_col else " (id: the data row number from 0)"))
    return 0


def kept_columns(given: list[str] | None) -> tuple[str, ...]:
    """``--keep a,b --keep c`` → ("a", "b", "c"): input columns copied into the predictions file."""
    names = [c.strip() for flag in given or () for c in flag.split(",")]
    if any(not c for c in names):
        raise CliError("--keep takes column names separated by commas, e.g. --keep age,sex")
    return tuple(dict.fromkeys(names))


def _load_for_prediction(args: argparse.Namespace, schema, keep: tuple[str, ...] = ()):
    """(dataset, id column) of the records to predict (with the ``keep`` columns carried along): the schema's id
    column if the data has it; data without it is read by row number (id column None)."""
    from .data import DataError
    from .records import load
    from .sources import source_from_args

    path = source_from_args(args)
    try:
        return load(path, schema, labels=False, carry=keep), schema.id_column  # the label column may be absent
    except DataError as e:
        if schema.id_column is None:
            raise
        first = e
    no_id = dataclasses.replace(schema, id_column=None,
                                columns=tuple(c for c in schema.columns if c != schema.id_column))
    try:
        return load(path, no_id, labels=False, carry=keep), None
    except DataError:
        raise first from None


def cmd_account(args: argparse.Namespace) -> int:
    from .engine import calibration_for
    from .federation.tuning import is_tuning_plan

    if getattr(args, "plan", None) is not None and is_tuning_plan(args.plan):
        return _account_tuning(args)
    plan = _account_plan(args)  # `--plan`: what the federation's parties compute for it (None: flags)
    hp = hyperparameters_from_args(args) if plan is None else plan.hyperparameters
    cal = calibration_for(hp) if plan is None else plan.verify_privacy()  # refuses a σ or ε the plan misstates
    mode = modes.training_mode(hp)
    res = {"sigma": cal.sigma, "alpha": cal.alpha, "rho": cal.rho, "epsilon": cal.epsilon, "delta": cal.delta,
           "accountant": cal.accountant, "rounds": cal.rounds, "eps_init": cal.eps_init, "eps_ds": cal.eps_ds,
           "tree_builder": hp.tree_builder, "eps_select": cal.eps_select, "sigma_select": cal.sigma_select,
           "sigma_sketch": cal.sigma_sketch}
    gaussian = mode.gaussian_leaves(federated=plan is not None)  # Laplace leaves: no σ_leaf or ρ
    human = (f"accountant   {cal.accountant}\n"
             + (f"sigma        {cal.sigma:.6g}   (unweighted leaf noise σ_leaf)\n" if gaussian else "")
             + (f"alpha        {cal.alpha}   (RDP order α̂)\n" if cal.accountant == "rdp" else "")
             + (f"rho          {cal.rho:.6g}   (per-record RDP budget ρ(α̂) of the trees)\n"
                if gaussian and cal.accountant == "rdp" else "")
             + f"epsilon      {cal.epsilon:.6g}   (achieved, target {hp.epsilon:g}; δ = {cal.delta:.3g})\n"
             f"rounds       {cal.rounds} accounted trees, γ = {cal.gamma:g}, {hp.tree_builder} trees")
    human = mode.account(hp, cal, plan is not None, res, human)
    emit(args, res, human)
    return 0


def _account_tuning(args: argparse.Namespace) -> int:
    """``fedsbdt account --plan TUNING``: every trial's ε and the composed totals, recomputed (a misstated tuning
    plan is refused like a misstated plan)."""
    from .cli_tune import settings_line
    from .federation.tuning import FederatedTuning

    _no_hyperparameter_flags(args)
    t = FederatedTuning.load(args.plan)
    trials = [{"plan_sha256": p.sha256, "epsilon_eval": p.eval_epsilon, **t.settings(i)} for i, p in enumerate(t.trials)]
    emit(args, {"epsilon": t.stated_epsilon, "epsilon_eval": t.stated_epsilon_eval, "delta": t.delta,
                "trials": trials, "tuning_plan_sha256": t.sha256},
         "\n".join(f"trial {i + 1}     ε = {x['epsilon']:.6g}, ε_eval = {x['epsilon_eval']:.6g}   ({settings_line(x)})"
                   for i, x in enumerate(trials))
         + f"\nall trials   ε = {t.stated_epsilon:.6g} (training records), ε_eval = {t.stated_epsilon_eval:.6g} "
           f"(held-out records); δ = {t.delta:.3g}; composed (RDP), the coordinator sees every trial")
    return 0


def _no_hyperparameter_flags(args: argparse.Namespace) -> None:
    given = [f.name for f in dataclasses.fields(Hyperparameters) if getattr(args, f.name, None) is not None]
    if given:
        raise CliError(f"--plan takes the hyperparameters from the plan; drop --{given[0].replace('_', '-')}")


def _account_plan(args: argparse.Namespace):
    """The plan of ``fedsbdt account --plan`` (its hyperparameters replace the flags), or None."""
    if getattr(args, "plan", None) is None:
        return None
    _no_hyperparameter_flags(args)
    from .federation.plan import Plan

    return Plan.load(args.plan)


# --------------------------------------------------------------------------- parser


def base_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The ``fedsbdt`` parser without commands (``--version``, ``--log-format``, ``--log-level``) and its
    sub-parsers, to which each command module's ``register`` adds its commands (:func:`fedsbdt.cli.build_parser`
    composes them)."""
    p = argparse.ArgumentParser(prog="fedsbdt", description=(
        "Federated, differentially private gradient-boosted decision trees (S-BDT)."))
    p.add_argument("--version", action="version", version=f"fedsbdt {__version__}")
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="stderr log lines as text or as JSON objects (ts, level, logger, msg, fields) "
                        "(default: text)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info",
                   help="least severe log level shown (progress lines are info) (default: info)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    return p, sub


def register(sub) -> None:
    """``fedsbdt train``, ``evaluate``, ``predict`` and ``account``: one local file, central noise."""
    from .ledger_cli import add_ledger_flags
    from .sources import add_source_flags

    t = sub.add_parser("train", help="train a DP model on one local file (central noise)")
    t.add_argument("--data", required=True, metavar="SOURCE",
                   help="CSV or Parquet file described by the schema, or a database URL with --query "
                        "(docs/data-sources.md)")
    t.add_argument("--schema", required=True, metavar="FILE",
                   help="public schema (TOML), e.g. examples/abalone/schema.toml")
    t.add_argument("--out", required=True, metavar="FILE", help="where to write the model (JSON)")
    t.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    t.add_argument("--quiet", action="store_true",
                   help="no progress output, and one line for the result (errors and warnings still show)")
    t.add_argument("--sampler", choices=SAMPLERS, default="ours",
                   help="exact noise sampler: ours (default) or opendp (~30x slower)")
    add_source_flags(t)
    add_settings_flags(t)
    add_hyperparameter_flags(t)
    add_ledger_flags(t, "train")
    t.set_defaults(func=cmd_train, on_interrupt="no model was written and nothing was released; run the same "
                                                 "command again to train")

    e = sub.add_parser("evaluate", help="rmse (regression), auc/accuracy (binary) or accuracy/macro_auc/log_loss "
                                        "(multiclass) of a model on a file")
    e.add_argument("--model", required=True, metavar="FILE", help="model file written by train (JSON)")
    e.add_argument("--data", required=True, metavar="SOURCE",
                   help="labelled CSV or Parquet file in the model's schema (the label column is required), or a "
                        "database URL with --query")
    e.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_source_flags(e)
    e.set_defaults(func=cmd_evaluate)

    pr = sub.add_parser("predict", help="write predictions for a file as CSV (id, [probability,] prediction)")
    pr.add_argument("--model", required=True, metavar="FILE", help="model file written by train (JSON)")
    pr.add_argument("--data", required=True, metavar="SOURCE",
                    help="CSV or Parquet file in the model's schema, with or without the label column, or a "
                         "database URL with --query")
    pr.add_argument("--out", required=True, metavar="FILE",
                    help="where to write the predictions (CSV: the schema's id column, or the data row number "
                         "from 0 as 'id' when the schema or the file has none; then 'probability' for binary "
                         "tasks, 'probability_<class>' per class for multiclass tasks, and 'prediction', the "
                         "schema's label)")
    pr.add_argument("--keep", action="append", metavar="COLUMNS",
                    help="copy these input columns (names separated by commas; as written) into the predictions "
                         "file, after the id; repeatable (default: none)")
    pr.add_argument("--threshold", type=float, metavar="X",
                    help="binary models: predict the positive label when its probability is at least X "
                         "(default: 0.5)")
    pr.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_source_flags(pr)
    pr.set_defaults(func=cmd_predict)

    a = sub.add_parser("account", help="noise scale and privacy accounting for hyperparameters (no data needed)")
    a.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.add_argument("--plan", metavar="FILE",
                   help="account this federated plan's hyperparameters as its federation releases them "
                        "(instead of the hyperparameter flags; checks the plan's stated σ and ε) (default: none: "
                        "the flags)")
    add_hyperparameter_flags(a)
    a.set_defaults(func=cmd_account)



def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``parser`` (the composed one, :func:`fedsbdt.cli.build_parser`), set up logging and
    run the chosen command: an expected failure is one line and exit status 2, an interrupt exit status 130."""
    args = parser.parse_args(argv)
    from .logging_setup import configure_logging

    log = configure_logging(args.log_format, args.log_level)
    with sigterm_as_interrupt():
        return _run(args, log)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (``docker stop``, podman, systemd) interrupts the command as SIGINT (Ctrl-C) does: Python raises
    KeyboardInterrupt in the main thread, every command stops the way it stops on Ctrl-C (durable state,
    exit 130, one line saying how to resume).  Only in the main thread; the old handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def interrupted_line(args: argparse.Namespace) -> str:
    """The one line printed when a command is stopped by SIGINT or SIGTERM: how to resume it."""
    hint = getattr(args, "on_interrupt", None) or "run the command again"
    return f"fedsbdt {args.command}: interrupted; " + hint.format(**vars(args))


def caused_by_interrupt(e: BaseException | None) -> bool:
    """A KeyboardInterrupt (Ctrl-C, or SIGTERM turned into one), also when it surfaced inside a numba dispatcher:
    an interrupt that lands while numba unpickles a compiled function comes out as a SystemError caused by it."""
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        e = e.__cause__ or e.__context__
    return False


def _run(args: argparse.Namespace, log: logging.Logger) -> int:
    from .accountant import AccountingError
    from .data import DataError
    from .files import OutputError
    from .fixedpoint import FixedPointError
    from .model import ModelError
    from .schema import SchemaError

    try:
        return int(args.func(args) or 0)
    except (CliError, ConfigError, DataError, SchemaError, ModelError, AccountingError, FixedPointError, OutputError,
            FileNotFoundError, PermissionError, IsADirectoryError) as e:
        if args.log_format == "json":
            log.error(f"fedsbdt {args.command}: error: {e}", extra={"command": args.command, "exit": EXIT_USAGE})
        else:
            print(f"fedsbdt {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyboardInterrupt, SystemError) as e:
        if not caused_by_interrupt(e):
            raise
        if args.log_format == "json":
            log.warning(interrupted_line(args), extra={"event": "interrupted", "command": args.command, "exit": 130})
        else:
            print(interrupted_line(args), file=sys.stderr)
        return 130

