"""The coordinator process's cyclic garbage collector: fewer, cheaper collections while it serves rounds.

Reference counting frees almost everything a round allocates; the cyclic collector only has to find cycles.
With CPython's default thresholds (700, 10, 10) it runs a young collection every 700 net allocations of
containers.  A fast round at n = 100 decoded ≈ 10,000 of them (each reply's (dealer, share) pairs, alive until
the release; the replies have since kept their shares as bytes, docs/federation.md §10), and ≈ 12 young
collections per round promoted the round's live messages to older generations; the full collections those
promotions trigger rescanned the whole heap — imports, plan and session included
(measured: docs/federation.md §10, "The garbage collector").  :func:`quiet_collector`, called once the
service has loaded everything long-lived, collects once, freezes what is alive (``gc.freeze``: never scanned
again — whatever of it later dies inside a reference cycle is not reclaimed, at most the start's own state)
and raises the young threshold.  Garbage made later is collected as before.  Calling it again (the next
trial of a tuning plan) first unfreezes, so what the last session left in cycles is reclaimed, not frozen.
"""
from __future__ import annotations

import gc

#: net container allocations between two young collections (CPython's default: 700)
YOUNG = 20_000
#: young collections per middle-generation one, and middle per full (defaults: 10, 10)
MIDDLE, OLD = 50, 100


def quiet_collector() -> None:
    """Collect once (the frozen objects of an earlier call included), freeze the survivors out of every later
    scan, and set the thresholds above."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
