"""What the coordinator holds in memory at n sites, without gRPC and without the sites (a script).

Records one in-process session (``benchmarks/session_scale.py``: Session and n SiteMachines, Abalone
sample, depth 6, distributed noise, fast rounds unless the plan refuses them), then replays every recorded
coordinator call into a fresh Session *and* a :class:`fedsbdt.server.service.FederationService` (only its
outboxes: every event the session emits is dispatched into them as over gRPC, nothing is sent) under
``tracemalloc``.  So the numbers are the coordinator process's Python heap — session, secure aggregation,
epochs, outboxes — without the sites, the transport's C buffers or the interpreter's code.

Reports the traced heap after each release (``retained_mib``), its peak, a least-squares slope per round
over the second half of the releases (``growth_kib_per_round``: what stays behind per round), and where
the heap is at the end (top allocation sites).

Run:  python benchmarks/coordinator_memory.py [--sites 50 100] [--trees 70] [--epoch-rounds 64] [--graph sparse]
          [--out coordinator_memory]
"""
from __future__ import annotations

import argparse
import statistics
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _util import save  # noqa: E402
from session_scale import _counter_bytes, record, replay_calls  # noqa: E402
from fedsbdt.server.service import FederationService  # noqa: E402

try:
    from fedsbdt.server.outbox import Outbox  # noqa: E402
except ImportError:  # a checkout before server/outbox.py (``--baseline-python``)
    from fedsbdt.server.service import Outbox  # noqa: E402
from fedsbdt.server.session import Session  # noqa: E402

MIB = 1 << 20


