"""``fedsbdt coordinator``, ``fedsbdt plan`` and ``fedsbdt ca``, registered by :mod:`fedsbdt.cli`.

    fedsbdt coordinator --plan P [--listen ADDR] [--state DIR] [--tls-cert F --tls-key F --tls-ca F | --insecure]
                        [--status-port PORT [--status-host HOST]]
    fedsbdt plan --schema S --site ID=identity.pub ... --out P --rows N [--threshold T] [--dropout-slack S]
                 [--settings auto|paper] [hyperparameter flags]
    fedsbdt ca init --out CA_DIR
    fedsbdt ca sign --ca CA_DIR --csr SITE/tls.csr --out SITE/tls.crt
    fedsbdt ca server --ca CA_DIR --host coordinator.example.org --out DIR
    fedsbdt demo [--sites 3] [--dataset abalone|adult] [--trees N] [--json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import time
from pathlib import Path

from fedsbdt.common.cli import (CliError, add_hyperparameter_flags, emit, given_hyperparameters,
                                with_state_lock)
from fedsbdt.common.config import SAMPLERS
from fedsbdt.common.instance import address_in_use
from fedsbdt.common.modes import training_mode

log = logging.getLogger("fedsbdt.coordinator")


# --------------------------------------------------------------------------- coordinator


def cmd_coordinator(args: argparse.Namespace) -> int:
    from fedsbdt.common.federation.plan import Plan

    from .malloc import map_large_buffers

    map_large_buffers()  # before gRPC's threads exist: an epoch setup's buffers go back when freed
    t0 = time.perf_counter()
    from fedsbdt.common.federation.tuning import FederatedTuning, is_tuning_plan

    if is_tuning_plan(args.plan):
        tuning = FederatedTuning.load(args.plan)
        if args.model is not None:
            raise CliError("a tuning plan trains its trials in turn: --model is not available with it")
        for p in tuning.trials:
            p.make_randomness(args.allow_insecure_test_randomness)  # refuse test randomness before anything runs
        status = status_page(args)  # one page on one port for every trial
        state = Path(args.state)
        return with_state_lock(state, "coordinator state directory", lambda: _closing(
            status, lambda: _tune(args, t0, tuning, state, status)))
    plan = Plan.load(args.plan)
    cal = plan.verify_privacy()
    randomness = plan.make_randomness(args.allow_insecure_test_randomness)
    if plan.insecure:
        log.warning("THIS PLAN USES TEST-ONLY RANDOMNESS: the model is NOT differentially private",
                    extra={"event": "insecure_randomness"})
    if plan.noise == "central":
        log.warning("central noise mode: this coordinator sees the noiseless sums and adds the noise itself; "
                    "the sites must trust it", extra={"event": "central_noise"})
    status = status_page(args)  # --status-port: bound before anything is written (a taken port: exit 2)
    state = Path(args.state)  # one coordinator per --state

    def serve() -> int:
        code, out, human, _ = _serve(args, args.listen, t0, plan, cal, randomness, state, status)
        emit(args, out, human)
        return code

    return with_state_lock(state, "coordinator state directory", lambda: _closing(status, serve))


def _closing(status, run) -> int:
    """``run()``, then the status page (if any) closed."""
    try:
        return run()
    finally:
        if status is not None:
            status.close()


def _tune(args: argparse.Namespace, t0: float, tuning, state: Path, status=None) -> int:
    """A tuning plan: serve its trial plans in turn (each in ``STATE/trial-<i>``, on the address the first one
    bound), then keep the trial whose released evaluation metric is best: ``STATE/model.json`` and the receipt
    ``STATE/tuning.json``.  A trial finished before a restart (its ``result.json``) is not run again."""
    from fedsbdt.common.cli_tune import settings_line
    from fedsbdt.common.federation.tuning import WINNER_METRIC, pick_winner
    from fedsbdt.common.files import write_atomic

    listen, results = args.listen, []
    args.tls_dir = args.tls_dir or str(state)  # the certificate stays in STATE, the trials' state below it
    for i, plan in enumerate(tuning.trials):
        trial_state = state / f"trial-{i + 1}"
        done = trial_state / "result.json"
        if done.exists():
            results.append(json.loads(done.read_text()))
            continue
        log.info(f"tuning: trial {i + 1} of {len(tuning.trials)} (plan {plan.sha256[:16]}…)",
                 extra={"event": "tuning_trial", "trial": i + 1, "plan_sha256": plan.sha256})
        code, out, human, listen = _serve(args, listen, t0, plan, plan.verify_privacy(),
                                          plan.make_randomness(args.allow_insecure_test_randomness), trial_state,
                                          status, {"trial": i + 1, "trials": len(tuning.trials)})
        args.ready_fd = None  # the address is announced once; later trials serve the same one
        if code != 0:
            emit(args, {**out, "trial": i + 1}, f"tuning stopped in trial {i + 1}: {human}")
            return code
        write_atomic(done, json.dumps(out, sort_keys=True), "trial result")
        results.append(out)
    metric, larger = WINNER_METRIC[tuning.task]
    scores = [r.get("evaluation", {}).get("metrics") for r in results]
    win = pick_winner(tuning.task, scores)
    if win is None:
        raise CliError("no trial's federated evaluation was released: no winner can be chosen (the trials' models "
                       f"are in {state}/trial-*/model.json)")
    trials = [{"trial": i + 1, "plan_sha256": p.sha256, "settings": tuning.settings(i), "model_sha256": r["model_sha256"],
               "metrics": scores[i], "intervals": r.get("evaluation", {}).get("intervals")}
              for i, (p, r) in enumerate(zip(tuning.trials, results))]
    receipt = {
        "tuning_plan_sha256": tuning.sha256, "epsilon": tuning.stated_epsilon, "epsilon_eval": tuning.stated_epsilon_eval,
        "delta": tuning.delta, "epsilon_trial": tuning.trials[0].stated_epsilon,
        "method": "K fixed trial plans run in turn; the coordinator sees every trial, so all trainings (training "
                  "records) and all evaluations (held-out records) are composed (RDP, Cor. 6)",
        "chosen_by": f"the {'highest' if larger else 'lowest'} released (noisy) {metric} of the trials' federated "
                     "evaluations (post-processing)",
        "trials": trials, "winner": win + 1, "trial_model_sha256": results[win]["model_sha256"]}
    receipt["model_sha256"] = _write_winner(Path(results[win]["model"]), state / "model.json", tuning, receipt)
    write_atomic(state / "tuning.json", json.dumps(receipt, sort_keys=True, indent=1), "tuning receipt")
    out = {"model": str(state / "model.json"), "tuning": str(state / "tuning.json"), **receipt,
           "seconds": round(time.perf_counter() - t0, 3)}
    lines = [f"tuned over {len(trials)} trial plans; all trials composed: ε = {tuning.stated_epsilon:.6g} (training "
             f"records), ε_eval = {tuning.stated_epsilon_eval:.6g} (held-out records)"]
    lines += [f"  trial {t['trial']}: {settings_line(t['settings'])}: {metric} = "
              + (f"{t['metrics'][metric]:.4g}" if t["metrics"] and t["metrics"].get(metric) is not None else "not released")
              for t in trials]
    lines.append(f"winner: trial {win + 1} (the {'highest' if larger else 'lowest'} released {metric}); model "
                 f"{state / 'model.json'} (sha256 {receipt['model_sha256']}; the sites verified it as trial {win + 1}'s "
                 f"model {receipt['trial_model_sha256']}), receipt {state / 'tuning.json'}")
    emit(args, out, "\n".join(lines))
    return 0


def _write_winner(trial_model: Path, out: Path, tuning, receipt: dict) -> str:
    """The winning trial's model with the privacy statement of the whole tuning (every trial is released to the
    coordinator) and the tuning's record (``training.tuning``, shown by ``fedsbdt report``); its SHA-256."""
    from fedsbdt.common.files import sha256_file
    from fedsbdt.common.model import Ensemble

    m = Ensemble.load(trial_model)
    p = m.privacy
    p.update(epsilon=tuning.stated_epsilon, target_epsilon=tuning.stated_epsilon, epsilon_trial=p["epsilon"],
             epsilon_eval_total=tuning.stated_epsilon_eval,
             guarantee=(f"({tuning.stated_epsilon:.6g}, {tuning.delta:.3g})-differential privacy for every training "
                        f"record (add/remove one record), covering all {len(tuning.trials)} trials of the tuning "
                        f"plan; the held-out records: ({tuning.stated_epsilon_eval:.6g}, {tuning.delta:.3g}) over all "
                        "trials' evaluations"))
    m.training["tuning"] = {k: receipt[k] for k in ("tuning_plan_sha256", "method", "chosen_by", "winner",
                                                    "epsilon_trial", "trial_model_sha256")} | {
        "trials": [{k: t[k] for k in ("trial", "settings", "plan_sha256", "model_sha256")} for t in receipt["trials"]]}
    m.save(out)
    return sha256_file(out)


