"""Cryptographic primitives of the secure-aggregation protocol (pure functions).

Everything is built from the ``cryptography`` package:

* X25519 key agreement (RFC 7748) for pairwise mask secrets and for the keys
  that encrypt Shamir shares;
* Ed25519 signatures (RFC 8032) with the sites' pinned identity keys;
* HKDF-SHA256 (RFC 5869) for every derived key;
* AES-256-GCM for share encryption;
* AES-256-CTR with an all-zero initial counter block as the mask PRG: the
  keystream over ``8·d`` zero bytes, read as ``d`` little-endian ``uint64``.
  Every PRG key is derived for exactly one (session, epoch, round, party or
  pair, length), so a zero nonce never repeats under one key.

Every derivation binds the *session digest* (SHA-256 of the canonical,
length-prefixed roster; see :func:`fedsbdt.common.secagg.config.session_digest`) and a
distinct domain label, so no key, signature or commitment from one context can
be replayed in another.  All functions are side-effect free except that
:func:`x25519_generate` consumes randomness from the ``randbytes`` callable it
is given.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import InvalidMessage

#: A source of cryptographically secure random bytes (``os.urandom`` in production).
RandBytes = Callable[[int], bytes]

KEY_SIZE = 32  # X25519 keys, AES-256 keys, seeds, digests
SIGNATURE_SIZE = 64
NONCE_SIZE = 12
TAG_SIZE = 16

_PROTO = b"fedsbdt/secagg/v1/"

# Domain labels; one per use.  Changing any of these changes every transcript.
LABEL_SESSION = b"session"
LABEL_EPOCH = b"epoch"
LABEL_SELF_MASK = b"self-mask"
LABEL_PAIR_MASK = b"pair-mask"
LABEL_SHARE_KEY = b"share-key"
LABEL_SHARE_AD = b"share-ad"
LABEL_SEED_COMMIT = b"seed-commit"
LABEL_SHARE_COMMIT = b"share-commit"
LABEL_ROW_DIGEST = b"row-digest"
LABEL_SIG_ADVERTISE = b"sig-advertise"
LABEL_SIG_COMMITMENTS = b"sig-commitments"
LABEL_SIG_CONSISTENCY = b"sig-consistency"

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def lp(b: bytes) -> bytes:
    """Length-prefixed bytes: ``u32(len(b)) ‖ b``."""
    return _U32.pack(len(b)) + b


def label(name: bytes) -> bytes:
    """The length-prefixed domain label ``fedsbdt/secagg/v1/<name>``."""
    return lp(_PROTO + name)


def u32(v: int) -> bytes:
    return _U32.pack(v)


def u64(v: int) -> bytes:
    return _U64.pack(v)


def sha256(*parts: bytes) -> bytes:
    """SHA-256 over the concatenation of ``parts`` (callers length-prefix variable parts)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


# --------------------------------------------------------------------------- KDF / PRG

def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = KEY_SIZE) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``ikm`` with ``salt`` and ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


_ZERO_COUNTER = bytes(16)


def prg_expand(key: bytes, length: int) -> np.ndarray:
    """Expand a 32-byte key into ``length`` ring elements (``uint64``).

    AES-256-CTR with an all-zero initial counter block over ``8·length`` zero
    bytes, read as little-endian ``uint64``.  Deterministic; callers must never
    use one key for two different purposes (every key here is derived for a
    single round and party/pair).
    """
    if len(key) != KEY_SIZE:
        raise ValueError(f"PRG key must be {KEY_SIZE} bytes, got {len(key)}")
    if length < 0:
        raise ValueError("PRG length must be non-negative")
    enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_COUNTER)).encryptor()
    stream = enc.update(bytes(8 * length)) + enc.finalize()
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64, copy=False)


def self_mask_key(seed: bytes, session_digest: bytes, epoch: int, round_id: int, site: str, length: int) -> bytes:
    """PRG key of site ``site``'s self mask ``PRG(b_{u,r})`` for one round and vector length."""
    info = label(LABEL_SELF_MASK) + u64(epoch) + u64(round_id) + lp(site.encode()) + u32(length)
    return hkdf_sha256(seed, session_digest, info)


def pair_mask_key(shared: bytes, session_digest: bytes, epoch: int, round_id: int, a: str, b: str, length: int) -> bytes:
    """PRG key of the pairwise mask between sites ``a`` and ``b`` (order-independent) for one round."""
    lo, hi = (a, b) if a < b else (b, a)
    info = (
        label(LABEL_PAIR_MASK) + u64(epoch) + u64(round_id) + lp(lo.encode()) + lp(hi.encode()) + u32(length)
    )
    return hkdf_sha256(shared, session_digest, info)


