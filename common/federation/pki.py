"""Consortium PKI for mutual TLS: a small CA, certificate signing, and gRPC credentials.

Every party holds a certificate issued by the consortium's CA.  A site's
certificate names the site (subject CN and a DNS subjectAltName equal to the
site id, extended key usage clientAuth); the coordinator's names its host
names (serverAuth).  The coordinator requires a client certificate from the
CA and checks that its CN equals the site id the caller claims.

This module is what ``fedsbdt ca init``, ``fedsbdt ca sign`` and ``fedsbdt ca
server`` run, and what ``fedsbdt demo`` uses to set up a throw-away CA.  A
real consortium may equally use OpenSSL (docs/deployment.md); fedsbdt only
needs PEM files.
"""
from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
TLS_CERT, TLS_KEY, TLS_CSR = "tls.crt", "tls.key", "tls.csr"


class PkiError(ValueError):
    """A key, certificate or request is missing, malformed, or does not fit."""


def write_private(path: Path, data: bytes) -> None:
    """Write a secret file with mode 0600 (atomic replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise PkiError(f"{what} not found: {path}") from None
    except OSError as e:
        raise PkiError(f"cannot read {what} {path}: {e}") from None


def load_cert(path: Path, what: str = "certificate") -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_read(path, what))
    except ValueError as e:
        raise PkiError(f"{path}: not a PEM certificate ({e})") from None


def load_key(path: Path, what: str = "private key"):
    try:
        return serialization.load_pem_private_key(_read(path, what), password=None)
    except (ValueError, TypeError) as e:
        raise PkiError(f"{path}: not an unencrypted PEM private key ({e})") from None


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def validity_problem(cert: x509.Certificate, now: dt.datetime | None = None) -> str | None:
    """"expired on …" / "is not valid before …" for a certificate outside its validity period, else None."""
    now = now or _now()
    if cert.not_valid_after_utc < now:
        return f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if cert.not_valid_before_utc > now:
        return f"is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    return None


def common_name(cert_or_csr) -> str:
    attrs = cert_or_csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not attrs:
        raise PkiError("the certificate (request) has no common name")
    return str(attrs[0].value)


# --------------------------------------------------------------------------- CA


def ca_init(directory: Path, name: str = "fedsbdt consortium CA", days: int = 3650) -> Path:
    """Create ``ca.key`` (0600) and the self-signed ``ca.crt`` in ``directory``; refuses to overwrite."""
    directory = Path(directory)
    if (directory / CA_KEY).exists():
        raise PkiError(f"{directory / CA_KEY} exists; refusing to overwrite a CA key")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    write_private(directory / CA_KEY, _pem_key(key))
    write_public(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM))
    return directory / CA_CERT


def _issue(ca_dir: Path, subject_cn: str, public_key, dns: list[str], ips: list[str], server: bool,
           days: int) -> x509.Certificate:
    ca_cert = load_cert(Path(ca_dir) / CA_CERT, "CA certificate")
    ca_key = load_key(Path(ca_dir) / CA_KEY, "CA private key")
    now = _now()
    san: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    for ip in ips:
        san.append(x509.IPAddress(ipaddress.ip_address(ip)))
    eku = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
               .issuer_name(ca_cert.subject).public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_csr(key, site_id: str) -> x509.CertificateSigningRequest:
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, site_id)]))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(site_id)]), critical=False)
            .sign(key, hashes.SHA256()))


def ca_sign(ca_dir: Path, csr_path: Path, out: Path, days: int = 825) -> Path:
    """Issue a site (client) certificate for a CSR made by ``fedsbdt keygen``; also copies ``ca.crt`` next to it."""
    from fedsbdt.common.secagg.encoding import check_site_id
    from fedsbdt.common.secagg.errors import InvalidMessage

    try:
        csr = x509.load_pem_x509_csr(_read(Path(csr_path), "certificate request"))
    except ValueError as e:
        raise PkiError(f"{csr_path}: not a PEM certificate request ({e})") from None
    if not csr.is_signature_valid:
        raise PkiError(f"{csr_path}: the request's signature is invalid")
    cn = common_name(csr)
    try:
        check_site_id(cn)
    except InvalidMessage as e:
        raise PkiError(f"{csr_path}: {e}") from None
    cert = _issue(Path(ca_dir), cn, csr.public_key(), [cn], [], server=False, days=days)
    out = Path(out)
    write_public(out, cert.public_bytes(serialization.Encoding.PEM))
    if (out.parent / CA_CERT).resolve() != (Path(ca_dir) / CA_CERT).resolve():
        shutil.copyfile(Path(ca_dir) / CA_CERT, out.parent / CA_CERT)
    return out


def ca_server(ca_dir: Path, out_dir: Path, hosts: list[str], days: int = 825) -> Path:
    """Key and server certificate for the coordinator (CN = first host; SAN = every host name / IP)."""
    if not hosts:
        raise PkiError("name at least one host name or IP address of the coordinator (--host)")
    dns, ips = [], []
    for h in hosts:
        try:
            ipaddress.ip_address(h)
            ips.append(h)
        except ValueError:
            dns.append(h)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(Path(ca_dir), hosts[0], key.public_key(), dns, ips, server=True, days=days)
    out_dir = Path(out_dir)
    write_private(out_dir / TLS_KEY, _pem_key(key))
    write_public(out_dir / TLS_CERT, cert.public_bytes(serialization.Encoding.PEM))
    if (out_dir / CA_CERT).resolve() != (Path(ca_dir) / CA_CERT).resolve():
        shutil.copyfile(Path(ca_dir) / CA_CERT, out_dir / CA_CERT)
    return out_dir / TLS_CERT


# --------------------------------------------------------------------------- gRPC credentials


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path

    @classmethod
    def in_dir(cls, directory: Path, cert: str | None = None, key: str | None = None,
               ca: str | None = None) -> "TlsFiles":
        d = Path(directory)
        return cls(Path(cert) if cert else d / TLS_CERT, Path(key) if key else d / TLS_KEY,
                   Path(ca) if ca else d / CA_CERT)

    def read(self) -> tuple[bytes, bytes, bytes]:
        """The PEM bytes of certificate, key and CA; refuses missing, malformed, expired or not yet valid files."""
        cert = _read(self.cert, "TLS certificate")
        key = _read(self.key, "TLS private key")
        ca = _read(self.ca, "CA certificate")
        for path, what in ((self.cert, "TLS certificate"), (self.ca, "CA certificate")):
            problem = validity_problem(load_cert(path, what))
            if problem is not None:
                raise PkiError(f"the {what} {path} {problem}; ask the consortium CA for a new one")
        load_key(self.key, "TLS private key")
        return cert, key, ca

    def certificate_name(self) -> str:
        return common_name(load_cert(self.cert, "TLS certificate"))


def add_tls_flags(p: argparse.ArgumentParser, default_dir: str) -> None:
    """The flags naming a party's :class:`TlsFiles` (``fedsbdt coordinator`` and ``fedsbdt client``)."""
    g = p.add_argument_group("transport security (mutual TLS with the consortium CA)")
    g.add_argument("--tls-dir", metavar="DIR",
                   help=f"folder holding tls.crt, tls.key and ca.crt (default: {default_dir}); e.g. the old "
                        "state directory when a new plan gets a new --state")
    g.add_argument("--tls-cert", metavar="FILE", help="this party's certificate (default: TLS_DIR/tls.crt)")
    g.add_argument("--tls-key", metavar="FILE", help="its private key (default: TLS_DIR/tls.key)")
    g.add_argument("--tls-ca", metavar="FILE", help="the consortium CA certificate (default: TLS_DIR/ca.crt)")
    g.add_argument("--insecure", action="store_true",
                   help="plain-text gRPC without TLS: only for local tests and demos, never across a network")


