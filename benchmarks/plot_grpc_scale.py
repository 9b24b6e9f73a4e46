"""The coordinator over gRPC at 50–200 real site processes: peak RSS and CPU per tree round (a script).

Reads the ``federation_costs*.json`` runs named in ``RUNS`` (``benchmarks/federation_costs.py``; one run per
point, 2-core machine, load average in each file) and writes ``benchmarks/results/grpc_scale.png`` for
docs/federation.md §10 "A hundred sites and more".

Run:  python benchmarks/plot_grpc_scale.py
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

#: (series, file, summary key): complete graph before this stop's storage change, after it, sparse fast-only
RUNS = {
    "complete graph, blobs in memory": [("federation_costs_n50_grpcmem.json", "this_tree"),
                                        ("federation_costs_n100_dealer_rows.json", "this_tree")],
    "complete graph, setup stored as it arrives": [("federation_costs_n100_blobs_stored.json", "this_tree")],
    "sparse fast-only": [("federation_costs_n100_sparse_fast.json", "this_tree"),
                         ("federation_costs_n200_sparse_fast.json", "this_tree")],
}


def main() -> None:
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for (name, runs), marker in zip(RUNS.items(), "osD"):
        pts = []
        for f, key in runs:
            d = json.loads((RESULTS / f).read_text())
            s = d["summary"][key]
            pts.append((d["setting"]["sites"], s["coordinator_peak_rss_mb_max"], s["coordinator_cpu_ms_per_round_median"]))
        n, rss, cpu = zip(*pts)
        ax[0].plot(n, rss, marker=marker, label=name)
        ax[1].plot(n, cpu, marker=marker, label=name)
    ax[0].axhline(300, color="grey", ls=":", label="goal at n = 100")
    ax[1].axhline(25, color="grey", ls=":", label="goal at n = 100")
    ax[0].set(xlabel="sites (real processes)", ylabel="coordinator peak RSS (MB)", title="memory", ylim=(0, None))
    ax[1].set(xlabel="sites (real processes)", ylabel="coordinator CPU per tree round (ms)",
              title="CPU (2 cores shared with every site)", ylim=(0, None))
    for a in ax:
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.tight_layout()
    out = RESULTS / "grpc_scale.png"
    fig.savefig(out, dpi=110)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
