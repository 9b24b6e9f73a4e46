"""How secure aggregation's CPU per round grows with the number of sites (a script, not a test).

The coordinator and n site state machines (``common/secagg``) run in this one
process, no gRPC: every message crosses as its canonical bytes, and each
party's handling of it (decode, validate, compute, encode) is timed with
``time.process_time``.  For n = 3 … 200 (threshold t = ⌊n/2⌋ + 1, vector
length d = 128 = one depth-6 tree) it measures CPU per round for each stage:

* site, per round: ``masked_input`` (RoundStart → MaskedInput: n − 1 X25519
  agreements and PRG expansions), ``consistency`` (sign U3), ``unmask``
  (verify t signatures, reveal shares);
* site, epoch setup amortised per round: ``advertise`` (E mask keys),
  ``share_keys`` (Shamir-share 2E secrets to n holders: E·n·t field
  multiplications; commit, encrypt), ``epoch_shares`` (verify n − 1 dealers'
  signatures, decrypt, check commitments);
* coordinator, per round: ``masked_input`` (collect n inputs), ``consistency``
  (verify n signatures), ``unmask`` (collect n·n shares, reconstruct n
  secrets from t shares, remove n self masks), and setup amortised per round
  (``advertise``, ``share_keys``: validate n ShareKeys of n rows, route n·n blobs).

Setup has a per-epoch part and a per-slot part (Shamir, commitments).  Each
repeat sets up one epoch of 1 slot and one of 8 slots, which separates them;
setup per round is reported at E = ``--epoch-rounds`` (the plan default 64):
per-epoch / E + per-slot.  Every stage's medians (over sites and repeats) are
fitted with c0 + c1·n + c2·n² (non-negative least squares, relative error)
and projected to 1,000 sites; the table says from which n the n² term is
more than half of the fit.  Writes ``benchmarks/results/secagg_scale.json``
and ``secagg_scale.png``.

Cost: every site of every size runs in this process, so the run is dominated by
n = 200 (two epoch setups of 200 sites: a few minutes of CPU); about 5–10 min
on a shared 2-core machine, ``--quick`` (n = 3, 10, 30) about 20 s.

``--graph sparse`` measures the sparse-graph variant (Bell et al., CCS 2020;
``common/secagg/graph.py``): each site masks with k neighbours of a public
random k-regular graph, k = ``--neighbours`` or by default the documented
2·⌈2·log2 n⌉ (capped at the largest even k ≤ n − 2; below that the complete
graph is used and the row says so), c = 2t − n − 1 assumed colluders (the
federation's default).  It writes ``secagg_scale_sparse.{json,png}``; the PNG
puts its totals beside the complete-graph curve read from
``secagg_scale.json`` (an earlier run), and ``--reference-complete`` sizes
(default 50, 100) are measured on the complete graph in the same run, so the
ratio at those sizes is not a comparison across machine loads.

``--fast`` runs fast rounds (docs/secagg.md §6: one exchange, FastRoundStart →
FastMaskedInput, every site's input and seed shares of all sites in one
message); the round stages are then the single ``fast_round`` (sites: mask and
share; coordinator: collect, reconstruct n seeds, unmask).  It writes
``secagg_scale_fast.{json,png}``; with ``--graph sparse`` a fast-only session (docs/secagg.md §10),
``secagg_scale_sparse_fast.{json,png}``.

Run:  python benchmarks/secagg_scale.py [--sizes 3,5,10,20,35,50,75,100,200] [--quick] [--graph sparse] [--fast]
"""
from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _util import RESULTS, save  # noqa: E402
from fedsbdt.common.secagg.graph import check_sparse_parameters, suggested_neighbours  # noqa: E402
from fedsbdt.common.secagg import (  # noqa: E402
    ConfigError,
    MemoryStorage,
    SecAggCoordinator,
    SecAggSite,
    SessionConfig,
    SiteIdentity,
    decode_message,
)

cpu = time.process_time

SITE_SETUP = ("advertise", "share_keys", "epoch_shares")
ROUND_STAGES = ("masked_input", "consistency", "unmask")
COORD_SETUP = ("advertise", "share_keys")
SLOTS = (1, 8)  # the two epoch sizes set up per repeat (per-epoch and per-slot setup cost)


def repeats_for(n: int) -> tuple[int, int]:
    """(repeats, rounds per repeat): fewer at large n so the whole run takes minutes on 2 busy cores."""
    if n <= 20:
        return 5, 4
    if n <= 50:
        return 2, 3
    return 1, 2


