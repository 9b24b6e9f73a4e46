"""One figure for docs/federation.md §10 "A hundred sites and more" (a script).

Reads ``benchmarks/results/coordinator_memory.json`` (the coordinator's memory per release, this tree and
the baseline replaying the same recording), ``fast_round_coordinator.json`` (a fast round's coordinator CPU,
alternated runs) and ``setup_sizes.json`` (setup bytes per site, measured and the plan's estimate to
1,000 sites) and writes ``benchmarks/results/scale_coordinator.png``.

Run:  python benchmarks/plot_scale.py
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    mem = json.loads((RESULTS / "coordinator_memory.json").read_text())
    cpu = json.loads((RESULTS / "fast_round_coordinator.json").read_text())
    setup = json.loads((RESULTS / "setup_sizes.json").read_text())
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in mem["runs"]:
        for name, data, style in (("this tree", r, "-"), ("baseline", r.get("baseline"), ":")):
            if data:
                xs, ys = zip(*data["rss_mib_after_release"])
                ck = ", checkpoint" if r.get("checkpoint") else ""
                ax[0].plot(xs, ys, style, label=f"n = {r['sites']}{ck}, {name}")
    ax[0].set(xlabel="trees released", ylabel="coordinator RSS above its warm start (MiB)",
              title="memory the coordinator keeps (replayed alone)")
    ax[0].legend(fontsize=8)
    sizes = sorted({x["n"] for run in cpu["runs"] for x in run["results"]})
    for name in ("baseline", "this_tree"):
        med = [statistics.median(x["total_ms"] for run in cpu["runs"] if run["version"] == name
                                 for x in run["results"] if x["n"] == n) for n in sizes]
        ax[1].plot(sizes, med, "o-", label=name)
    ax[1].set(xlabel="sites", ylabel="ms CPU", title="a fast round's secure aggregation at the coordinator")
    ax[1].legend(fontsize=8)
    for graph, style in (("complete", "o"), ("sparse", "s")):
        rows = [x for x in setup["measured"] if x["graph"] == graph]
        ax[2].plot([x["n"] for x in rows], [x["received_per_site_bytes_max"] / 2**20 for x in rows], style,
                   label=f"{graph}: measured, received per site")
    est = setup["plan_estimates"]
    ax[2].plot([x["n"] for x in est], [x["complete_estimate_bytes"] / 2**20 for x in est], "--",
               label="complete: plan estimate, largest message")
    ax[2].plot([x["n"] for x in est], [x["sparse_estimate_bytes"] / 2**20 for x in est], "-.",
               label="sparse: plan estimate, largest message")
    ax[2].axhline(est[0]["limit_bytes"] / 2**20, color="grey", lw=0.8, label="plan limit")
    ax[2].set(xlabel="sites", ylabel="MiB per epoch (E = 64)", title="epoch setup bytes per site",
              xscale="log", yscale="log")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    out = RESULTS / "scale_coordinator.png"
    fig.savefig(out, dpi=110)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
