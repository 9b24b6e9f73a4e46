"""Transport faults against the gRPC layer in process: regression tests for two bugs the network tests found."""
from __future__ import annotations

import os
import threading
import time
from concurrent import futures

import grpc
import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.server.service import CoordinatorServer
from fedsbdt.server.session import Session
from fedsbdt.common.federation.wire import GRPC_OPTIONS, SERVER_OPTIONS, sign_join

from federation.conftest import abalone_with_ids, make_identities, make_test_plan

from .faultproxy import FaultProxy

SITES = ["site-a", "site-b", "site-c"]


@pytest.fixture
def served(tmp_path):
    ids = make_identities(tmp_path, SITES)
    schema, _ = abalone_with_ids(60)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=3, depth=2, seed=1), randomness="insecure-test")
    session = Session(plan, plan.make_randomness(True), time.monotonic())
    server = CoordinatorServer(session, "127.0.0.1:0")  # no TLS: identity is not what these tests are about
    server.start()
    try:
        yield plan, ids, server
    finally:
        server.stop(grace=0.5)


def join(stub, plan, ids, site: str) -> bytes:
    nonce = os.urandom(32)
    return stub.Join(pb.JoinRequest(plan_sha256=plan.sha256, site_id=site, nonce=nonce,
                                    signature=sign_join(ids[site].key, plan.sha256, site, nonce)), timeout=10).token


def test_a_site_that_resubscribes_before_its_old_stream_closes_stays_connected(served):
    """Regression: after a network fault a site re-subscribes with the same token; when the server noticed
    the *old* stream's end only afterwards, its close callback marked the site disconnected although the
    new stream was open — the site then never took part in a round again (found by test_network.py)."""
    plan, ids, server = served
    svc = server.service
    subscribed, closed = threading.Semaphore(0), threading.Event()
    orig_sub, orig_closed = svc.session.subscribed, svc._stream_closed

    def on_subscribed(*a):
        out = orig_sub(*a)
        subscribed.release()
        return out

    def on_closed(*a):
        orig_closed(*a)
        closed.set()

    svc.session.subscribed, svc._stream_closed = on_subscribed, on_closed
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=list(GRPC_OPTIONS))
    stub = pbg.FederationStub(ch)
    token = join(stub, plan, ids, "site-a")
    old = stub.Subscribe(pb.SubscribeRequest(site_id="site-a", token=token))
    assert subscribed.acquire(timeout=10)
    new = stub.Subscribe(pb.SubscribeRequest(site_id="site-a", token=token, after_seq=0))
    assert subscribed.acquire(timeout=10)
    old.cancel()  # the old stream ends after the new one started
    assert closed.wait(timeout=10)
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert {s.site_id: s.connected for s in st.sites}["site-a"] is True
    closed.clear()
    new.cancel()  # the last stream of this join ends: now the site is disconnected
    assert closed.wait(timeout=10)
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert {s.site_id: s.connected for s in st.sites}["site-a"] is False
    ch.close()


class _Idle(pbg.FederationServicer):
    """A server whose stream never sends and whose unary call never answers."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def Subscribe(self, request, context):
        while context.is_active() and not self.stop.is_set():
            self.stop.wait(0.1)
        return iter(())

    def GetStatus(self, request, context):
        self.stop.wait(60)
        return pb.GetStatusResponse()

    def GetPlan(self, request, context):
        return pb.GetPlanResponse()


def test_keepalive_notices_a_black_holed_connection_and_fails_calls_in_flight():
    """Regression: the keepalive ping's ack timeout is grpc.http2.ping_timeout_ms (60 s by default in this
    gRPC), not keepalive_timeout_ms, so a black-holed connection went unnoticed for ~70 s and a call in
    flight hung until its deadline.  With the options of common/federation/wire.py (only the ping period shortened
    to 1 s here, to keep the test fast) both fail UNAVAILABLE within seconds."""
    idle = _Idle()
    srv = grpc.server(futures.ThreadPoolExecutor(4), options=list(SERVER_OPTIONS))
    pbg.add_FederationServicer_to_server(idle, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    proxy = FaultProxy(("127.0.0.1", port))
    opts = [o for o in GRPC_OPTIONS if o[0] != "grpc.keepalive_time_ms"] + [("grpc.keepalive_time_ms", 1000)]
    ch = grpc.insecure_channel(f"127.0.0.1:{proxy.port}", options=opts)
    stub = pbg.FederationStub(ch)
    result: dict[str, tuple[float, grpc.StatusCode]] = {}
    done = threading.Event()

    def follow():
        try:
            for _ in stub.Subscribe(pb.SubscribeRequest(site_id="x")):
                pass
        except grpc.RpcError as e:
            result["stream"] = (time.monotonic() - t0, e.code())
        done.set()

    def unary():
        try:
            stub.GetStatus(pb.GetStatusRequest(), timeout=30)
        except grpc.RpcError as e:
            result["unary"] = (time.monotonic() - t0, e.code())

    try:
        t0 = time.monotonic()
        th = threading.Thread(target=follow, daemon=True)
        th.start()
        stub.GetPlan(pb.GetPlanRequest(), timeout=10)  # the connection is up
        proxy.stall()  # from now on nothing gets through, and nothing is closed
        t0 = time.monotonic()
        tu = threading.Thread(target=unary, daemon=True)
        tu.start()
        assert done.wait(timeout=20), "the dead connection was not noticed within 20 s"
        tu.join(timeout=20)
        assert result["stream"][1] == grpc.StatusCode.UNAVAILABLE
        assert result["unary"][1] == grpc.StatusCode.UNAVAILABLE and result["unary"][0] < 20
    finally:
        idle.stop.set()
        proxy.close()
        ch.close()
        srv.stop(0)
