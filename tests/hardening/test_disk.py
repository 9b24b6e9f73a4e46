"""A site whose state directory fills up, or is read-only, refuses to send rather than send without a ledger.

The privacy rule under test (client/ledger.py): the ledger update of a round
commits (fsync) before the masked vector leaves the site.  With the disk full
the commit fails, so the vector must never leave: the coordinator's debug log
of received masked inputs is matched against the site's SQLite ledger.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import Deadlines

from .conftest import SITES, make_setup
from .harness import check_outcome, read_ledger


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def mounts():
    """Mount helpers (tmpfs, read-only bind) that are always unmounted at teardown."""
    made: list[Path] = []

    def tmpfs(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
        made.append(path)
        return path

    def read_only(path: Path) -> Path:
        sh("mount", "--bind", str(path), str(path))
        made.append(path)
        sh("mount", "-o", "remount,bind,ro", str(path))
        return path

    try:
        yield tmpfs, read_only
    finally:
        for p in reversed(made):
            subprocess.run(["umount", "-l", str(p)], capture_output=True, timeout=30)


def fill(path: Path) -> int:
    """Write zeros into ``path/filler`` until the file system is full; returns the bytes written."""
    n = 0
    with open(path / "filler", "wb", buffering=0) as fh:
        for chunk in (1 << 20, 4096, 512, 1):
            block = b"\0" * chunk
            while True:
                try:
                    fh.write(block)
                    n += chunk
                except OSError as e:
                    assert e.errno in (errno.ENOSPC, errno.EFBIG), e
                    break
        os.fsync(fh.fileno())
    return n


def test_a_site_whose_disk_fills_up_stops_and_nothing_leaves_it_without_a_committed_ledger(
        tmp_path, ca_dir, federation, mounts):
    tmpfs, _ = mounts
    state = tmpfs(tmp_path / "hospital-3", "16m")  # hospital-3's keys, certificate and ledger live here
    hp = Hyperparameters(trees=40, depth=2, seed=31, epsilon=1.0, filter=True, subsample=0.5)
    st = make_setup(tmp_path, ca_dir, hp, n_rows=300, epoch_rounds=8,
                    deadlines=Deadlines(join=10.0, stage=3.0, quorum=60.0, finish=3.0))
    fed = federation(st.plan_path)
    coord = fed.coordinator()
    for s in SITES:
        fed.site(s, st.data[s])
    fed.wait_event(lambda e: e.get("event") == "tree" and e.get("tree", 0) >= 3 and "hospital-3" in e["sites"],
                   timeout=90)
    filled_at = time.monotonic()
    assert fill(state) > 0
    h3 = fed.current["hospital-3"]
    assert h3.wait(timeout=60) == 2, h3.errors
    err = h3.errors
    assert f"the site's database in {state} failed" in err and "full" in err, err
    assert "nothing was sent after the last committed round" in err
    assert "Traceback" not in "".join(h3.lines)
    assert coord.wait(timeout=120) == 0, coord.errors  # the others finish without it
    for s in ("hospital-1", "hospital-2"):
        assert fed.current[s].wait(timeout=60) == 0, fed.current[s].errors
    (state / "filler").unlink()  # room to read the ledger back
    summary = check_outcome(fed, st.plan, SITES, st.records, without_model=("hospital-3",))
    # every masked input the coordinator got from hospital-3 was committed in its ledger first ...
    got = {int(e["round_id"]) for e in fed.events if e.get("event") == "input_received"
           and e.get("site") == "hospital-3"}
    assert got and got <= set(read_ledger(state, st.plan.sha256)["contributions"])
    # ... and after its disk filled up it sent nothing at all (its last rounds ran without it)
    late = [e for e in fed.events if e.get("event") == "input_received" and e.get("site") == "hospital-3"
            and e["_t"] > filled_at + 0.5]
    assert not late, late
    last_rounds = [e["sites"] for e in fed.events if e.get("_proc") == "coordinator" and e.get("event") == "tree"][-3:]
    assert all("hospital-3" not in s for s in last_rounds)
    assert summary["trees"] == hp.total_rounds


def test_a_site_with_a_read_only_state_directory_refuses_to_start(tmp_path, ca_dir, federation, mounts):
    _, read_only = mounts
    hp = Hyperparameters(trees=5, depth=2, seed=32, epsilon=1.0)
    st = make_setup(tmp_path, ca_dir, hp, n_rows=150, deadlines=Deadlines(join=10.0, stage=3.0, quorum=60.0,
                                                                          finish=3.0))
    read_only(tmp_path / "hospital-3")  # keys and certificate readable, nothing writable
    fed = federation(st.plan_path)
    coord = fed.coordinator()
    p = fed.site("hospital-3", st.data["hospital-3"])
    assert p.wait(timeout=60) == 2
    assert "hospital-3" in p.errors and "read-only" in p.errors.lower(), p.errors
    assert "Traceback" not in "".join(p.lines)
    assert not [e for e in fed.events if e.get("_proc") == "coordinator" and e.get("site") == "hospital-3"]
    coord.kill()