def _serve(args: argparse.Namespace, listen: str, t0: float, plan, cal, randomness, state: Path,
           status, trial: dict | None = None) -> tuple[int, dict, str, str]:
    """Serve one plan's session until it ends: (exit code, the JSON result, its line for people, the address
    served).  ``status``: the status page to show it on (the caller closes it); ``trial``: which trial of a
    tuning plan this session is, shown there."""
    credentials = _credentials(args, state)
    session = _open_session(args, listen, plan, randomness, state, credentials)
    server = _start_server(args, session, plan, listen, credentials, status, trial)
    _wait(server, session, lambda: _announce(args, server, plan, credentials))
    return _result(args, session, server.address, server.service, plan, cal, state, t0)


def _credentials(args: argparse.Namespace, state: Path):
    """The server's TLS credentials (None with ``--insecure``); a missing or bad certificate is one line."""
    from fedsbdt.common.federation.pki import PkiError, TlsFiles, server_credentials

    if args.insecure:
        return None
    try:
        return server_credentials(TlsFiles.in_dir(Path(args.tls_dir or state), args.tls_cert, args.tls_key,
                                                  args.tls_ca))
    except PkiError as e:
        raise CliError(f"{e} (the coordinator needs a server certificate from the consortium CA; "
                       "`fedsbdt ca server` makes one, or pass --insecure for a local test)") from None


