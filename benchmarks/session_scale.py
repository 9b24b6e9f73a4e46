"""The coordinator's CPU per round without gRPC: Session and secure aggregation driven in one process (a script).

Runs ``server.session.Session`` and n ``client.site.SiteMachine`` s through
the in-process transport of the tests (``tests/federation/inproc.py``: every
event and reply crosses as the service would hand it over, no network, no
threads) on an Abalone sample dealt to n sites, and times only the
coordinator's session calls (``submit_*``, ``tick``, ``subscribed``…) with
the process clock.  Per round = CPU between the second and the last tree
release / rounds (the epoch setup before them is not counted).  Compared
with ``benchmarks/federation_costs.py`` (the same coordinator over gRPC with
mutual TLS), the difference is what the transport costs.

With ``--baseline REF`` the code of a git ref (exported with ``git archive``)
and this tree are run alternately, each size in a fresh process, ``--repeats``
times each, so old and new are measured under the same machine load.

Run:  python benchmarks/session_scale.py [--sites 3 10 20 50] [--trees 60 30 20 12] [--baseline REF] [--repeats 2]
Writes ``benchmarks/results/session_scale.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from _util import save  # noqa: E402
from client.policy import SitePolicy  # noqa: E402
from client.site import SiteMachine, SiteOptions  # noqa: E402
from common.config import Hyperparameters  # noqa: E402
from common.federation.plan import Deadlines, SiteEntry, make_plan  # noqa: E402
from federation.conftest import abalone_with_ids, write_splits  # noqa: E402
from federation.inproc import Clock, InProcess  # noqa: E402
from server.session import Session  # noqa: E402

TIMED = ("submit_setup", "submit_input", "submit_round", "tick", "report_progress", "report_refusal",
         "report_finished", "subscribed", "unsubscribed", "join")


def run(n: int, trees: int, rows_per_site: int = 40) -> dict:
    """One in-process session of ``trees`` depth-6 trees over n sites; the coordinator's CPU per round."""
    with tempfile.TemporaryDirectory(prefix="fedsbdt-session-scale-") as tmp:
        tmp = Path(tmp)
        sites = [f"site-{i:03d}" for i in range(n)]
        schema, raw = abalone_with_ids(rows_per_site * n)
        paths = write_splits(raw, sites, tmp / "data")
        keys = {s: Ed25519PrivateKey.generate() for s in sites}
        hp = Hyperparameters(trees=trees, depth=6, seed=3, epsilon=1.0)
        plan = make_plan(schema, hp, [SiteEntry(s, keys[s].public_key().public_bytes_raw()) for s in sites],
                         randomness="insecure-test", test_seed=1, test_noise=True, max_records_per_site=10_000,
                         deadlines=Deadlines(join=30, stage=10, quorum=10_000, finish=30), epoch_rounds=128)
        clock = Clock()
        session = Session(plan, plan.make_randomness(True), clock.now, None)
        opts = SiteOptions(expected_plan_sha256=plan.sha256, allow_insecure_test_randomness=True,
                           policy=SitePolicy(allow_central_noise=True))
        machines = {}
        for s in sites:
            machines[s] = SiteMachine(s, keys[s], paths[s], tmp / f"state-{s}", opts)
            machines[s].accept_plan(plan.canonical_json, plan.sha256)
        spent = [0.0]

        def timed(fn):
            def call(*a, **k):
                t0 = time.process_time()
                try:
                    return fn(*a, **k)
                finally:
                    spent[0] += time.process_time() - t0
            return call

        for name in TIMED:
            setattr(session, name, timed(getattr(session, name)))
        marks: list[tuple[int, float]] = []
        release = session._release

        def on_release(*a, **k):
            out = release(*a, **k)
            marks.append((len(session.trees), spent[0]))
            return out

        session._release = on_release
        fed = InProcess(session, machines, clock)
        for s in sites:
            fed.join(s)
        fed.run()
        for m in machines.values():
            m.close()
        session.close()
        if session.exit_code != 0:
            raise RuntimeError(f"the session failed: {session.stage}")
        (k0, c0), (k1, c1) = marks[1], marks[-1]  # marks[0] is the initial score, after the epoch setup
        return {"sites": n, "trees": trees, "rounds_timed": k1 - k0,
                "coordinator_cpu_ms_per_round": round((c1 - c0) / (k1 - k0) * 1e3, 3),
                "coordinator_cpu_s_total": round(spent[0], 3)}


def run_in(code: Path, n: int, trees: int) -> dict:
    """:func:`run` of the ``session_scale`` module under ``code`` (a checkout), in a fresh Python process."""
    prog = (f"import json, sys; sys.path.insert(0, {str(code / 'benchmarks')!r}); import session_scale; "
            f"print(json.dumps(session_scale.run({n}, {trees})))")
    out = subprocess.run([sys.executable, "-c", prog], cwd=code, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[3, 10, 20, 50])
    ap.add_argument("--trees", type=int, nargs="+", default=[60, 30, 20, 12], help="trees per size (one per --sites)")
    ap.add_argument("--baseline", help="git ref to compare against, alternated with this tree (e.g. main)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per size and version")
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
                r = run_in(code, n, trees) if args.baseline else run(n, trees)
                print(name, r, flush=True)
                runs[name].append(r)
    summary = {}
    for n in args.sites:
        row = {k: statistics.median(r["coordinator_cpu_ms_per_round"] for r in v if r["sites"] == n)
               for k, v in runs.items()}
        if args.baseline:
            row["ratio_this_tree_to_baseline"] = round(row["this_tree"] / row["baseline"], 3)
        summary[str(n)] = row
        print(f"n = {n}: coordinator CPU ms per round (median) {row}", flush=True)
    meta = {"baseline_ref": args.baseline, "baseline_commit": versions["baseline"].name} if args.baseline else {}
    path = save("session_scale", {
        "description": "coordinator Session + secure aggregation CPU per tree round, driven in one process without "
                       "gRPC (tests/federation/inproc.py), depth 6, t = n/2 + 1, distributed noise"
                       + ("; baseline and this tree alternated in one run, each size in a fresh process"
                          if args.baseline else ""),
        **meta, "repeats": args.repeats,
        "summary_coordinator_cpu_ms_per_round_median": summary, "runs": runs})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
