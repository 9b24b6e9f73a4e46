"""Per-round cost of secure aggregation (a script, not a test).

For n = 3, 10, 50 sites, threshold t = ⌊n/2⌋ + 1, vector length d = 128 and
epochs of E round slots, measures

* site CPU per round: decode the coordinator's messages, handle RoundStart,
  ConsistencyRequest and UnmaskRequest, encode the replies (median over sites
  and rounds; every site does the same work);
* coordinator CPU per round: decode and validate every reply, close each
  stage, reconstruct and unmask;
* bytes sent per site per round (MaskedInput + ConsistencySignature +
  UnmaskResponse), and bytes received per site per round;
* epoch setup per round: site CPU and bytes for AdvertiseKeys + ShareKeys +
  EpochShares processing, divided by E; the coordinator's setup CPU / E.

A scenario with one site dropping before MaskedInput in every round is also
timed (the coordinator then recovers that site's mask key and removes t pair
masks).  Prints a table and writes ``benchmarks/results/secagg.json``.

``--fast`` measures, in the same run, slow rounds and fast rounds (docs/secagg.md
§6: one exchange, FastRoundStart → FastMaskedInput) with nobody dropping, prints
the ratios and writes ``benchmarks/results/secagg_fast.json``.

Run:  python benchmarks/secagg_bench.py [--rounds R] [--epoch-rounds E] [--sizes 3,10,50] [--fast]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsbdt.common.secagg import (  # noqa: E402
    MemoryStorage,
    SecAggCoordinator,
    SecAggSite,
    SessionConfig,
    SiteIdentity,
    decode_message,
)

cpu = time.process_time


def _site_call(site: SecAggSite, data: bytes, value=None):
    """Decode, handle, encode: what a site does per message. Returns (reply bytes or None, cpu seconds)."""
    t0 = cpu()
    reply = site.handle(decode_message(data), value)
    out = None if reply is None else reply.to_bytes()
    return out, cpu() - t0


def run(n: int, rounds: int, epoch_rounds: int, d: int, drop_one: bool, seed: int = 0, fast: bool = False) -> dict:
    t = n // 2 + 1
    ids = [f"site-{i:03d}" for i in range(n)]
    keys = {s: Ed25519PrivateKey.generate() for s in ids}
    cfg = SessionConfig(
        b"bench", t, tuple(SiteIdentity(s, keys[s].public_key().public_bytes_raw()) for s in ids),
        max_epoch_rounds=max(epoch_rounds, 1),
    )
    sites = {s: SecAggSite(cfg, s, keys[s], MemoryStorage()) for s in ids}
    coord = SecAggCoordinator(cfg)
    rng = np.random.default_rng(seed)

    setup_site_cpu = {s: 0.0 for s in ids}
    setup_site_sent = {s: 0 for s in ids}
    setup_site_recv = {s: 0 for s in ids}
    setup_coord_cpu = 0.0
    epochs = 0

    def epoch_setup() -> None:
        nonlocal setup_coord_cpu, epochs
        t0 = cpu()
        setup, ann = coord.begin_epoch(epoch_rounds)
        ann_b = ann.to_bytes()
        setup_coord_cpu += cpu() - t0
        adverts = {}
        for s in ids:
            setup_site_recv[s] += len(ann_b)
            adverts[s], dt = _site_call(sites[s], ann_b)
            setup_site_cpu[s] += dt
            setup_site_sent[s] += len(adverts[s])
        t0 = cpu()
        for s in ids:
            setup.receive_advertise(decode_message(adverts[s]))
        roster_b = setup.close_advertise().to_bytes()
        setup_coord_cpu += cpu() - t0
        sk = {}
        for s in ids:
            setup_site_recv[s] += len(roster_b)
            sk[s], dt = _site_call(sites[s], roster_b)
            setup_site_cpu[s] += dt
            setup_site_sent[s] += len(sk[s])
        t0 = cpu()
        for s in ids:
            setup.receive_share_keys(decode_message(sk[s]))
        routed = {s: m.to_bytes() for s, m in setup.close_share_keys().items()}
        setup_coord_cpu += cpu() - t0
        for s in ids:
            setup_site_recv[s] += len(routed[s])
            _, dt = _site_call(sites[s], routed[s])
            setup_site_cpu[s] += dt
        epochs += 1

    site_cpu: list[float] = []
    site_sent: list[int] = []
    site_recv: list[int] = []
    coord_cpu: list[float] = []
    for r in range(rounds):
        if coord.slots_remaining() == 0:
            epoch_setup()
        dropped = {ids[r % n]} if drop_one else set()
        c = 0.0
        t0 = cpu()
        rnd, start = coord.begin_round(d, fast=fast)
        start_b = start.to_bytes()
        c += cpu() - t0
        per_cpu = {s: 0.0 for s in ids}
        per_sent = {s: 0 for s in ids}
        per_recv = {s: 0 for s in ids}
        inputs = {}
        for s in start.participants:
            if s in dropped:
                continue
            x = rng.integers(-(2**40), 2**40, d)
            inputs[s] = x
            per_recv[s] += len(start_b)
            b, dt = _site_call(sites[s], start_b, x)
            per_cpu[s] += dt
            per_sent[s] += len(b)
            t0 = cpu()
            rnd.receive(b)
            c += cpu() - t0
        # the signed path's two further exchanges (a fast round has none)
        for close in () if fast else (rnd.close_inputs, rnd.close_consistency):
            t0 = cpu()
            req_b = close().to_bytes()
            c += cpu() - t0
            for s in inputs:
                per_recv[s] += len(req_b)
                b, dt = _site_call(sites[s], req_b)
                per_cpu[s] += dt
                per_sent[s] += len(b)
                t0 = cpu()
                rnd.receive(b)
                c += cpu() - t0
        t0 = cpu()
        res = rnd.finalize()
        c += cpu() - t0
        expected = np.sum(np.stack([inputs[s] for s in res.survivors]), axis=0)
        if not np.array_equal(res.total, expected):
            raise AssertionError("benchmark round produced a wrong sum")
        coord_cpu.append(c)
        for s in inputs:
            site_cpu.append(per_cpu[s])
            site_sent.append(per_sent[s])
            site_recv.append(per_recv[s])

    slots = epochs * epoch_rounds
    return {
        "n": n,
        "t": t,
        "vector_len": d,
        "epoch_rounds": epoch_rounds,
        "rounds": rounds,
        "dropouts_per_round": 1 if drop_one else 0,
        "fast": fast,
        "site_cpu_ms_median": 1e3 * statistics.median(site_cpu),
        "site_cpu_ms_p90": 1e3 * float(np.quantile(site_cpu, 0.9)),
        "coordinator_cpu_ms_median": 1e3 * statistics.median(coord_cpu),
        "site_bytes_sent_per_round": statistics.median(site_sent),
        "site_bytes_received_per_round": statistics.median(site_recv),
        "setup_site_cpu_ms_per_round": 1e3 * statistics.median(setup_site_cpu.values()) / slots,
        "setup_site_bytes_sent_per_round": statistics.median(setup_site_sent.values()) / slots,
        "setup_site_bytes_received_per_round": statistics.median(setup_site_recv.values()) / slots,
        "setup_coordinator_cpu_ms_per_round": 1e3 * setup_coord_cpu / slots,
        "site_total_cpu_ms_per_round": 1e3 * statistics.median(site_cpu)
        + 1e3 * statistics.median(setup_site_cpu.values()) / slots,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--epoch-rounds", type=int, default=32)
    ap.add_argument("--vector-len", type=int, default=128)
    ap.add_argument("--sizes", default="3,10,50")
    ap.add_argument("--fast", action="store_true",
                    help="slow and fast rounds (nobody drops) in the same run; default --out secagg_fast.json")
    ap.add_argument("--out", default=None, help="default benchmarks/results/secagg.json (secagg_fast.json with --fast)")
    args = ap.parse_args()
    args.out = args.out or str(ROOT / "benchmarks" / "results" / ("secagg_fast.json" if args.fast else "secagg.json"))
    rows = []
    scenarios = ((False, False), (False, True)) if args.fast else ((False, False), (True, False))  # (drop, fast)
    for n in [int(x) for x in args.sizes.split(",")]:
        for drop, fast in scenarios:
            rows.append(run(n, args.rounds, args.epoch_rounds, args.vector_len, drop, fast=fast))
    hdr = (
        f"{'n':>3} {'t':>3} {'drop':>4} {'fast':>4} | {'site ms':>8} {'p90':>6} {'coord ms':>9} {'sent B':>8} {'recv B':>8} | "
        f"{'setup site ms':>13} {'setup sent B':>12} {'setup coord ms':>14} | {'site total ms':>13}"
    )
    print(f"secure aggregation, d={args.vector_len}, E={args.epoch_rounds} rounds/epoch, {args.rounds} rounds; per round:")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['n']:>3} {r['t']:>3} {r['dropouts_per_round']:>4} {'yes' if r['fast'] else 'no':>4} | {r['site_cpu_ms_median']:>8.2f} {r['site_cpu_ms_p90']:>6.2f} "
            f"{r['coordinator_cpu_ms_median']:>9.2f} {r['site_bytes_sent_per_round']:>8.0f} {r['site_bytes_received_per_round']:>8.0f} | "
            f"{r['setup_site_cpu_ms_per_round']:>13.2f} {r['setup_site_bytes_sent_per_round']:>12.0f} "
            f"{r['setup_coordinator_cpu_ms_per_round']:>14.2f} | {r['site_total_cpu_ms_per_round']:>13.2f}"
        )
    ratios = {}
    if args.fast:
        for slow, fast in zip(rows[::2], rows[1::2]):
            ratios[str(slow["n"])] = {k: fast[k] / slow[k] for k in
                                      ("site_cpu_ms_median", "coordinator_cpu_ms_median", "site_bytes_sent_per_round")}
            print(f"n = {slow['n']}: fast / slow  site CPU {ratios[str(slow['n'])]['site_cpu_ms_median']:.2f}, "
                  f"coordinator CPU {ratios[str(slow['n'])]['coordinator_cpu_ms_median']:.2f}, "
                  f"site bytes sent {ratios[str(slow['n'])]['site_bytes_sent_per_round']:.2f}")
    out = {
        "description": "secure aggregation per-round cost (CPU = process time; medians)",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "vector_len": args.vector_len,
        "epoch_rounds": args.epoch_rounds,
        "goal": "site CPU per round < 5 ms at n = 10",
        "results": rows,
        **({"fast_over_slow_same_run": ratios} if args.fast else {}),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