def _open_session(args: argparse.Namespace, listen: str, plan, randomness, state: Path, credentials):
    """The session on its checkpoint in ``state``, after the address is found free (nothing written on a
    refusal); a checkpoint of another plan is one line saying what to do."""
    from .checkpoint import CheckpointError, CoordinatorStore
    from .session import Session

    released = existing_model(plan, args.model)
    busy = address_in_use(listen)  # before the session opens its store: nothing written on a refusal
    if busy is not None:
        raise CliError(busy)
    try:
        return Session(plan, randomness, time.monotonic(), CoordinatorStore(state, plan.sha256), released=released)
    except CheckpointError as e:
        hint = ""
        if "belongs to plan" in str(e) and credentials is not None and not args.tls_dir:
            hint = (f"; the new directory needs the coordinator's TLS files: copy tls.crt, tls.key and ca.crt "
                    f"from {state} into it, or pass --tls-dir {state}")
        raise CliError(f"{e}{hint}") from None


def _start_server(args: argparse.Namespace, session, plan, listen: str, credentials, status,
                  trial: dict | None):
    """The gRPC server of ``session`` (bound, not yet started), with the status page's monitor attached."""
    from .collector import quiet_collector
    from .service import CoordinatorServer

    try:
        server = CoordinatorServer(session, listen, credentials)
    except (OSError, RuntimeError) as e:
        raise CliError(address_in_use(listen) or (
            f"cannot listen on {listen}: gRPC could not bind it (not an address of this machine, or in use; "
            "GRPC_VERBOSITY=debug shows gRPC's own reason)" if "bind" in str(e).lower()
            else f"cannot listen on {listen}: {e}")) from None
    if status is not None:
        from .status import CoordinatorMonitor

        monitor = CoordinatorMonitor(session, tuning=trial)
        server.service.observers.append(monitor.after_step)
        status.start(monitor.current, monitor.registry)
    quiet_collector()  # everything long-lived is loaded: freeze it out of the collector's scans
    return server


def _announce(args: argparse.Namespace, server, plan, credentials) -> None:
    """Say where the started server listens: the log's ``listening`` event and ``--ready-fd``."""
    log.info(f"coordinator for plan {plan.sha256} listening on {server.address} "
             f"({'mutual TLS' if credentials else 'PLAIN TEXT (--insecure)'}); {plan.n} sites, t = {plan.threshold}, "
             f"{plan.budget_text()}, noise {plan.noise}",
             extra={"event": "listening", "address": server.address, "plan_sha256": plan.sha256})
    if args.ready_fd is not None:
        try:
            os.write(args.ready_fd, (server.address + "\n").encode())
            os.close(args.ready_fd)
        except OSError:
            pass


def _wait(server, session, announce) -> None:
    """Start the server, ``announce`` it, and serve until the session ends or SIGTERM/SIGINT stops the server;
    then close both.  The signal handlers are in place before the server starts and before anyone is told it
    listens, so a signal at any point stops it (a SIGTERM right after the ``listening`` event once left the
    gRPC threads running).  A server stopped by an internal error is one line saying how to resume."""
    def stop(signum, frame):  # noqa: ARG001
        log.info(f"stopping on signal {signum}", extra={"event": "signal", "signal": signum})
        server._stop.set()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        announce()
        server.wait()
    finally:
        server.stop()
        session.close()
        for s, h in old.items():
            signal.signal(s, h)
    if server.fatal is not None:
        raise CliError(f"the coordinator stopped on an internal error: {server.fatal!r}; restart it with the same "
                       "command to resume from its checkpoint")


