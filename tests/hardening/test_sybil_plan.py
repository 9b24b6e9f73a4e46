"""The attack of issue 10 (1): a coordinator serves a plan built to read one hospital's exact sums.

The coordinator (a real ``fedsbdt coordinator`` process) serves the roster
{victim, sybil} — the sybil's keys and certificate are the coordinator's own,
run here as a real ``fedsbdt client`` — with t = 2, central noise and ε = 1.
Had the victim taken part, the sum of the two sites' vectors minus the sybil's
would be the victim's exact record count, label sum and leaf sums.  The
victim, a real ``fedsbdt client`` process (with ``--max-epsilon 1``, which
the plan meets), reaches the coordinator through a counting TCP proxy and
refuses in every configuration:

* unpinned (no ``--plan``/``--plan-hash``): exit 2 before opening any
  connection, one line naming both flags;
* pinned to this very plan (its operator was given the hash) but without
  ``--allow-central-noise``: refused after fetching the plan;
* opted in to central noise, with the default ``--min-sites 3``, or with
  ``--min-threshold 3`` or ``--min-colluders 1``: refused likewise;
* pinned with the plan file itself: refused before connecting.

Then: the victim never joined (the coordinator's log and status), no
round ran, nothing was released, and the victim wrote no ledger.
"""
from __future__ import annotations

import grpc

from fedsbdt.client.ledger import ledger_path
from fedsbdt.common.config import Hyperparameters
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.common.federation.pki import TlsFiles, ca_server, channel_credentials
from fedsbdt.common.federation.wire import GRPC_OPTIONS

from federation.conftest import abalone_with_ids, make_identities, make_test_plan, write_splits
from federation.processes import Proc

from .faultproxy import FaultProxy

VICTIM, SYBIL = "hospital-v", "sybil"


def test_a_site_refuses_a_sybil_roster_with_central_noise_and_sends_nothing(tmp_path, ca_dir, federation):
    schema, raw = abalone_with_ids(300)
    ids = make_identities(tmp_path, [VICTIM, SYBIL], ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    data = write_splits(raw, [VICTIM, SYBIL], tmp_path / "data")
    plan = make_test_plan(schema, ids, Hyperparameters(trees=4, depth=2, seed=5, epsilon=1.0), threshold=2,
                          noise="central", assumed_colluders=0)  # the attacker declares c = 0
    plan_path = tmp_path / "plan.toml"
    plan.save(plan_path)
    assert (plan.n, plan.threshold, plan.assumed_colluders, plan.noise) == (2, 2, 0, "central")
    assert plan.stated_epsilon <= 1.0  # the victim's --max-epsilon 1 does not stop it

    fed = federation(plan_path)
    coord = fed.coordinator()
    fed.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "listening", timeout=60)
    # the coordinator's sybil: a site that accepts this plan (and joins)
    fed.site(SYBIL, data[SYBIL], "--plan-hash", plan.sha256, "--allow-central-noise", "--min-sites", "2")

    def victim_exit_or_join(e: dict) -> bool:
        return ((e.get("_proc") == VICTIM and e.get("event") == "_exit")
                or (e.get("_proc") == "coordinator" and e.get("event") == "joined" and e.get("site") == VICTIM))

    proxy = FaultProxy(("127.0.0.1", fed.port))
    try:
        def victim(*flags: str) -> str:
            argv = ["client", "--coordinator", f"localhost:{proxy.port}", "--site", VICTIM, "--data",
                    str(data[VICTIM]), "--state", str(tmp_path / VICTIM), "--max-epsilon", "1",
                    "--reconnect-timeout", "30", "--json", *flags]
            mark = fed.mark()
            p = Proc(fed, VICTIM, argv)
            ev = fed.wait_event(victim_exit_or_join, after=mark, timeout=120)
            assert ev["event"] == "_exit", f"the victim ({' '.join(flags) or 'unpinned'}) joined the sybil session"
            assert p.wait(timeout=30) == 2, (flags, p.errors)
            last = p.errors.strip().splitlines()[-1]
            assert last.startswith("fedsbdt client: error: ") and p.stdout == "", (flags, last)
            assert "Traceback" not in "".join(p.lines), flags
            return last

        # 1. unpinned: refuses to start, before any connection
        last = victim()
        assert "--plan" in last and "--plan-hash" in last, last
        assert proxy.connections == 0 and proxy.bytes["up"] == 0
        # 2. pinned with the plan file: the policy refuses it before connecting
        last = victim("--plan", str(plan_path))
        assert "central noise" in last and "--allow-central-noise" in last, last
        assert proxy.connections == 0
        # 3. pinned by hash (the plan is fetched, then refused by the site's policy)
        refusals = {
            (): "--allow-central-noise",
            ("--allow-central-noise",): "has 2 sites (hospital-v, sybil), fewer than this site's --min-sites 3",
            ("--allow-central-noise", "--min-sites", "2", "--min-threshold", "3"):
                "threshold t = 2 is below this site's --min-threshold 3",
            ("--allow-central-noise", "--min-sites", "2", "--min-colluders", "1"):
                "c = 0 colluding sites, fewer than this site's --min-colluders 1",
        }
        for flags, msg in refusals.items():
            last = victim("--plan-hash", plan.sha256, *flags)
            assert msg in last, (flags, last)
        assert proxy.connections >= len(refusals)  # it did fetch the plan each time
    finally:
        proxy.close()

    # nothing of the victim's reached the coordinator: it never joined, no round ran, nothing was released
    fed.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "joined"
                   and e.get("site") == SYBIL, timeout=120)  # while the coordinator's sybil did
    files = TlsFiles.in_dir(tmp_path / SYBIL)
    with grpc.secure_channel(f"localhost:{fed.port}", channel_credentials(files), options=list(GRPC_OPTIONS)) as ch:
        st = pbg.FederationStub(ch).GetStatus(pb.GetStatusRequest(), timeout=20)
    assert st.stage == "gathering" and st.trees_released == 0, st
    assert {s.site_id: s.connected for s in st.sites} == {VICTIM: False, SYBIL: True}
    assert coord.alive
    assert all(e.get("site") != VICTIM for e in fed.events_of("coordinator", "joined"))
    assert not any(e.get("_proc") == "coordinator" and e.get("event") in ("started", "epoch_announced", "round_started",
                                                                    "input_received", "init", "tree")
                   for e in fed.events)
    assert not ledger_path(tmp_path / VICTIM, plan.sha256).exists()
    assert not any((tmp_path / VICTIM).glob("model*.json"))
