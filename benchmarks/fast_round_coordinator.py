"""The coordinator's CPU for one fast round of secure aggregation, alone (a script).

n sites and the coordinator run in this process (``benchmarks/secagg_scale.py``'s Federation, d = 128,
t = ⌊n/2⌋ + 1); the sites' FastMaskedInput replies are computed first, then the coordinator's part is
timed by itself with the process clock — every reply received as bytes, then ``finalize`` (recover n
seeds from t shares each, remove n self masks) — so the sites' work does not evict its caches between
messages (in ``secagg_scale.py --fast`` it does).  Median over ``--rounds`` rounds.  Run it with two
checkouts' interpreters, alternately, to compare code under the same load.

Run:  python benchmarks/fast_round_coordinator.py [--sizes 50 100 200] [--rounds 5] [--graph sparse]
      (prints one JSON line)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from secagg_scale import Federation  # noqa: E402


def coordinator_ms(n: int, rounds: int, graph: str = "complete") -> dict:
    f = Federation(n, 128, graph=graph, fast=True)
    f.epoch(rounds)
    receive, finalize = [], []
    for _ in range(rounds):
        rnd, start = f.coord.begin_round(128, fast=True)
        data = start.to_bytes()
        values = {s: f.rng.integers(-(2**40), 2**40, 128) for s in start.participants}
        replies = [f._site(s, data, values[s])[0] for s in start.participants]
        t0 = time.process_time()
        for b in replies:
            rnd.receive(b)
        t1 = time.process_time()
        rnd.finalize()
        t2 = time.process_time()
        receive.append((t1 - t0) * 1e3)
        finalize.append((t2 - t1) * 1e3)
    tot = [a + b for a, b in zip(receive, finalize)]
    return {"n": n, "graph": f.graph, "neighbours": f.k, "rounds": rounds,
            "receive_ms": round(statistics.median(receive), 3),
            "finalize_ms": round(statistics.median(finalize), 3), "total_ms": round(statistics.median(tot), 3),
            "reply_bytes": len(replies[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--graph", choices=("complete", "sparse"), default="complete",
                    help="sparse: a fast-only session on the sparse graph (k as secagg_scale.py chooses it)")
    args = ap.parse_args()
    print(json.dumps({"load_average": os.getloadavg(),
                      "results": [coordinator_ms(n, args.rounds, args.graph) for n in args.sizes]}))


if __name__ == "__main__":
    main()