def _result(args: argparse.Namespace, session, address: str, service, plan, cal, state: Path,
            t0: float) -> tuple[int, dict, str, str]:
    """What :func:`_serve` returns for a session that stopped: interrupted (130), failed (1) or done (the
    model, its hash, the bytes moved, the federated evaluation if any)."""
    from fedsbdt.common.files import sha256_file

    st = session.stage
    secs = round(time.perf_counter() - t0, 3)
    if not session.done:
        line = (f"coordinator stopped after {len(session.trees)} trees; the checkpoint in {state} is kept: "
                "restart with the same command to resume")
        if args.json:  # stdout holds the JSON object: the line goes to the log (stderr)
            log.warning(line, extra={"event": "interrupted", "trees": len(session.trees)})
        return 130, {"error": "interrupted", "trees": len(session.trees), "seconds": secs, "resume": line}, line, \
            address
    if session.exit_code and getattr(st, "reason", None):
        return 1, {"error": st.reason, "trees": len(session.trees), "seconds": secs}, \
            f"session failed: {st.reason}", address
    model = state / "model.json"
    out = {"model": str(model), "model_sha256": sha256_file(model), "trees": len(session.trees),
           "epsilon": cal.epsilon, "epsilon_total": plan.total_epsilon, "rounds_failed": session.rounds_failed,
           "seconds": secs,
           "bytes_received": service.bytes_in, "bytes_sent": service.bytes_out,
           "mismatched_sites": list(getattr(st, "mismatched", ()))}
    out["trees_per_site"] = session.trees_with_data()
    human = f"{session.data_summary()}; model written to {model} (sha256 {out['model_sha256']})"
    if session.evaluation is not None:
        out["evaluation"], line = write_evaluation(state, session.evaluation, out["model_sha256"])
        human += "\n" + line
    return session.exit_code, out, human, address


def status_page(args: argparse.Namespace):
    """The bound (not yet serving) status page of ``--status-port``, or None."""
    from fedsbdt.common.statuspage import StatusPageError, bind

    from .status import COORDINATOR_PAGE

    try:
        return bind(args, COORDINATOR_PAGE, "coordinator's status page")
    except StatusPageError as e:
        raise CliError(str(e)) from None


def existing_model(plan, path: str | None):
    """An evaluation-only plan's model (``--model``) as released records; ``None`` for a training plan."""
    if plan.eval_model_sha256 is None:
        if path is not None:
            raise CliError("--model is only for a plan that evaluates an existing model (evaluation.model_sha256)")
        return None
    if path is None:
        raise CliError("this plan evaluates an existing model: pass it with --model FILE")
    from fedsbdt.common.files import sha256_file
    from fedsbdt.common.federation.release import released_from_model
    from fedsbdt.common.model import Ensemble

    try:
        return released_from_model(plan, Ensemble.load(path), sha256_file(Path(path)))
    except (OSError, ValueError) as e:
        raise CliError(f"{path}: {e}") from None


def write_evaluation(state: Path, receipt: dict, model_sha256: str) -> tuple[dict, str]:
    """Write the evaluation receipt (``STATE/evaluation.json``); returns it and one line for people."""
    from fedsbdt.common.fed_eval import describe_receipt
    from fedsbdt.common.files import write_atomic

    receipt = receipt | {"model_sha256": model_sha256}
    path = write_atomic(state / "evaluation.json", json.dumps(receipt, sort_keys=True, indent=1), "evaluation")
    if "metrics" not in receipt:
        return receipt, f"federated evaluation: {describe_receipt(receipt)}"
    return receipt, (f"federated evaluation (ε_eval = {receipt['epsilon_eval']:g}, separate from the training "
                     f"ε = {receipt['training_epsilon']:.6g}; sites {', '.join(receipt['sites'])}): "
                     f"{describe_receipt(receipt)}; receipt {path}")


# --------------------------------------------------------------------------- plan


def _site_arg(text: str) -> tuple[str, bytes]:
    from fedsbdt.common.federation.keys import read_identity_pub

    if "=" not in text:
        raise CliError(f"--site {text!r}: expected ID=identity.pub (or ID=<64 hex digits>)")
    sid, val = text.split("=", 1)
    if len(val) == 64 and all(c in "0123456789abcdefABCDEF" for c in val):
        return sid, bytes.fromhex(val)
    from fedsbdt.common.federation.pki import PkiError

    try:
        return sid, read_identity_pub(Path(val))
    except PkiError as e:
        raise CliError(str(e)) from None


#: why ``fedsbdt plan`` (auto settings, the default) refuses to guess the row count
NEEDS_ROWS = ("the auto settings (the default) follow ε and the number of training records of all sites together: "
              "declare that number public with --rows N (auto reads only ε, δ, the schema and N; docs/auto.md), or "
              "pass --settings paper for the S-BDT paper's settings")


def plan_hyperparameters(args: argparse.Namespace, schema):
    """(hyperparameters, auto choice or None) a plan pins: ``--settings auto`` (default) applies the rule of
    common/auto.py to the public inputs — ε, δ, the schema and the declared row count ``--rows N`` — exactly as
    ``fedsbdt train --rows N`` does, so federated = central; every flag given wins over it, λ included.  A
    federation has no DP row count, so auto without ``--rows`` is refused (one line, exit 2).  Modes with their
    own defaults keep them, as in ``train`` (common.cli.settings_mode)."""
    from fedsbdt.common.auto import resolve
    from fedsbdt.common.cli import settings_mode
    from fedsbdt.common.config import Hyperparameters

    given = given_hyperparameters(args)
    mode = settings_mode(args, given)
    if args.rows is not None and args.rows < 1:
        raise CliError(f"--rows {args.rows}: the declared row count must be ≥ 1")
    if mode == "auto" and args.rows is None:
        raise CliError(NEEDS_ROWS)
    keys, choice = resolve(given, schema, args.rows, "declared", mode)
    hp = Hyperparameters.from_dict(keys)
    return training_mode(hp).federated_hyperparameters(hp, given), choice  # the mode's defaults


