"""Issue 10 (4, 5) against a real ``fedsbdt coordinator`` process with mutual TLS.

* A certificate the consortium CA issued for a name outside the roster gets
  PERMISSION_DENIED from every RPC of ``fedsbdt.v1.Federation`` and nothing
  else (the test enumerates the service descriptor, so a new RPC needs a case).
* 100 hostile idle ``Connect`` streams — over an outsider's certificate, then
  over a roster member's — do not delay another roster site's calls: the
  outsider's are refused at once, the member's beyond its quota of open
  streams are refused, and the ones within it are cancelled when their first
  message does not come.
"""
from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from fedsbdt.common.federation.keys import load_identity
from fedsbdt.common.config import Hyperparameters
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.common.federation.pki import TlsFiles, channel_credentials
from fedsbdt.server.service import FIRST_MESSAGE_SECONDS, STREAMS_PER_IDENTITY
from fedsbdt.common.federation.wire import GRPC_OPTIONS, sign_join

from federation.conftest import make_identities

from .conftest import SITES, make_setup

OUTSIDER = "mallory"
PROMPT = 5.0  # seconds: a correctness bound for a roster site's call, far above its normal few milliseconds


@pytest.fixture
def coordinator(tmp_path, ca_dir, federation):
    """A coordinator process for SITES (none started), and an outsider with a certificate from the same CA."""
    setup = make_setup(tmp_path, ca_dir, Hyperparameters(trees=3, depth=2, seed=1), n_rows=90)
    make_identities(tmp_path, [OUTSIDER], ca_dir)
    fed = federation(setup.plan_path)
    fed.coordinator()
    fed.wait_event(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "listening", timeout=60)
    channels: list[grpc.Channel] = []

    def channel(name: str) -> grpc.Channel:
        ch = grpc.secure_channel(fed.address, channel_credentials(TlsFiles.in_dir(tmp_path / name)),
                                 options=list(GRPC_OPTIONS))
        channels.append(ch)
        return ch

    try:
        yield setup, fed, channel
    finally:
        for ch in channels:
            ch.close()


def failure(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value


def test_every_rpc_refuses_a_ca_signed_certificate_outside_the_roster(coordinator, tmp_path):
    setup, fed, channel = coordinator
    plan = setup.plan
    stub = pbg.FederationStub(channel(OUTSIDER))
    site = SITES[0]  # the outsider claims to be a roster site where a call names one
    nonce = os.urandom(32)
    join = pb.JoinRequest(plan_sha256=plan.sha256, site_id=site, nonce=nonce,
                          signature=sign_join(load_identity(tmp_path / OUTSIDER / "identity.key"), plan.sha256,
                                              site, nonce))
    sub = pb.SubscribeRequest(site_id=site, token=b"t" * 16)
    agg = pb.SecAggSubmission(site_id=site, token=b"t" * 16, secagg=b"x")
    calls = {
        "GetPlan": lambda: stub.GetPlan(pb.GetPlanRequest(), timeout=10),
        "GetStatus": lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=10),
        "GetTrees": lambda: stub.GetTrees(pb.GetTreesRequest(from_index=0), timeout=10),
        "Join": lambda: stub.Join(join, timeout=10),
        "Subscribe": lambda: list(stub.Subscribe(sub, timeout=10)),
        "SubmitSetup": lambda: stub.SubmitSetup(agg, timeout=10),
        "SubmitMaskedInput": lambda: stub.SubmitMaskedInput(
            pb.MaskedInputSubmission(site_id=site, token=b"t" * 16, purpose=1, secagg=b"x"), timeout=10),
        "SubmitRound": lambda: stub.SubmitRound(agg, timeout=10),
        "Report": lambda: stub.Report(pb.ReportRequest(site_id=site, token=b"t" * 16, kind=pb.REPORT_PROGRESS),
                                      timeout=10),
        "Connect": lambda: list(stub.Connect(iter([pb.SiteMessage(subscribe=sub)]), timeout=10)),
    }
    assert set(calls) == {m.name for m in pb.DESCRIPTOR.services_by_name["Federation"].methods}
    for name, call in calls.items():
        e = failure(call)
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, (name, e.code(), e.details())
        assert f"issued to {OUTSIDER!r}, which is not in the plan's roster" in e.details(), (name, e.details())
    # a roster site is served (the check is the roster, not a blanket refusal) and saw nothing change
    roster = pbg.FederationStub(channel(SITES[1]))
    assert roster.GetPlan(pb.GetPlanRequest(), timeout=10).plan_sha256 == plan.sha256
    st = roster.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert st.stage == "gathering" and not any(s.connected for s in st.sites)
    assert fed.events_of("coordinator", "joined") == []
    fed.wait_count(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "not_on_roster", len(calls),
                   timeout=30)  # the coordinator process writes its log asynchronously


