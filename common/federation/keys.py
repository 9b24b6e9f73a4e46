"""A site's keys: the Ed25519 identity key (pinned in the plan) and a TLS key with its certificate request.

``fedsbdt keygen --site ID --out DIR`` writes::

    identity.key   Ed25519 private key (PEM, PKCS#8, mode 0600) — signs secure-aggregation keys and joins
    identity.pub   its raw public key as 64 hex digits — goes into the plan's roster
    tls.key        EC P-256 private key (PEM, mode 0600) for mutual TLS
    tls.csr        certificate request, CN = subjectAltName = the site id, for the consortium CA

The CA returns ``tls.crt`` (and ``ca.crt``), e.g. with ``fedsbdt ca sign``.
Nothing is overwritten: a site's identity is pinned in plans.
"""
from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.common.federation.pki import TLS_CSR, TLS_KEY, PkiError, _read, make_csr, write_private, write_public

IDENTITY_KEY, IDENTITY_PUB = "identity.key", "identity.pub"


def keygen(site_id: str, out: Path) -> dict[str, str]:
    from fedsbdt.common.secagg.encoding import check_site_id
    from fedsbdt.common.secagg.errors import InvalidMessage

    try:
        check_site_id(site_id)
    except InvalidMessage as e:
        raise PkiError(str(e)) from None
    out = Path(out)
    for name in (IDENTITY_KEY, TLS_KEY):
        if (out / name).exists():
            raise PkiError(f"{out / name} exists; refusing to overwrite a key (its public part may be pinned "
                           "in a plan)")
    ident = Ed25519PrivateKey.generate()
    tls = ec.generate_private_key(ec.SECP256R1())
    pem = serialization.PrivateFormat.PKCS8
    write_private(out / IDENTITY_KEY, ident.private_bytes(serialization.Encoding.PEM, pem,
                                                          serialization.NoEncryption()))
    pub = ident.public_key().public_bytes_raw().hex()
    write_public(out / IDENTITY_PUB, (pub + "\n").encode())
    write_private(out / TLS_KEY, tls.private_bytes(serialization.Encoding.PEM, pem, serialization.NoEncryption()))
    write_public(out / TLS_CSR, make_csr(tls, site_id).public_bytes(serialization.Encoding.PEM))
    return {"site": site_id, "identity_pub": pub, "dir": str(out)}


def load_identity(path: Path) -> Ed25519PrivateKey:
    data = _read(Path(path), "identity key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise PkiError(f"{path}: not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PkiError(f"{path}: not an Ed25519 identity key")
    return key


def read_identity_pub(path: Path) -> bytes:
    text = _read(Path(path), "identity public key").decode("ascii", "replace").strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise PkiError(f"{path}: expected 64 hex digits (a raw Ed25519 public key written by `fedsbdt keygen`)")
    return raw
