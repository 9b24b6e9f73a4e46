"""Coordinator CPU per round and site memory in a real federation, this tree against a baseline (a script).

Runs a 3-site federation on Adult (``adult.data`` dealt round-robin, separate
processes, gRPC over loopback with mutual TLS, distributed noise, 1000 trees
of depth 6 by default) once with the code of a baseline git ref (exported with
``git archive`` to a temporary directory, run from there) and once with this
working tree, alternating ``--repeats`` times so that both see the same
machine load.  Per run it records:

* coordinator CPU per round: process time between the first and last tree
  release (the ``cpu`` field of its ``tree`` events) / rounds;
* each site's CPU per round (its own ``cpu_ms_per_round``);
* peak resident memory (``VmHWM`` from ``/proc/<pid>/status``, polled) of
  the coordinator and of every site process;
* the median time between tree releases.

``--fast-path {auto,never,both}`` sets the plan's ``[secure_aggregation]
fast_path`` for this tree (default auto: tree rounds take the fast path, one
message each way per site; never: the six-message rounds); ``both`` runs the
two plans alternately in the same run and reports each median and the ratio
never / auto.  A ``--baseline`` ref runs the default plan only (it may not
know the option).  The JSON notes the load average before and after.

Also per run: bytes each site received and sent per round (the session's total over rounds, setups
included), and the 1-minute load average every 5 s (min / median / max).  ``--probe DIR`` runs each version's
coordinator under ``benchmarks/_coordinator_probe.py`` (RSS timeline, garbage collection, largest mappings at exit;
tracemalloc with ``FEDSBDT_PROBE_TRACEMALLOC=frames``, cProfile with ``FEDSBDT_PROBE_CPROFILE=1``) and
copies its log beside it.

Optionally (``--profile FILE``) the working tree's first coordinator runs
under ``py-spy record`` (``pip install py-spy`` into the venv): a flame
graph (``.svg``) or collapsed stacks (``.txt``) in FILE.

Run:  python benchmarks/federation_costs.py [--baseline REF] [--trees 1000] [--repeats 2] [--profile F.svg]
                                              [--fast-path auto|never|both] [--graph complete|sparse] [--out NAME]
Writes ``benchmarks/results/federation_costs.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from _util import save  # noqa: E402
from fedsbdt.demo import Layout, follow_log, prepare  # noqa: E402


def export_tree(ref: str, dest: Path) -> Path:
    """The files of git ref ``ref`` under ``dest`` (reused when already there), with an importable
    ``fedsbdt`` package in ``_import/`` (see :func:`import_path`)."""
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    out = dest / commit[:12]
    if not (out / "common" / "cli.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    pkg = out / "protos" / "fedsbdt"
    for sub in ("common", "server", "client"):  # pyproject's package-dir, as links
        if not (pkg / sub).exists():
            (pkg / sub).symlink_to(out / sub, target_is_directory=True)
    (out / "_import").mkdir(exist_ok=True)
    if not (out / "_import" / "fedsbdt").exists():
        (out / "_import" / "fedsbdt").symlink_to(pkg, target_is_directory=True)
    return out


def import_path(code: Path) -> str:
    """PYTHONPATH under which ``import fedsbdt`` finds the code under ``code``: an exported tree's
    ``_import`` (the venv's editable install maps ``fedsbdt`` to this working tree, and PYTHONPATH comes
    before it: without this a baseline would run this tree's code), or this tree itself."""
    return str(code / "_import") if (code / "_import").is_dir() else str(code)


class PeakMemory:
    """Polls ``VmHWM`` (peak resident set) of processes until they exit."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = {}
        self.load: list[float] = []  # the 1-minute load average, every 5 s
        self.pids: dict[str, int] = {}
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._th.start()

    def watch(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(0.2):
            n += 1
            if n % 25 == 1:
                self.load.append(os.getloadavg()[0])
            for name, pid in list(self.pids.items()):
                try:
                    with open(f"/proc/{pid}/status") as fh:
                        for line in fh:
                            if line.startswith("VmHWM:"):
                                self.peak[name] = max(self.peak.get(name, 0.0), int(line.split()[1]) / 1024)
                except OSError:
                    continue

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._th.join()
        return {k: round(v, 1) for k, v in self.peak.items()}


def run_federation(code: Path, hp: dict, sites: int, profile: Path | None = None, stagger: float = 0.0,
                   fast_path: str = "auto", probe: Path | None = None, graph: str = "complete") -> dict:
    """One federation with the code under ``code``; returns CPU and memory figures.

    ``stagger``: seconds between site starts (many sites: their start-up children must not all overlap).
    ``fast_path``: the plan's [secure_aggregation] fast_path ("auto" is left out of the plan).
    ``graph``: "sparse" runs a fast-only session on the sparse graph (k = ``suggested_neighbours(n)``,
    ``fast_path = "always"``; docs/secagg.md §10).
    ``probe``: run the coordinator under ``benchmarks/_coordinator_probe.py`` writing into this folder (its
    RSS timeline; tracemalloc and cProfile as the FEDSBDT_PROBE_* environment variables say).
    """
    from fedsbdt.common.federation.plan import Deadlines
    env = dict(os.environ, PYTHONPATH=import_path(code))
    env.setdefault("NUMBA_CACHE_DIR", str(code / ".numba-cache"))

    def cli(*args: str) -> list[str]:
        return [sys.executable, "-m", "fedsbdt.cli", "--log-format", "json", *args]

    with tempfile.TemporaryDirectory(prefix="fedsbdt-costs-") as tmp:
        layout = Layout(Path(tmp))
        deadlines = Deadlines(join=60.0 + (stagger + 20.0) * sites, stage=max(10.0, 1.5 * sites), quorum=600.0,
                              finish=max(10.0, 1.0 * sites))  # the demo's deadlines for 3 sites
        secagg = {} if fast_path == "auto" else {"secagg_fast_path": fast_path}
        if graph == "sparse":
            from fedsbdt.common.secagg.graph import suggested_neighbours
            secagg = {"secagg_graph": "sparse", "secagg_neighbours": suggested_neighbours(sites),
                      "secagg_fast_path": "always"}
        plan, rows = prepare(layout, sites, "adult", hp, ["localhost", "127.0.0.1"], epoch_rounds=128,
                             deadlines=deadlines, **secagg)
        layout.logs.mkdir(parents=True, exist_ok=True)
        mem = PeakMemory()
        procs: list[subprocess.Popen] = []
        index: list[int] = []
        cpu_at: list[float] = []
        release_at: list[float] = []

        def on_event(rec: dict) -> None:
            if rec.get("event") == "tree":
                index.append(int(rec["tree"]))
                cpu_at.append(float(rec["cpu"]))
                release_at.append(float(rec["at"]))

        try:
            r, w = os.pipe()
            cmd = cli("coordinator", "--plan", str(layout.plan), "--listen", "127.0.0.1:0", "--state",
                      str(layout.coordinator), "--ready-fd", str(w), "--json")
            if probe is not None:
                cmd = [sys.executable, str(ROOT / "benchmarks" / "_coordinator_probe.py"), str(probe)] + cmd[3:]
            if profile is not None:
                cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "--rate", "200", "--subprocesses",
                       "--nonblocking", "--format", "raw" if profile.suffix == ".txt" else "flamegraph",
                       "-o", str(profile), "--"] + cmd
            coord = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(w,), text=True,
                                     cwd=code, env=env)
            os.close(w)
            procs.append(coord)
            with os.fdopen(r) as fh:
                address = fh.readline().strip()
            if not address:
                raise RuntimeError("the coordinator did not start: " + coord.stderr.read()[-2000:])
            mem.watch("coordinator", _python_pid(coord.pid) if profile is not None else coord.pid)
            reader = follow_log(coord.stderr, on_event, [], layout.logs / "coordinator.log")
            site_procs = {}
            for sid in plan.site_ids:
                err = open(layout.logs / f"{sid}.log", "w")
                p = subprocess.Popen(cli("client", "--coordinator", f"localhost:{address.rsplit(':', 1)[1]}",
                                         "--site", sid, "--data", str(layout.site_data(sid)), "--state",
                                         str(layout.site_state(sid)), "--plan-hash", plan.sha256, "--json"),
                                     stdout=subprocess.PIPE, stderr=err, text=True, cwd=code, env=env)
                err.close()
                procs.append(p)
                site_procs[sid] = p
                mem.watch(sid, p.pid)
                if stagger:
                    time.sleep(stagger)
            out = coord.stdout.read()  # not communicate(): the log reader owns stderr
            coord.wait(timeout=3600)
            reader.join(timeout=10)
            site_out = {}
            for sid, p in site_procs.items():
                sout, _ = p.communicate(timeout=120)
                if p.returncode != 0:
                    raise RuntimeError(f"{sid} failed: {(layout.logs / f'{sid}.log').read_text()[-2000:]}")
                site_out[sid] = json.loads(sout)
            if coord.returncode != 0:
                raise RuntimeError(f"coordinator failed: {out[-2000:]}")
            if probe is not None:  # the coordinator's log beside its RSS timeline
                shutil.copy(layout.logs / "coordinator.log", probe / "coordinator.log")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            peaks = mem.stop()
            load = [round(x, 2) for x in mem.load]
    rounds = index[-1] - index[0]
    gaps = np.diff(release_at) * 1e3
    return {
        "trees": index[-1] + 1, "rows": rows,
        "coordinator_cpu_ms_per_round": round((cpu_at[-1] - cpu_at[0]) / rounds * 1e3, 3),
        "site_cpu_ms_per_round": {sid: o.get("cpu_ms_per_round") for sid, o in site_out.items()},
        # the data loader's and (this tree) the noise sampler's child processes, whole session
        "site_child_cpu_s": {sid: o.get("child_cpu_seconds") for sid, o in site_out.items()},
        "site_noise_processes": {sid: o.get("noise_processes") for sid, o in site_out.items()},
        "peak_rss_mb": peaks,
        "site_bytes_per_round": {  # everything over the whole session (epoch setups included) / rounds
            "received_median": statistics.median(o.get("bytes_received", 0) / rounds for o in site_out.values()),
            "sent_median": statistics.median(o.get("bytes_sent", 0) / rounds for o in site_out.values())},
        "load_average_1min_during": {"min": min(load, default=None), "median": statistics.median(load) if load else None,
                                     "max": max(load, default=None)},
        "round_latency_ms_median": round(float(np.median(gaps)), 3),
    }


def _python_pid(spy_pid: int, timeout: float = 10.0) -> int:
    """The pid of the process py-spy started (its child)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            kids = Path(f"/proc/{spy_pid}/task/{spy_pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    return spy_pid


def summarise(runs: list[dict]) -> dict:
    med = statistics.median
    coord = [r["coordinator_cpu_ms_per_round"] for r in runs]
    site_cpu = [v for r in runs for v in r["site_cpu_ms_per_round"].values() if v is not None]
    site_rss = [v for r in runs for k, v in r["peak_rss_mb"].items() if k != "coordinator"]
    return {
        "coordinator_cpu_ms_per_round_median": med(coord), "coordinator_cpu_ms_per_round_min": min(coord),
        "site_cpu_ms_per_round_median": med(site_cpu) if site_cpu else None,
        "site_peak_rss_mb_max": max(site_rss), "site_peak_rss_mb_median": med(site_rss),
        "coordinator_peak_rss_mb_max": max(r["peak_rss_mb"].get("coordinator", 0.0) for r in runs),
        "round_latency_ms_median": med(r["round_latency_ms_median"] for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="git ref to compare against (e.g. main); omitted: this tree only")
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between site starts (many sites)")
    ap.add_argument("--profile", metavar="FILE",
                    help="py-spy the coordinator of this tree's first run: flame graph (.svg) or raw stacks (.txt)")
    ap.add_argument("--fast-path", choices=["auto", "never", "both"], default="auto",
                    help="this tree's plan [secure_aggregation] fast_path; both: auto and never alternately")
    ap.add_argument("--probe", metavar="DIR",
                    help="run the coordinators under benchmarks/_coordinator_probe.py, one folder per run and version "
                         "in DIR (RSS and GC timeline; FEDSBDT_PROBE_TRACEMALLOC=frames, FEDSBDT_PROBE_CPROFILE=1)")
    ap.add_argument("--graph", choices=["complete", "sparse"], default="complete",
                    help="sparse: a fast-only session on the sparse graph (this tree only; default: complete)")
    ap.add_argument("--out", default="federation_costs")
    args = ap.parse_args()
    hp = {"epsilon": 1.0, "trees": args.trees, "depth": args.depth, "seed": 1}
    modes = ["auto", "never"] if args.fast_path == "both" else [args.fast_path]
    versions = {f"this_tree (fast_path = {m})" if len(modes) > 1 else "this_tree": (ROOT, m) for m in modes}
    tmp = Path(tempfile.gettempdir()) / "fedsbdt-baselines"
    if args.baseline:
        versions = {f"baseline ({args.baseline})": (export_tree(args.baseline, tmp), "auto"), **versions}
    runs: dict[str, list[dict]] = {k: [] for k in versions}
    profile = Path(args.profile) if args.profile else None
    load_before = os.getloadavg()
    for rep in range(args.repeats):
        for name, (code, mode) in versions.items():
            prof = profile if (profile is not None and name.startswith("this_tree") and rep == 0) else None
            print(f"run {rep + 1}/{args.repeats}: {name} ...", flush=True)
            tag = "" if name.startswith("this_tree") else "-baseline"
            probe = (Path(args.probe) / f"run{rep + 1}-{mode}{tag}") if args.probe else None
            r = run_federation(code, hp, args.sites, prof, args.stagger, mode, probe, args.graph)
            print("  " + json.dumps(r), flush=True)
            runs[name].append(r)
    summary = {k: summarise(v) for k, v in runs.items()}
    if len(modes) > 1:
        slow, fast = (summary[f"this_tree (fast_path = {m})"]["coordinator_cpu_ms_per_round_median"]
                      for m in ("never", "auto"))
        summary["coordinator_cpu_ratio_never_over_auto"] = round(slow / fast, 3)
    print(json.dumps(summary, indent=2))
    path = save(args.out, {
        "description": f"{args.sites}-site federation on Adult over gRPC/mTLS on loopback: coordinator CPU per round, "
                       "site CPU per round, peak RSS per process (VmHWM); versions alternated in one run",
        "setting": {"dataset": "adult", "sites": args.sites, **hp, "noise": "distributed", "epoch_rounds": 128,
                    "repeats": args.repeats, "fast_path": args.fast_path, "graph": args.graph},
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before],
                                "after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()},
        "summary": summary, "runs": runs,
    })
    print(f"saved {path}")


if __name__ == "__main__":
    main()
