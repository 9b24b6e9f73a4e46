"""server/collector.py: the coordinator's collector runs rarely, skips what was alive at start, and still frees
the cycles made later."""
from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import gc, json, sys, weakref
from fedsbdt.server.collector import YOUNG, quiet_collector

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a

long_lived = [[i] for i in range(50_000)]  # loaded before the service starts
session = cycle()  # the first session's state, in a reference cycle
if sys.argv[1] == "quiet":
    quiet_collector()
first = weakref.ref(session)
del session  # the first session ends: its cycle is garbage, but frozen
if sys.argv[1] == "quiet":  # the next session in this process (a tuning plan's next trial)
    quiet_collector()
for _ in range(3):
    cycle()
found = gc.collect()  # a full collection: the cycles made after the start are garbage to it
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count(), "found": found,
                  "young_after": YOUNG, "first_freed": first() is None}))
"""


def _run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_quiet_collector_freezes_the_start_and_still_frees_later_cycles():
    """Also across two starts in one process (a tuning plan's trials): the first start's state, frozen, is
    reclaimed by the second once it is garbage."""
    default, quiet = _run("default"), _run("quiet")
    assert default["threshold"][0] == 700 and default["frozen"] == 0
    assert quiet["threshold"] == [quiet["young_after"], 50, 100]
    assert quiet["frozen"] > 50_000  # the long-lived lists: never scanned again
    assert quiet["found"] >= 6 and default["found"] >= 6  # three 2-object cycles freed either way
    assert quiet["first_freed"] and default["first_freed"]  # a second start reclaims the first's frozen cycles
