"""Federated greedy trees on Adult: 3 site processes, gRPC over loopback with mutual TLS, distributed noise.

The setting of ``benchmarks/greedy.py``'s Adult table (ε = 1, δ = 1/n_train, the same public 70/30 splits of
the complete ``adult.data`` rows, learning rate 0.3, λ = 1, 20 trees of depth 3, the 32-candidate grid,
selection : leaf = 0.7 : 0.3) run as a real federation: the training part is dealt round-robin to three
``fedsbdt client`` processes, the coordinator selects every split from the noisy level histograms it
learns through secure aggregation (docs/greedy.md "Federated greedy").  Per split it records the test AUC
and, from the coordinator's log, per round: the secure-aggregation vector length and the wall time from the
previous release to this one (a level of a greedy tree; a leaf round), and the coordinator's CPU.  One
federation with random trees (S-BDT, same trees and depth) on the first split gives the random-round
baseline of the cost table.

Run:  python benchmarks/greedy_federated.py [--runs N] [--trees 20] [--depth 3]
Writes ``benchmarks/results/greedy_federated.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _util import ROOT, save, summary  # noqa: E402

from fedsbdt.common.data import load  # noqa: E402
from fedsbdt.common.metrics import auc  # noqa: E402
from fedsbdt.common.model import Ensemble  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402
from greedy import PAPER_ADULT, split_70_30  # noqa: E402
from fedsbdt.demo import Layout, Processes, follow_log, prepare, start_coordinator, start_site  # noqa: E402

SITES = 3
ADULT = ROOT / "examples" / "adult"


def complete_lines() -> list[str]:
    """The rows of adult.data that the schema keeps (no "?"), in file order: the rows of ``load``."""
    return [ln for ln in (ADULT / "adult.data").read_text().splitlines() if ln.strip() and "?" not in ln]


def federation(hp: dict, train_lines: list[str], seed: int, dataset: str = "adult",
               kinds: tuple[str, ...] = ("level", "tree")) -> tuple[Ensemble, list[dict], float]:
    """One 3-site federation on ``train_lines`` of ``dataset``; returns (model, the coordinator's release events
    of ``kinds``, seconds)."""
    with tempfile.TemporaryDirectory(prefix="fedsbdt-greedy-fed-") as tmp:
        layout = Layout(Path(tmp))
        plan, _ = prepare(layout, SITES, dataset, {**hp, "seed": seed}, ["localhost", "127.0.0.1"],
                          epoch_rounds=128)
        for k, sid in enumerate(plan.site_ids):  # replace the demo's split with this run's training part
            layout.site_data(sid).write_text("\n".join(train_lines[k::SITES]) + "\n")
        procs = Processes()
        events: list[dict] = []
        t0 = time.perf_counter()
        try:
            address, coord = start_coordinator(layout, procs)
            reader = follow_log(coord.stderr, lambda rec: events.append(rec)
                                if rec.get("event") in kinds else None, [])
            sites = [start_site(layout, sid, address, plan, procs) for sid in plan.site_ids]
            out = coord.stdout.read()
            coord.wait(timeout=3600)
            reader.join(timeout=10)
            for p in sites:
                p.communicate(timeout=120)
                if p.returncode != 0:
                    raise RuntimeError(f"a site failed: {(layout.logs).as_posix()}")
            if coord.returncode != 0:
                raise RuntimeError(f"coordinator failed: {out[-2000:]}")
            model = Ensemble.load(layout.coordinator / "model.json")
        finally:
            procs.kill_all()
    return model, events, time.perf_counter() - t0


def round_costs(events: list[dict], depth: int) -> dict:
    """Per kind of round: vector length, wall ms from the previous release, coordinator CPU ms."""
    out: dict[str, dict[str, list]] = {}
    for prev, ev in zip(events, events[1:]):
        kind = "level" if ev["event"] == "level" else "leaves"
        d = out.setdefault(kind, {"vector_len": [], "ms": [], "cpu_ms": []})
        d["vector_len"].append(int(ev["vector_len"]) if kind == "level" else 2 * 2**depth)
        d["ms"].append((float(ev["at"]) - float(prev["at"])) * 1e3)
        d["cpu_ms"].append((float(ev["cpu"]) - float(prev["cpu"])) * 1e3)
    return {k: {"vector_len": sorted(set(v["vector_len"])), "ms_median": statistics.median(v["ms"]),
                "coordinator_cpu_ms_median": statistics.median(v["cpu_ms"]), "rounds": len(v["ms"])}
            for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="70/30 splits (the central table has 15)")
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--depth", type=int, default=3)
    args = ap.parse_args()
    schema = Schema.load(ADULT / "schema.toml")
    lines = complete_lines()
    ds = load(ADULT / "adult.data", schema)
    assert len(lines) == ds.n, "the complete rows must be the rows load() keeps"
    aucs, costs, seconds = [], [], []
    base = {"epsilon": 1.0, "trees": args.trees, "depth": args.depth, "learning_rate": 0.3, "l2": 1.0}
    greedy = {**base, "tree_builder": "greedy", "selection": "histogram", "subsample": 1.0, "cyclical": False,
              "split_candidates": 32}
    for run in range(args.runs):
        tr, te = split_70_30(ds.n, run)
        hp = {**greedy, "delta": 1.0 / tr.size}
        model, events, secs = federation(hp, [lines[i] for i in tr], seed=7919 * run + 31 * args.trees + args.depth)
        test = ds.subset(te)
        aucs.append(auc(test.y, model.predict_margin(test.X)))
        costs.append(round_costs(events, args.depth))
        seconds.append(secs)
        print(f"run {run + 1}/{args.runs}: AUC {aucs[-1]:.4f}, {secs:.0f} s, {json.dumps(costs[-1])}", flush=True)
    tr, te = split_70_30(ds.n, 0)
    rmodel, revents, rsecs = federation({**base, "delta": 1.0 / tr.size}, [lines[i] for i in tr], seed=11)
    rtest = ds.subset(te)
    random_auc = auc(rtest.y, rmodel.predict_margin(rtest.X))
    random_cost = round_costs(revents, args.depth)
    print(f"random trees (split 0): AUC {random_auc:.4f}, {rsecs:.0f} s, {json.dumps(random_cost)}", flush=True)
    med = statistics.median
    result = {
        "description": "federated greedy trees (histogram selection) on Adult: 3 site processes, gRPC/mTLS on "
                       "loopback, distributed noise; test AUC per 70/30 split and per-round costs from the "
                       "coordinator's log (wall ms from the previous release, coordinator CPU ms)",
        "setting": {**greedy, "delta": "1/n_train", "sites": SITES, "runs": args.runs,
                    "splits": "benchmarks/greedy.py split_70_30(run), run = 0..runs-1"},
        "greedy_federated": {"auc": summary(aucs) | {"values": aucs}, "seconds": seconds, "costs": costs,
                             "level_ms_median": med(c["level"]["ms_median"] for c in costs),
                             "leaf_round_ms_median": med(c["leaves"]["ms_median"] for c in costs),
                             "level_vector_len": costs[0]["level"]["vector_len"],
                             "leaf_vector_len": costs[0]["leaves"]["vector_len"]},
        "random_federated": {"auc_split0": random_auc, "seconds": rsecs, "costs": random_cost},
        "paper_table1_xgb": PAPER_ADULT["greedy"],
    }
    path = save("greedy_federated", result)
    print(json.dumps({k: v for k, v in result["greedy_federated"].items() if k not in ("costs",)}, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    sys.exit(main())
