"""The privacy conformance suite's numbers as a table (issue 37; docs/plugins.md "The conformance suite").

For every registered mode and both scenarios of ``tests/federation/test_conformance.py`` (``clean``; ``failures``:
two rounds failed after every site sent its input, retried by the coordinator) it runs the same in-process
federation under the same observer and prints, per role (``train``: the training records, ``eval``: the held-out
records of the federated evaluation):

* ``observed`` — data-carrying masked inputs the observer saw the sites send (all sites), and the worst record's ε
  computed by dp-accounting from those observations alone (``ε independent``);
* ``charged`` — rows of the sites' lifetime ledgers, and the worst record's ε they charge (``ε gate``);
* ``ε plan`` — the plan's statement (ε, or ε_eval).

Disagreements between gate, independent count and plan are listed (``NOT CONFORMANT``) and exit 1.
Writes ``results/conformance.json``; ``results/conformance_main.json`` is the same run on main's code before the
fix (commit 134cf28): DPBoost's gate charged ε 2.742736621 where its sites released, and the plan stated, 4.

Run:  python benchmarks/conformance.py   (~2–3 min on 2 loaded cores)
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from _util import RESULTS, environment  # noqa: E402  (puts the repo on sys.path)

from tests.federation.test_conformance import MODE_NAMES, SCENARIOS, measure  # noqa: E402


def main(argv=None) -> int:
    rows, problems, t0 = [], [], time.perf_counter()
    for name in MODE_NAMES:
        for scenario in SCENARIOS:
            with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
                r, p = measure(name, scenario, Path(d), mp)
                rows, problems = rows + r, problems + p
    head = f"{'mode':10s} {'scenario':9s} {'role':5s} {'observed':>8s} {'charged':>8s} " \
           f"{'ε independent':>14s} {'ε gate':>12s} {'ε plan':>12s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.mode:10s} {r.scenario:9s} {r.role:5s} {r.releases_observed:8d} {r.rows_charged:8d} "
              f"{r.oracle_epsilon:14.9f} {r.gate_epsilon:12.9f} {r.plan_epsilon:12.9f}")
    for p in problems:
        print(f"NOT CONFORMANT: {p}")
    out = RESULTS / "conformance.json"
    out.write_text(json.dumps({"environment": environment(), "seconds": round(time.perf_counter() - t0, 1),
                               "rows": [asdict(r) for r in rows], "problems": problems}, indent=1) + "\n")
    print(f"wrote {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