def auto_lines(choice, hp) -> str:
    """The settings a plan pins (``hp``) and, with auto, why, for people (empty without auto)."""
    if choice is None:
        return ""
    from fedsbdt.common.auto import settings_text

    return (f"\nauto settings for n = {choice.inputs.rows} training records (declared public): "
            f"{settings_text(hp.to_dict())}\n  because: " + "\n  because: ".join(choice.reasons))


def cmd_plan(args: argparse.Namespace) -> int:
    from fedsbdt.common.schema import Schema

    from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan

    evaluation, choice = {}, None
    if args.eval_epsilon is not None:
        evaluation = dict(eval_epsilon=args.eval_epsilon, eval_bins=args.eval_bins,
                          eval_residual_clip=args.eval_residual_clip)
    if args.evaluate_model:
        schema, hp, evaluation["eval_model_sha256"], evaluation["eval_model_content_sha256"] = \
            model_for_evaluation(args)
    else:
        if not args.schema:
            raise CliError("--schema is required (unless --evaluate-model gives the model's schema)")
        schema = Schema.load(args.schema)
        hp, choice = plan_hyperparameters(args, schema)
    sites = [SiteEntry(*_site_arg(s)) for s in args.site]
    session = dict(noise=args.noise, assumed_colluders=args.colluders, dropout_slack=args.dropout_slack,
                   epoch_rounds=args.epoch_rounds,
                   max_records_per_site=args.max_records,
                   deadlines=Deadlines(join=args.join_deadline, stage=args.stage_deadline,
                                       quorum=args.quorum_deadline, finish=args.finish_deadline),
                   sampler=args.sampler, **evaluation)
    if args.secagg_graph == "sparse":  # Bell et al.'s sparse graph (docs/secagg.md §10)
        from fedsbdt.common.secagg.graph import suggested_neighbours

        session.update(secagg_graph="sparse",
                       secagg_neighbours=args.neighbours if args.neighbours is not None else suggested_neighbours(len(sites)))
    elif args.neighbours is not None:
        raise CliError("--neighbours needs --secagg-graph sparse")
    if args.secagg_fast_path != "auto":
        session.update(secagg_fast_path=args.secagg_fast_path)
    if args.insecure_test_randomness is not None:
        session.update(randomness="insecure-test", test_seed=args.insecure_test_randomness,
                       test_noise=args.test_noise)
    if args.tune_trials is not None:
        return write_tuning_plan(args, schema, hp, sites, session, choice)
    plan = make_plan(schema, hp, sites, args.threshold, args.session_id, **session)
    plan.save(args.out)
    emit(args, {"plan": str(args.out), "plan_sha256": plan.sha256, "sigma": plan.stated_sigma,
                "epsilon": plan.stated_epsilon, "epsilon_total": plan.total_epsilon,
                "threshold": plan.threshold, "dropout_slack": plan.dropout_slack,
                "assumed_colluders": plan.assumed_colluders, "noise": plan.noise, "guarantee": plan.guarantee,
                "sites": list(plan.site_ids), "seed": plan.hyperparameters.seed, "epsilon_eval": plan.eval_epsilon,
                "secagg_graph": plan.secagg_graph, "neighbours": plan.secagg_neighbours or None,
                "secagg_fast_path": plan.secagg_fast_path, "hyperparameters": plan.hyperparameters.to_dict(),
                "settings": "auto" if choice is not None else None if args.evaluate_model else "paper"}
         | ({"auto": choice.to_dict()} if choice is not None else {}),
         f"wrote {args.out}: {plan.n} sites, t = {plan.threshold}, c = {plan.assumed_colluders}, dropout slack "
         f"{plan.dropout_slack}, noise {plan.noise}, σ = {plan.stated_sigma:.6g}, ε = {plan.stated_epsilon:.6g}"
         + (f"\nfederated evaluation: ε_eval = {plan.eval_epsilon:g} on the sites' held-out files "
            f"({plan.eval_bins} bins)" if plan.eval_epsilon is not None else "")
         + f"\nprivacy budget: {plan.budget_text()}"
         + auto_lines(choice, plan.hyperparameters)
         + f"\nguarantee: {plan.guarantee}\nplan hash (give it to every site out of band): {plan.sha256}")
    return 0