def pair_mask_sign(own: str, peer: str) -> int:
    """+1 if ``own`` sorts before ``peer`` (adds the pair mask), −1 otherwise (subtracts it)."""
    if own == peer:
        raise ValueError("a site has no pairwise mask with itself")
    return 1 if own < peer else -1


# --------------------------------------------------------------------------- X25519

def x25519_generate(randbytes: RandBytes) -> tuple[bytes, bytes]:
    """A fresh X25519 key pair ``(private_raw, public_raw)`` from 32 random bytes."""
    sk = randbytes(KEY_SIZE)
    if len(sk) != KEY_SIZE:
        raise ValueError("randbytes returned the wrong number of bytes")
    return sk, x25519_public(sk)


def x25519_public(private_raw: bytes) -> bytes:
    """The X25519 public key of a raw 32-byte private key."""
    return X25519PrivateKey.from_private_bytes(private_raw).public_key().public_bytes_raw()


def x25519_agree(private_raw: bytes, peer_public_raw: bytes) -> bytes:
    """X25519 shared secret; a low-order or malformed peer key raises :class:`InvalidMessage`."""
    return x25519_agree_many(private_raw, [peer_public_raw])[0]


def x25519_agree_many(private_raw: bytes, peer_public_raws: "list[bytes] | tuple[bytes, ...]") -> list[bytes]:
    """X25519 shared secrets of one private key with several peers (the key is loaded once)."""
    try:
        sk = X25519PrivateKey.from_private_bytes(private_raw)
        return [sk.exchange(X25519PublicKey.from_public_bytes(pk)) for pk in peer_public_raws]
    except ValueError as exc:
        raise InvalidMessage(f"X25519 key agreement failed (invalid or low-order public key): {exc}") from None


# --------------------------------------------------------------------------- Ed25519

def ed25519_public(private_key: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte public key of an Ed25519 private key."""
    return private_key.public_key().public_bytes_raw()


def ed25519_sign(private_key: Ed25519PrivateKey, domain: bytes, message: bytes) -> bytes:
    """Ed25519 signature over ``label(domain) ‖ message``."""
    return private_key.sign(label(domain) + message)


def ed25519_verify(public_key: Ed25519PublicKey, domain: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``label(domain) ‖ message``."""
    if len(signature) != SIGNATURE_SIZE:
        return False
    try:
        public_key.verify(signature, label(domain) + message)
        return True
    except InvalidSignature:
        return False


# --------------------------------------------------------------------------- share encryption

def share_encryption_key(
    shared: bytes, session_digest: bytes, epoch: int, epoch_digest: bytes, sender: str, recipient: str
) -> bytes:
    """Directional AEAD key for the share blob ``sender → recipient`` of one epoch."""
    info = (
        label(LABEL_SHARE_KEY) + u64(epoch) + epoch_digest + lp(sender.encode()) + lp(recipient.encode())
    )
    return hkdf_sha256(shared, session_digest, info)


def share_associated_data(
    session_digest: bytes, epoch: int, epoch_digest: bytes, sender: str, recipient: str
) -> bytes:
    """AEAD associated data for the share blob ``sender → recipient``."""
    return (
        label(LABEL_SHARE_AD) + session_digest + u64(epoch) + epoch_digest + lp(sender.encode()) + lp(recipient.encode())
    )


def aead_encrypt(key: bytes, nonce: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """AES-256-GCM encryption; returns ``ciphertext ‖ tag``."""
    return AESGCM(key).encrypt(nonce, plaintext, associated_data)


def aead_decrypt(key: bytes, nonce: bytes, ciphertext: bytes, associated_data: bytes) -> bytes:
    """AES-256-GCM decryption; a failed tag raises :class:`InvalidMessage`."""
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, associated_data)
    except InvalidTag:
        raise InvalidMessage("encrypted shares failed authentication (tampered, re-addressed or wrong session)") from None


# --------------------------------------------------------------------------- commitments

def commit_self_mask_seed(seed: bytes, session_digest: bytes, epoch: int, slot: int, dealer: str) -> bytes:
    """Binding, hiding commitment to a 32-byte self-mask seed ``b_{u,r}``."""
    return sha256(label(LABEL_SEED_COMMIT), session_digest, u64(epoch), u32(slot), lp(dealer.encode()), seed)


def commit_share(
    share: bytes, session_digest: bytes, epoch: int, slot: int, kind: int, dealer: str, holder: str
) -> bytes:
    """Commitment to one encoded Shamir share (``kind`` 0: self-mask seed, 1: mask key)."""
    return sha256(
        label(LABEL_SHARE_COMMIT), session_digest, u64(epoch), u32(slot), bytes((kind,)),
        lp(dealer.encode()), lp(holder.encode()), share,
    )


def row_digest(commitments: bytes) -> bytes:
    """Digest of one holder's row of share commitments (what the dealer signs)."""
    return sha256(label(LABEL_ROW_DIGEST), commitments)
