"""The Connect stream (Subscribe + Submit* + Report on one bidirectional stream) over real mutual TLS."""
from __future__ import annotations

import os
import queue
import threading
import time

import grpc
import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.federation.pki import TlsFiles, ca_server, server_credentials
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.server.service import CoordinatorServer
from fedsbdt.server.session import Session

from .conftest import abalone_with_ids, make_identities, make_test_plan
from .test_service import SITES, code_of, join_req, served, stub_for  # noqa: F401, F811  (served: the module fixture)


def connect(stub, first, timeout=20):
    """Open a Connect stream whose first message is ``first``; returns (outgoing queue, response iterator)."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    q.put(first)

    def requests():
        while True:
            m = q.get()
            if m is None:
                return
            yield m

    return q, stub.Connect(requests(), timeout=timeout)


def subscribe(site, token, after=0):
    return pb.SiteMessage(subscribe=pb.SubscribeRequest(site_id=site, token=token, after_seq=after))


def test_connect_checks_identity_and_order_like_the_unary_calls(served):
    plan, ids, server, root = served
    stub, ch = stub_for(served, "site-b")
    token = stub.Join(join_req(plan, ids, "site-b"), timeout=10).token
    # the first message must subscribe
    q, resp = connect(stub, pb.SiteMessage(setup=pb.SecAggSubmission(site_id="site-b", token=token)))
    code, msg = code_of(lambda: next(resp))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "subscribe" in msg
    q.put(None)
    # a forged token, and site-b's certificate speaking for site-c
    q, resp = connect(stub, subscribe("site-b", b"forged"))
    assert code_of(lambda: next(resp))[0] == grpc.StatusCode.UNAUTHENTICATED
    q.put(None)
    q, resp = connect(stub, subscribe("site-c", token))
    assert code_of(lambda: next(resp))[0] == grpc.StatusCode.PERMISSION_DENIED
    q.put(None)
    # on a valid stream, a message for another site or with another token ends the stream
    for bad, want in ((pb.SecAggSubmission(site_id="site-c", token=token), grpc.StatusCode.PERMISSION_DENIED),
                      (pb.SecAggSubmission(site_id="site-b", token=b"other"), grpc.StatusCode.UNAUTHENTICATED)):
        q, resp = connect(stub, subscribe("site-b", token))
        q.put(pb.SiteMessage(round=bad))
        with pytest.raises(grpc.RpcError) as e:
            for _ in resp:
                pass
        assert e.value.code() == want
        q.put(None)
    # a second subscribe on the stream is a protocol error too
    q, resp = connect(stub, subscribe("site-b", token))
    q.put(subscribe("site-b", token))
    with pytest.raises(grpc.RpcError) as e:
        for _ in resp:
            pass
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    q.put(None)
    assert server.fatal is None
    ch.close()


def test_connect_counts_processed_messages_and_reports_refusals(served):
    """Garbage is refused one by one (the stream goes on); every batch says how many site messages were
    processed, which is what a site's resend list is trimmed by."""
    plan, ids, server, root = served
    stub, ch = stub_for(served, "site-c")
    token = stub.Join(join_req(plan, ids, "site-c"), timeout=10).token
    q, resp = connect(stub, subscribe("site-c", token))
    garbage = [b"", b"garbage", os.urandom(3000), b"FSA\x01\x02" + os.urandom(100)]
    for data in garbage:
        q.put(pb.SiteMessage(setup=pb.SecAggSubmission(site_id="site-c", token=token, secagg=data)))
        q.put(pb.SiteMessage(round=pb.SecAggSubmission(site_id="site-c", token=token, secagg=data)))
        q.put(pb.SiteMessage(input=pb.MaskedInputSubmission(site_id="site-c", token=token, purpose=2, tree=0,
                                                            secagg=data)))
    q.put(pb.SiteMessage(input=pb.MaskedInputSubmission(site_id="site-c", token=token, purpose=77, secagg=b"x")))
    q.put(pb.SiteMessage(report=pb.ReportRequest(site_id="site-c", token=token, kind=99)))
    q.put(pb.SiteMessage(report=pb.ReportRequest(site_id="site-c", token=token, kind=pb.REPORT_PROGRESS)))
    sent = 3 * len(garbage) + 3
    rejected, processed = [], 0
    for batch in resp:
        rejected += list(batch.rejected)
        assert batch.processed >= processed  # monotone
        processed = batch.processed
        if processed == sent:
            break
    assert len(rejected) == sent - 1  # everything but the progress report
    assert any("purpose" in r for r in rejected) and any("report kind" in r for r in rejected)
    q.put(None)
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert st.trees_released == 0 and server.fatal is None
    ch.close()


def test_bytes_that_are_not_a_site_message_end_the_stream_with_invalid_argument(served):
    """Undecodable bytes, as the first message or after a valid subscribe, end the stream with
    INVALID_ARGUMENT from the service (not an error inside gRPC's deserializer), and nothing else changes."""
    plan, ids, server, root = served
    stub, ch = stub_for(served, "site-b")
    token = stub.Join(join_req(plan, ids, "site-b"), timeout=10).token
    raw = ch.stream_stream("/fedsbdt.v1.Federation/Connect", request_serializer=None, response_deserializer=None)
    garbage = b"\xff\xff\xff\xff"  # field 31, wire type 7: not protobuf
    for messages in ([garbage], [subscribe("site-b", token).SerializeToString(), garbage]):
        q: queue.SimpleQueue = queue.SimpleQueue()
        for m in messages:
            q.put(m)
        resp = raw(iter(q.get, None), timeout=20)
        with pytest.raises(grpc.RpcError) as e:
            for _ in resp:
                pass
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
        assert "deserialize" in e.value.details()
        q.put(None)
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert st.trees_released == 0 and server.fatal is None
    ch.close()


def test_the_bytes_sent_count_every_stream_write(tmp_path, ca_dir):
    """The coordinator's ``bytes_sent`` (its JSON result) is the sum of what its streams wrote.  When all sites
    subscribe, the epoch's announcement is written to every stream at once: each write is awaited while the
    others are in flight, so ``bytes_out += await write(…)`` read the counter before the await and kept one
    stream's bytes only."""
    ids = make_identities(tmp_path, SITES, ca_dir)
    schema, _ = abalone_with_ids(60)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=3, depth=2, seed=1), randomness="insecure-test",
                          test_noise=False)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    server = CoordinatorServer(Session(plan, plan.make_randomness(True), time.monotonic()), "127.0.0.1:0",
                               server_credentials(TlsFiles.in_dir(tmp_path / "coordinator")))
    server.start()
    here = (plan, ids, server, tmp_path)  # what stub_for reads
    received = {s: 0 for s in SITES}
    streams, readers = [], []
    try:
        for s in SITES:
            stub, ch = stub_for(here, s)
            token = stub.Join(join_req(plan, ids, s), timeout=10).token
            q, resp = connect(stub, subscribe(s, token))
            streams.append((q, ch))

            def read(s=s, resp=resp):
                for batch in resp:
                    received[s] += len(batch.SerializeToString())
                    if batch.events:
                        return  # the announcement: nothing more is sent before the sites answer it

            readers.append(threading.Thread(target=read, daemon=True))
            readers[-1].start()
        for r in readers:
            r.join(20)
        assert all(received.values()), received
        deadline = time.monotonic() + 60  # a site can read a message before the server's write call returns (slow under load)
        while server.service.bytes_out < sum(received.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.service.bytes_out == sum(received.values())
    finally:
        for q, ch in streams:
            q.put(None)
            ch.close()
        server.stop(grace=0.5)
