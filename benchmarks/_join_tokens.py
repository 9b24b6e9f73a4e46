"""Deterministic join tokens for a recorded coordinator session and its replays (a small module: a replaying
coordinator process imports nothing else of the benchmarks, so its memory is the coordinator's own)."""
from __future__ import annotations

import hashlib
import itertools


def counter_bytes():
    """``randbytes`` for a Session: SHAKE-256 of a counter, so a replayed session hands out the same tokens."""
    counter = itertools.count()
    return lambda k: hashlib.shake_256(next(counter).to_bytes(8, "big")).digest(k)
