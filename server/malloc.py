"""The coordinator process's allocator settings: large buffers go back to the system when freed.

glibc's malloc serves a request of at least its mmap threshold with a mapping of its own, unmapped on
``free``; but the threshold is *dynamic*: freeing such a mapping raises it to that size (up to 32 MiB), so
from then on buffers of that size come from the arenas — one per thread that allocates, gRPC's and the
event loop's included — and stay there, fragmented, after they are freed.  The coordinator's epoch setup
passes n ShareKeys in and n EpochShares out (≈ 1–2 MB each at 100 sites), so with the dynamic threshold its
resident memory kept most of an epoch setup's transient bytes for good (measured: ≈ 130 MB of arenas
after one setup at 40 sites).  A fixed threshold (which also fixes the trim threshold) keeps every buffer of
``LARGE_BYTES`` or more in its own mapping: resident memory follows what is alive.
"""
from __future__ import annotations

import ctypes
import ctypes.util

#: Buffers of at least this size are mapped on their own (glibc's initial threshold, made fixed).
LARGE_BYTES = 128 * 1024
_M_MMAP_THRESHOLD = -3  # <malloc.h>


def map_large_buffers(threshold: int = LARGE_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; False where there is no glibc
    ``mallopt`` (another C library: nothing changes)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1
