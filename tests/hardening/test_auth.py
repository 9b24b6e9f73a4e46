"""Authentication under attack: expired certificates, and Join requests replayed or carried over from another
session.  (Certificates from another CA, a certificate for another site and identity keys that do not match
the roster are covered in tests/federation/test_service.py and test_processes.py.)"""
from __future__ import annotations

import datetime as dt
import os
import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsbdt.cli import main
from fedsbdt.common.config import Hyperparameters
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.server.checkpoint import CoordinatorStore
from fedsbdt.common.federation.pki import TlsFiles, ca_server, channel_credentials, load_cert, load_key, server_credentials, tls_probe
from fedsbdt.server.service import CoordinatorServer
from fedsbdt.server.session import Session
from fedsbdt.common.federation.wire import GRPC_OPTIONS, sign_join

from federation.conftest import abalone_with_ids, make_identities, make_test_plan

SITES = ["site-a", "site-b", "site-c"]


def issue_expired(ca_dir, public_key, cn: str, out, server: bool = False) -> None:
    """A certificate from the consortium CA whose validity ended yesterday."""
    ca_cert, ca_key = load_cert(ca_dir / "ca.crt"), load_key(ca_dir / "ca.key")
    now = dt.datetime.now(dt.timezone.utc)
    san = [x509.DNSName("localhost"), x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))] if server \
        else [x509.DNSName(cn)]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_cert.subject).public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=3)).not_valid_after(now - dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                  else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.fixture
def pki(tmp_path, ca_dir):
    ids = make_identities(tmp_path, SITES, ca_dir)
    ca_server(ca_dir, tmp_path / "coordinator", ["localhost", "127.0.0.1"], days=2)
    schema, _ = abalone_with_ids(60)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=3, depth=2, seed=1), randomness="insecure-test")
    plan.save(tmp_path / "plan.toml")
    return plan, ids


def serve(plan, root, credentials=None, store: bool = False) -> CoordinatorServer:
    cp = CoordinatorStore(root / "coordinator", plan.sha256) if store else None
    session = Session(plan, plan.make_randomness(True), time.monotonic(), cp)
    if credentials is None:
        credentials = server_credentials(TlsFiles.in_dir(root / "coordinator"))
    server = CoordinatorServer(session, "127.0.0.1:0", credentials)
    server.start()
    return server


