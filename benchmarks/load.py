"""Load benchmark: how far the federation scales on one machine (a script, not a test).

For each federation size n (default 3, 10, 25, 50 sites) every site is a
separate ``fedsbdt client`` process on loopback with mutual TLS, secure
randomness and distributed noise, holding 100,000 synthetic rows (8 numeric
features, a regression label; public ranges in the schema, data from a fixed
public seed).  The coordinator trains trees of depth 6.  Measured:

* wall time from the coordinator's start to its exit (process start-up,
  joins and every site's confirmation included), and from the first to the
  last released tree;
* per-round latency: the time between consecutive tree releases on the
  coordinator's monotonic clock (median, p99, max);
* coordinator CPU (user + system, from /proc, and per round between the first
  and last tree) and memory (peak RSS, VmHWM); the sites' CPU per round and
  their total resident memory;
* bytes per round: protobuf payload bytes the coordinator received and sent,
  divided by the rounds run (epoch setups amortised in).

Everything shares this machine's CPUs: with n sites, a round costs the
coordinator's CPU plus n sites' CPU, and on 2 cores the round cannot be
faster than (coordinator + Σ sites) CPU / 2.  The JSON records that bound
next to the measured latency.

Run one size at a time (heavy: 50 sites ≈ 50 Python processes):

    python benchmarks/load.py                               # 3, 10, 25, 50 sites (trees per size below)
    python benchmarks/load.py --sizes 3 10 --trees 1000
    python benchmarks/load.py --sizes 50 --trees-for 50=200 # append/replace one size in the results

Results: benchmarks/results/load.json and load.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsbdt.demo import Layout, Processes, follow_log, launch_coordinator, site_flags  # noqa: E402

ROWS = 100_000
FEATURES = 8
DEFAULT_TREES = {3: 1000, 10: 1000, 25: 300, 50: 200}
RESULTS = ROOT / "benchmarks" / "results"


# --------------------------------------------------------------------------- data, keys, plan


def schema_dict() -> dict:
    return {"name": "synthetic", "task": "regression", "target": "y", "label_range": [-4.0, 4.0],
            "id_column": "rid", "format": {"header": True, "separator": ","},
            "features": [{"name": f"x{j}", "type": "numeric", "range": [0.0, 1.0]} for j in range(FEATURES)]}


def write_site_data(path: Path, k: int) -> None:
    """100,000 rows for site k (public seed): y = a sparse nonlinear function of x plus noise."""
    import pandas as pd

    rng = np.random.default_rng(1000 + k)
    X = rng.random((ROWS, FEATURES))
    y = np.sin(3 * X[:, 0]) + 2 * (X[:, 1] > 0.5) - X[:, 2] * X[:, 3] + 0.3 * rng.standard_normal(ROWS)
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(FEATURES)])
    frame["y"] = np.clip(y, -4.0, 4.0)
    frame.insert(0, "rid", np.arange(ROWS, dtype=np.int64) + k * ROWS)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path)


def prepare(layout: Layout, n: int, trees: int, depth: int) -> object:
    from fedsbdt.common.federation.keys import IDENTITY_PUB, keygen, read_identity_pub
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.schema import Schema
    from fedsbdt.common.federation.pki import ca_init, ca_server, ca_sign
    from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan

    ca_init(layout.ca, name="fedsbdt load CA", days=7)
    ca_server(layout.ca, layout.coordinator, ["localhost", "127.0.0.1"], days=7)
    entries = []
    for k in range(n):
        sid = f"site-{k + 1:02d}"
        d = layout.site_state(sid)
        keygen(sid, d)
        ca_sign(layout.ca, d / "tls.csr", d / "tls.crt", days=7)
        entries.append(SiteEntry(sid, read_identity_pub(d / IDENTITY_PUB)))
        write_site_data(layout.root / "data" / f"{sid}.parquet", k)
    hp = Hyperparameters(trees=trees, depth=depth, seed=7, epsilon=1.0)
    # generous deadlines: 50 processes on 2 cores take minutes to start and seconds per stage
    plan = make_plan(Schema.from_dict(schema_dict()), hp, entries, session_id=f"load-{n}", epoch_rounds=128,
                     max_records_per_site=ROWS, deadlines=Deadlines(join=900.0, stage=120.0, quorum=900.0,
                                                                    finish=120.0))
    layout.plan.parent.mkdir(parents=True, exist_ok=True)
    plan.save(layout.plan)
    return plan


# --------------------------------------------------------------------------- /proc sampling


def proc_stat(pid: int) -> tuple[float, int, int] | None:
    """(cpu seconds user+system, VmRSS bytes, VmHWM bytes) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            parts = fh.read().rsplit(")", 1)[1].split()
        cpu = (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
        rss = hwm = 0
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
        return cpu, rss, hwm
    except (OSError, IndexError, ValueError):
        return None


class Sampler(threading.Thread):
    """Samples the coordinator's and the sites' CPU and memory every ``period`` seconds."""

    def __init__(self, coordinator: int, sites: dict[str, int], period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.coordinator, self.sites, self.period = coordinator, sites, period
        self.stop = threading.Event()
        self.coord_cpu = 0.0
        self.coord_hwm = 0
        self.coord_rss_max = 0
        self.sites_rss_max = 0
        self.site_cpu: dict[str, float] = {}

    def run(self) -> None:
        while not self.stop.wait(self.period):
            self.sample()

    def sample(self) -> None:
        s = proc_stat(self.coordinator)
        if s is not None:
            self.coord_cpu = max(self.coord_cpu, s[0])
            self.coord_rss_max = max(self.coord_rss_max, s[1])
            self.coord_hwm = max(self.coord_hwm, s[2])
        total = 0
        for sid, pid in self.sites.items():
            st = proc_stat(pid)
            if st is not None:
                self.site_cpu[sid] = max(self.site_cpu.get(sid, 0.0), st[0])
                total += st[1]
        self.sites_rss_max = max(self.sites_rss_max, total)


# --------------------------------------------------------------------------- one run


def run_size(n: int, trees: int, depth: int, keep: Path | None) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"fedsbdt-load-{n}-", dir=keep)
    layout = Layout(Path(tmp))
    print(f"[{n} sites] preparing keys, certificates and {n} × {ROWS} rows ...", flush=True)
    plan = prepare(layout, n, trees, depth)
    procs = Processes()
    releases: list[float] = []
    cpu_marks: list[float] = []
    incidents: list[str] = []
    first_event: dict[str, float] = {}

    def on_event(rec: dict) -> None:
        ev = rec.get("event")
        if ev == "tree":
            releases.append(float(rec["at"]))
            cpu_marks.append(float(rec["cpu"]))
            if len(releases) % 50 == 0:
                print(f"  tree {len(releases)}/{trees}", flush=True)
        elif ev in ("round_failed", "suspended", "session_failed", "epoch_failed"):
            incidents.append(rec.get("msg", ""))
        elif ev in ("started", "init") and ev not in first_event:
            first_event[ev] = time.monotonic()

    t0 = time.monotonic()
    p, address_of = launch_coordinator(layout, procs)
    reader = follow_log(p.stderr, on_event, [], layout.logs / "coordinator.log")
    address = address_of()
    port = address.rsplit(":", 1)[1]
    sites: dict[str, subprocess.Popen] = {}
    layout.logs.mkdir(parents=True, exist_ok=True)
    for sid in plan.site_ids:
        cmd = [sys.executable, "-m", "fedsbdt.cli", "--log-format", "json", "client", "--coordinator",
               f"localhost:{port}", "--site", sid, "--data", str(layout.root / "data" / f"{sid}.parquet"),
               "--state", str(layout.site_state(sid)), *site_flags(plan), "--json",
               "--reconnect-timeout", "900"]
        with open(layout.logs / f"{sid}.log", "w") as err:
            sites[sid] = procs.procs[sid] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    sampler = Sampler(p.pid, {s: q.pid for s, q in sites.items()})
    sampler.start()
    print(f"[{n} sites] {n + 1} processes started; training {trees} trees of depth {depth} ...", flush=True)
    try:
        out, _ = p.communicate(timeout=6 * 3600)
        wall = time.monotonic() - t0
        reader.join(timeout=30)
        site_out = {}
        for sid, q in sites.items():
            sout, _ = q.communicate(timeout=600)
            if q.returncode != 0:
                raise RuntimeError(f"{sid} failed: {(layout.logs / f'{sid}.log').read_text()[-2000:]}")
            site_out[sid] = json.loads(sout)
    finally:
        sampler.stop.set()
        procs.kill_all()
    if p.returncode != 0:
        raise RuntimeError(f"coordinator failed ({p.returncode}): {out[-2000:]}")
    coord = json.loads(out)
    lat = np.diff(np.asarray(releases)) * 1e3
    rounds_run = coord["trees"] + 1 + coord["rounds_failed"]  # trees, the initial score, retries
    span = releases[-1] - releases[0]
    site_cpu_round = [r["cpu_ms_per_round"] for r in site_out.values() if r.get("cpu_ms_per_round")]
    coord_cpu_round = (cpu_marks[-1] - cpu_marks[0]) / (len(cpu_marks) - 1) * 1e3
    res = {
        "sites": n, "trees": coord["trees"], "depth": depth, "rows_per_site": ROWS,
        "wall_seconds": round(wall, 2),
        "startup_seconds": round(first_event.get("started", first_event.get("init", t0)) - t0, 2),
        "first_to_last_tree_seconds": round(span, 2),
        "round_latency_ms": {"median": round(float(np.median(lat)), 2), "p99": round(float(np.percentile(lat, 99)), 2),
                             "max": round(float(lat.max()), 2), "mean": round(float(lat.mean()), 2)},
        "rounds_failed": coord["rounds_failed"],
        "coordinator": {"cpu_seconds": round(sampler.coord_cpu, 2),
                        "cpu_ms_per_round": round(coord_cpu_round, 2),
                        "cpu_utilisation_during_rounds": round(coord_cpu_round / float(np.mean(lat)), 3),
                        "peak_rss_mib": round(sampler.coord_hwm / 2**20, 1)},
        "sites_cpu_ms_per_round": {"mean": round(statistics.mean(site_cpu_round), 2),
                                   "max": round(max(site_cpu_round), 2)} if site_cpu_round else None,
        "sites_total_rss_mib_peak": round(sampler.sites_rss_max / 2**20, 1),
        "bytes_per_round": {"coordinator_received": round(coord["bytes_received"] / rounds_run),
                            "coordinator_sent": round(coord["bytes_sent"] / rounds_run),
                            "per_site_sent": round(statistics.mean(r["bytes_sent"] for r in site_out.values())
                                                   / rounds_run),
                            "per_site_received": round(statistics.mean(r["bytes_received"]
                                                                       for r in site_out.values()) / rounds_run)},
        "incidents": incidents[:10],
    }
    if site_cpu_round:
        total = coord_cpu_round + sum(site_cpu_round)
        res["cpu_ms_per_round_all_processes"] = round(total, 1)
        res["cpu_bound_ms_per_round_on_this_machine"] = round(total / (os.cpu_count() or 1), 1)
    print(json.dumps(res), flush=True)
    return res


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = sorted(results, key=lambda r: r["sites"])
    n = [r["sites"] for r in rs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.plot(n, [r["round_latency_ms"]["median"] for r in rs], "o-", label="per-round latency, median")
    a.plot(n, [r["round_latency_ms"]["p99"] for r in rs], "s--", label="per-round latency, p99")
    a.plot(n, [r.get("cpu_bound_ms_per_round_on_this_machine", np.nan) for r in rs], "^:",
           label="CPU bound: all processes' CPU per round / cores")
    a.axhline(100, color="grey", lw=0.8, ls="-.", label="goal: 100 ms")
    a.set_xlabel("sites (separate processes, one 2-core machine)")
    a.set_ylabel("ms per round")
    a.set_yscale("log")
    a.legend(fontsize=8)
    a.set_title("latency per round (depth 6, 100k rows/site)")
    b.plot(n, [r["coordinator"]["cpu_ms_per_round"] for r in rs], "o-", label="coordinator CPU per round")
    b.plot(n, [r["sites_cpu_ms_per_round"]["mean"] if r["sites_cpu_ms_per_round"] else np.nan for r in rs], "s-",
           label="one site's CPU per round (mean)")
    b.plot(n, [r.get("cpu_ms_per_round_all_processes", np.nan) for r in rs], "^-", label="all processes' CPU per round")
    b.set_xlabel("sites")
    b.set_ylabel("CPU ms per round")
    b.set_yscale("log")
    b.legend(fontsize=8)
    b.set_title("where the time goes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 10, 25, 50])
    ap.add_argument("--trees", type=int, help="trees for every size (default: per size, see DEFAULT_TREES)")
    ap.add_argument("--trees-for", action="append", default=[], metavar="N=T", help="trees for one size")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--keep", type=Path, help="keep the run directories under this folder")
    ap.add_argument("--out", type=Path, default=RESULTS / "load.json")
    args = ap.parse_args()
    per = dict(DEFAULT_TREES)
    for kv in args.trees_for:
        k, v = kv.split("=")
        per[int(k)] = int(v)
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    results = {r["sites"]: r for r in old.get("results", [])}
    for n in args.sizes:
        trees = args.trees or per.get(n, 1000)
        results[n] = run_size(n, trees, args.depth, args.keep)
        doc = {"benchmark": "benchmarks/load.py", "date": time.strftime("%Y-%m-%d"),
               "setting": {"rows_per_site": ROWS, "features": FEATURES, "depth": args.depth,
                           "transport": "gRPC over loopback, mutual TLS", "noise": "distributed",
                           "randomness": "secure (OpenDP exact samplers)", "epoch_rounds": 128,
                           "note": "coordinator and all sites are processes on this one machine"},
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "platform": platform.platform(), "memory_gib": round(
                               os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
               "results": [results[k] for k in sorted(results)]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        plot(doc["results"], args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
