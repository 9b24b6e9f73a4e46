"""Run ``fedsbdt`` (the coordinator) under memory and CPU probes (benchmarks only; no cost to the package).

``python benchmarks/_coordinator_probe.py OUTDIR [cli args...]`` runs ``fedsbdt.cli.main`` with
the given arguments and writes into OUTDIR, chosen by the environment:

* always: ``rss.jsonl``, one line per 0.2 s: elapsed seconds, VmRSS / VmHWM (MB), the Python heap that
  tracemalloc sees (MB, when on), thread count, process CPU seconds, and the seconds spent in Python's cyclic
  garbage collector so far (thread CPU seconds) and its collections, per generation (``gc_s``, ``gc_n``:
  ``gc.callbacks``);
* ``FEDSBDT_PROBE_TRACEMALLOC=N`` (frames): tracemalloc on; a snapshot whenever the traced Python memory
  reaches a new high (at most one per 2 s) and one at exit, the top allocation sites of the highest one in
  ``tracemalloc_peak.txt`` and of the last in ``tracemalloc_end.txt``;
* ``FEDSBDT_PROBE_CPROFILE=1``: cProfile of the whole process (the event loop's thread included: the
  profiler is installed in every thread with ``threading.setprofile``) in ``cprofile.pstats``.

RSS minus the traced Python heap is what gRPC's C core, OpenSSL, numpy buffers and the allocator hold.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path


def _status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
            elif k == "Threads":
                out[k] = int(v)
    return out


def _mappings(top: int = 15) -> list[dict]:
    """The largest mappings by resident size (/proc/self/smaps): which heap, arena or library holds the RSS."""
    maps, cur = [], None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                cur = {"range": head[0], "name": head[5] if len(head) > 5 else "[anon]", "rss_mb": 0.0}
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur["size_mb"] = round((hi - lo) / 2**20, 1)
                maps.append(cur)
            elif head[0] == "Rss:" and cur is not None:
                cur["rss_mb"] = round(int(head[1]) / 1024, 1)
    by_name: dict[str, float] = {}
    for m in maps:
        by_name[m["name"]] = round(by_name.get(m["name"], 0.0) + m["rss_mb"], 1)
    return sorted(maps, key=lambda m: -m["rss_mb"])[:top] + [{"by_name": dict(sorted(
        by_name.items(), key=lambda kv: -kv[1])[:top])}]


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.argv = ["fedsbdt"] + sys.argv[2:]
    frames = int(os.environ.get("FEDSBDT_PROBE_TRACEMALLOC", "0") or 0)
    if frames:
        tracemalloc.start(frames)
    t0 = time.monotonic()
    stop = threading.Event()
    collected = {"s": [0.0, 0.0, 0.0], "n": [0, 0, 0], "start": 0.0}

    def on_gc(phase: str, info: dict) -> None:  # runs in the collecting thread, which holds the GIL throughout
        if phase == "start":
            collected["start"] = time.thread_time()  # CPU time: the wall clock counts other processes' turns
        else:
            collected["s"][info["generation"]] += time.thread_time() - collected["start"]
            collected["n"][info["generation"]] += 1

    gc.callbacks.append(on_gc)
    best = {"traced": 0.0, "snap": None, "at": 0.0, "rss": 0.0}

    def sample() -> None:
        with open(out_dir / "rss.jsonl", "w") as fh:
            last_snap = 0.0
            while not stop.wait(0.2):
                st = _status()
                row = {"t": round(time.monotonic() - t0, 2), "wall": round(time.time(), 2), "rss_mb": round(st["VmRSS"], 1),
                       "hwm_mb": round(st["VmHWM"], 1), "threads": st["Threads"],
                       "cpu_s": round(time.process_time(), 2), "gc_s": [round(x, 4) for x in collected["s"]],
                       "gc_n": list(collected["n"])}
                if frames:
                    cur, _ = tracemalloc.get_traced_memory()
                    row["py_mb"] = round(cur / 2**20, 1)
                    now = time.monotonic()
                    if cur > best["traced"] * 1.05 and now - last_snap > 2.0:
                        best.update(traced=cur, snap=tracemalloc.take_snapshot(), at=row["t"], rss=st["VmRSS"])
                        last_snap = time.monotonic()
                fh.write(json.dumps(row) + "\n")
                fh.flush()

    th = threading.Thread(target=sample, name="probe", daemon=True)
    th.start()

    def top(snap, name: str, title: str) -> None:
        stats = snap.statistics("traceback")
        total = sum(s.size for s in stats)
        with open(out_dir / name, "w") as fh:
            fh.write(f"{title}; traced total {total / 2**20:.1f} MB in {sum(s.count for s in stats)} blocks\n\n")
            for s in stats[:25]:
                fh.write(f"{s.size / 2**20:8.2f} MB {s.count:8d} blocks\n")
                for line in s.traceback.format()[-2 * frames:]:
                    fh.write("    " + line + "\n")
            by_line = snap.statistics("lineno")
            fh.write("\nby line:\n")
            for s in by_line[:40]:
                fh.write(f"{s.size / 2**20:8.2f} MB {s.count:8d}  {s.traceback}\n")

    def finish() -> None:
        stop.set()
        th.join(timeout=2)
        (out_dir / "exit.json").write_text(json.dumps({"numba_loaded": "numba" in sys.modules,
                                                       "modules": len(sys.modules), "mappings": _mappings()}))
        if frames:
            if best["snap"] is not None:
                top(best["snap"], "tracemalloc_peak.txt",
                    f"highest traced heap at t = {best['at']} s (RSS then {best['rss']:.0f} MB)")
            top(tracemalloc.take_snapshot(), "tracemalloc_end.txt", "at exit")

    atexit.register(finish)
    from fedsbdt.cli import main as cli_main

    if os.environ.get("FEDSBDT_PROBE_CPROFILE"):
        import cProfile

        prof = cProfile.Profile()
        # the event loop runs in its own thread: profile every thread started from here on (one profiler
        # object cannot be enabled in two threads at once, so threads get their own and are merged)
        profs: list = [prof]
        lock = threading.Lock()

        def in_thread(*_a):
            p = cProfile.Profile()
            with lock:
                profs.append(p)
            threading.setprofile(None)
            sys.setprofile(None)
            p.enable()

        threading.setprofile(in_thread)

        def dump() -> None:
            import pstats

            for p in profs:
                p.disable()
            st = pstats.Stats(profs[0])
            for p in profs[1:]:
                try:
                    st.add(p)
                except TypeError:  # a thread's profiler that never collected anything
                    pass
            st.dump_stats(str(out_dir / "cprofile.pstats"))

        atexit.register(dump)
        prof.enable()
        try:
            code = cli_main()
        finally:
            prof.disable()
    else:
        code = cli_main()
    sys.exit(code)


if __name__ == "__main__":
    main()