def test_an_expired_site_certificate_is_refused_by_the_client_and_by_the_coordinator(tmp_path, ca_dir, pki,
                                                                                     capsys):
    plan, ids = pki
    site = tmp_path / "site-a"
    key = load_key(site / "tls.key")
    issue_expired(ca_dir, key.public_key(), "site-a", tmp_path / "expired.crt")
    server = serve(plan, tmp_path)
    try:
        # fedsbdt client refuses to start with it, naming the file and the date (nothing is sent)
        rc = main(["client", "--coordinator", f"localhost:{server.port}", "--site", "site-a", "--data",
                   str(tmp_path / "none.csv"), "--state", str(site), "--tls-cert", str(tmp_path / "expired.crt"),
                   "--plan-hash", plan.sha256])
        err = capsys.readouterr().err
        assert rc == 2 and "expired.crt" in err and "expired on" in err and "Traceback" not in err, err
        # a client that does not check (another implementation) is refused by the coordinator's TLS,
        # and the diagnosis says why
        files = TlsFiles(tmp_path / "expired.crt", site / "tls.key", site / "ca.crt")
        cert, k, ca = (files.cert.read_bytes(), files.key.read_bytes(), files.ca.read_bytes())
        ch = grpc.secure_channel(f"localhost:{server.port}", grpc.ssl_channel_credentials(ca, k, cert),
                                 options=list(GRPC_OPTIONS))
        with pytest.raises(grpc.RpcError) as e:
            pbg.FederationStub(ch).GetPlan(pb.GetPlanRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        ch.close()
        diagnosis = tls_probe(f"localhost:{server.port}", files)
        assert diagnosis is not None and "rejected this site" in diagnosis and "expired on" in diagnosis, diagnosis
        assert all(s.joins == 0 for s in server.session.sites.values())
    finally:
        server.stop(grace=0.5)


def test_an_expired_coordinator_certificate_is_refused_by_the_coordinator_and_by_sites(tmp_path, ca_dir, pki,
                                                                                      capsys):
    plan, ids = pki
    coord = tmp_path / "coordinator"
    issue_expired(ca_dir, load_key(coord / "tls.key").public_key(), "coordinator", coord / "tls.crt", server=True)
    rc = main(["coordinator", "--plan", str(tmp_path / "plan.toml"), "--listen", "127.0.0.1:0", "--state",
               str(coord), "--allow-insecure-test-randomness"])
    err = capsys.readouterr().err
    assert rc == 2 and "expired on" in err and "tls.crt" in err, err
    # served anyway (another implementation): the sites' TLS refuses it, and the diagnosis says why
    creds = grpc.ssl_server_credentials([((coord / "tls.key").read_bytes(), (coord / "tls.crt").read_bytes())],
                                        root_certificates=(coord / "ca.crt").read_bytes(), require_client_auth=True)
    server = serve(plan, tmp_path, credentials=creds)
    try:
        files = TlsFiles.in_dir(tmp_path / "site-a")
        ch = grpc.secure_channel(f"localhost:{server.port}", channel_credentials(files), options=list(GRPC_OPTIONS))
        with pytest.raises(grpc.RpcError) as e:
            pbg.FederationStub(ch).GetPlan(pb.GetPlanRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        ch.close()
        diagnosis = tls_probe(f"localhost:{server.port}", files)
        assert diagnosis is not None and "not trusted" in diagnosis and "expired" in diagnosis, diagnosis
    finally:
        server.stop(grace=0.5)


def join_request(plan_sha: str, ids, site: str, nonce: bytes) -> pb.JoinRequest:
    return pb.JoinRequest(plan_sha256=plan_sha, site_id=site, nonce=nonce,
                          signature=sign_join(ids[site].key, plan_sha, site, nonce))


def test_a_replayed_join_is_refused_even_after_a_coordinator_restart(tmp_path, pki):
    """Regression: the Join's nonce was signed but never checked for freshness, so a captured Join could be
    replayed (with TLS only by the holder of the site's certificate; without TLS by anyone on the path) to
    take over the site's session token and event stream."""
    plan, ids = pki
    req = join_request(plan.sha256, ids, "site-a", os.urandom(32))
    files = TlsFiles.in_dir(tmp_path / "site-a")
    for incarnation in range(2):  # a coordinator restart keeps the used nonces (checkpoint)
        server = serve(plan, tmp_path, store=True)
        ch = grpc.secure_channel(f"localhost:{server.port}", channel_credentials(files), options=list(GRPC_OPTIONS))
        stub = pbg.FederationStub(ch)
        try:
            if incarnation == 0:
                assert stub.Join(req, timeout=10).token
            with pytest.raises(grpc.RpcError) as e:
                stub.Join(req, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "replayed" in e.value.details()
            # a fresh nonce is fine
            assert stub.Join(join_request(plan.sha256, ids, "site-a", os.urandom(32)), timeout=10).token
            assert server.fatal is None
        finally:
            ch.close()
            server.stop(grace=0.5)
            server.session.checkpoint.close()


def test_a_join_from_another_session_is_refused(tmp_path, pki):
    plan, ids = pki
    earlier = make_test_plan(plan.schema, ids, Hyperparameters(trees=3, depth=2, seed=2), randomness="insecure-test")
    assert earlier.sha256 != plan.sha256
    old = join_request(earlier.sha256, ids, "site-a", os.urandom(32))  # captured in an earlier session
    server = serve(plan, tmp_path)
    files = TlsFiles.in_dir(tmp_path / "site-a")
    ch = grpc.secure_channel(f"localhost:{server.port}", channel_credentials(files), options=list(GRPC_OPTIONS))
    stub = pbg.FederationStub(ch)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.Join(old, timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "plan hash mismatch" in e.value.details()
        relabelled = pb.JoinRequest(plan_sha256=plan.sha256, site_id="site-a", nonce=old.nonce,
                                    signature=old.signature)  # the old signature does not cover this plan
        with pytest.raises(grpc.RpcError) as e:
            stub.Join(relabelled, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "identity key" in e.value.details()
        assert all(s.joins == 0 for s in server.session.sites.values())
    finally:
        ch.close()
        server.stop(grace=0.5)
