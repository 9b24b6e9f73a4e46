"""The gRPC service over real mutual TLS (in-process server): identity checks and hostile input."""
from __future__ import annotations

import os
import time

import grpc
import pytest

from fedsbdt.common.config import Hyperparameters
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.common.federation.pki import TlsFiles, ca_init, ca_server, ca_sign, channel_credentials, server_credentials, tls_probe
from fedsbdt.server.service import CoordinatorServer
from fedsbdt.server.session import Session
from fedsbdt.common.federation.wire import GRPC_OPTIONS, sign_join

from .conftest import abalone_with_ids, make_identities, make_test_plan

SITES = ["site-a", "site-b", "site-c"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, ca_dir):
    root = tmp_path_factory.mktemp("svc")
    ids = make_identities(root, SITES + ["mallory"], ca_dir)
    schema, _ = abalone_with_ids(60)
    plan = make_test_plan(schema, {s: ids[s] for s in SITES}, Hyperparameters(trees=3, depth=2, seed=1),
                          randomness="insecure-test", test_noise=False)
    ca_server(ca_dir, root / "coordinator", ["localhost", "127.0.0.1"], days=2)
    session = Session(plan, plan.make_randomness(True), time.monotonic())
    server = CoordinatorServer(session, "127.0.0.1:0", server_credentials(TlsFiles.in_dir(root / "coordinator")))
    server.start()
    yield plan, ids, server, root
    server.stop(grace=0.5)


def stub_for(served, site: str):
    plan, ids, server, root = served
    ch = grpc.secure_channel(f"localhost:{server.port}", channel_credentials(TlsFiles.in_dir(root / site)),
                             options=list(GRPC_OPTIONS))
    return pbg.FederationStub(ch), ch


def join_req(plan, ids, site: str, as_site: str | None = None, plan_sha=None, key_of: str | None = None):
    nonce = os.urandom(32)
    claimed = as_site or site
    sig = sign_join(ids[key_of or site].key, plan_sha or plan.sha256, claimed, nonce)
    return pb.JoinRequest(plan_sha256=plan_sha or plan.sha256, site_id=claimed, nonce=nonce, signature=sig)


def code_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def test_join_checks_roster_certificate_identity_signature_and_plan(served):
    plan, ids, server, root = served
    stub, ch = stub_for(served, "mallory")
    code, msg = code_of(lambda: stub.Join(join_req(plan, ids, "mallory"), timeout=10))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not in the plan's roster" in msg
    stub_a, ch_a = stub_for(served, "site-a")
    # site-a's certificate claiming to be site-b (with site-b's identity key even): refused by the TLS check
    code, msg = code_of(lambda: stub_a.Join(join_req(plan, ids, "site-a", as_site="site-b", key_of="site-b"),
                                            timeout=10))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "issued to 'site-a'" in msg
    # right certificate, join signed with another key than the one the plan pins
    code, msg = code_of(lambda: stub_a.Join(join_req(plan, ids, "site-a", key_of="site-b"), timeout=10))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "identity key" in msg
    code, msg = code_of(lambda: stub_a.Join(join_req(plan, ids, "site-a", plan_sha="0" * 64), timeout=10))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "plan hash mismatch" in msg
    st = stub_a.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert st.trees_released == 0 and all(not s.connected for s in st.sites)
    ch.close()
    ch_a.close()


def test_hostile_calls_are_refused_and_the_coordinator_keeps_serving(served):
    plan, ids, server, root = served
    stub, ch = stub_for(served, "site-a")
    token = stub.Join(join_req(plan, ids, "site-a"), timeout=10).token
    for data in (b"", b"garbage", os.urandom(3000), b"FSA\x01\x02" + os.urandom(100)):
        r = stub.SubmitSetup(pb.SecAggSubmission(site_id="site-a", token=token, secagg=data), timeout=10)
        assert not r.accepted and r.detail
        r = stub.SubmitMaskedInput(pb.MaskedInputSubmission(site_id="site-a", token=token, purpose=2, tree=0,
                                                            secagg=data), timeout=10)
        assert not r.accepted
        r = stub.SubmitRound(pb.SecAggSubmission(site_id="site-a", token=token, secagg=data), timeout=10)
        assert not r.accepted
    r = stub.SubmitMaskedInput(pb.MaskedInputSubmission(site_id="site-a", token=token, purpose=77, secagg=b"x"),
                               timeout=10)
    assert not r.accepted and "purpose" in r.detail
    code, _ = code_of(lambda: stub.SubmitRound(pb.SecAggSubmission(site_id="site-a", token=b"forged", secagg=b""),
                                               timeout=10))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = code_of(lambda: next(stub.Subscribe(pb.SubscribeRequest(site_id="site-a", token=b"x"), timeout=10)))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    code, _ = code_of(lambda: stub.Report(pb.ReportRequest(site_id="site-a", token=token, kind=99), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = code_of(lambda: stub.Report(pb.ReportRequest(site_id="site-b", token=token, kind=1), timeout=10))
    assert code == grpc.StatusCode.PERMISSION_DENIED  # site-a's certificate speaking for site-b
    # still serving, nothing released, no internal error
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert st.stage == "gathering" and st.trees_released == 0
    assert stub.GetTrees(pb.GetTreesRequest(from_index=0), timeout=10).trees_released == 0
    assert server.fatal is None
    ch.close()


def test_a_certificate_from_another_ca_is_refused_with_a_clear_diagnosis(served, tmp_path):
    plan, ids, server, root = served
    other = tmp_path / "other-ca"
    ca_init(other, days=2)
    d = tmp_path / "site-a"
    d.mkdir()
    (d / "tls.key").write_bytes((root / "site-a" / "tls.key").read_bytes())
    ca_sign(other, root / "site-a" / "tls.csr", d / "tls.crt", days=2)
    (d / "ca.crt").write_bytes((root / "site-a" / "ca.crt").read_bytes())  # trusts the real coordinator
    files = TlsFiles.in_dir(d)
    ch = grpc.secure_channel(f"localhost:{server.port}", channel_credentials(files))
    code, _ = code_of(lambda: pbg.FederationStub(ch).GetPlan(pb.GetPlanRequest(), timeout=10))
    assert code == grpc.StatusCode.UNAVAILABLE
    ch.close()
    diagnosis = tls_probe(f"localhost:{server.port}", files)
    assert diagnosis is not None and "rejected this site's certificate" in diagnosis
    assert tls_probe(f"localhost:{server.port}", TlsFiles.in_dir(root / "site-b")) is None  # a good one passes
    # a site that does not trust the coordinator's certificate
    (d / "ca.crt").write_bytes((other / "ca.crt").read_bytes())
    assert "not trusted" in tls_probe(f"localhost:{server.port}", TlsFiles.in_dir(d))
