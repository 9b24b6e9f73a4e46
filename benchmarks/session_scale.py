"""The coordinator's CPU per round without gRPC: Session and secure aggregation driven in one process (a script).

Runs ``fedsbdt.server.session.Session`` and n ``fedsbdt.client.site.SiteMachine`` s through
the in-process transport of the tests (``tests/federation/inproc.py``: every
event and reply crosses as the service would hand it over, no network, no
threads) on an Abalone sample dealt to n sites, and times only the
coordinator's session calls (``submit_*``, ``tick``, ``subscribed``…) with
the process clock.  Per round = CPU between the second and the last tree
release / rounds (the epoch setup before them is not counted).  The epoch
setup is timed on its own (``setup_cpu_ms_per_epoch``: the coordinator's
``submit_setup`` calls — decoding and checking AdvertiseKeys and ShareKeys,
closing the stages, encoding the roster and every EpochShares, the epoch's
commit — and setup transitions taken elsewhere, minus rounds begun inside
them) and amortised over ``epoch_rounds`` (``setup_cpu_ms_per_round``).
``--checkpoint`` gives the coordinator its SQLite database (one durable
commit per round, the epoch stored), as ``fedsbdt coordinator`` has.  Compared
with ``benchmarks/federation_costs.py`` (the same coordinator over gRPC with
mutual TLS), the difference is what the transport costs.

Every recorded coordinator call is then replayed, in order, into a fresh
Session without the sites' work in between (``replayed``: the coordinator's
own code with warm caches, as in a process of its own; the replay must release
the identical model).  In one process the n site machines run between two
coordinator calls and evict its code and data from the CPU caches, which
makes every coordinator call 2–4× slower than the same call replayed.

With ``--baseline REF`` this harness drives the code of a git ref (exported
with ``git archive``) and this tree alternately, each size in a fresh process,
``--repeats`` times each, so old and new are measured under the same load.

Run:  python benchmarks/session_scale.py [--sites 3 10 20 50] [--trees 60 30 20 12] [--baseline REF] [--repeats 2]
          [--epoch-rounds 128] [--checkpoint] [--out session_scale]
Writes ``benchmarks/results/session_scale.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the checkout whose code this harness drives (``--baseline`` points it at an exported git ref)
CODE = Path(os.environ.get("SESSION_SCALE_CODE", ROOT))
sys.path.insert(0, str(CODE))
sys.path.insert(0, str(CODE / "benchmarks"))
sys.path.insert(0, str(CODE / "tests"))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from _join_tokens import counter_bytes as _counter_bytes  # noqa: E402
from _util import save  # noqa: E402
from fedsbdt.client.policy import SitePolicy  # noqa: E402
from fedsbdt.client.site import SiteMachine, SiteOptions  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan  # noqa: E402
from federation.conftest import abalone_with_ids, write_splits  # noqa: E402
from federation.inproc import Clock, InProcess  # noqa: E402
from fedsbdt.server.checkpoint import CoordinatorStore  # noqa: E402
from fedsbdt.server.session import Session  # noqa: E402

TIMED = ("submit_setup", "submit_input", "submit_round", "tick", "report_progress", "report_refusal",
         "report_finished", "subscribed", "unsubscribed", "join")


def run(n: int, trees: int, rows_per_site: int = 40, epoch_rounds: int = 128, checkpoint: bool = False) -> dict:
    """One in-process session of ``trees`` depth-6 trees over n sites; the coordinator's CPU per round and per
    epoch setup (with its SQLite checkpoint if ``checkpoint``)."""
    with tempfile.TemporaryDirectory(prefix="fedsbdt-session-scale-") as tmp:
        rec = record(Path(tmp), n, trees, rows_per_site, epoch_rounds, checkpoint)
        session, plan, start, store = rec["session"], rec["plan"], rec["start"], rec["store"]
        spent, marks, calls, setup = rec["spent"], rec["marks"], rec["calls"], rec["setup"]
        # The same coordinator calls again, into a fresh Session, without the sites' work in between.
        replay = Session(plan, plan.make_randomness(True), start, store("replay"), randbytes=_counter_bytes())
        spent2, marks2, _, setup2 = _instrument(replay, record=False)
        replay_calls(replay, calls)
        if replay.model_json is None or replay.model_json != session.model_json:
            raise RuntimeError("the replayed coordinator released a different model")
        for s in (session, replay):
            if s.checkpoint is not None:
                s.checkpoint.close()
        (k0, c0), (k1, c1) = marks[1], marks[-1]  # marks[0] is the initial score, after the epoch setup
        (r0, d0), (r1, d1) = marks2[1], marks2[-1]
        epochs = session.next_epoch_id  # epochs set up (ids are never reused)
        if any(c0 < t < c1 for t in setup[1]):
            raise RuntimeError("an epoch setup fell between the timed releases: time fewer trees or more epoch rounds")
        return {"sites": n, "trees": trees, "rounds_timed": k1 - k0, "epoch_rounds": epoch_rounds,
                "checkpoint": checkpoint, "epochs": epochs,
                "coordinator_cpu_ms_per_round": round((c1 - c0) / (k1 - k0) * 1e3, 3),
                "coordinator_cpu_s_total": round(spent[0], 3),
                "replayed_cpu_ms_per_round": round((d1 - d0) / (r1 - r0) * 1e3, 3),
                "setup_cpu_ms_per_epoch": round(setup[0] / epochs * 1e3, 3),
                "setup_cpu_ms_per_round": round(setup[0] / epochs / epoch_rounds * 1e3, 4),
                "replayed_setup_cpu_ms_per_epoch": round(setup2[0] / epochs * 1e3, 3),
                "replayed_setup_cpu_ms_per_round": round(setup2[0] / epochs / epoch_rounds * 1e3, 4)}


def replay_calls(replay: Session, calls: list, after=None) -> None:
    """Apply recorded coordinator ``calls`` to a fresh Session in order; each must end as it did
    (``after(name, args, result)`` sees every call's result, e.g. to fill a service's outboxes)."""
    for name, a, k, outcome in calls:
        try:
            out = getattr(replay, name)(*a, **k)
            got = type(out).__name__
        except Exception as exc:  # noqa: BLE001 - a refused message is refused again
            got, out = type(exc).__name__, None
        if got != outcome:
            raise RuntimeError(f"the replay diverged at {name}: {got} instead of {outcome}")
        if after is not None and out is not None:
            after(name, a, out)


def record(tmp: Path, n: int, trees: int, rows_per_site: int = 40, epoch_rounds: int = 128,
           checkpoint: bool = False, graph: str = "complete", neighbours: int = 0, stage_seconds: int = 10) -> dict:
    """Run one in-process session in ``tmp`` with every coordinator call timed and recorded (see :func:`run`);
    ``stage_seconds``: the plan's stage deadline (a replay over gRPC on a busy machine needs more)."""
    sites = [f"site-{i:03d}" for i in range(n)]
    schema, raw = abalone_with_ids(rows_per_site * n)
    paths = write_splits(raw, sites, tmp / "data")
    keys = {s: Ed25519PrivateKey.generate() for s in sites}
    hp = Hyperparameters(trees=trees, depth=6, seed=3, epsilon=1.0)
    plan = make_plan(schema, hp, [SiteEntry(s, keys[s].public_key().public_bytes_raw()) for s in sites],
                     randomness="insecure-test", test_seed=1, test_noise=True, max_records_per_site=10_000,
                     deadlines=Deadlines(join=max(30, stage_seconds), stage=stage_seconds, quorum=10_000, finish=30),
                     epoch_rounds=epoch_rounds,
                     **({"secagg_graph": "sparse", "secagg_neighbours": neighbours} if graph == "sparse" else {}))
    clock = Clock()
    start = clock.now
    def store(name):
        return CoordinatorStore(tmp / name, plan.sha256) if checkpoint else None

    session = Session(plan, plan.make_randomness(True), start, store("coordinator"), randbytes=_counter_bytes())
    opts = SiteOptions(expected_plan_sha256=plan.sha256, allow_insecure_test_randomness=True,
                       policy=SitePolicy(allow_central_noise=True))
    machines = {}
    for s in sites:
        machines[s] = SiteMachine(s, keys[s], paths[s], tmp / f"state-{s}", opts)
        machines[s].accept_plan(plan.canonical_json, plan.sha256)
    spent, marks, calls, setup = _instrument(session, record=True)
    fed = InProcess(session, machines, clock)
    for s in sites:
        fed.join(s)
    fed.run()
    for m in machines.values():
        m.close()
    session.close()
    if session.exit_code != 0:
        raise RuntimeError(f"the session failed: {session.stage}")
    return {"session": session, "plan": plan, "start": start, "store": store, "spent": spent, "marks": marks,
            "calls": calls, "setup": setup, "keys": keys}


