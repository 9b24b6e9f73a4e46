"""``fedsbdt client`` (one per hospital) and ``fedsbdt keygen``, registered by :mod:`fedsbdt.cli`.

    fedsbdt keygen --site ID --out DIR
    fedsbdt client --coordinator ADDR --site ID --data F (--plan P | --plan-hash H) [--state DIR]
                   [--max-epsilon E] [--lifetime-epsilon X] [--lifetime-delta X] [--population NAME]
                   [--allow-central-noise] [--min-sites N] [--min-threshold T]
                   [--min-colluders C] [--schema S] [--out M]
                   [--tls-cert F --tls-key F --tls-ca F --identity-key F | --insecure]
                   [--status-port PORT [--status-host HOST]]

The plan is always pinned (``--plan`` or ``--plan-hash``, received out of
band): without one the client exits 2 before any network traffic.  The other
policy flags refuse a served plan (one line, exit 2, nothing joined, no
ledger written) in central noise mode unless ``--allow-central-noise``, or
with fewer sites, a lower threshold or fewer assumed colluders than the site
accepts.

Key files default to the state directory (``identity.key``, ``tls.crt``,
``tls.key``, ``ca.crt``), which is where ``fedsbdt keygen --out`` and
``fedsbdt ca sign`` put them.  ``--json`` prints one object at the end.
"""
from __future__ import annotations

import argparse
import logging
import resource
import time
from pathlib import Path

from fedsbdt.common.cli import CliError, emit, with_state_lock
from fedsbdt.common.federation.pki import add_tls_flags
from fedsbdt.common.files import sha256_file
from fedsbdt.common.sources import add_source_flags
from fedsbdt.common.statuspage import add_status_flags

from fedsbdt.common.ledger_cli import add_lifetime_flags

from .policy import MAX_EVAL_EPSILON, MAX_FAILED_ATTEMPTS, MIN_COLLUDERS, MIN_SITES, MIN_THRESHOLD

log = logging.getLogger("fedsbdt.site")


def cmd_keygen(args: argparse.Namespace) -> int:
    from fedsbdt.common.federation.pki import PkiError

    from fedsbdt.common.federation.keys import keygen

    try:
        info = keygen(args.site, Path(args.out))
    except PkiError as e:
        raise CliError(str(e)) from None
    emit(args, info, f"wrote {args.out}/identity.key, identity.pub, tls.key and tls.csr for site {args.site}\n"
                     f"identity public key (for the plan's roster): {info['identity_pub']}\n"
                     f"next: have the consortium CA sign {args.out}/tls.csr, e.g.\n"
                     f"  fedsbdt ca sign --ca CA_DIR --csr {args.out}/tls.csr --out {args.out}/tls.crt")
    return 0


