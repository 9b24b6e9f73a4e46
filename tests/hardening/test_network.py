"""Network faults between real processes (mutual TLS): network namespaces and a fault-injecting TCP proxy.

``tc netem`` is not available, so latency, connection resets and refused
connections come from :mod:`.faultproxy`; real partitions (packets vanish,
TCP retransmits, nothing is closed) come from taking a site's veth link down.

* Recoverable faults, one federation: every site in its own network namespace,
  reaching the coordinator through its own proxy (10 ms each way).  Two of
  three sites lose the coordinator at once — one by a cut link (RST, new
  connections refused), one by a partition — so nothing can be released;
  both come back and take part again; then every connection is reset.
  Training completes within a wall-time bound, every process exits 0, and the
  outcome checks of the crash tests hold.
* Unrecoverable: two of three sites cut for good — the coordinator fails after
  its quorum deadline (exit 1), the cut sites give up after their reconnect
  timeout, the connected one is told why (exit 2); every message is one clear
  sentence and no process is left running.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import time

import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.plan import Deadlines

from .conftest import SITES, make_setup
from .faultproxy import FaultProxy
from .harness import check_outcome


def tree_at_least(k: int):
    return lambda e: e.get("_proc") == "coordinator" and e.get("event") == "tree" and e["tree"] >= k


def released(fed) -> list[int]:
    return [e["tree"] for e in fed.events if tree_at_least(0)(e)]


def sites_of_rounds_after(fed, t0: float) -> set[str]:
    return {s for e in fed.events if tree_at_least(0)(e) and e["_t"] > t0 for s in e["sites"]}


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def proxies():
    made: list[FaultProxy] = []

    def make(port: int, listen_host: str = "127.0.0.1") -> FaultProxy:
        p = FaultProxy(("127.0.0.1", port), listen_host)
        made.append(p)
        return p

    try:
        yield make
    finally:
        for p in made:
            p.close()


@pytest.fixture
def namespaces():
    """One network namespace per site, each joined to the host by a veth pair on its own /30 subnet."""
    tag = secrets.token_hex(2)
    in_use = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
    free = [n for n in range(200, 250) if f" 10.{n}." not in in_use]  # e.g. namespaces a killed run left behind
    net = free[secrets.randbelow(len(free))]
    made: list[tuple[str, str]] = []
    out = {}
    try:
        for k, s in enumerate(SITES):
            ns, host_if, ns_if = f"fsbdt-{tag}-{k}", f"fh{tag}{k}a", f"fh{tag}{k}b"
            sh("ip", "netns", "add", ns)
            made.append((ns, host_if))
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            sh("ip", "link", "set", ns_if, "netns", ns)
            host_ip, ns_ip = f"10.{net}.{k}.1", f"10.{net}.{k}.2"
            sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
            sh("ip", "link", "set", host_if, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            out[s] = {"ns": ns, "host_if": host_if, "host_ip": host_ip}
        yield out
    finally:
        for ns, host_if in made:
            subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_partitions_cuts_latency_and_resets_heal_within_bounded_time(tmp_path, ca_dir, federation, namespaces,
                                                                     proxies):
    hp = Hyperparameters(trees=50, depth=2, seed=23, epsilon=1.0)
    dl = Deadlines(join=10.0, stage=2.0, quorum=60.0, finish=20.0)
    hosts = ["localhost", "127.0.0.1", *(v["host_ip"] for v in namespaces.values())]
    st = make_setup(tmp_path, ca_dir, hp, n_rows=300, epoch_rounds=8, deadlines=dl, hosts=hosts)
    fed = federation(st.plan_path)
    px = {s: proxies(fed.port, v["host_ip"]) for s, v in namespaces.items()}
    for p in px.values():
        p.delay(0.005)  # 5 ms each way on every link
    t0 = time.monotonic()
    coord = fed.coordinator()
    for s, v in namespaces.items():
        fed.site(s, st.data[s], address=px[s].address, prefix=("ip", "netns", "exec", v["ns"]),
                 reconnect_timeout=30)
    fed.wait_event(tree_at_least(3), timeout=90)
    # 1. hospital-1's link is cut (RST, connections refused) and hospital-2 is partitioned (its veth is
    #    down: packets vanish, nothing is closed): fewer than t = 2 sites, nothing can be released
    m = fed.mark()
    px["hospital-1"].refuse()
    sh("ip", "link", "set", namespaces["hospital-2"]["host_if"], "down")
    fed.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "waiting", timeout=30, after=m)
    stalled_at = max(released(fed))
    time.sleep(1.5)  # a window in which nothing may be released (the faults' duration is the test itself)
    assert max(released(fed)) == stalled_at
    # 2. both come back and take part again
    px["hospital-1"].restore()
    sh("ip", "link", "set", namespaces["hospital-2"]["host_if"], "up")
    healed = time.monotonic()
    m = fed.mark()
    for s in ("hospital-1", "hospital-2"):
        fed.wait_event(lambda e, s=s: tree_at_least(0)(e) and s in e["sites"], timeout=40, after=m)
    # 3. every connection is reset at once
    for p in px.values():
        p.reset()
    assert coord.wait(timeout=120) == 0, coord.errors
    for s in SITES:
        assert fed.current[s].wait(timeout=60) == 0, fed.current[s].errors
    wall = time.monotonic() - t0
    assert wall < 150, f"training under network faults took {wall:.0f} s"
    check_outcome(fed, st.plan, SITES, st.records)
    assert sites_of_rounds_after(fed, healed) == set(SITES)
    assert all(p.connections >= 2 for p in px.values())  # every site reconnected at least once


def test_losing_two_of_three_sites_for_good_aborts_cleanly_and_every_process_exits(tmp_path, ca_dir, federation,
                                                                                   proxies):
    hp = Hyperparameters(trees=200, depth=2, seed=22, epsilon=1.0)
    dl = Deadlines(join=10.0, stage=2.0, quorum=4.0, finish=5.0)
    st = make_setup(tmp_path, ca_dir, hp, n_rows=150, epoch_rounds=16, deadlines=dl)
    fed = federation(st.plan_path)
    px = {s: proxies(fed.port) for s in SITES}
    coord = fed.coordinator()
    for s in SITES:
        fed.site(s, st.data[s], address=px[s].address, reconnect_timeout=4)
    fed.wait_event(tree_at_least(3), timeout=60)
    cut = time.monotonic()
    px["hospital-2"].refuse()
    px["hospital-3"].refuse()
    released_at_cut = max(released(fed))
    bound = 3 * dl.stage + dl.quorum + 4 + 15  # stage deadlines, quorum, reconnect timeout, backoff and exit slack
    assert coord.wait(timeout=bound) == 1, coord.errors
    assert "fewer than t = 2 sites were available for 4 s" in coord.errors
    codes = {s: fed.current[s].wait(timeout=bound) for s in SITES}
    waited = time.monotonic() - cut
    assert waited < bound, f"the processes took {waited:.0f} s to give up"
    assert codes == {s: 2 for s in SITES}, codes
    assert "the coordinator aborted the session: fewer than t = 2" in fed.current["hospital-1"].errors
    for s in ("hospital-2", "hospital-3"):
        err = fed.current[s].errors
        assert "lost the coordinator" in err and "for more than 4 s" in err and "restart the client" in err, err
    for p in fed.history:
        assert "Traceback" not in "".join(p.lines), p.name
    assert max(released(fed)) <= released_at_cut + 1  # at most the round that was past its inputs
    assert not (tmp_path / "coordinator" / "model.json").exists()
    assert json.loads(coord.stdout)["error"].startswith("fewer than t = 2 sites")