def write_tuning_plan(args: argparse.Namespace, schema, hp, sites, session: dict, choice=None) -> int:
    """``fedsbdt plan --tune-trials K``: K trial plans around the plan's settings and the tuning plan pinning them
    (common/federation/tuning.py); ``--epsilon`` and ``--eval-epsilon`` are the totals over all trials."""
    from fedsbdt.common.cli_tune import settings_line
    from fedsbdt.common.federation.plan import make_plan
    from fedsbdt.common.federation.tuning import plan_trials

    if args.evaluate_model:
        raise CliError("--tune-trials trains its trials; it cannot evaluate an existing model (--evaluate-model)")
    session = {k: v for k, v in session.items() if not k.startswith("eval_")}
    if hp.seed is None:  # one public split seed for all trials (and the public order of the neighbours)
        hp = hp.replace(seed=secrets.randbits(63))
    eval_total = args.eval_epsilon if args.eval_epsilon is not None else 0.1

    def make(h, suffix: str, eval_epsilon: float):
        return make_plan(schema, h, sites, args.threshold, args.session_id + suffix, eval_epsilon=eval_epsilon,
                         eval_bins=args.eval_bins, eval_residual_clip=args.eval_residual_clip, **session)

    tuning = plan_trials(make, hp, schema.task, args.tune_trials, hp.epsilon, eval_total,
                         matched_l2="l2" not in given_hyperparameters(args))
    written = tuning.save(args.out)
    first = tuning.trials[0]
    trials = [{"plan": str(p), "plan_sha256": t.sha256, **tuning.settings(i)}
              for i, (p, t) in enumerate(zip(written[1:], tuning.trials))]
    emit(args, {"plan": str(args.out), "plan_sha256": tuning.sha256, "epsilon": tuning.stated_epsilon,
                "epsilon_eval": tuning.stated_epsilon_eval, "epsilon_trial": first.stated_epsilon,
                "epsilon_eval_trial": first.eval_epsilon, "trials": trials, "sites": list(first.site_ids),
                "threshold": first.threshold, "assumed_colluders": first.assumed_colluders, "noise": first.noise,
                "guarantee": first.guarantee, "seed": first.hyperparameters.seed,
                "settings": "auto" if choice is not None else "paper"}
         | ({"auto": choice.to_dict()} if choice is not None else {}),
         f"wrote {args.out} and {len(trials)} trial plans around the "
         f"{'auto' if choice is not None else 'given'} settings: {first.n} sites, t = {first.threshold}, "
         f"c = {first.assumed_colluders}, noise {first.noise}\n"
         + "".join(f"  trial {i + 1}: {settings_line(t)} λ={t['l2']:.3g} ({written[i + 1].name})\n"
                   for i, t in enumerate(trials))
         + f"each trial: ε = {first.stated_epsilon:.6g} training, ε_eval = {first.eval_epsilon:.6g} on the held-out "
           f"files; all trials composed: ε = {tuning.stated_epsilon:.6g} (training records), ε_eval = "
           f"{tuning.stated_epsilon_eval:.6g} (held-out records)\n"
           f"guarantee: {first.guarantee}\n"
           f"tuning plan hash (give it to every site out of band, with the plan files): {tuning.sha256}")
    return 0


def model_for_evaluation(args: argparse.Namespace):
    """(schema, hyperparameters, file SHA-256, content digest) of ``--evaluate-model``: the plan evaluates it."""
    from fedsbdt.common.files import sha256_file
    from fedsbdt.common.model import Ensemble

    if args.eval_epsilon is None:
        raise CliError("--evaluate-model needs --eval-epsilon (the evaluation's privacy budget)")
    if args.schema:
        raise CliError("--evaluate-model takes the schema from the model; leave out --schema")
    from fedsbdt.common.federation.release import model_content_sha256

    model = Ensemble.load(args.evaluate_model)
    return model.schema, model.hyperparameters, sha256_file(Path(args.evaluate_model)), model_content_sha256(model)

# --------------------------------------------------------------------------- ca


def cmd_ca(args: argparse.Namespace) -> int:
    from fedsbdt.common.federation.pki import PkiError, ca_init, ca_server, ca_sign

    try:
        if args.ca_command == "init":
            path = ca_init(Path(args.out), days=args.days)
            emit(args, {"ca_cert": str(path)}, f"wrote {path} and {Path(args.out) / 'ca.key'} (keep ca.key offline)")
        elif args.ca_command == "sign":
            path = ca_sign(Path(args.ca), Path(args.csr), Path(args.out), days=args.days)
            emit(args, {"cert": str(path)}, f"wrote {path} (and ca.crt next to it)")
        else:
            path = ca_server(Path(args.ca), Path(args.out), args.host, days=args.days)
            emit(args, {"cert": str(path)}, f"wrote {path}, tls.key and ca.crt in {args.out}")
    except PkiError as e:
        raise CliError(str(e)) from None
    return 0


# --------------------------------------------------------------------------- registration


