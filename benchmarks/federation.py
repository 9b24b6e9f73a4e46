"""Federated S-BDT over gRPC on loopback versus the centralised engine (a script, not a test).

Speed: 3 sites (separate processes, mutual TLS, distributed noise, secure
randomness), Adult's training file dealt round-robin in thirds, 1000 trees of
depth 6.  Measures the total wall time (coordinator start → model verified by
every site), the per-round latency (time between consecutive tree releases,
from the coordinator's monotonic clock; median and p99), the bytes each site
sent and received (protobuf payloads, without HTTP/2 and TLS framing), and
compares with ``fedsbdt.common.engine.train`` on the union of the data with the same
hyperparameters.  The same is repeated in central noise mode (sites add no
noise) to separate the transport + secure-aggregation cost from the cost of
every site drawing its own noise share.

Utility: at the paper's Adult settings (Fig. 4: ε = 0.02, T = 200, d = 5,
γ = 0.005, r1 = 0.1, g* = 0.5, h* = 0.1), K centralised runs and K federated
runs for each federated setting, with the same public split seeds; mean test
AUC ± standard error.  Settings: the default t = ⌊n/2⌋ + 1 = 2 of 3 with
dropout_slack s = 0 (each round's noise split k_r = max(t, |P_r| − s) − c
ways: exactly σ² when all three sites take part) and with s = n − t (the
old fixed split into t − c shares: 3/2·σ² when all three take part).  The
initial score carries n full Laplace shares in both.

Run:  python benchmarks/federation.py [--trees 1000] [--depth 6] [--utility-runs 8] [--only speed|utility]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsbdt.common.cli import evaluate_model  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.data import load  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.model import Ensemble  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402
from fedsbdt.demo import EXAMPLES, Layout, Processes, follow_log, prepare, start_coordinator, start_site  # noqa: E402

SCHEMA = Schema.load(EXAMPLES / "adult" / "schema.toml")
PAPER_ADULT = dict(epsilon=0.02, trees=200, depth=5, subsample=0.005, r1=0.1, grad_clip=0.5, hess_clip=0.1)


def federated_run(hp: dict, sites: int, noise: str = "distributed", threshold: int | None = None,
                  dropout_slack: int = 0) -> dict:
    """One federation run on Adult; returns timings, bytes and the test metric."""
    with tempfile.TemporaryDirectory(prefix="fedsbdt-bench-") as tmp:
        layout = Layout(Path(tmp))
        plan, rows = prepare(layout, sites, "adult", hp, ["localhost", "127.0.0.1"], noise=noise,
                             epoch_rounds=128, threshold=threshold, dropout_slack=dropout_slack)
        procs = Processes()
        releases: list[float] = []
        cpu: list[float] = []
        index: list[int] = []
        events: list[dict] = []

        def on_event(rec: dict) -> None:
            if rec.get("event") == "tree":
                index.append(int(rec["tree"]))
                releases.append(float(rec["at"]))
                cpu.append(float(rec["cpu"]))
            elif rec.get("event") in ("round_failed", "suspended", "session_failed"):
                events.append(rec)

        t0 = time.perf_counter()
        try:
            address, coord = start_coordinator(layout, procs)
            reader = follow_log(coord.stderr, on_event, [], layout.logs / "coordinator.log")
            ps = {sid: start_site(layout, sid, address, plan, procs) for sid in plan.site_ids}
            out = coord.stdout.read()  # not communicate(): it would read stderr too, taking lines from the reader
            coord.wait(timeout=3600)
            reader.join(timeout=10)
            results = {}
            for sid, p in ps.items():
                sout, _ = p.communicate(timeout=120)
                if p.returncode != 0:
                    raise RuntimeError(f"{sid} failed: {(layout.logs / f'{sid}.log').read_text()[-2000:]}")
                results[sid] = json.loads(sout)
            wall = time.perf_counter() - t0
            if coord.returncode != 0:
                raise RuntimeError(f"coordinator failed: {out}")
            coord_res = json.loads(out)
        finally:
            procs.kill_all()
        model = Ensemble.load(layout.coordinator / "model.json")
        metric = evaluate_model(model, load(layout.test_data, SCHEMA))
        lat = np.diff(np.asarray(releases)) * 1e3
        return {
            "wall_seconds": round(wall, 3),
            "first_to_last_tree_seconds": round(releases[-1] - releases[0], 3) if releases else None,
            "round_latency_ms_median": round(float(np.median(lat)), 3) if lat.size else None,
            "round_latency_ms_p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
            "rounds_failed": coord_res["rounds_failed"],
            "cpu_ms_per_round": {"coordinator": round((cpu[-1] - cpu[0]) / (index[-1] - index[0]) * 1e3, 3)
                                 if len(cpu) > 1 else None,
                                 **{sid: r.get("cpu_ms_per_round") for sid, r in results.items()}},
            "incidents": [e.get("msg") for e in events][:10],
            "bytes_per_site": {sid: {"sent": r["bytes_sent"], "received": r["bytes_received"]}
                               for sid, r in results.items()},
            "coordinator_bytes": {"received": coord_res["bytes_received"], "sent": coord_res["bytes_sent"]},
            "auc": metric["auc"], "accuracy": metric["accuracy"], "epsilon": model.privacy["epsilon"],
            "rows": rows,
        }


def central_run(hp: dict) -> dict:
    ds = load(EXAMPLES / "adult" / "adult.data", SCHEMA)
    test = load(EXAMPLES / "adult" / "adult.test", SCHEMA)
    h = Hyperparameters(**hp)
    t0 = time.perf_counter()
    res = train(ds, h)
    wall = time.perf_counter() - t0
    m = evaluate_model(res.model, test)
    return {"wall_seconds": round(wall, 3), "per_round_ms": round(wall / h.total_rounds * 1e3, 3),
            "auc": m["auc"], "accuracy": m["accuracy"], "epsilon": res.model.privacy["epsilon"]}


def mean_se(xs: list[float]) -> tuple[float, float]:
    return float(np.mean(xs)), float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else 0.0


def speed_part(args) -> dict:
    speed_hp = {"epsilon": 1.0, "trees": args.trees, "depth": args.depth, "seed": 1}
    print(f"centralised engine: {args.trees} trees, depth {args.depth} ...", flush=True)
    central = central_run(speed_hp)
    print(json.dumps(central), flush=True)
    print("federation, distributed noise ...", flush=True)
    fed = federated_run(speed_hp, args.sites, "distributed")
    print(json.dumps(fed), flush=True)
    speed = {"setting": {"dataset": "adult (adult.data in thirds, adult.test held out)", "sites": args.sites,
                         **speed_hp, "transport": "gRPC over loopback, mutual TLS", "randomness": "secure",
                         "note": "coordinator and all sites share this machine's CPUs"},
             "centralised": central, "federated_distributed_noise": fed}
    n = args.trees
    speed["overhead_ms_per_round_distributed"] = round((fed["first_to_last_tree_seconds"] / (n - 1)
                                                        - central["wall_seconds"] / n) * 1e3, 3)
    speed["ratio_wall_distributed"] = round(fed["wall_seconds"] / central["wall_seconds"], 2)
    if not args.skip_central_mode:
        print("federation, central noise (sites add no noise) ...", flush=True)
        fed_c = federated_run(speed_hp, args.sites, "central")
        print(json.dumps(fed_c), flush=True)
        speed["federated_central_noise"] = fed_c
        speed["overhead_ms_per_round_central_noise"] = round((fed_c["first_to_last_tree_seconds"] / (n - 1)
                                                              - central["wall_seconds"] / n) * 1e3, 3)
        speed["ratio_wall_central_noise"] = round(fed_c["wall_seconds"] / central["wall_seconds"], 2)
    return speed


def utility_part(args) -> dict:
    util = {"setting": {"dataset": "adult", "sites": args.sites, **PAPER_ADULT, "runs": args.utility_runs}}
    t = args.sites // 2 + 1
    slack_max = args.sites - t
    settings = {f"federated_t{t}_s0": 0, f"federated_t{t}_s{slack_max}": slack_max}
    util["setting"]["threshold"] = t
    runs: dict[str, list[float]] = {"centralised": [], **{name: [] for name in settings}}
    for k in range(args.utility_runs):
        hp = dict(PAPER_ADULT, seed=1000 + k)
        print(f"utility run {k + 1}/{args.utility_runs} ...", flush=True)
        runs["centralised"].append(central_run(hp)["auc"])
        for name, s in settings.items():
            runs[name].append(federated_run(hp, args.sites, threshold=t, dropout_slack=s)["auc"])
        print("  " + "  ".join(f"{name} auc {v[-1]:.4f}" for name, v in runs.items()), flush=True)
    cm, cse = mean_se(runs["centralised"])
    util["auc"] = runs
    util["summary"] = {}
    for name, xs in runs.items():
        m, se = mean_se(xs)
        entry = {"mean": m, "se": se}
        if name != "centralised":
            diff_se = float(np.sqrt(se**2 + cse**2))
            entry.update({"difference": m - cm, "se_of_difference": diff_se,
                          "within_one_se": abs(m - cm) <= diff_se})
        util["summary"][name] = entry
    return util


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--utility-runs", type=int, default=8)
    ap.add_argument("--skip-central-mode", action="store_true")
    ap.add_argument("--only", choices=["speed", "utility"],
                    help="run one part and keep the other part of an existing results file")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "federation.json"))
    args = ap.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if args.only and out.exists() else {}
    if args.only != "utility":
        result["speed"] = speed_part(args)
        result["speed_date"] = time.strftime("%Y-%m-%d")
    if args.only != "speed":
        result["utility"] = utility_part(args)
        result["utility_date"] = time.strftime("%Y-%m-%d")
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "platform": platform.platform()}
    result.pop("date", None)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if "speed" in result:
        sp = result["speed"]
        print(json.dumps({k: sp[k] for k in sp if k.startswith(("overhead", "ratio"))}, indent=2))
    if "utility" in result:
        print(json.dumps(result["utility"]["summary"], indent=2))


if __name__ == "__main__":
    main()
