"""What the live status page (``--status-port``) costs the coordinator, by roster size.

In one process, without gRPC: a :class:`~fedsbdt.server.session.Session` of n sites (random identity keys, the
Abalone schema), its :class:`~fedsbdt.server.status.CoordinatorMonitor`, and the page's HTTP server on loopback.
Measures the observer the service calls after every session step (nothing changed: the common case), one
snapshot (taken at most every 0.2 s), and a request for ``/status.json`` and for ``/metrics`` (best of
several rounds, and the median).  Writes ``results/status_page.json``.

    python benchmarks/status_page.py [--sites 3 30 100 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import urllib.request

from _util import ROOT, save

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import SiteEntry, make_plan
from fedsbdt.common.schema import Schema
from fedsbdt.common.statuspage import StatusServer
from fedsbdt.server.session import Session
from fedsbdt.server.status import COORDINATOR_PAGE, CoordinatorMonitor


def per_call(fn, n: int, rounds: int = 5) -> tuple[float, float]:
    """(best, median) seconds per call of ``fn`` over ``rounds`` rounds of ``n`` calls."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n)
    return min(times), statistics.median(times)


def measure(n: int) -> dict:
    schema = Schema.load(ROOT / "examples" / "abalone" / "schema.toml")
    plan = make_plan(schema, Hyperparameters(trees=100, depth=3, epsilon=1.0),
                     [SiteEntry(f"site-{i}", os.urandom(32)) for i in range(n)])
    session = Session(plan, plan.make_randomness(False), time.monotonic())
    monitor = CoordinatorMonitor(session)
    server = StatusServer("127.0.0.1", 0, COORDINATOR_PAGE).start(monitor.current, monitor.registry)
    try:
        observe = per_call(monitor._observe, 2000)
        snapshot = per_call(lambda: monitor._take_snapshot(time.monotonic()), 50)
        status = per_call(lambda: urllib.request.urlopen(server.url + "status.json").read(), 30)
        metrics = per_call(lambda: urllib.request.urlopen(server.url + "metrics").read(), 30)
    finally:
        server.close()
        session.close()
    return {"sites": n, "observe_us": [round(x * 1e6, 2) for x in observe],
            "snapshot_us": [round(x * 1e6, 1) for x in snapshot],
            "status_json_ms": [round(x * 1e3, 3) for x in status], "metrics_ms": [round(x * 1e3, 3) for x in metrics],
            "snapshot_cpu_share_at_5_per_s": round(5 * snapshot[1], 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[3, 30, 100, 300])
    args = ap.parse_args()
    rows = [measure(n) for n in args.sites]
    print(f"{'sites':>6} {'observe µs':>11} {'snapshot µs':>12} {'status.json ms':>15} {'metrics ms':>11}  (best / median)")
    for r in rows:
        print(f"{r['sites']:>6} {r['observe_us'][0]:>5} / {r['observe_us'][1]:<5}"
              f"{r['snapshot_us'][0]:>6} / {r['snapshot_us'][1]:<6}"
              f"{r['status_json_ms'][0]:>7} / {r['status_json_ms'][1]:<7}"
              f"{r['metrics_ms'][0]:>5} / {r['metrics_ms'][1]:<5}")
    print(f"wrote {save('status_page', {'rows': rows})}")


if __name__ == "__main__":
    main()
