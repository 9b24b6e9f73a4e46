"""The privacy conformance suite's numbers as a table (issue 37; docs/plugins.md "The conformance suite").

For every registered mode and both scenarios of ``tests/federation/test_conformance.py`` (``clean``; ``failures``:
two rounds failed after every site sent its input, retried by the coordinator) it runs the same in-process
federation under the same observer and prints, per role (``train``: the training records, ``eval``: the held-out
records of the federated evaluation):

* ``observed`` — data-carrying masked inputs the observer saw the sites send (all sites), and the worst record's ε
  computed by dp-accounting from those observations alone (``ε independent``);
* ``charged`` — rows of the sites' lifetime ledgers, and the worst record's ε they charge (``ε gate``);
* ``ε plan`` — the plan's statement (ε, or ε_eval).

Every row is also an assertion: the run fails if gate, independent count and plan disagree (see the test).
Writes ``results/conformance.json``.

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

from tests.federation.test_conformance import MODE_NAMES, SCENARIOS, check  # noqa: E402


def main(argv=None) -> int:
    rows, t0 = [], time.perf_counter()
    for name in MODE_NAMES:
        for scenario in SCENARIOS:
            with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
                rows += check(name, scenario, Path(d), mp)
    head = f"{'mode':10s} {'scenario':9s} {'role':5s} {'observed':>8s} {'charged':>8s} " \
           f"{'ε independent':>14s} {'ε gate':>10s} {'ε plan':>10s}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.mode:10s} {r.scenario:9s} {r.role:5s} {r.releases_observed:8d} {r.rows_charged:8d} "
              f"{r.oracle_epsilon:14.6f} {r.gate_epsilon:10.6f} {r.plan_epsilon:10.6f}")
    out = RESULTS / "conformance.json"
    out.write_text(json.dumps({"environment": environment(), "seconds": round(time.perf_counter() - t0, 1),
                               "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