class IdleStreams:
    """``n`` Connect streams that never send their first message; records how each one ended."""

    def __init__(self, channel: grpc.Channel, n: int) -> None:
        self.gate = threading.Event()
        self.cond = threading.Condition()
        self.ended: list[grpc.StatusCode] = []
        stub = pbg.FederationStub(channel)
        self.calls = [stub.Connect(self._silence()) for _ in range(n)]
        for c in self.calls:
            c.add_done_callback(self._done)

    def _silence(self):
        self.gate.wait()
        yield from ()

    def _done(self, call) -> None:
        with self.cond:
            self.ended.append(call.code())
            self.cond.notify_all()

    def wait_ended(self, k: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.ended) >= k, timeout=timeout)

    def close(self) -> None:
        self.gate.set()
        for c in self.calls:
            c.cancel()


def roster_calls_are_prompt(stub, plan) -> None:
    for _ in range(3):
        t0 = time.monotonic()
        assert stub.GetPlan(pb.GetPlanRequest(), timeout=PROMPT).plan_sha256 == plan.sha256
        assert stub.GetStatus(pb.GetStatusRequest(), timeout=PROMPT).stage == "gathering"
        assert stub.GetTrees(pb.GetTreesRequest(from_index=0), timeout=PROMPT).trees_released == 0
        assert time.monotonic() - t0 < PROMPT


@pytest.mark.parametrize("hostile", [OUTSIDER, SITES[0]], ids=["outside-the-roster", "roster-member"])
def test_a_hundred_idle_connect_streams_do_not_delay_a_roster_site(coordinator, hostile):
    setup, fed, channel = coordinator
    n = 100
    streams = [IdleStreams(channel(hostile), n // 4) for _ in range(4)]  # over four connections
    try:
        refused = n if hostile == OUTSIDER else n - STREAMS_PER_IDENTITY
        for s in streams:  # let the refusals happen (today's main never refuses: it keeps them all)
            s.wait_ended(len(s.calls) if hostile == OUTSIDER else len(s.calls) - STREAMS_PER_IDENTITY, 10)
        legit = pbg.FederationStub(channel(SITES[1]))
        roster_calls_are_prompt(legit, setup.plan)
        ended = [c for s in streams for c in s.ended]
        expected = grpc.StatusCode.PERMISSION_DENIED if hostile == OUTSIDER else grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ended.count(expected) == refused and len(ended) >= refused, ended
        if hostile != OUTSIDER:
            # the member's streams within its quota hold a thread only until the first-message deadline
            deadline = time.monotonic() + FIRST_MESSAGE_SECONDS + 20
            while len([c for s in streams for c in s.ended]) < n and time.monotonic() < deadline:
                streams[0].wait_ended(len(streams[0].calls), 0.5)
            ended = [c for s in streams for c in s.ended]
            assert len(ended) == n and ended.count(grpc.StatusCode.CANCELLED) == STREAMS_PER_IDENTITY, ended
            # each cancelled stream's log line is written after the stream ended: wait for them to arrive
            fed.wait_count(lambda e: e.get("_proc") == "coordinator" and e.get("event") == "idle_stream",
                           STREAMS_PER_IDENTITY, timeout=30)
            assert len(fed.events_of("coordinator", "idle_stream")) == STREAMS_PER_IDENTITY
        roster_calls_are_prompt(legit, setup.plan)
    finally:
        for s in streams:
            s.close()
