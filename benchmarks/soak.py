"""Seeded random-kill soak of a real federation (a script, not a test: minutes per seed).

For each seed, a federation of separate processes (coordinator + n sites,
mutual TLS, secure randomness, distributed noise, the individual Rényi
filter) trains a model while kill points drawn from the seeded RNG make the
coordinator and the sites SIGKILL themselves at random protocol stages
(common/testhooks.py: epoch setup, initial-score round, masked input,
consistency, unmask, tree release; before or after the message leaves) and at
random trees; each killed process is restarted at once with its next point.
After the run every check of tests/hardening/harness.py:check_outcome must
hold: the run completed, every party's model file is byte-identical, each
tree was released exactly once with increasing round ids, the privacy receipt
counts exactly the released rounds, no record's ledger exceeds its budget,
and every masked input the coordinator received was committed in the
sender's ledger first.

The short version of this (one seed, four kills) runs in the test suite:
tests/hardening/test_crashes.py::test_seeded_random_kill_soak_short.

Run:  python benchmarks/soak.py [--seeds 1 2 3] [--kills 12] [--trees 60] [--sites 3]
Results: benchmarks/results/soak.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.federation.pki import ca_init  # noqa: E402
from fedsbdt.common.federation.plan import Deadlines  # noqa: E402

from hardening.conftest import make_setup  # noqa: E402
from hardening.harness import Federation, check_outcome, run_with_random_kills  # noqa: E402


def one_seed(seed: int, kills: int, trees: int, n: int, keep: bool) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"fedsbdt-soak-{seed}-"))
    sites = [f"hospital-{k + 1}" for k in range(n)]
    ca = root / "ca"
    ca_init(ca, days=2)
    extra = max(trees // 4, 1)
    hp = Hyperparameters(trees=trees - extra, extra_trees=extra, filter=True, depth=3, seed=seed, epsilon=1.0,
                         subsample=0.3)
    st = make_setup(root, ca, hp, n_rows=600, sites=sites, epoch_rounds=8,
                    deadlines=Deadlines(join=15.0, stage=5.0, quorum=300.0, finish=60.0))
    fed = Federation(root, st.plan_path)
    for s in sites:  # every kill may fail a round the sites answered: the soak tests recovery, not that policy
        fed.configure_site(s, st.data[s], "--max-failed-attempts-per-session", str(hp.total_rounds),
                           reconnect_timeout=120.0)
    t0 = time.monotonic()
    ok, error, summary, fired = True, None, None, []
    try:
        fired = run_with_random_kills(fed, sites, seed=seed, kills=kills, trees_total=hp.total_rounds,
                                      timeout=1800)
        summary = check_outcome(fed, st.plan, sites, st.records)
    except AssertionError as e:
        ok, error = False, str(e)[-3000:]
    finally:
        fed.stop()
    out = {"seed": seed, "ok": ok, "seconds": round(time.monotonic() - t0, 1), "sites": n,
           "trees": hp.total_rounds, "kills_scheduled": kills,
           "kills_fired": [{"party": k.party, "point": k.point, "at_s": k.seconds} for k in fired],
           "summary": summary, "error": error, "events": str(root / "events.jsonl")}
    if ok and not keep:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--trees", type=int, default=60)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the run directories of passing seeds too")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    args = ap.parse_args()
    runs = []
    for seed in args.seeds:
        print(f"seed {seed}: {args.kills} random kill points, {args.trees} trees, {args.sites} sites ...", flush=True)
        r = one_seed(seed, args.kills, args.trees, args.sites, args.keep)
        print(json.dumps({k: r[k] for k in ("seed", "ok", "seconds")} | {"fired": len(r["kills_fired"])}),
              flush=True)
        runs.append(r)
    doc = {"benchmark": "benchmarks/soak.py", "date": time.strftime("%Y-%m-%d"), "runs": runs,
           "passed": sum(r["ok"] for r in runs), "total": len(runs)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{doc['passed']}/{doc['total']} seeds passed; wrote {args.out}")
    sys.exit(0 if doc["passed"] == doc["total"] else 1)


if __name__ == "__main__":
    main()
