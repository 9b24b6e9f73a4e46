"""server/malloc.py: with the coordinator's fixed mmap threshold, freed large buffers leave the process."""
from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
from fedsbdt.server.malloc import map_large_buffers

def rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) / 1024

if sys.argv[1] == "fixed":
    assert map_large_buffers()
big = b"b" * (8 << 20)
del big  # glibc's dynamic threshold would now be 8 MB: 1 MB buffers would come from the heap
before = rss_mb()
bufs, pins = [], []
for i in range(60):
    bufs.append(bytes([i % 256]) * (1 << 20))
    pins.append(b"p" * 2000 + bytes([i]))  # small blocks between them: the heap cannot shrink from its top
del bufs
print(rss_mb() - before)
"""


def _kept_mb(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; glibc's mallopt")
def test_freed_large_buffers_are_given_back_with_the_fixed_threshold():
    dynamic, fixed = _kept_mb("dynamic"), _kept_mb("fixed")
    assert dynamic > 40  # the default: 60 MB freed, most of it still resident
    assert fixed < 10  # map_large_buffers(): each buffer had its own mapping, unmapped when freed
