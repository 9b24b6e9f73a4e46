"""The bytes of one epoch setup per site, complete against sparse graph, measured and projected (a script).

Runs one epoch setup of the secure-aggregation state machines in this process (``secagg_scale.py``'s
Federation: n sites, E slots, t = ⌊n/2⌋ + 1, sparse k = 2·⌈2·log2 n⌉ and c = 2t − n − 1 as a plan
chooses them) and records the size of every setup message (EpochRoster: the same for every site;
ShareKeys sent and EpochShares received: the largest over sites), the CPU of the setup, and the plan's
size estimate (``wire.estimated_largest_message``, which a plan must keep below 8 MiB) for n up to 1,000.

Run:  python benchmarks/setup_sizes.py [--sizes 50 100 200] [--epoch-rounds 64] [--out setup_sizes]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import save  # noqa: E402
import secagg_scale  # noqa: E402
from secagg_scale import Federation  # noqa: E402
from fedsbdt.common.secagg import decode_message  # noqa: E402
from fedsbdt.common.federation.wire import MAX_MESSAGE_BYTES, estimated_largest_message  # noqa: E402


def neighbours(n: int) -> int:
    """k as ``fedsbdt plan --secagg-graph sparse`` picks it: 2·⌈2·log2 n⌉, at most the largest even ≤ n − 2."""
    return min(2 * math.ceil(2 * math.log2(n)), (n - 2) // 2 * 2)


def one_epoch(n: int, graph: str, e: int) -> dict:
    secagg_scale.SLOTS = (e,)  # the configuration's max_epoch_rounds
    f = Federation(n, 128, graph=graph)
    t0 = time.process_time()
    setup, ann = f.coord.begin_epoch(e)
    ann_b = ann.to_bytes()
    adverts = [f._site(s, ann_b)[0] for s in f.ids]
    for b in adverts:
        setup.receive_advertise(decode_message(b))
    roster_b = setup.close_advertise().to_bytes()
    share_keys = [f._site(s, roster_b)[0] for s in f.ids]
    for b in share_keys:
        setup.receive_share_keys(decode_message(b))
    routed = {s: m.to_bytes() for s, m in setup.close_share_keys().items()}
    for s in f.ids:
        f._site(s, routed[s])
    cpu = time.process_time() - t0
    return {"n": n, "graph": f.graph, "neighbours": f.k, "epoch_rounds": e,
            "advertise_bytes": max(map(len, adverts)), "roster_bytes": len(roster_b),
            "share_keys_bytes_max": max(map(len, share_keys)),
            "epoch_shares_bytes_max": max(map(len, routed.values())),
            "received_per_site_bytes_max": len(ann_b) + len(roster_b) + max(map(len, routed.values())),
            "setup_cpu_s_all_parties": round(cpu, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    ap.add_argument("--epoch-rounds", type=int, default=64)
    ap.add_argument("--complete-up-to", type=int, default=100,
                    help="measure the complete graph only up to this n (its setup is O(n²·E) CPU per site)")
    ap.add_argument("--out", default="setup_sizes")
    args = ap.parse_args()
    e = args.epoch_rounds
    rows = []
    for n in args.sizes:
        for graph in ("complete", "sparse") if n <= args.complete_up_to else ("sparse",):
            r = one_epoch(n, graph, e)
            print(r, flush=True)
            rows.append(r)
    plan = []
    for n in (50, 100, 200, 354, 500, 1000):
        k = neighbours(n)
        plan.append({"n": n, "neighbours": k,
                     "complete_estimate_bytes": estimated_largest_message(n, e, 6),
                     "sparse_estimate_bytes": estimated_largest_message(n, e, 6, holders=k + 1),
                     "limit_bytes": MAX_MESSAGE_BYTES // 2})
        print(plan[-1], flush=True)
    path = save(args.out, {"description": __doc__.split("\n\n")[0], "load_average": os.getloadavg(),
                           "measured": rows, "plan_estimates": plan})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
