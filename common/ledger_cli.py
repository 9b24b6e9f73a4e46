"""``fedsbdt ledger``: a data-protection officer's view of the lifetime ledger; central ``train``/``tune --ledger``.

``fedsbdt ledger --state DIR [--json] [--releases] [--lifetime-delta X]`` shows, per account (the site's
population, or one declared with ``--population``), its lifetime (ε, δ) at the lifetime δ and one line per
session (a federated plan, or a central run): when, how many releases of which purpose, its own ε and the
provenance of what it read (source and digest); ``--releases`` adds every release (common/lifetime.py).
Central ``fedsbdt train --ledger DIR`` and ``fedsbdt tune --ledger DIR`` check their run against
``--lifetime-epsilon`` before training and charge it before the model is written.
"""
from __future__ import annotations

import argparse
import math
import sqlite3
from dataclasses import dataclass

from .cli_base import CliError, emit
from .lifetime import (DEFAULT_LIFETIME_DELTA, DEFAULT_LIFETIME_EPSILON, DEFAULT_POPULATION, Lifetime, LifetimeError,
                       LifetimeLedger, RecordSource, check_lifetime_delta, check_population, event_to_json,
                       record_source, summary)


def _what(session: dict) -> str:
    parts = ", ".join(f"{k} {v}" if v > 1 else k for k, v in session["purposes"].items())
    n = session["releases"]
    return f"{n} release{'s' if n != 1 else ''} ({parts})"


def _source(src: dict) -> str:
    how = ("schema-1 ledger, ids " + ("taken since" if src["keyed"] else "not stored") if src["legacy"] else
           "by record id" if src["keyed"] else "by position")
    return f"{src['source']} (sha256 {src['content_sha256'][:16]}…, {src['records']} records, {how})"


def cmd_ledger(args: argparse.Namespace) -> int:
    try:
        delta = check_lifetime_delta(args.lifetime_delta)
        lt = LifetimeLedger(args.state, create=False)
    except LifetimeError as e:
        raise CliError(str(e)) from None
    try:
        out = summary(lt, delta, releases=args.releases)
    finally:
        lt.close()
    lines = [f"lifetime ledger {out['ledger']}: each account's lifetime ε at δ = {delta:g} (--lifetime-delta)"]
    for acct in out["populations"]:
        life = acct["lifetime"]
        declared = " (declared with --population)" if acct["declared"] else " (this site's records)"
        lines.append(f"population {acct['population']}{declared}: lifetime ε = {life['epsilon']:.6g} at δ = "
                     f"{life['delta']:g}, its worst record; {life['records']} records known by id, "
                     f"{len(acct['sessions'])} sessions, {life['releases']} releases")
        by_session: dict[str, list] = {}
        for r in acct.get("releases", []):
            by_session.setdefault(r["session"], []).append(r)
        for s in acct["sessions"]:
            who = f"plan {s['plan_sha256'][:16]}…" if s["plan_sha256"] else s["kind"]
            srcs = "; ".join(_source(x) for x in s["sources"])
            lines.append(f"  {s['first']}  {who}  {_what(s)}  ε = {s['epsilon']:.6g}  read {srcs}")
            for r in by_session.get(s["session"], []):
                where = "" if r["tree"] is None else f" tree {r['tree']}" + ("" if r["level"] is None else
                                                                             f" level {r['level']}")
                lines.append(f"      {r['when']}  {r['purpose']}{where}  {r['records']} records  "
                             f"ε = {r['epsilon']:.6g} at its δ = {r['delta']:.3g}")
    if not out["populations"]:
        lines.append("no releases yet")
    emit(args, out, "\n".join(lines))
    return 0


# --------------------------------------------------------------------------- central runs (train, tune)


@dataclass
class CentralRun:
    """A central run admitted to the lifetime ledger: where it will be charged, and with what."""

    ledger: LifetimeLedger
    state: str
    population: str
    delta: float
    source: RecordSource
    event: object
    release_delta: float


def check_flags(args) -> None:
    """``--population`` and ``--lifetime-delta`` of a central command, before anything is read (one line)."""
    try:
        check_population(args.population)
        check_lifetime_delta(args.lifetime_delta)
    except LifetimeError as e:
        raise CliError(str(e)) from None


def central_run(args, ids, id_column: str | None, event, release_delta: float) -> CentralRun | None:
    """``train/tune --ledger DIR``: the run, checked against ``--lifetime-epsilon`` (``event``, what it may cost a
    worst-case record, on every record it reads, in the population's one account; ``release_delta``: the run's own
    δ, recorded as provenance); None without ``--ledger``.  Refusal: one line, nothing written."""
    if not getattr(args, "ledger", None):
        return None
    from .sources import source_from_args

    try:
        population = check_population(args.population)
        delta = check_lifetime_delta(args.lifetime_delta)
        src: RecordSource = record_source(source_from_args(args), ids, id_column)
        lt = LifetimeLedger(args.ledger)
    except (LifetimeError, OSError) as e:
        raise CliError(str(e)) from None
    try:
        after = lt.lifetime(population, delta, extra=[(src, event)])
        now = lt.lifetime(population, delta)
    except BaseException:
        lt.close()
        raise
    refusal = _refusal(after, now, event, args, population, delta)
    if refusal is not None:
        lt.close()
        raise CliError(refusal)
    return CentralRun(lt, str(args.ledger), population, delta, src, event, float(release_delta))