def _instrument(session: Session, record: bool):
    """Time the coordinator's entry points with the process clock; mark the CPU spent at every release.

    Returns (spent, marks, calls, setup): ``spent[0]`` the CPU so far, ``marks`` (trees released, CPU) after
    each release, ``calls`` every timed call (name, args, kwargs, what it returned or raised) if ``record``,
    ``setup`` = [CPU of the epoch setups, the values of ``spent[0]`` after each setup step].  Setup is every
    ``submit_setup`` call (decode, checks, stage closes and their commit) minus rounds stepped inside it,
    plus setup transitions (announce, a close on a deadline) taken inside other calls.
    """
    spent, marks, calls = [0.0], [], []
    setup, inside = [0.0, []], [False]

    def timed(name, fn):
        def call(*a, **k):
            outcome = "?"
            t0 = time.process_time()
            try:
                out = fn(*a, **k)
                outcome = type(out).__name__
                return out
            except Exception as exc:
                outcome = type(exc).__name__
                raise
            finally:
                dt = time.process_time() - t0
                spent[0] += dt
                if name == "submit_setup":
                    setup[0] += dt
                    setup[1].append(spent[0])
                if record:
                    calls.append((name, a, k, outcome))
        return call

    for name in TIMED:
        fn = timed(name, getattr(session, name))
        setattr(session, name, _flagged(fn, inside) if name == "submit_setup" else fn)
    step_pipeline, step_rounds = session._step_pipeline, session._step_rounds

    def pipeline(*a, **k):  # a setup transition outside submit_setup counts as setup
        t0 = time.process_time()
        moved = step_pipeline(*a, **k)
        if moved and not inside[0]:
            setup[0] += time.process_time() - t0
            setup[1].append(spent[0])
        return moved

    def rounds(*a, **k):  # a round stepped inside submit_setup is not setup
        if not inside[0]:
            return step_rounds(*a, **k)
        t0 = time.process_time()
        try:
            return step_rounds(*a, **k)
        finally:
            setup[0] -= time.process_time() - t0

    session._step_pipeline, session._step_rounds = pipeline, rounds
    release = session._release

    def on_release(*a, **k):
        out = release(*a, **k)
        marks.append((len(session.trees), spent[0]))
        return out

    session._release = on_release
    return spent, marks, calls, setup