class Federation:
    """n sites and a coordinator in memory; each party's CPU per stage is accumulated."""

    def __init__(self, n: int, d: int, graph: str = "complete", neighbours: int | None = None,
                 fast: bool = False) -> None:
        self.n, self.d, self.t = n, d, n // 2 + 1
        self.fast = fast
        self.round_stages = ("fast_round",) if fast else ROUND_STAGES
        self.ids = [f"site-{i:04d}" for i in range(n)]
        keys = {s: Ed25519PrivateKey.generate() for s in self.ids}
        roster = tuple(SiteIdentity(s, keys[s].public_key().public_bytes_raw()) for s in self.ids)
        self.graph, self.k, extra = "complete", n - 1, {}
        if graph == "sparse":
            c = 2 * self.t - n - 1
            k = neighbours if neighbours is not None else min(suggested_neighbours(n), (n - 2) // 2 * 2)
            try:
                check_sparse_parameters(n, k, c)
            except ConfigError:
                pass  # too few sites for a sparse graph: measured on the complete graph, and the row says so
            else:
                self.graph, self.k = "sparse", k
                extra = {"graph": "sparse", "neighbours": k, "assumed_colluders": c, "fast_only": fast}
        self.cfg = SessionConfig(b"secagg-scale", self.t, roster, max_epoch_rounds=max(SLOTS), **extra)
        self.sites = {s: SecAggSite(self.cfg, s, keys[s], MemoryStorage()) for s in self.ids}
        self.coord = SecAggCoordinator(self.cfg)
        self.rng = np.random.default_rng(n)
        self.sent = {s: 0 for s in self.ids}
        self.received = {s: 0 for s in self.ids}

    def _site(self, s: str, data: bytes, value=None) -> tuple[bytes | None, float]:
        self.received[s] += len(data)
        t0 = cpu()
        reply = self.sites[s].handle(decode_message(data), value)
        out = None if reply is None else reply.to_bytes()
        dt = cpu() - t0
        self.sent[s] += 0 if out is None else len(out)
        return out, dt

    def _deliver(self, data_of, stage: str, site: dict) -> list[bytes | None]:
        """Each roster site handles ``data_of(site)``; its CPU goes to ``site[stage]``; returns the replies."""
        out = []
        for s in self.ids:
            b, dt = self._site(s, data_of(s))
            site[stage].append(dt)
            out.append(b)
        return out

    def epoch(self, slots: int) -> tuple[dict[str, list[float]], dict[str, float]]:
        """One epoch setup; returns (stage → CPU of every site, stage → coordinator CPU)."""
        site = {k: [] for k in SITE_SETUP}
        coord = {}
        t0 = cpu()
        setup, ann = self.coord.begin_epoch(slots)
        ann_b = ann.to_bytes()
        c = cpu() - t0
        adverts = self._deliver(lambda s: ann_b, "advertise", site)
        t0 = cpu()
        for b in adverts:
            setup.receive_advertise(decode_message(b))
        roster_b = setup.close_advertise().to_bytes()
        coord["advertise"] = c + cpu() - t0
        share_keys = self._deliver(lambda s: roster_b, "share_keys", site)
        t0 = cpu()
        for b in share_keys:
            setup.receive_share_keys(decode_message(b))
        routed = {s: m.to_bytes() for s, m in setup.close_share_keys().items()}
        coord["share_keys"] = cpu() - t0
        self._deliver(routed.__getitem__, "epoch_shares", site)
        return site, coord

    def _collect(self, rnd, data: bytes, stage: str, site: dict, values=None) -> float:
        """Deliver ``data`` to every participant, record each site's CPU, hand the replies to the
        coordinator; returns the coordinator's CPU for receiving them."""
        c = 0.0
        for s in rnd.participants:
            b, dt = self._site(s, data, None if values is None else values[s])
            site[stage].append(dt)
            t0 = cpu()
            rnd.receive(b)
            c += cpu() - t0
        return c

    def round(self) -> tuple[dict[str, list[float]], dict[str, float]]:
        """One round with every site taking part; checks the sum."""
        site = {k: [] for k in self.round_stages}
        coord = {}
        t0 = cpu()
        rnd, start = self.coord.begin_round(self.d, fast=self.fast)
        start_b = start.to_bytes()
        c = cpu() - t0
        inputs = {s: self.rng.integers(-(2**40), 2**40, self.d) for s in start.participants}
        if self.fast:
            coord["fast_round"] = self._finalize(rnd, c + self._collect(rnd, start_b, "fast_round", site, inputs), inputs)
            return site, coord
        c += self._collect(rnd, start_b, "masked_input", site, inputs)
        t0 = cpu()
        creq_b = rnd.close_inputs().to_bytes()
        coord["masked_input"] = c + cpu() - t0
        c = self._collect(rnd, creq_b, "consistency", site)
        t0 = cpu()
        ureq_b = rnd.close_consistency().to_bytes()
        coord["consistency"] = c + cpu() - t0
        coord["unmask"] = self._finalize(rnd, self._collect(rnd, ureq_b, "unmask", site), inputs)
        return site, coord

    def _finalize(self, rnd, c: float, inputs) -> float:
        """Finalize, check the sum; returns ``c`` plus the coordinator's CPU for it."""
        t0 = cpu()
        res = rnd.finalize()
        c += cpu() - t0
        if not np.array_equal(res.total, np.sum(np.stack(list(inputs.values())), axis=0)):
            raise AssertionError(f"n = {self.n}: the round produced a wrong sum")
        return c


def measure(n: int, d: int, epoch_rounds: int, graph: str = "complete", neighbours: int | None = None,
            fast: bool = False) -> dict:
    reps, rounds = repeats_for(n)
    fed = Federation(n, d, graph, neighbours, fast)
    setup_site = {E: {k: [] for k in SITE_SETUP} for E in SLOTS}
    setup_coord = {E: {k: [] for k in COORD_SETUP} for E in SLOTS}
    round_site = {k: [] for k in fed.round_stages}
    round_coord = {k: [] for k in fed.round_stages}
    done_rounds = 0
    t_wall = time.perf_counter()
    for _ in range(reps):
        gc.collect()
        for E in SLOTS:
            site, coord = fed.epoch(E)
            for k in SITE_SETUP:
                setup_site[E][k].extend(site[k])
            for k in COORD_SETUP:
                setup_coord[E][k].append(coord[k])
        while fed.coord.slots_remaining() > sum(SLOTS) - rounds:
            site, coord = fed.round()
            done_rounds += 1
            for k in fed.round_stages:
                round_site[k].extend(site[k])
                round_coord[k].append(coord[k])
        while fed.coord.slots_remaining():  # leftover slots: burn them so the next repeat starts clean
            rnd, _ = fed.coord.begin_round(d, fast=fast)
            rnd.abort("benchmark: unused slot")
    med = statistics.median
    a, b = SLOTS

    def per_round(one: float, many: float) -> tuple[float, float, float]:
        per_slot = max((many - one) / (b - a), 0.0)
        per_epoch = max(one - a * per_slot, 0.0)
        return per_epoch, per_slot, per_epoch / epoch_rounds + per_slot

    site_ms, coord_ms, parts = {}, {}, {}
    for party, ms, rounds_of, setup_of in (("site", site_ms, round_site, setup_site),
                                           ("coordinator", coord_ms, round_coord, setup_coord)):
        for k, v in rounds_of.items():
            ms[k] = 1e3 * med(v)
        for k in setup_of[a]:
            pe, ps, pr = per_round(med(setup_of[a][k]), med(setup_of[b][k]))
            ms[f"setup_{k}"] = 1e3 * pr
            parts[f"{party}_{k}"] = {"per_epoch_ms": 1e3 * pe, "per_slot_ms": 1e3 * ps}
    slots = reps * sum(SLOTS)
    return {
        "n": n, "t": fed.t, "graph": fed.graph, "neighbours": fed.k, "fast": fast,
        "local_threshold": fed.cfg.local_threshold.threshold if fed.cfg.sparse else fed.t,
        "repeats": reps, "rounds": done_rounds,
        "site_ms_per_round": site_ms, "site_total_ms_per_round": sum(site_ms.values()),
        "coordinator_ms_per_round": coord_ms, "coordinator_total_ms_per_round": sum(coord_ms.values()),
        "federation_total_ms_per_round": n * sum(site_ms.values()) + sum(coord_ms.values()),
        "setup_split": parts,
        "site_bytes_per_slot": {"sent": med(fed.sent.values()) / slots, "received": med(fed.received.values()) / slots},
        "wall_seconds": time.perf_counter() - t_wall,
    }


# --------------------------------------------------------------------------- fit


def fit_quadratic(ns, ys) -> list[float]:
    """Non-negative (c0, c1, c2) minimising the relative error of c0 + c1·n + c2·n² (all term subsets tried)."""
    ns = np.asarray(ns, float)
    return fit_nonnegative(np.stack([np.ones_like(ns), ns, ns**2], axis=1), ys)


def fit_nonnegative(basis: np.ndarray, ys) -> list[float]:
    """Non-negative coefficients of the basis columns minimising the relative error (all column subsets tried)."""
    ys = np.asarray(ys, float)
    w = 1.0 / np.maximum(ys, 1e-9)
    m = basis.shape[1]
    best, best_err = [0.0] * m, np.inf
    for k in range(1, m + 1):
        for cols in itertools.combinations(range(m), k):
            A = basis[:, cols] * w[:, None]
            coef, *_ = np.linalg.lstsq(A, ys * w, rcond=None)
            if (coef < 0).any():
                continue
            err = float(np.sum((A @ coef - ys * w) ** 2))
            if err < best_err:
                best_err, best = err, [0.0] * m
                for c, v in zip(cols, coef):
                    best[c] = float(v)
    return best


SPARSE_TERMS = ("1", "n", "k", "n·k", "n²")


def sparse_basis(n, k):
    n, k = np.asarray(n, float), np.asarray(k, float)
    return np.stack([np.ones_like(n), n, k, n * k, n * n], axis=-1)


def fit_sparse(ns, ks, ys) -> list[float]:
    """Non-negative coefficients of 1, n, k, n·k, n² for the sparse graph: per site O(k) work plus O(n)
    message sizes; at the coordinator O(n·k) plus O(n); n² shows what is left."""
    return fit_nonnegative(sparse_basis(ns, ks), ys)


def sparse_fits(rows: list[dict], project: list[int]) -> dict:
    rows = [r for r in rows if r["graph"] == "sparse"]
    ns, ks = [r["n"] for r in rows], [r["neighbours"] for r in rows]
    out = {}
    for party, key in (("site", "site_total_ms_per_round"), ("coordinator", "coordinator_total_ms_per_round")):
        c = fit_sparse(ns, ks, [r[key] for r in rows])
        out[f"{party}/total"] = {
            "terms": dict(zip(SPARSE_TERMS, c)),
            "projected_ms": {str(m): float(sparse_basis(m, suggested_neighbours(m)) @ c) for m in project},
            "projected_k": {str(m): suggested_neighbours(m) for m in project},
        }
    return out


def evaluate(coef, n) -> float:
    return coef[0] + coef[1] * n + coef[2] * n * n


def quadratic_from(coef) -> float | None:
    """Smallest n at which c2·n² exceeds c0 + c1·n (None if never)."""
    c0, c1, c2 = coef
    if c2 <= 0:
        return None
    return float((c1 + np.sqrt(c1 * c1 + 4 * c2 * c0)) / (2 * c2))


def fits(rows: list[dict], project: list[int]) -> dict:
    ns = [r["n"] for r in rows]
    out = {}
    for party, key in (("site", "site_ms_per_round"), ("coordinator", "coordinator_ms_per_round")):
        stages = list(rows[0][key])
        for k in stages + ["total"]:
            ys = [sum(r[key].values()) if k == "total" else r[key][k] for r in rows]
            c = fit_quadratic(ns, ys)
            out[f"{party}/{k}"] = {
                "c0_ms": c[0], "c1_ms_per_site": c[1], "c2_ms_per_site2": c[2],
                "n2_dominates_from": quadratic_from(c),
                "projected_ms": {str(m): evaluate(c, m) for m in project},
            }
    return out


def plot(rows: list[dict], fit: dict, project_to: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = np.array([r["n"] for r in rows])
    grid = np.geomspace(ns.min(), project_to, 200)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, party, key in ((axes[0], "site", "site_ms_per_round"), (axes[1], "coordinator", "coordinator_ms_per_round")):
        stages = list(rows[0][key]) + ["total"]
        for i, k in enumerate(stages):
            ys = [sum(r[key].values()) if k == "total" else r[key][k] for r in rows]
            c = fit[f"{party}/{k}"]
            color = "black" if k == "total" else f"C{i}"
            ax.plot(ns, ys, "o", color=color, ms=4)
            label = f"{k}: {c['c0_ms']:.2g} + {c['c1_ms_per_site']:.2g}·n + {c['c2_ms_per_site2']:.2g}·n²"
            ax.plot(grid, [evaluate([c["c0_ms"], c["c1_ms_per_site"], c["c2_ms_per_site2"]], g) for g in grid],
                    "-" if k == "total" else "--", color=color, lw=1.8 if k == "total" else 1, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axvline(ns.max(), color="grey", lw=0.5)
        ax.set_xlabel("sites n (t = ⌊n/2⌋ + 1); right of the grey line: fit projected")
        ax.set_ylabel("CPU ms per round")
        ax.set_title(f"{party}: CPU per round by stage (setup amortised)")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_against_complete(rows: list[dict], fit: dict, sparse_fit: dict, complete: dict, project_to: int, path: Path,
                          reference: list[dict]) -> None:
    """Totals per round of the sparse graph beside the complete graph's (from secagg_scale.json)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for run, style, name in ((complete, "o", "complete graph"), ({"results": rows, "fit": fit, "sparse_fit": sparse_fit}, "s", "sparse graph")):
        ns = np.array([r["n"] for r in run["results"]])
        grid = np.geomspace(ns.min(), project_to, 200)
        for ax, key, title in ((axes[0], "site_total_ms_per_round", "site total"),
                               (axes[1], "coordinator_total_ms_per_round", "coordinator total"),
                               (axes[2], "federation_total_ms_per_round", "all parties (n · site + coordinator)")):
            ys = [r[key] for r in run["results"]]
            color = "C0" if name == "complete graph" else "C3"
            ax.plot(ns, ys, style, color=color, ms=4, label=f"{name}, measured")
            party = "site" if key.startswith("site") else "coordinator"
            if key != "federation_total_ms_per_round" and name == "complete graph":
                c = run["fit"][f"{party}/total"]
                f = [evaluate([c["c0_ms"], c["c1_ms_per_site"], c["c2_ms_per_site2"]], g) for g in grid]
                ax.plot(grid, f, "--", color=color, lw=1,
                        label=f"{name} fit: {c['c0_ms']:.2g} + {c['c1_ms_per_site']:.2g}·n + {c['c2_ms_per_site2']:.2g}·n²")
            elif key != "federation_total_ms_per_round":
                terms = run["sparse_fit"][f"{party}/total"]["terms"]
                c = [terms[t] for t in SPARSE_TERMS]
                g2 = grid[grid >= 30]
                f = [float(sparse_basis(g, suggested_neighbours(int(g))) @ c) for g in g2]
                ax.plot(g2, f, "--", color=color, lw=1, label=f"{name} fit: " + " + ".join(
                    f"{v:.2g}·{t}" if t != "1" else f"{v:.2g}" for t, v in terms.items() if v > 0))
            if name == "sparse graph" and reference:
                ax.plot([r["n"] for r in reference], [r[key] for r in reference], "D", mfc="none", color="C0", ms=7,
                        label="complete graph, measured in the same run")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("sites n (t = ⌊n/2⌋ + 1)")
            ax.set_ylabel("CPU ms per round (setup amortised)")
            ax.set_title(title)
            ax.grid(True, which="both", lw=0.3)
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("secure aggregation: complete graph against the sparse graph (k = 2·⌈2·log2 n⌉ neighbours)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="3,5,10,20,35,50,75,100,200")
    ap.add_argument("--vector-len", type=int, default=128, help="ring elements per round (2 · 2^depth)")
    ap.add_argument("--epoch-rounds", type=int, default=64, help="E used to amortise setup (the plan default)")
    ap.add_argument("--project", default="500,1000")
    ap.add_argument("--quick", action="store_true", help="n = 3, 10, 30 only")
    ap.add_argument("--out", default=None, help="result name under benchmarks/results/ (.json, .png); "
                                                "default secagg_scale or secagg_scale_sparse")
    ap.add_argument("--graph", choices=("complete", "sparse"), default="complete")
    ap.add_argument("--neighbours", type=int, default=None, help="k of the sparse graph (default 2·⌈2·log2 n⌉)")
    ap.add_argument("--reference-complete", default="50,100",
                    help="with --graph sparse: also measure the complete graph at these sizes in the same run")
    ap.add_argument("--fast", action="store_true", help="fast rounds (one exchange; docs/secagg.md §6)")
    args = ap.parse_args()
    args.out = args.out or ("secagg_scale" if args.graph == "complete" else "secagg_scale_sparse") + (
        "_fast" if args.fast else "")
    sizes = [3, 10, 30] if args.quick else [int(x) for x in args.sizes.split(",")]
    project = [int(x) for x in args.project.split(",")]
    rows = []
    t0 = time.perf_counter()
    for n in sizes:
        r = measure(n, args.vector_len, args.epoch_rounds, args.graph, args.neighbours, args.fast)
        rows.append(r)
        s, c = r["site_ms_per_round"], r["coordinator_ms_per_round"]
        graph = "complete" if r["graph"] == "complete" else f"k={r['neighbours']} t_k={r['local_threshold']}"
        print(f"n={n:4d} t={r['t']:4d} {graph}  site " + " ".join(f"{k} {v:.2f}" for k, v in s.items())
              + f" | total {r['site_total_ms_per_round']:.2f} ms"
              + "   coordinator " + " ".join(f"{k} {v:.2f}" for k, v in c.items())
              + f" | total {r['coordinator_total_ms_per_round']:.2f} ms   ({r['wall_seconds']:.1f} s)", flush=True)
    reference = []
    if args.graph == "sparse" and args.reference_complete:
        for n in [int(x) for x in args.reference_complete.split(",")]:
            r = measure(n, args.vector_len, args.epoch_rounds)
            reference.append(r)
            mine = next((x for x in rows if x["n"] == n), None)
            ratio = "" if mine is None else (
                f"  sparse/complete: site {mine['site_total_ms_per_round'] / r['site_total_ms_per_round']:.2f}, "
                f"coordinator {mine['coordinator_total_ms_per_round'] / r['coordinator_total_ms_per_round']:.2f}")
            print(f"n={n:4d} complete graph (same run): site total {r['site_total_ms_per_round']:.2f} ms, "
                  f"coordinator total {r['coordinator_total_ms_per_round']:.2f} ms{ratio}", flush=True)
    fit = fits(rows, project)
    print(f"\nfit c0 + c1·n + c2·n² (ms per round; setup amortised over E = {args.epoch_rounds}); "
          f"projection to {', '.join(map(str, project))} sites:")
    print(f"{'stage':32} {'c0':>8} {'c1':>9} {'c2':>10} {'n² > rest from n':>17} "
          + " ".join(f"{'n=' + str(m):>11}" for m in project))
    for k, f in fit.items():
        dom = f["n2_dominates_from"]
        print(f"{k:32} {f['c0_ms']:8.3f} {f['c1_ms_per_site']:9.4f} {f['c2_ms_per_site2']:10.6f} "
              f"{'-' if dom is None else f'{dom:.0f}':>17} "
              + " ".join(f"{f['projected_ms'][str(m)]:11.1f}" for m in project))
    sfit = sparse_fits(rows, project) if args.graph == "sparse" else None
    if sfit:
        print("\nsparse graph: fit over the sparse rows with terms 1, n, k, n·k, n² (k = neighbours; projected with "
              "k = 2·⌈2·log2 n⌉):")
        for k, f in sfit.items():
            print(f"{k:24} " + " + ".join(f"{v:.4g}·{t}" for t, v in f["terms"].items() if v > 0)
                  + "   " + "  ".join(f"n={m} (k={f['projected_k'][m]}): {v:.1f} ms" for m, v in f["projected_ms"].items()))
    png = RESULTS / f"{args.out}.png"
    complete_json = RESULTS / "secagg_scale.json"
    if args.graph == "sparse" and complete_json.exists():
        import json

        plot_against_complete(rows, fit, sfit, json.loads(complete_json.read_text()), max(project), png, reference)
    else:
        plot(rows, fit, max(project), png)
    path = save(args.out, {
        "description": "secure aggregation CPU per round against the number of sites, in one process (no gRPC); "
                       "CPU = process time, medians over sites and repeats; setup amortised per round",
        "setting": {"vector_len": args.vector_len, "epoch_rounds_for_amortisation": args.epoch_rounds,
                    "threshold": "n // 2 + 1", "setup_epoch_sizes": list(SLOTS), "all_sites_take_part": True,
                    "graph": args.graph, "fast_rounds": args.fast,
                    **({"neighbours": args.neighbours or "min(2·⌈2·log2 n⌉, largest even ≤ n − 2)",
                        "assumed_colluders": "2t − n − 1"} if args.graph == "sparse" else {})},
        "results": rows, "fit": fit, "wall_seconds": time.perf_counter() - t0,
        **({"complete_same_run": reference} if reference else {}),
        **({"sparse_fit": sfit} if sfit else {}),
    })
    print(f"saved {path} and {png}")


if __name__ == "__main__":
    main()