def _refusal(after: Lifetime, now: Lifetime, event, args, population: str, delta: float) -> str | None:
    where = f"the records in {args.ledger} (population {population})"
    if math.isinf(after.epsilon):
        d = event_to_json(event)
        stated = (f"stated only as (ε, δ) = ({d['epsilon']:.6g}, {d['delta']:.3g}), without an RDP curve"
                  if d["type"] == "approx" else "composed")
        return (f"this run is {stated}: with the earlier such runs it would spend δ = {after.approx_delta:.3g} of "
                f"{where}, not less than --lifetime-delta {delta:g}; nothing was trained (a smaller --delta, or a "
                "larger --lifetime-delta if your data-protection officer agrees)")
    if after.epsilon > args.lifetime_epsilon:
        return (f"this run would bring the lifetime ε of {where} to {after.epsilon:.6g} at --lifetime-delta "
                f"{delta:g} (now {now.epsilon:.6g}: `fedsbdt ledger --state {args.ledger}`), above --lifetime-epsilon "
                f"{args.lifetime_epsilon:g}; nothing was trained")
    return None


def charge_central(run: CentralRun | None, purpose: str, event=None) -> dict | None:
    """Charge a central run (``event``: what it finally cost, if other than admitted) to every record it read —
    committed before its model is written; returns the account's lifetime after it (for the run's output)."""
    if run is None:
        return None
    try:  # the record set is registered only now, with the run's release (nothing for a run that never ends)
        key = run.ledger.record_set(run.population, run.source)
        run.ledger.charge(key, purpose, run.event if event is None else event, run.release_delta)
        life = run.ledger.lifetime(run.population, run.delta)
    except (LifetimeError, sqlite3.Error) as e:
        raise CliError(f"{run.state}: the lifetime ledger could not record this run ({e}); the model was not "
                       "written") from None
    finally:
        run.ledger.close()
    return {"population": run.population, "epsilon": life.epsilon, "delta": life.delta}


def lifetime_line(life: dict | None, state: str | None) -> str:
    if life is None:
        return ""
    return (f"\nlifetime ε of population {life['population']}: {life['epsilon']:.6g} at δ = {life['delta']:g} "
            f"(`fedsbdt ledger --state {state}`)")


def add_ledger_flags(t, what: str = "train") -> None:
    """``--ledger``, ``--lifetime-epsilon``, ``--lifetime-delta`` and ``--population`` of a central command."""
    t.add_argument("--ledger", metavar="DIR",
                   help=f"charge this {what} run to the lifetime ledger in DIR (a site's state directory: its "
                        "federated plans, evaluations and other central runs on the same population compose with "
                        "it, whatever file or query they read; `fedsbdt ledger --state DIR`) (default: none: the run "
                        "is not charged to a lifetime ledger)")
    add_lifetime_flags(t, "refuse to train if the population's lifetime ε (its worst record) would exceed X",
                       "a release's", condition="with --ledger: ")


def add_lifetime_flags(g, refuse: str, whose_delta: str, condition: str = "") -> None:
    """``--lifetime-epsilon`` (``refuse``: what exceeding it stops), ``--lifetime-delta`` (never ``whose_delta``
    own δ) and ``--population``, for a central run's ledger (``condition``: which flag they need) and the site
    daemon (client/cli.py)."""
    g.add_argument("--lifetime-epsilon", type=float, default=DEFAULT_LIFETIME_EPSILON, metavar="X",
                   help=f"{condition}{refuse} (default: {DEFAULT_LIFETIME_EPSILON:g})")
    g.add_argument("--lifetime-delta", type=float, default=DEFAULT_LIFETIME_DELTA, metavar="X",
                   help=f"{condition}the δ at which the lifetime ε is computed (never {whose_delta} own δ) "
                        f"(default: {DEFAULT_LIFETIME_DELTA:g})")
    g.add_argument("--population", default=DEFAULT_POPULATION, metavar="NAME",
                   help=f"{condition}charge the account of this declared population, disjoint from the site's "
                        f"other records (default: {DEFAULT_POPULATION}, the site's one account)")

def register(sub) -> None:
    g = sub.add_parser("ledger", help="every session that released from a state directory's records, and each "
                                      "population's lifetime (ε, δ)")
    g.add_argument("--state", required=True, metavar="DIR", help="a site's state directory (or a train --ledger DIR)")
    g.add_argument("--releases", action="store_true",
                   help="list every release under its session (default: one line per session)")
    g.add_argument("--lifetime-delta", type=float, default=DEFAULT_LIFETIME_DELTA, metavar="X",
                   help=f"the δ at which lifetime and session ε are computed (default: {DEFAULT_LIFETIME_DELTA:g})")
    g.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    g.set_defaults(func=cmd_ledger)
