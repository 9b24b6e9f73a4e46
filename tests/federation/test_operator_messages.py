"""What the coordinator and a site tell their operators at the end (issue 36 item 3): numbers and reasons that
cannot be misread — which trees a site's data is missing from and why, how many sites each released sum covers,
and a coordinator that was never reached."""
from __future__ import annotations

import socket

import pytest

from .test_state_machines import SITES, Fed, fail_rounds_after_inputs, tree_hp


def test_tree_ranges():
    from fedsbdt.client.cli import tree_ranges

    assert tree_ranges([]) == "" and tree_ranges([3]) == "3"
    assert tree_ranges([0, 1, 2, 5, 7, 8]) == "0–2, 5, 7–8"


def test_trees_released_while_a_site_was_down_are_not_blamed_on_failed_attempts(tmp_path):
    """A site down for a few trees: those trees were released without it — not 'failed attempts spent the
    budget' — and the coordinator's summary does not read like a broken threshold."""
    from fedsbdt.client.cli import tree_ranges, without_data_text

    f = Fed(tmp_path, tree_hp(trees=8), dropout_slack=1).start()  # s = 1: the others go on at once
    f.fed.run(until=lambda: len(f.session.trees) >= 2)
    f.fed.crash("hosp-c")
    f.fed.run(until=lambda: len(f.session.trees) >= 5)
    f.restart_site("hosp-c")
    f.fed.run()
    assert f.session.exit_code == 0
    absent = [t.index for t in f.session.trees if "hosp-c" not in t.sites]
    assert absent and max(absent) < len(f.session.trees) - 1  # it came back before the end
    r = f.machines["hosp-c"].receipt()
    assert r["trees_without_this_site"] == absent and r["trees_with_zero_input"] == []
    text = without_data_text(r)
    assert (f"{len(absent)} were released while this site was not in the round (not connected, suspended or not "
            f"yet joined): trees {tree_ranges(absent)}") in text
    assert "failed attempts" not in text
    assert without_data_text(f.machines["hosp-a"].receipt()) == ""  # every tree carried its data
    summary = f.session.data_summary()
    n = len(f.session.trees)
    assert summary.startswith(f"trained {n} trees, each released from a sum over at least t = 2 sites; trees per "
                              f"site: hosp-a {n}, hosp-b {n}, hosp-c {n - len(absent)} (last at tree {n - 1}) (2 of "
                              "the 3 sites took part in all of them)"), summary
    assert "sites in every released sum" not in summary


def test_zero_inputs_after_failed_attempts_are_named_as_such(tmp_path):
    from fedsbdt.client.cli import without_data_text

    f = Fed(tmp_path, tree_hp(trees=3), secagg_fast_path="never").start()
    fail_rounds_after_inputs(f, 1)  # one failed attempt: every site's last tree carries its zero input
    assert f.session.exit_code == 0
    for s in SITES:
        r = f.machines[s].receipt()
        assert r["trees_with_zero_input"] == [2] and r["trees_without_this_site"] == []
        assert without_data_text(r) == ("(2 carried this site's data; 1 summed its zero input, because failed "
                                        "attempts it had answered spent its records' scheduled releases: trees 2) ")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_coordinator_never_reached_is_named_with_every_address_tried(tmp_path):
    """gRPC reports only the last address it tried (often [::1] for localhost) and the old message said 'lost';
    a site that never reached the coordinator says so and names what each address of the host answered."""
    from fedsbdt.client.daemon import Daemon, DaemonError, DaemonOptions

    f = Fed(tmp_path, tree_hp(trees=2))
    port = _closed_port()
    target = f"localhost:{port}"
    d = Daemon(f.machines["hosp-a"], target, None, DaemonOptions(reconnect_timeout=0.5, backoff_initial=0.05,
                                                                  rpc_timeout=2.0))
    with pytest.raises(DaemonError) as e:
        d.run()
    msg = str(e.value)
    assert msg.startswith(f"never reached the coordinator at {target} in 0.5 s while fetching the plan"), msg
    assert "lost the coordinator" not in msg
    addresses = {a[4][0] for a in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
    for a in addresses:
        shown = f"[{a}]:{port}" if ":" in a else f"{a}:{port}"
        assert f"{shown}: connection refused" in msg, msg
    assert "is the coordinator running" in msg