def cmd_client(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    state = Path(args.state)  # one client per --state
    return with_state_lock(state, "site state directory", lambda: _run_client(args, t0, state))


def _run_client(args: argparse.Namespace, t0: float, state: Path) -> int:
    from fedsbdt.common.schema import Schema
    from fedsbdt.common.federation.pki import PkiError, TlsFiles
    from fedsbdt.common.federation.plan import Plan
    from fedsbdt.common.federation.tuning import FederatedTuning, is_tuning_plan

    from fedsbdt.common.federation.keys import IDENTITY_KEY, load_identity
    from .policy import SitePolicy
    from .site import model_path

    if args.plan and args.plan_hash:
        raise CliError("give either --plan or --plan-hash, not both")
    if not (args.plan or args.plan_hash):
        raise CliError("pin the plan you agreed to: pass --plan FILE or --plan-hash SHA256 (received out of "
                       "band); a site never takes part in whatever plan the coordinator serves")
    policy = SitePolicy(args.allow_central_noise, args.min_sites, args.min_threshold, args.min_colluders,
                        max_failed_attempts=args.max_failed_attempts, lifetime_epsilon=args.lifetime_epsilon,
                        max_failed_attempts_per_session=args.max_failed_attempts_per_session,
                        lifetime_delta=args.lifetime_delta, population=args.population)
    tuning = None
    if args.plan and is_tuning_plan(args.plan):
        tuning = FederatedTuning.load(args.plan)
        _check_tuning(args, tuning)
        pinned: list = list(tuning.trials)
    elif args.plan:
        pinned = [Plan.load(args.plan)]
    else:
        h = args.plan_hash.strip().lower()
        if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise CliError("--plan-hash must be 64 hex digits (the SHA-256 printed by `fedsbdt plan`)")
        pinned = [h]
    for p in pinned:
        refusal = None if isinstance(p, str) else policy.refusal(p)  # known before connecting; checked again
        if refusal is not None:
            raise CliError(f"{args.plan}: {refusal}")
    page = status_page(args)  # --status-port: bound before anything else (a taken port: exit 2)
    try:
        identity = load_identity(Path(args.identity_key) if args.identity_key else state / IDENTITY_KEY)
        files = None
        if not args.insecure:
            files = TlsFiles.in_dir(Path(args.tls_dir or state), args.tls_cert, args.tls_key, args.tls_ca)
            files.read()  # refuse unreadable files now, with their name
            name = files.certificate_name()
            if name != args.site:
                raise CliError(f"{files.cert} is issued to {name!r}, not to site {args.site!r}")
    except PkiError as e:
        raise CliError(str(e)) from None
    if not (args.data or args.eval_data):
        raise CliError("pass this site's data with --data (and, for a federated evaluation, --eval-data)")
    local_schema = Schema.load(args.schema) if args.schema else None
    if tuning is None:
        out, human = _take_part(args, t0, state, pinned[0], identity, files, local_schema, policy, page)
        emit(args, out, human)
        return 0
    trials, lines = [], []
    for i, plan in enumerate(tuning.trials):
        model_out = (Path(args.out) if args.out else model_path(state, tuning.sha256)).with_suffix(
            f".trial-{i + 1}.json")
        if model_out.exists():  # verified and written before a restart: not joined again
            trials.append({"trial": i + 1, "plan_sha256": plan.sha256, "model": str(model_out),
                           "model_sha256": sha256_file(model_out), "resumed": True})
            continue
        log.info(f"{args.site}: tuning trial {i + 1} of {len(tuning.trials)} (plan {plan.sha256[:16]}…)",
                 extra={"event": "tuning_trial", "site": args.site, "trial": i + 1})
        out, human = _take_part(args, t0, state, plan, identity, files, local_schema, policy, page,
                                model_out=model_out, earlier=frozenset(p.sha256 for p in tuning.trials[:i]),
                                trial={"trial": i + 1, "trials": len(tuning.trials)})
        trials.append({"trial": i + 1, **out})
        lines.append(f"trial {i + 1}: {human}")
    emit(args, {"site": args.site, "tuning_plan_sha256": tuning.sha256, "epsilon": tuning.stated_epsilon,
                "epsilon_eval": tuning.stated_epsilon_eval, "trials": trials,
                "seconds": round(time.perf_counter() - t0, 3)},
         "\n".join(lines) + f"\n{args.site}: took part in {len(trials)} tuning trials; all trials composed: ε = "
         f"{tuning.stated_epsilon:.6g} (training file), ε_eval = {tuning.stated_epsilon_eval:.6g} (held-out file); "
         "the coordinator's tuning.json names the winner by its model hash")
    return 0


def _check_tuning(args: argparse.Namespace, tuning) -> None:
    """A tuning plan's totals against this site's caps, before anything runs (each trial is checked again as
    it is accepted, its lifetime ledger holding the earlier trials' releases)."""
    if args.max_epsilon is not None and tuning.stated_epsilon > args.max_epsilon:
        raise CliError(f"{args.plan}: the tuning plan's trials together spend ε = {tuning.stated_epsilon:.6g} of the "
                       f"training records, above this site's --max-epsilon {args.max_epsilon:g}; refusing to take part")
    if args.eval_data and tuning.stated_epsilon_eval > args.max_eval_epsilon:
        raise CliError(f"{args.plan}: the tuning plan's evaluations together spend ε_eval = "
                       f"{tuning.stated_epsilon_eval:.6g} of the held-out records, above this site's "
                       f"--max-eval-epsilon {args.max_eval_epsilon:g}; refusing to take part")


def _take_part(args: argparse.Namespace, t0: float, state: Path, pinned, identity, files, local_schema, policy,
               page=None, model_out: Path | None = None, earlier: frozenset = frozenset(),
               trial: dict | None = None) -> tuple[dict, str]:
    """Take part in one session (``pinned``: the plan, or the hash of the plan the coordinator must serve) until
    the model is verified, shown on the status page ``page`` (``trial``: which trial of a tuning plan it is);
    (the JSON result, its line for people)."""
    from fedsbdt.common.fed_eval import describe_receipt

    from .daemon import Daemon, DaemonError, DaemonOptions
    from .site import SessionAbort, SiteMachine, SiteOptions

    options = SiteOptions(
        max_epsilon=args.max_epsilon, expected_plan_sha256=pinned if isinstance(pinned, str) else pinned.sha256,
        local_schema=local_schema, allow_insecure_test_randomness=args.allow_insecure_test_randomness,
        model_out=model_out or (Path(args.out) if args.out else None), policy=policy,
        eval_data=Path(args.eval_data) if args.eval_data else None, max_eval_epsilon=args.max_eval_epsilon)
    from fedsbdt.common.sources import source_from_args

    machine = SiteMachine(args.site, identity, source_from_args(args), state, options)
    if page is not None:
        page.show(machine, trial)  # --status-port: this session's state from now on
    if not isinstance(pinned, str):  # everything checkable here is checked before any connection: plan, policy, keys, data
        machine.accept_plan(pinned.canonical_json, pinned.sha256)  # SiteRefusal: exit 2, nothing contacted
    daemon = Daemon(machine, args.coordinator, files,
                    DaemonOptions(reconnect_timeout=args.reconnect_timeout, earlier_plans=earlier))
    import sqlite3

    from fedsbdt.common.secagg.errors import StorageError

    try:
        done = daemon.run()
    except (DaemonError, SessionAbort) as e:
        raise CliError(str(e)) from None
    except (sqlite3.Error, StorageError, OSError) as e:
        raise CliError(f"the site's database in {state} failed ({e}); nothing was sent after the last "
                       "committed round — restart the client with the same command to resume") from None
    plan = machine.plan
    out = {"site": args.site, "model": str(done.model_path), "model_sha256": done.model_sha256,
           "trees": machine.trees_applied, "epsilon": machine.cal.epsilon, "epsilon_total": plan.total_epsilon,
           "plan_sha256": plan.sha256,
           "tree_contributions": machine.ledger.tree_contributions(), **machine.receipt(),
           "bytes_sent": daemon.bytes_sent, "bytes_received": daemon.bytes_received,
           "seconds": round(time.perf_counter() - t0, 3), "cpu_seconds": round(time.process_time(), 3)}
    charge = machine.ledger.eval_charge()
    if charge is not None:  # the held-out file's separate budget (one release, retries resend it)
        out["evaluation"] = charge
    released = machine.evaluation_released  # the metrics the coordinator released, recomputed here
    if released is not None:
        out["evaluation_released"] = released
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the data loader and the noise sampler processes
    out["child_cpu_seconds"] = round(children.ru_utime + children.ru_stime, 3)
    out["noise_processes"] = getattr(machine.randomness, "children", 0)
    if machine.cpu_at_first_tree is not None and machine.trees_applied > 1:
        out["cpu_ms_per_round"] = round((time.process_time() - machine.cpu_at_first_tree)
                                        / (machine.trees_applied - 1) * 1e3, 3)
    return out, (f"{args.site}: model with {machine.trees_applied} trees verified "
                 + without_data_text(out)
                 + f"(sha256 {done.model_sha256}) and written to {done.model_path}"
                 + (f"\n{args.site}: held-out file evaluated: {charge['records']} records; privacy budget "
                    f"{plan.budget_text()}" if charge is not None else "")
                 + (f"\n{args.site}: federated evaluation released to the sites: {describe_receipt(released)}"
                    if released is not None else ""))


def tree_ranges(trees: list[int]) -> str:
    """Tree indices as ranges for people: ``664–966, 970``."""
    out, start = [], None
    for i, t in enumerate(trees):
        if start is None:
            start = t
        if i + 1 == len(trees) or trees[i + 1] != t + 1:
            out.append(f"{start}–{t}" if t > start else f"{t}")
            start = None
    return ", ".join(out)


def without_data_text(receipt: dict) -> str:
    """Which released trees did not carry this site's data, and why (``(… ) `` or nothing): released while the site
    was not in the round (down, suspended or joining), or with its zero input after failed attempts had spent its
    records' scheduled releases."""
    absent, zero = receipt.get("trees_without_this_site", []), receipt.get("trees_with_zero_input", [])
    if not absent and not zero:
        return ""
    why = ([f"{len(absent)} were released while this site was not in the round (not connected, suspended or not "
            f"yet joined): trees {tree_ranges(absent)}"] if absent else []) + (
        [f"{len(zero)} summed its zero input, because failed attempts it had answered spent its records' scheduled "
         f"releases: trees {tree_ranges(zero)}"] if zero else [])
    return f"({receipt['trees_with_data']} carried this site's data; {'; '.join(why)}) "


def status_page(args: argparse.Namespace):
    """``--status-port``: the site's own status page (client/status.py), bound now, serving from the first
    session on until the process ends; None without the flag."""
    from fedsbdt.common.statuspage import StatusPageError

    from .status import bind_page

    try:
        return bind_page(args)
    except StatusPageError as e:
        raise CliError(str(e)) from None


def register(sub) -> None:
    """``fedsbdt keygen`` and ``fedsbdt client`` (composed by :mod:`fedsbdt.cli`)."""
    _register_keygen(sub)
    _register_client(sub)


def _register_keygen(sub) -> None:
    """``fedsbdt keygen``: a site's keys and certificate request."""
    k = sub.add_parser("keygen", help="create a site's Ed25519 identity key, TLS key and certificate request")
    k.add_argument("--site", required=True, metavar="ID", help="the site id (as in the plan's roster)")
    k.add_argument("--out", required=True, metavar="DIR", help="directory for identity.key/.pub, tls.key, tls.csr")
    k.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    k.set_defaults(func=cmd_keygen)


def _register_client(sub) -> None:
    """``fedsbdt client``: run one site of a session."""
    c = sub.add_parser("client", help="run one site (hospital) of a federated training session")
    c.add_argument("--coordinator", required=True, metavar="ADDR", help="coordinator address host:port")
    c.add_argument("--site", required=True, metavar="ID", help="this site's id in the plan's roster")
    c.add_argument("--data", metavar="SOURCE",
                   help="this site's private training data (CSV/Parquet, the plan's schema, or a database URL "
                        "with --query: docs/data-sources.md); required, except for a plan that evaluates an "
                        "existing model")
    add_source_flags(c)
    c.add_argument("--eval-data", metavar="FILE",
                   help="this site's held-out records (the plan's schema, disjoint from --data) for the plan's "
                        "federated evaluation (docs/federated-evaluation.md) (default: none: the site refuses "
                        "a plan with an evaluation)")
    c.add_argument("--state", default="fedsbdt-site", metavar="DIR",
                   help="state directory: SQLite ledger, secure-aggregation keys, keys/certificates, model "
                        "(default: ./fedsbdt-site)")
    _add_plan_pin_flags(c)
    _add_policy_flags(c)
    c.add_argument("--schema", metavar="FILE",
                   help="this site's copy of the public schema: must equal the plan's (default: none: no check)")
    c.add_argument("--out", metavar="FILE",
                   help="where to write the verified model (default: STATE/model-<first 16 hex digits of the plan "
                        "hash>.json: one per plan, as the ledger)")
    c.add_argument("--identity-key", metavar="FILE", help="Ed25519 identity key (default: STATE/identity.key)")
    add_tls_flags(c, "STATE")
    c.add_argument("--allow-insecure-test-randomness", action="store_true",
                   help="accept a plan with deterministic test-only randomness (no privacy; tests only)")
    c.add_argument("--reconnect-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="give up after this many seconds without reaching the coordinator (default: 300)")
    add_status_flags(c).add_argument(
        "--status-show-records", action="store_true",
        help="also show statistics of this site's records on its status page and /metrics: the record count, the ε "
             "each record spent (quantiles, maximum), the records out of budget; they are not differentially "
             "private, so only with a loopback --status-host (default: not shown)")
    c.add_argument("--json", action="store_true", help="print one JSON object on stdout at the end")
    c.set_defaults(func=cmd_client, on_interrupt="every committed round is kept in {state}; restart the same "
                                                   "command to resume")


def _add_plan_pin_flags(p) -> None:
    """The plan the site agreed to, received out of band: its file or its hash."""
    pin = p.add_argument_group("the plan this site agreed to (one of the two is required)")
    pin.add_argument("--plan", metavar="FILE",
                     help="the plan file received out of band: checked here before connecting, and the served "
                          "plan must have its hash (required, or --plan-hash)")
    pin.add_argument("--plan-hash", metavar="SHA256",
                     help="the plan's SHA-256 received out of band (required, or --plan)")


def _add_policy_flags(p) -> None:
    """The site's policy: a served plan that breaks it is refused before joining."""
    pol = p.add_argument_group("site policy (a served plan that breaks it is refused before joining)")
    pol.add_argument("--max-epsilon", type=float, metavar="X",
                     help="refuse a plan whose total privacy budget, ε plus the ε_eval of its federated "
                          "evaluation (the plan's summary prints it), exceeds this site's own limit X "
                          "(default: no limit)")
    pol.add_argument("--allow-central-noise", action="store_true",
                     help="accept a plan in central noise mode, where the sites add no noise: the coordinator "
                          "then sees the exact (noiseless) sum of the sites' vectors, and with a roster of few "
                          "sites or sites it controls, this site's exact sums; it must be trusted to add the "
                          "noise (default: refuse)")
    pol.add_argument("--min-sites", type=int, default=MIN_SITES, metavar="N",
                     help=f"refuse a plan whose roster has fewer than N sites (default: {MIN_SITES}; with two, "
                          "the only other site may be a sybil whose key the coordinator holds)")
    pol.add_argument("--min-threshold", type=int, default=MIN_THRESHOLD, metavar="N",
                     help="refuse a plan whose secure-aggregation threshold t is below N: no sum over fewer "
                          f"than N sites is released (default: {MIN_THRESHOLD})")
    pol.add_argument("--min-colluders", type=int, default=MIN_COLLUDERS, metavar="N",
                     help="refuse a plan that assumes fewer than N colluding sites (the noise and secure "
                          f"aggregation hold against the plan's declared c only; default: {MIN_COLLUDERS})")
    pol.add_argument("--max-eval-epsilon", type=float, metavar="X", default=MAX_EVAL_EPSILON,
                     help="refuse a plan whose federated evaluation budget ε_eval exceeds this site's limit "
                          f"(default: {MAX_EVAL_EPSILON:g}; ε + ε_eval must also be within --max-epsilon)")
    pol.add_argument("--max-failed-attempts", type=int, default=MAX_FAILED_ATTEMPTS, metavar="N",
                     help="leave the session (exit 2, saying why) once the coordinator has failed one round "
                          "more than N times after this site answered it: each retry that carries data spends "
                          "privacy budget "
                          f"(default: {MAX_FAILED_ATTEMPTS})")
    pol.add_argument("--max-failed-attempts-per-session", type=int, metavar="N",
                     help="leave the session (exit 2, saying why) once the coordinator has failed more than N rounds "
                          "in all after this site answered them, counted in the site's ledger (a restart keeps the "
                          "count) (default: a tenth of the plan's trees, rounded up, at least --max-failed-attempts: "
                          "each failed attempt may cost one of the last trees this site's data)")
    add_lifetime_flags(pol, "refuse a plan that would bring the lifetime ε of this site's records (one account: "
                            "every plan, evaluation and central `train/tune --ledger` run from this state "
                            "directory, whatever file or query it read, `fedsbdt ledger --state DIR`) above X",
                       "a plan's")