def _flagged(fn, flag: list):
    """``fn`` with ``flag[0]`` True while it runs."""
    def call(*a, **k):
        flag[0] = True
        try:
            return fn(*a, **k)
        finally:
            flag[0] = False
    return call


def run_in(code: Path, n: int, trees: int, epoch_rounds: int, checkpoint: bool) -> dict:
    """:func:`run` of this harness driving the code of checkout ``code``, in a fresh Python process."""
    prog = (f"import json, runpy; print(json.dumps(runpy.run_path({__file__!r})['run']"
            f"({n}, {trees}, epoch_rounds={epoch_rounds}, checkpoint={checkpoint})))")
    out = subprocess.run([sys.executable, "-c", prog], cwd=code, capture_output=True, text=True, check=True,
                         env={**os.environ, "SESSION_SCALE_CODE": str(code)}).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[3, 10, 20, 50])
    ap.add_argument("--trees", type=int, nargs="+", default=[60, 30, 20, 12], help="trees per size (one per --sites)")
    ap.add_argument("--baseline", help="git ref to compare against, alternated with this tree (e.g. main)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per size and version")
    ap.add_argument("--epoch-rounds", type=int, default=128, help="round slots per epoch (setup amortised over them)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="give the coordinator its SQLite database (a durable commit per round), as in a deployment")
    ap.add_argument("--out", default="session_scale", help="results file name in benchmarks/results/ (no .json)")
    args = ap.parse_args()
    if len(args.trees) != len(args.sites):
        ap.error("give one --trees value per --sites value")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    versions = {"this_tree": ROOT}
    if args.baseline:
        from federation_costs import export_tree
        versions = {"baseline": export_tree(args.baseline, Path(tempfile.gettempdir()) / "fedsbdt-baselines"),
                    **versions}
    runs: dict[str, list[dict]] = {k: [] for k in versions}
    for n, trees in zip(args.sites, args.trees):
        for _ in range(args.repeats):
            for name, code in versions.items():
                r = (run_in(code, n, trees, args.epoch_rounds, args.checkpoint) if args.baseline
                     else run(n, trees, epoch_rounds=args.epoch_rounds, checkpoint=args.checkpoint))
                print(name, r, flush=True)
                runs[name].append(r)
    summary = {}
    for n in args.sites:
        row = {}
        for metric in ("coordinator_cpu_ms_per_round", "replayed_cpu_ms_per_round", "setup_cpu_ms_per_epoch",
                       "setup_cpu_ms_per_round", "replayed_setup_cpu_ms_per_epoch", "replayed_setup_cpu_ms_per_round"):
            med = {k: round(statistics.median(r[metric] for r in v if r["sites"] == n), 3) for k, v in runs.items()}
            if args.baseline:
                med["ratio_this_tree_to_baseline"] = round(med["this_tree"] / med["baseline"], 3)
            row[metric] = med
        summary[str(n)] = row
        print(f"n = {n}: medians {row}", flush=True)
    meta = {"baseline_ref": args.baseline, "baseline_commit": versions["baseline"].name} if args.baseline else {}
    path = save(args.out, {
        "description": "coordinator Session + secure aggregation CPU per tree round, driven in one process without "
                       "gRPC (tests/federation/inproc.py), depth 6, t = n/2 + 1, distributed noise"
                       + ("; baseline and this tree alternated in one run, each size in a fresh process"
                          if args.baseline else ""),
        **meta, "repeats": args.repeats, "epoch_rounds": args.epoch_rounds, "checkpoint": args.checkpoint,
        "summary_medians": summary, "runs": runs})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