def held(n: int, trees: int, epoch_rounds: int, graph: str = "complete", neighbours: int = 0,
         trace: bool = False, baseline_python: str | None = None) -> dict:
    """Record a session of ``trees`` trees over n sites, then replay the coordinator alone in a fresh process."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedsbdt-coord-memory-") as tmp:
        rec = record(Path(tmp), n, trees, epoch_rounds=epoch_rounds, graph=graph, neighbours=neighbours)
        dump = Path(tempfile.gettempdir()) / f"fedsbdt-coordinator-calls-{graph}-{n}.pickle"  # kept: replay again
        # with ``--replay FILE`` under another checkout's interpreter
        dump.write_bytes(pickle.dumps((rec["plan"].canonical_json, rec["start"], rec["calls"])))
        recorded_s = time.monotonic() - t0
        ncalls = len(rec["calls"])
        del rec
        runs = {}
        for name, python in [("baseline", baseline_python), ("this_tree", sys.executable)]:
            if python is None:
                continue
            out = subprocess.run([python, __file__, "--replay", str(dump)] + (["--trace"] if trace else []),
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"the replay with {python} failed:\n{out.stderr[-3000:]}")
            runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
    head = {"sites": n, "trees": trees, "graph": graph, "neighbours": neighbours, "epoch_rounds": epoch_rounds,
            "calls": ncalls, "record_s": round(recorded_s, 1)}
    return {**head, **runs["this_tree"], **({"baseline": runs["baseline"]} if "baseline" in runs else {})}


def replay_alone(dump: Path, trace: bool, top: int = 12, checkpoint: bool = False) -> dict:
    """The replay half of :func:`held` (this process holds nothing else): RSS after each release, peak RSS,
    the heap's growth per round and, with ``trace``, the top allocation sites at the end (tracemalloc sees
    Python's allocations only; protobuf messages live in C memory and show in RSS)."""
    from fedsbdt.common.federation.plan import Plan

    canonical, start, calls = pickle.loads(dump.read_bytes())
    plan = Plan.from_canonical_json(canonical)
    if trace:
        tracemalloc.start(1)
    store = None
    if checkpoint:  # the SQLite checkpoint of ``fedsbdt coordinator`` (a ready epoch's rows then live on disk)
        from fedsbdt.server.checkpoint import CoordinatorStore

        store = CoordinatorStore(Path(tempfile.mkdtemp(prefix="fedsbdt-coord-memory-db-")), plan.sha256)
    replay = Session(plan, plan.make_randomness(True), start, store, randbytes=_counter_bytes())
    base = _rss()  # after the Session's warm-up (its numba kernels compiled): what it holds from here on
    service = FederationService(replay, tls=False)
    samples: list[tuple[int, int]] = []  # (trees released, RSS above the start) after each release
    cpu_at: list[float] = []  # process time at each release
    release = replay._release

    def on_release(*a, **k):
        out = release(*a, **k)
        cpu_at.append(time.process_time())
        samples.append((len(replay.trees), _rss() - base))
        return out

    replay._release = on_release

    def after(name, args, out):
        if name == "join":
            token, out = out
            service.outboxes[args[0]] = Outbox(token)
        service.dispatch(out)

    cpu = time.process_time()
    replay_calls(replay, calls, after)
    cpu = time.process_time() - cpu
    if replay.model_json is None:
        raise RuntimeError("the replayed coordinator did not finish")
    half = samples[len(samples) // 2:]
    boxes = service.outboxes.values()
    r = {"rss_base_mib": round(base / MIB, 1), "peak_rss_mib": round(_status("VmHWM") / MIB, 1),
         "rss_mib_end": round(samples[-1][1] / MIB, 1), "growth_kib_per_round": round(_slope(half) / 1024, 2),
         "replay_cpu_s": round(cpu, 2),
         # the coordinator alone (no transport, no sites): CPU between releases, median (an epoch setup
         # falls into one interval) and mean over all (the setups amortised)
         "replay_cpu_ms_per_round_median": round(statistics.median(np.diff(cpu_at[1:])) * 1e3, 3),
         "replay_cpu_ms_per_round_mean": round((cpu_at[-1] - cpu_at[1]) / (len(cpu_at) - 2) * 1e3, 3),
         "outbox_events_held": sum(len(b.events) for b in boxes),
         "outbox_mib_held": round(sum(_size(e) for b in boxes for e in b.events) / MIB, 2),  # per outbox
         "outbox_mib_distinct": round(sum(_size(e) for e in {id(_body(e)): e for b in boxes
                                                              for e in b.events}.values()) / MIB, 2),
         "rss_mib_after_release": [(k, round(b / MIB, 1)) for k, b in samples]}
    if trace:
        snap = tracemalloc.take_snapshot()
        r["python_heap_mib_end"] = round(tracemalloc.get_traced_memory()[0] / MIB, 2)
        r["top_allocations_at_end"] = [{"where": str(s.traceback[0]), "mib": round(s.size / MIB, 2),
                                        "blocks": s.count} for s in snap.statistics("lineno")[:top]]
    return r


def _size(event) -> int:
    """Bytes of one held event: an encoded body (server/outbox.py) or a protobuf Event (earlier checkouts)."""
    return event.body.size if hasattr(event, "body") else event.ByteSize()


def _body(event):
    return event.body if hasattr(event, "body") else event


def _status(field: str) -> int:
    """A /proc/self/status memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rss() -> int:
    return _status("VmRSS")


def _slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of bytes against trees released (0 for fewer than two points)."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[50, 100])
    ap.add_argument("--trees", type=int, default=70, help="trees per run (default 70: past one epoch of 64)")
    ap.add_argument("--epoch-rounds", type=int, default=64, help="round slots per epoch (the plan default, 64)")
    ap.add_argument("--graph", choices=("complete", "sparse"), default="complete")
    ap.add_argument("--neighbours", type=int, default=0, help="k of the sparse graph (default 2·⌈2·log2 n⌉)")
    ap.add_argument("--baseline-python", help="also replay the same recording with this interpreter (another "
                                              "checkout's venv), e.g. to compare with main")
    ap.add_argument("--checkpoint", action="store_true",
                    help="replay with the coordinator's SQLite checkpoint, as `fedsbdt coordinator` runs")
    ap.add_argument("--trace", action="store_true", help="also list the top Python allocation sites (tracemalloc)")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # internal: the replay half, in a fresh process
    ap.add_argument("--out", default="coordinator_memory", help="results file in benchmarks/results/ (no .json)")
    args = ap.parse_args()
    if args.replay:
        print(json.dumps(replay_alone(args.replay, args.trace, checkpoint=args.checkpoint)))
        return
    runs = []
    for n in args.sites:
        k = args.neighbours
        if args.graph == "sparse" and not args.neighbours:
            import math
            k = min(2 * math.ceil(2 * math.log2(n)), n - 2)
            k -= k % 2
        r = held(n, args.trees, args.epoch_rounds, args.graph, k if args.graph == "sparse" else 0, args.trace,
                 args.baseline_python)
        print({x: r[x] for x in r if x not in ("rss_mib_after_release", "top_allocations_at_end", "baseline")},
              flush=True)
        if "baseline" in r:
            print("  baseline:", {x: v for x, v in r["baseline"].items() if x != "rss_mib_after_release"}, flush=True)
        for s in r.get("top_allocations_at_end", [])[:6]:
            print("   ", s, flush=True)
        runs.append(r)
    path = save(args.out, {"description": __doc__.split("\n\n")[0], "load_average": os.getloadavg(),
                           "runs": runs})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
