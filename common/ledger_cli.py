"""``fedsbdt ledger``: a data-protection officer's view of the lifetime ledger, and central ``train --ledger``.

``fedsbdt ledger --state DIR [--json]`` lists, per dataset (its identity: content digest and record-id
digest), every release — when, the plan's hash, the purpose, the records it read and its ε at its δ — and
the dataset's lifetime (ε, δ) (common/lifetime.py).  Central ``fedsbdt train --ledger DIR`` checks its run
against ``--lifetime-epsilon`` before training and charges it (as its (ε, δ)) before the model is written.
"""
from __future__ import annotations

import argparse

from .cli import CliError, emit
from .lifetime import DEFAULT_LIFETIME_EPSILON, LifetimeError, LifetimeLedger, data_identity, summary


def cmd_ledger(args: argparse.Namespace) -> int:
    try:
        lt = LifetimeLedger(args.state, create=False)
    except LifetimeError as e:
        raise CliError(str(e)) from None
    try:
        out = summary(lt)
    finally:
        lt.close()
    lines = [f"lifetime ledger {out['ledger']}"]
    for ds in out["datasets"]:
        life = ds["lifetime"]
        lines.append(f"dataset {ds['key'][:16]}… ({ds['source']}, {ds['records']} records, content "
                     f"{ds['content_sha256'][:16]}…): lifetime ε = {life['epsilon']:.6g} at δ = {life['delta']:.3g}, "
                     f"{len(ds['releases'])} releases")
        for r in ds["releases"]:
            where = "" if r["tree"] is None else f" tree {r['tree']}" + ("" if r["level"] is None else
                                                                         f" level {r['level']}")
            plan = "central run" if r["plan_sha256"] is None else f"plan {r['plan_sha256'][:16]}…"
            lines.append(f"  {r['when']}  {plan}  {r['purpose']}{where}  {r['records']} records  "
                         f"ε = {r['epsilon']:.6g} at δ = {r['delta']:.3g}")
    emit(args, out, "\n".join(lines))
    return 0


def central_run(args, data_path: str, ids, epsilon: float, delta: float):
    """``train --ledger DIR``: (ledger, dataset key) after checking ``--lifetime-epsilon``; None without --ledger."""
    if not getattr(args, "ledger", None):
        return None
    try:
        lt = LifetimeLedger(args.ledger)
        from .sources import source_from_args

        key = lt.dataset("train", data_identity(source_from_args(args)), ids)
        after = lt.lifetime(key, {"type": "approx", "epsilon": epsilon, "delta": delta})
    except (LifetimeError, OSError) as e:
        raise CliError(str(e)) from None
    if after.epsilon > args.lifetime_epsilon:
        lt.close()
        raise CliError(f"this run would bring the lifetime ε of {data_path} to {after.epsilon:.6g} (now "
                       f"{lt_epsilon(args.ledger, key):.6g}: `fedsbdt ledger --state {args.ledger}`), above "
                       f"--lifetime-epsilon {args.lifetime_epsilon:g}; nothing was trained")
    return lt, key


def lt_epsilon(state, key) -> float:
    lt = LifetimeLedger(state)
    try:
        return lt.lifetime(key).epsilon
    finally:
        lt.close()


def charge_central(run, epsilon: float, delta: float) -> None:
    """Charge a central run's (ε, δ) — the whole receipt, the auto row count included — to every record
    (before its model is written)."""
    if run is None:
        return
    lt, key = run
    try:
        lt.charge(key, "train", {"type": "approx", "epsilon": float(epsilon), "delta": float(delta)}, float(delta))
    finally:
        lt.close()


def add_train_flags(t) -> None:
    t.add_argument("--ledger", metavar="DIR",
                   help="charge this run to the lifetime ledger in DIR (a site's state directory: its federated "
                        "plans and evaluations on the same file compose with it; `fedsbdt ledger --state DIR`) "
                        "(default: none: the run is not charged to a lifetime ledger)")
    t.add_argument("--lifetime-epsilon", type=float, default=DEFAULT_LIFETIME_EPSILON, metavar="X",
                   help="with --ledger: refuse to train if the data's lifetime ε would exceed X "
                        f"(default: {DEFAULT_LIFETIME_EPSILON:g})")


def register(sub) -> None:
    g = sub.add_parser("ledger", help="every release made from a state directory's data and its lifetime (ε, δ)")
    g.add_argument("--state", required=True, metavar="DIR", help="a site's state directory (or a train --ledger DIR)")
    g.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    g.set_defaults(func=cmd_ledger)