def server_credentials(files: TlsFiles):
    import grpc

    cert, key, ca = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(files: TlsFiles):
    import grpc

    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def _own_certificate_hint(files: TlsFiles) -> str:
    try:
        problem = validity_problem(load_cert(files.cert))
    except PkiError:
        problem = None
    return f"it {problem}" if problem else "it must be issued by the consortium CA"


def tls_probe(target: str, files: TlsFiles, timeout: float = 3.0) -> str | None:
    """Diagnose a failing mutual-TLS connection with a plain TLS handshake to ``target`` (host:port).

    gRPC reports a certificate the server rejects only as "Socket closed".  This
    handshake with the same files reads the peer's TLS alert and returns one
    sentence naming the problem, or ``None`` when the handshake is accepted or
    the server cannot be reached at all (then it is not a certificate problem).
    """
    import socket
    import ssl

    host, _, port = target.rpartition(":")
    host = host.strip("[]") or "localhost"
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(files.ca))
        ctx.load_cert_chain(str(files.cert), str(files.key))
        ctx.set_alpn_protocols(["h2"])
    except (ssl.SSLError, OSError, ValueError) as e:
        return f"this site's TLS files cannot be used ({e})"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                tls.settimeout(timeout)
                try:
                    # TLS 1.3: the server's verdict on our certificate arrives after the handshake; gRPC
                    # closes the connection (often without an alert) when it rejects the certificate.
                    data = tls.recv(1)
                except (socket.timeout, TimeoutError):
                    return None
                if data:
                    return None  # the server speaks HTTP/2: the certificate was accepted
                return (f"the coordinator closed the connection right after the TLS handshake: it rejected this "
                        f"site's certificate {files.cert} ({_own_certificate_hint(files)})")
    except ssl.SSLCertVerificationError as e:
        return (f"the coordinator's certificate is not trusted by --tls-ca {files.ca} ({e.verify_message}); "
                "is it the consortium CA certificate?")
    except ssl.SSLError as e:
        reason = (e.reason or str(e)).lower().replace("_", " ")
        if "unknown ca" in reason or "certificate" in reason or "bad" in reason:
            return (f"the coordinator rejected this site's TLS certificate {files.cert} ({reason}; "
                    f"{_own_certificate_hint(files)})")
        return f"the TLS handshake with the coordinator failed ({reason})"
    except (OSError, ValueError):
        return None