def register(sub) -> None:
    """``fedsbdt coordinator``, ``fedsbdt plan`` and ``fedsbdt ca`` (composed by :mod:`fedsbdt.cli`)."""
    _register_coordinator(sub)
    _register_plan(sub)
    _register_ca(sub)


def _register_coordinator(sub) -> None:
    """``fedsbdt coordinator``: serve a plan's session."""
    from fedsbdt.common.federation.pki import add_tls_flags
    from fedsbdt.common.statuspage import add_status_flags

    c = sub.add_parser("coordinator", help="run the coordinator of a federated training session")
    c.add_argument("--plan", required=True, metavar="FILE", help="the plan (TOML)")
    c.add_argument("--listen", default="0.0.0.0:7443", metavar="ADDR",
                   help="address to serve on (default: 0.0.0.0:7443; port 0 picks a free port)")
    c.add_argument("--state", default="fedsbdt-coordinator", metavar="DIR",
                   help="checkpoints, secure-aggregation state, certificates, final model "
                        "(default: ./fedsbdt-coordinator)")
    add_tls_flags(c, "STATE")
    c.add_argument("--allow-insecure-test-randomness", action="store_true",
                   help="serve a plan with deterministic test-only randomness (no privacy; tests only)")
    c.add_argument("--model", metavar="FILE",
                   help="evaluation-only plans (evaluation.model_sha256): the existing model to evaluate "
                        "(default: none: a training plan)")
    c.add_argument("--ready-fd", type=int, metavar="FD",
                   help="write the listening address to this inherited file descriptor once serving "
                        "(default: none)")
    add_status_flags(c)
    c.add_argument("--json", action="store_true", help="print one JSON object on stdout at the end")
    c.set_defaults(func=cmd_coordinator, on_interrupt="the checkpoint in {state} is kept; restart the same "
                                                        "command to resume")


def _register_plan(sub) -> None:
    """``fedsbdt plan``: write a plan with its privacy statement computed."""
    p = sub.add_parser("plan", help="write a plan (TOML) with its privacy statement computed")
    p.add_argument("--schema", metavar="FILE", help="the public schema (TOML); required unless --evaluate-model")
    p.add_argument("--site", action="append", required=True, metavar="ID=identity.pub",
                   help="a roster entry: site id and its identity.pub file (or 64 hex digits); repeat per site")
    _add_roster_flags(p)
    _add_deadline_flags(p)
    _add_evaluation_flags(p)
    p.add_argument("--settings", choices=["auto", "paper"], default="auto",
                   help="auto (default): the settings `fedsbdt train` uses, from ε, δ, the schema and --rows "
                        "(docs/auto.md), so federated = central; paper: the S-BDT paper's defaults shown below (other "
                        "modes keep their own defaults, as in train). Any hyperparameter flag overrides either")
    p.add_argument("--rows", type=int, default=None, metavar="N",
                   help="the number of training records of all sites together, declared public, for the auto "
                        "settings (required with --settings auto; a federation has no DP row count) (default: none)")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the plan")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_hyperparameter_flags(p)
    p.set_defaults(func=cmd_plan)


def _add_roster_flags(p) -> None:
    """The plan's secure aggregation: threshold, colluders, dropouts, noise, epochs, mask graph."""
    p.add_argument("--threshold", type=int, metavar="N",
                   help="t: sums over fewer than t sites are never released (default: ⌊n/2⌋ + 1, or the smallest t with 2t > n + c when --colluders is given)")
    p.add_argument("--colluders", type=int, default=None, metavar="N",
                   help="c: the guarantee holds if at most c sites collude with the coordinator; needs 2t > n + c "
                        "(default: the largest the threshold allows, 2t − n − 1)")
    p.add_argument("--dropout-slack", type=int, default=0, metavar="N",
                   help="s in 0..n−t: a round's noise is split max(t, participants − s) − c ways, so up to s "
                        "sites may drop out of a round after it starts (default: 0: the centralised noise "
                        "when no site drops out; a dropout retries the round)")
    p.add_argument("--noise", choices=["distributed", "central"], default="distributed",
                   help="distributed (sites add noise shares; default) or central (trust the coordinator)")
    p.add_argument("--session-id", default="fedsbdt-session", metavar="NAME",
                   help="a name for the session (default: fedsbdt-session)")
    p.add_argument("--epoch-rounds", type=int, default=64, metavar="N",
                   help="round slots per secure-aggregation epoch (default: 64)")
    p.add_argument("--secagg-graph", choices=["complete", "sparse"], default="complete",
                   help="complete (every site masks with every other; default) or sparse (each site masks with "
                        "k neighbours of a public random graph per epoch, Bell et al.; for large consortia)")
    p.add_argument("--neighbours", type=int, metavar="N",
                   help="with --secagg-graph sparse: k, even and below n − 1 (default: 2·⌈2·log2 n⌉)")
    p.add_argument("--secagg-fast-path", choices=["auto", "always", "never"], default="auto",
                   help="rounds in one message each way, without the consistency and unmask exchanges: auto "
                        "(default: when the round tolerates no missing input anyway), always (any missing input "
                        "fails the round; with --secagg-graph sparse a fast-only session, docs/secagg.md §10) or never "
                        "(docs/federation.md §10)")
    p.add_argument("--max-records", type=int, default=1_000_000, metavar="N",
                   help="public upper bound on the records of one site (fixed-point capacity check) "
                        "(default: 1000000)")


def _add_deadline_flags(p) -> None:
    """The plan's deadlines and its randomness (sampler; test-only seeds)."""
    p.add_argument("--join-deadline", type=float, default=120.0, metavar="SECONDS",
                   help="seconds to wait for the whole roster (default: 120)")
    p.add_argument("--stage-deadline", type=float, default=10.0, metavar="SECONDS",
                   help="seconds per secure-aggregation stage (default: 10)")
    p.add_argument("--quorum-deadline", type=float, default=600.0, metavar="SECONDS",
                   help="seconds with fewer than t usable sites before the session gives up (default: 600)")
    p.add_argument("--finish-deadline", type=float, default=30.0, metavar="SECONDS",
                   help="seconds to wait for every site's confirmation of the model hash (default: 30)")
    p.add_argument("--sampler", choices=SAMPLERS, default="ours",
                   help="exact noise sampler every party uses: ours (default) or opendp (~30x slower)")
    p.add_argument("--insecure-test-randomness", type=int, metavar="N",
                   help="TESTS ONLY: deterministic randomness with this seed (no privacy) (default: none: the "
                        "OS CSPRNG)")
    p.add_argument("--test-noise", action=argparse.BooleanOptionalAction, default=True,
                   help="TESTS ONLY: with --insecure-test-randomness, add (deterministic) noise or none")


def _add_evaluation_flags(p) -> None:
    """The plan's federated evaluation, evaluation-only plans and federated tuning."""
    p.add_argument("--eval-epsilon", type=float, nargs="?", const=0.1, metavar="X",
                   help="evaluate the model federatedly after training at ε_eval = X on the sites' held-out "
                        "files (--eval-data), a budget separate from the training ε (default if given without "
                        "a value: 0.1; default: none: no evaluation; docs/federated-evaluation.md)")
    p.add_argument("--eval-bins", type=int, default=20, metavar="N",
                   help="public score (binary) or residual (regression) bins of the evaluation (even; default: 20)")
    p.add_argument("--eval-residual-clip", type=float, metavar="X",
                   help="regression evaluation: residuals are clipped to ±X (public; default: a quarter of the "
                        "label range's width); the RMSE's noise grows with X²")
    p.add_argument("--evaluate-model", metavar="FILE",
                   help="a plan that only evaluates this existing model (schema and hyperparameters from it; "
                        "needs --eval-epsilon; run the coordinator with --model FILE) (default: none: a "
                        "training plan)")
    p.add_argument("--tune-trials", type=int, metavar="K",
                   help="federated tuning: write K trial plans around these settings (the centre, the cyclical "
                        "flag flipped, then other one-step neighbours) and a tuning plan (--out) that runs them in "
                        "turn, each scored by a federated evaluation on the sites' held-out files; the coordinator "
                        "keeps the best. --epsilon and --eval-epsilon (then 0.1 if not given) are the totals over "
                        "all trials (default: none: one training plan; docs/auto.md)")


def _register_ca(sub) -> None:
    """``fedsbdt ca init|sign|server``: a small consortium CA."""
    a = sub.add_parser("ca", help="a small consortium CA for mutual TLS (demo and small deployments)")
    asub = a.add_subparsers(dest="ca_command", metavar="ACTION")
    asub.required = True
    i = asub.add_parser("init", help="create ca.key and ca.crt")
    i.add_argument("--out", required=True, metavar="DIR", help="CA directory")
    s = asub.add_parser("sign", help="issue a site certificate for a request made by `fedsbdt keygen`")
    s.add_argument("--ca", required=True, metavar="DIR", help="CA directory (ca.key, ca.crt)")
    s.add_argument("--csr", required=True, metavar="FILE", help="the site's tls.csr")
    s.add_argument("--out", required=True, metavar="FILE", help="certificate to write (ca.crt is copied next to it)")
    v = asub.add_parser("server", help="key and certificate for the coordinator")
    v.add_argument("--ca", required=True, metavar="DIR", help="CA directory (ca.key, ca.crt)")
    v.add_argument("--host", action="append", required=True, metavar="HOST",
                   help="host name or IP of the coordinator; repeat")
    v.add_argument("--out", required=True, metavar="DIR", help="directory for tls.key, tls.crt, ca.crt")
    for q, days in ((i, 3650), (s, 825), (v, 825)):  # the CA outlives the certificates it issues
        q.add_argument("--days", type=int, default=days, metavar="N", help=f"validity in days (default: {days})")
        q.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    a.set_defaults(func=cmd_ca)
