"""Protocol messages: typed, immutable dataclasses with a canonical binary encoding.

Every message has ``to_bytes()`` and ``Class.from_bytes(data)``; the
encoding is deterministic (see ``encoding.py``) and starts with a 5-byte
header ``b"FSA" ‖ version ‖ type-tag``, so :func:`decode_message` can turn
any opaque ``bytes`` field carried by a transport back into the right type.
Construction validates *structure* (sizes, counts, id syntax, sort order,
duplicates) and raises :class:`~fedsbdt.common.secagg.errors.InvalidMessage`;
*semantic* checks (membership, signatures, stage, replay) belong to the state
machines in ``site.py`` and ``coordinator.py``.  Two messages are equal iff
their encodings are equal.

Message flow (C = coordinator, S = site); one epoch prepares ``E`` rounds::

    C→S  EpochAnnounce        epoch id, first round id, E
    S→C  AdvertiseKeys        signed: encryption key c_u and E mask keys
    C→S  EpochRoster          all adverts received (A1)
    S→C  ShareKeys            signed commitments, commitment rows, one AEAD blob per recipient
    C→S  EpochShares          per recipient: each dealer's signed commitments + its blob (A2)
    --- per round r (slot r − first_round of its epoch) ---
    C→S  RoundStart           round id, vector length d, participant set P_r
    S→C  MaskedInput          y_u = x_u + PRG(b_u) + Σ ±PRG(s_uv)
    C→S  ConsistencyRequest   survivor set U3
    S→C  ConsistencySignature signed (session, epoch, round, d, P_r, U3)
    C→S  UnmaskRequest        U3, dropped = P_r \\ U3, ≥ t signatures on U3
    S→C  UnmaskResponse       shares of b_v for v ∈ U3, of mask keys of v ∈ dropped
    --- or, a fast round (nobody may drop; docs/secagg.md §6 "Fast rounds") ---
    C→S  FastRoundStart       a RoundStart marked fast (its own type tag)
    S→C  FastMaskedInput      y_u and the sender's shares of b_v for every v ∈ P_r
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import ClassVar

import numpy as np

from .encoding import (
    MAX_EPOCH_ROUNDS,
    MAX_ID,
    MAX_SITES,
    MAX_VECTOR_LEN,
    Reader,
    Writer,
    check_bytes,
    check_int,
    check_site_id,
    check_sorted_ids,
)
from .errors import InvalidMessage
from .primitives import (
    KEY_SIZE,
    LABEL_EPOCH,
    LABEL_SIG_ADVERTISE,
    LABEL_SIG_COMMITMENTS,
    LABEL_SIG_CONSISTENCY,
    NONCE_SIZE,
    SIGNATURE_SIZE,
    TAG_SIZE,
    label,
    sha256,
)
from .shamir import PRIME, SHARE_SIZE

MAGIC = b"FSA"
VERSION = 1
#: Share kinds inside a commitment row / an unmask response.
KIND_SEED = 0  # share of the self-mask seed b_{u,r}
KIND_KEY = 1  # share of the round's X25519 mask private key
#: Upper bound on one AEAD share blob (header + 2·E shares + tag).
_MAX_BLOB = 256 + 2 * MAX_EPOCH_ROUNDS * SHARE_SIZE + TAG_SIZE

_REGISTRY: dict[int, type["Message"]] = {}


def _sorted_unique(items: tuple, key, what: str) -> tuple:
    keys = [key(i) for i in items]
    check_sorted_ids(keys, what)
    return items


class Message:
    """Base class: framing, (de)serialisation and equality by canonical encoding."""

    TAG: ClassVar[int] = 0

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "TAG" in cls.__dict__ and cls.TAG:  # a class that names its own tag (not a form of its parent's)
            if cls.TAG in _REGISTRY:
                raise TypeError(f"duplicate message tag {cls.TAG}")
            _REGISTRY[cls.TAG] = cls

    # subclasses implement
    def _write(self, w: Writer) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _read(cls, r: Reader) -> "Message":  # pragma: no cover - abstract
        raise NotImplementedError

    def to_bytes(self) -> bytes:
        """Canonical encoding ``b"FSA" ‖ version ‖ tag ‖ body``."""
        w = Writer().raw(MAGIC).u8(VERSION).u8(self.TAG)
        self._write(w)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Message":
        """Decode and structurally validate; raises :class:`InvalidMessage` on any defect."""
        msg = decode_message(data)
        if not isinstance(msg, cls):
            raise InvalidMessage(f"expected a {cls.__name__} message, got {type(msg).__name__}")
        return msg

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()  # the tag leads the encoding: kinds never compare equal

    def __hash__(self) -> int:
        return hash(self.to_bytes())


def decode_message(data: bytes) -> Message:
    """Decode any protocol message from its canonical encoding."""
    r = Reader(data, "secagg message")
    if r.raw(3, "magic") != MAGIC:
        raise InvalidMessage("not a secure-aggregation message (bad magic bytes)")
    version = r.u8("version")
    if version != VERSION:
        raise InvalidMessage(f"unsupported secure-aggregation message version {version} (expected {VERSION})")
    tag = r.u8("message type")
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise InvalidMessage(f"unknown secure-aggregation message type {tag}")
    r2 = Reader(data[5:], cls.__name__)
    msg = cls._read(r2)
    r2.done()
    return msg


def _digest(v: bytes, what: str) -> bytes:
    return check_bytes(v, KEY_SIZE, what)


def _id(v: int, what: str) -> int:
    return check_int(v, 0, MAX_ID, what)


# =========================================================================== epoch setup

@dataclass(frozen=True, eq=False)
class EpochAnnounce(Message):
    """C→S: open epoch ``epoch`` covering round ids ``first_round … first_round + num_rounds − 1``."""

    TAG: ClassVar[int] = 1
    session_digest: bytes
    epoch: int
    first_round: int
    num_rounds: int

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.first_round, "first round id")
        check_int(self.num_rounds, 1, MAX_EPOCH_ROUNDS, "rounds per epoch")
        _id(self.first_round + self.num_rounds - 1, "last round id")

    @property
    def last_round(self) -> int:
        return self.first_round + self.num_rounds - 1

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.first_round).u32(self.num_rounds)

    @classmethod
    def _read(cls, r: Reader) -> "EpochAnnounce":
        return cls(r.raw(KEY_SIZE, "session digest"), r.u64("epoch"), r.u64("first round"), r.u32("num rounds"))


@dataclass(frozen=True, eq=False)
class AdvertiseKeys(Message):
    """S→C: a site's fresh X25519 encryption key and one X25519 mask key per round slot, signed."""

    TAG: ClassVar[int] = 2
    session_digest: bytes
    epoch: int
    first_round: int
    sender: str
    encryption_key: bytes
    mask_keys: tuple[bytes, ...]
    signature: bytes

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.first_round, "first round id")
        check_site_id(self.sender, "sender")
        check_bytes(self.encryption_key, KEY_SIZE, "encryption public key")
        object.__setattr__(self, "mask_keys", tuple(self.mask_keys))
        check_int(len(self.mask_keys), 1, MAX_EPOCH_ROUNDS, "number of mask keys")
        for k in self.mask_keys:
            check_bytes(k, KEY_SIZE, "mask public key")
        if len(set(self.mask_keys) | {self.encryption_key}) != len(self.mask_keys) + 1:
            raise InvalidMessage(f"advertisement of {self.sender!r} contains duplicate public keys")
        check_bytes(self.signature, SIGNATURE_SIZE, "signature")

    @property
    def num_rounds(self) -> int:
        return len(self.mask_keys)

    def _body(self, w: Writer) -> Writer:
        w.raw(self.session_digest).u64(self.epoch).u64(self.first_round).text(self.sender)
        w.raw(self.encryption_key).u32(len(self.mask_keys))
        for k in self.mask_keys:
            w.raw(k)
        return w

    def signing_bytes(self) -> bytes:
        """What the sender signs (domain ``sig-advertise``): every field except the signature."""
        return self._body(Writer()).getvalue()

    SIGN_DOMAIN: ClassVar[bytes] = LABEL_SIG_ADVERTISE

    def _write(self, w: Writer) -> None:
        self._body(w).raw(self.signature)

    @classmethod
    def _read(cls, r: Reader) -> "AdvertiseKeys":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch = r.u64("epoch")
        first = r.u64("first round")
        sender = r.site_id("sender")
        enc = r.raw(KEY_SIZE, "encryption key")
        n = r.count("mask keys", MAX_EPOCH_ROUNDS)
        keys = tuple(r.raw(KEY_SIZE, "mask key") for _ in range(n))
        return cls(digest, epoch, first, sender, enc, keys, r.raw(SIGNATURE_SIZE, "signature"))


@dataclass(frozen=True, eq=False)
class EpochRoster(Message):
    """C→S: the advertisements the coordinator accepted for this epoch (the set A1)."""

    TAG: ClassVar[int] = 3
    session_digest: bytes
    epoch: int
    adverts: tuple[AdvertiseKeys, ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        object.__setattr__(self, "adverts", tuple(self.adverts))
        _sorted_unique(self.adverts, lambda a: a.sender, "roster advertisements")
        for a in self.adverts:
            if not isinstance(a, AdvertiseKeys):
                raise InvalidMessage("roster entries must be AdvertiseKeys messages")
            if a.session_digest != self.session_digest or a.epoch != self.epoch:
                raise InvalidMessage(f"advertisement of {a.sender!r} is for another session or epoch")

    @property
    def senders(self) -> tuple[str, ...]:
        return tuple(a.sender for a in self.adverts)

    def epoch_digest(self) -> bytes:
        """Digest of the whole roster; bound into share encryption and all later signatures."""
        return sha256(label(LABEL_EPOCH), self.to_bytes())

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u32(len(self.adverts))
        for a in self.adverts:
            a._write(w)

    @classmethod
    def _read(cls, r: Reader) -> "EpochRoster":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch = r.u64("epoch")
        n = r.count("advertisements", MAX_SITES)
        return cls(digest, epoch, tuple(AdvertiseKeys._read(r) for _ in range(n)))


@dataclass(frozen=True, eq=False)
class SignedCommitments:
    """A dealer's signed commitments for one epoch (part of :class:`ShareKeys`).

    ``seed_commitments[j]`` commits to the self-mask seed b_{u,j} of slot j;
    ``row_digests`` maps each holder in A1 (the dealer included) to the digest
    of that holder's row of share commitments (see :class:`ShareRow`).  The
    dealer's X25519 mask public keys already commit to its mask private keys.
    """

    session_digest: bytes
    epoch: int
    dealer: str
    epoch_digest: bytes
    seed_commitments: tuple[bytes, ...]
    row_digests: tuple[tuple[str, bytes], ...]
    signature: bytes

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        check_site_id(self.dealer, "dealer")
        _digest(self.epoch_digest, "epoch digest")
        object.__setattr__(self, "seed_commitments", tuple(self.seed_commitments))
        check_int(len(self.seed_commitments), 1, MAX_EPOCH_ROUNDS, "number of seed commitments")
        for c in self.seed_commitments:
            _digest(c, "seed commitment")
        object.__setattr__(self, "row_digests", tuple((h, d) for h, d in self.row_digests))
        _sorted_unique(self.row_digests, lambda e: e[0], "row digests")
        for _, d in self.row_digests:
            _digest(d, "row digest")
        check_bytes(self.signature, SIGNATURE_SIZE, "signature")

    SIGN_DOMAIN: ClassVar[bytes] = LABEL_SIG_COMMITMENTS

    def _body(self, w: Writer) -> Writer:
        w.raw(self.session_digest).u64(self.epoch).text(self.dealer).raw(self.epoch_digest)
        w.u32(len(self.seed_commitments))
        for c in self.seed_commitments:
            w.raw(c)
        w.u32(len(self.row_digests))
        for h, d in self.row_digests:
            w.text(h).raw(d)
        return w

    # The encoding is computed once per object (it is frozen): the coordinator routes every dealer's
    # commitments to every holder, so EpochShares encoding would otherwise redo O(n) fields n² times per epoch.
    @cached_property
    def _signed_body(self) -> bytes:
        return self._body(Writer()).getvalue()

    @cached_property
    def _encoded(self) -> bytes:
        return self._signed_body + self.signature

    def signing_bytes(self) -> bytes:
        return self._signed_body

    def _write(self, w: Writer) -> None:
        w.raw(self._encoded)

    @classmethod
    def _read(cls, r: Reader) -> "SignedCommitments":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch = r.u64("epoch")
        dealer = r.site_id("dealer")
        edig = r.raw(KEY_SIZE, "epoch digest")
        n = r.count("seed commitments", MAX_EPOCH_ROUNDS)
        seeds = tuple(r.raw(KEY_SIZE, "seed commitment") for _ in range(n))
        m = r.count("row digests", MAX_SITES)
        rows = tuple((r.site_id("row holder"), r.raw(KEY_SIZE, "row digest")) for _ in range(m))
        return cls(digest, epoch, dealer, edig, seeds, rows, r.raw(SIGNATURE_SIZE, "signature"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SignedCommitments):
            return NotImplemented
        return self._encoded == other._encoded

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class ShareRow:
    """Commitments to the 2·E shares one holder received from one dealer.

    ``commitments`` is ``E · 2 · 32`` bytes, slot-major: for slot j the
    commitment to the seed share (kind 0) then to the mask-key share (kind 1).
    """

    holder: str
    commitments: bytes

    def __post_init__(self) -> None:
        check_site_id(self.holder, "row holder")
        if not isinstance(self.commitments, bytes) or len(self.commitments) % (2 * KEY_SIZE) or not self.commitments:
            raise InvalidMessage("a commitment row must be a non-empty multiple of 64 bytes")

    def commitment(self, slot: int, kind: int) -> bytes:
        off = (2 * slot + kind) * KEY_SIZE
        return self.commitments[off : off + KEY_SIZE]


@dataclass(frozen=True, eq=False)
class EncryptedShares:
    """One AEAD blob: all of a dealer's shares for one recipient for one epoch."""

    recipient: str
    nonce: bytes
    ciphertext: bytes

    def __post_init__(self) -> None:
        check_site_id(self.recipient, "recipient")
        check_bytes(self.nonce, NONCE_SIZE, "AEAD nonce")
        if not isinstance(self.ciphertext, bytes) or not TAG_SIZE < len(self.ciphertext) <= _MAX_BLOB:
            raise InvalidMessage("encrypted share blob has an impossible length")

    def _write(self, w: Writer) -> None:
        w.text(self.recipient).raw(self.nonce).var(self.ciphertext)

    @classmethod
    def _read(cls, r: Reader) -> "EncryptedShares":
        return cls(r.site_id("recipient"), r.raw(NONCE_SIZE, "nonce"), r.var("ciphertext", _MAX_BLOB))


@dataclass(frozen=True, eq=False)
class ShareKeys(Message):
    """S→C: signed commitments, commitment rows for every holder, one AEAD blob per other holder."""

    TAG: ClassVar[int] = 4
    session_digest: bytes
    epoch: int
    sender: str
    commitments: SignedCommitments
    rows: tuple[ShareRow, ...]
    encrypted: tuple[EncryptedShares, ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        check_site_id(self.sender, "sender")
        c = self.commitments
        if not isinstance(c, SignedCommitments):
            raise InvalidMessage("ShareKeys.commitments must be SignedCommitments")
        if c.dealer != self.sender or c.epoch != self.epoch or c.session_digest != self.session_digest:
            raise InvalidMessage("ShareKeys commitments belong to another sender, epoch or session")
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "encrypted", tuple(self.encrypted))
        _sorted_unique(self.rows, lambda x: x.holder, "commitment rows")
        _sorted_unique(self.encrypted, lambda x: x.recipient, "encrypted share blobs")
        e = len(c.seed_commitments)
        for row in self.rows:
            if len(row.commitments) != 2 * KEY_SIZE * e:
                raise InvalidMessage(f"commitment row for {row.holder!r} does not cover {e} round slots")

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).text(self.sender)
        self.commitments._write(w)
        w.u32(len(self.rows))
        for row in self.rows:
            w.text(row.holder).var(row.commitments)
        w.u32(len(self.encrypted))
        for blob in self.encrypted:
            blob._write(w)

    @classmethod
    def _read(cls, r: Reader) -> "ShareKeys":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch = r.u64("epoch")
        sender = r.site_id("sender")
        comm = SignedCommitments._read(r)
        n = r.count("rows", MAX_SITES)
        rows = tuple(ShareRow(r.site_id("row holder"), r.var("row", 2 * KEY_SIZE * MAX_EPOCH_ROUNDS)) for _ in range(n))
        m = r.count("encrypted blobs", MAX_SITES)
        blobs = tuple(EncryptedShares._read(r) for _ in range(m))
        return cls(digest, epoch, sender, comm, rows, blobs)


@dataclass(frozen=True, eq=False)
class RoutedShares:
    """One dealer's entry in :class:`EpochShares`: its signed commitments and the blob for the recipient
    (``None`` when the recipient is the dealer itself)."""

    commitments: SignedCommitments
    encrypted: EncryptedShares | None

    @property
    def dealer(self) -> str:
        return self.commitments.dealer


@dataclass(frozen=True, eq=False)
class EpochShares(Message):
    """C→S: for one recipient, every dealer that completed ShareKeys (the set A2)."""

    TAG: ClassVar[int] = 5
    session_digest: bytes
    epoch: int
    recipient: str
    entries: tuple[RoutedShares, ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        check_site_id(self.recipient, "recipient")
        object.__setattr__(self, "entries", tuple(self.entries))
        _sorted_unique(self.entries, lambda e: e.dealer, "routed share entries")
        for e in self.entries:
            if e.commitments.session_digest != self.session_digest or e.commitments.epoch != self.epoch:
                raise InvalidMessage(f"commitments of {e.dealer!r} belong to another session or epoch")
            if (e.encrypted is None) != (e.dealer == self.recipient):
                raise InvalidMessage(
                    f"entry of dealer {e.dealer!r} must carry an encrypted blob exactly when the dealer is not the recipient"
                )
            if e.encrypted is not None and e.encrypted.recipient != self.recipient:
                raise InvalidMessage(f"blob from {e.dealer!r} is addressed to {e.encrypted.recipient!r}, not {self.recipient!r}")

    @property
    def dealers(self) -> tuple[str, ...]:
        return tuple(e.dealer for e in self.entries)

    def to_parts(self) -> tuple[bytes, ...]:
        """:meth:`to_bytes` as byte strings to concatenate, in which each dealer's signed commitments are its
        one encoding shared by every recipient's EpochShares and each blob's ciphertext is the dealer's
        ShareKeys' own bytes object: the n recipients' messages of an epoch then hold O(n) distinct commitment
        bytes and no copy of the blobs, instead of n copies of them all."""
        w = Writer().raw(MAGIC).u8(VERSION).u8(self.TAG)
        self._write(w)
        shared = {id(e.commitments._encoded) for e in self.entries}
        shared.update(id(e.encrypted.ciphertext) for e in self.entries if e.encrypted is not None)
        out: list[bytes] = []
        run: list[bytes] = []
        for part in w._parts:
            if id(part) in shared:
                if run:
                    out.append(b"".join(run))
                    run = []
                out.append(part)
            else:
                run.append(part)
        if run:
            out.append(b"".join(run))
        return tuple(out)

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).text(self.recipient).u32(len(self.entries))
        for e in self.entries:
            e.commitments._write(w)
            if e.encrypted is None:
                w.u8(0)
            else:
                w.u8(1)
                e.encrypted._write(w)

    @classmethod
    def _read(cls, r: Reader) -> "EpochShares":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch = r.u64("epoch")
        recipient = r.site_id("recipient")
        n = r.count("entries", MAX_SITES)
        entries = []
        for _ in range(n):
            comm = SignedCommitments._read(r)
            flag = r.u8("blob flag")
            if flag not in (0, 1):
                raise InvalidMessage("EpochShares: blob flag must be 0 or 1")
            entries.append(RoutedShares(comm, EncryptedShares._read(r) if flag else None))
        return cls(digest, epoch, recipient, tuple(entries))


# =========================================================================== rounds

@dataclass(frozen=True, eq=False)
class RoundStart(Message):
    """C→S: run round ``round_id`` (a slot of ``epoch``) over ``participants`` with vectors of ``vector_len``."""

    TAG: ClassVar[int] = 6
    #: True for :class:`FastRoundStart` (one exchange: inputs and seed shares together, nothing signed)
    fast: ClassVar[bool] = False
    session_digest: bytes
    epoch: int
    round_id: int
    vector_len: int
    participants: tuple[str, ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        check_int(self.vector_len, 1, MAX_VECTOR_LEN, "vector length")
        object.__setattr__(self, "participants", check_sorted_ids(self.participants, "participant set"))

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).u32(self.vector_len).ids(self.participants)

    @classmethod
    def _read(cls, r: Reader) -> "RoundStart":
        return cls(r.raw(KEY_SIZE, "session digest"), r.u64("epoch"), r.u64("round"), r.u32("vector length"), r.ids("participants"))


def _frozen_ring(m: object) -> np.ndarray:
    """A read-only copy of a masked vector after checking it is a 1-D uint64 vector of allowed length."""
    if not isinstance(m, np.ndarray) or m.dtype != np.uint64 or m.ndim != 1:
        raise InvalidMessage("masked input must be a 1-D numpy uint64 vector")
    check_int(m.shape[0], 1, MAX_VECTOR_LEN, "masked vector length")
    m = m.copy()
    m.setflags(write=False)
    return m


@dataclass(frozen=True, eq=False)
class MaskedInput(Message):
    """S→C: the masked vector ``y_u`` (ring elements, uint64)."""

    TAG: ClassVar[int] = 7
    session_digest: bytes
    epoch: int
    round_id: int
    sender: str
    masked: np.ndarray

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        check_site_id(self.sender, "sender")
        object.__setattr__(self, "masked", _frozen_ring(self.masked))

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).text(self.sender).ring(self.masked)

    @classmethod
    def _read(cls, r: Reader) -> "MaskedInput":
        return cls(r.raw(KEY_SIZE, "session digest"), r.u64("epoch"), r.u64("round"), r.site_id("sender"), r.ring("masked vector"))


@dataclass(frozen=True, eq=False)
class ConsistencyRequest(Message):
    """C→S: the survivor set U3 (sites whose masked input the coordinator holds)."""

    TAG: ClassVar[int] = 8
    session_digest: bytes
    epoch: int
    round_id: int
    survivors: tuple[str, ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        object.__setattr__(self, "survivors", check_sorted_ids(self.survivors, "survivor set"))

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).ids(self.survivors)

    @classmethod
    def _read(cls, r: Reader) -> "ConsistencyRequest":
        return cls(r.raw(KEY_SIZE, "session digest"), r.u64("epoch"), r.u64("round"), r.ids("survivors"))


def consistency_payload(
    session_digest: bytes,
    epoch: int,
    epoch_digest: bytes,
    round_id: int,
    vector_len: int,
    participants: tuple[str, ...],
    survivors: tuple[str, ...],
) -> bytes:
    """The statement a site signs in the consistency check (domain ``sig-consistency``)."""
    return (
        Writer()
        .raw(session_digest)
        .u64(epoch)
        .raw(epoch_digest)
        .u64(round_id)
        .u32(vector_len)
        .ids(participants)
        .ids(survivors)
        .getvalue()
    )


CONSISTENCY_DOMAIN = LABEL_SIG_CONSISTENCY


@dataclass(frozen=True, eq=False)
class ConsistencySignature(Message):
    """S→C: the sender's signature over :func:`consistency_payload` for this round."""

    TAG: ClassVar[int] = 9
    session_digest: bytes
    epoch: int
    round_id: int
    sender: str
    signature: bytes

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        check_site_id(self.sender, "sender")
        check_bytes(self.signature, SIGNATURE_SIZE, "signature")

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).text(self.sender).raw(self.signature)

    @classmethod
    def _read(cls, r: Reader) -> "ConsistencySignature":
        return cls(
            r.raw(KEY_SIZE, "session digest"), r.u64("epoch"), r.u64("round"), r.site_id("sender"), r.raw(SIGNATURE_SIZE, "signature")
        )


@dataclass(frozen=True, eq=False)
class UnmaskRequest(Message):
    """C→S: reveal shares; ``survivors`` = U3, ``dropped`` = P_r \\ U3, ≥ t signatures on U3."""

    TAG: ClassVar[int] = 10
    session_digest: bytes
    epoch: int
    round_id: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    signatures: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        object.__setattr__(self, "survivors", check_sorted_ids(self.survivors, "survivor set"))
        object.__setattr__(self, "dropped", check_sorted_ids(self.dropped, "dropped set"))
        object.__setattr__(self, "signatures", tuple((s, sig) for s, sig in self.signatures))
        _sorted_unique(self.signatures, lambda e: e[0], "consistency signatures")
        for _, sig in self.signatures:
            check_bytes(sig, SIGNATURE_SIZE, "consistency signature")

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).ids(self.survivors).ids(self.dropped)
        w.u32(len(self.signatures))
        for s, sig in self.signatures:
            w.text(s).raw(sig)

    @classmethod
    def _read(cls, r: Reader) -> "UnmaskRequest":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch, rnd = r.u64("epoch"), r.u64("round")
        surv, drop = r.ids("survivors"), r.ids("dropped")
        n = r.count("signatures", MAX_SITES)
        sigs = tuple((r.site_id("signer"), r.raw(SIGNATURE_SIZE, "signature")) for _ in range(n))
        return cls(digest, epoch, rnd, surv, drop, sigs)


def _check_shares(entries: tuple, what: str) -> tuple:
    entries = tuple(entries)
    if not (set(map(type, entries)) <= {tuple} and set(map(len, entries)) <= {2}):
        entries = tuple((d, s) for d, s in entries)
    check_sorted_ids(map(itemgetter(0), entries), what)
    shares = tuple(map(itemgetter(1), entries))
    # bulk check: all exactly SHARE_SIZE-byte bytes with a zero leading byte (< 2^256 < p); else one by one
    if set(map(type, shares)) <= {bytes} and set(map(len, shares)) <= {SHARE_SIZE} \
            and not any(b"".join(shares)[::SHARE_SIZE]):
        return entries
    for s in shares:
        check_bytes(s, SHARE_SIZE, f"{what} value")
        if s >= _PRIME_BYTES:  # big-endian, equal length: bytes order is numeric order
            raise InvalidMessage(f"{what} value is not a field element")
    return entries


_PRIME_BYTES = PRIME.to_bytes(SHARE_SIZE, "big")


def _write_shares(w: Writer, entries: tuple[tuple[str, bytes], ...]) -> None:
    """A count-prefixed list of (dealer, 33-byte share) pairs (UnmaskResponse, FastMaskedInput)."""
    w.u32(len(entries))
    for d, s in entries:
        w.text(d).raw(s)


def _read_shares(r: Reader, what: str) -> tuple[tuple[str, bytes], ...]:
    """Inverse of :func:`_write_shares`: count checked against MAX_SITES, pairs read in bulk."""
    return r.id_fields(r.count(what, MAX_SITES), "dealer", SHARE_SIZE, "share")


@dataclass(frozen=True, eq=False)
class UnmaskResponse(Message):
    """S→C: the sender's shares of b_{v,r} for survivors and of the mask key of dropped sites."""

    TAG: ClassVar[int] = 11
    session_digest: bytes
    epoch: int
    round_id: int
    sender: str
    seed_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        check_site_id(self.sender, "sender")
        object.__setattr__(self, "seed_shares", _check_shares(self.seed_shares, "seed shares"))
        object.__setattr__(self, "key_shares", _check_shares(self.key_shares, "mask-key shares"))
        both = self.key_shares and {d for d, _ in self.seed_shares} & {d for d, _ in self.key_shares}
        if both:
            raise InvalidMessage(f"unmask response reveals both shares for {sorted(both)}")

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).text(self.sender)
        _write_shares(w, self.seed_shares)
        _write_shares(w, self.key_shares)

    @classmethod
    def _read(cls, r: Reader) -> "UnmaskResponse":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch, rnd = r.u64("epoch"), r.u64("round")
        sender = r.site_id("sender")
        return cls(digest, epoch, rnd, sender, _read_shares(r, "seed shares"), _read_shares(r, "mask-key shares"))


# =========================================================================== fast rounds

@dataclass(frozen=True, eq=False)
class FastRoundStart(RoundStart):
    """C→S: a :class:`RoundStart` marked fast (its own type tag, so slow rounds keep their encodings).

    Each participant answers with one :class:`FastMaskedInput` (its masked input *and* its shares of the
    self-mask seeds of all of P_r) and from then on refuses the round's consistency and unmask requests;
    the coordinator can unmask only if every participant's input arrives (docs/secagg.md §6).
    """

    TAG: ClassVar[int] = 12
    fast: ClassVar[bool] = True


@dataclass(frozen=True, eq=False)
class FastMaskedInput(Message):
    """S→C: the answer to a :class:`FastRoundStart`: ``y_u`` and the sender's shares of b_{v,r} for every
    v ∈ P_r (itself included), sorted by dealer.  No mask-key share is ever part of it."""

    TAG: ClassVar[int] = 13
    session_digest: bytes
    epoch: int
    round_id: int
    sender: str
    masked: np.ndarray
    seed_shares: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        _digest(self.session_digest, "session digest")
        _id(self.epoch, "epoch id")
        _id(self.round_id, "round id")
        check_site_id(self.sender, "sender")
        object.__setattr__(self, "masked", _frozen_ring(self.masked))
        object.__setattr__(self, "seed_shares", _check_shares(self.seed_shares, "seed shares"))

    def _write(self, w: Writer) -> None:
        w.raw(self.session_digest).u64(self.epoch).u64(self.round_id).text(self.sender).ring(self.masked)
        _write_shares(w, self.seed_shares)

    @property
    def dealers(self) -> tuple[str, ...]:
        """The dealers of :attr:`seed_shares`, in order."""
        return tuple(map(itemgetter(0), self.seed_shares))

    def share_matrix(self) -> np.ndarray:
        """The seed shares' bytes as a (dealers × SHARE_SIZE) uint8 array, in dealer order
        (:func:`~fedsbdt.common.secagg.shamir.reconstruct_many_packed`)."""
        return np.frombuffer(b"".join(map(itemgetter(1), self.seed_shares)), np.uint8).reshape(-1, SHARE_SIZE)

    @classmethod
    def _read(cls, r: Reader) -> "FastMaskedInput":
        digest = r.raw(KEY_SIZE, "session digest")
        epoch, rnd = r.u64("epoch"), r.u64("round")
        sender = r.site_id("sender")
        return cls(digest, epoch, rnd, sender, r.ring("masked vector"), _read_shares(r, "seed shares"))

    @classmethod
    def decode_expected(cls, data: bytes, layout) -> "FastMaskedInput | None":
        """:func:`decode_message` for a FastMaskedInput whose seed shares name exactly ``layout.dealers``, in
        order (what a coordinator expects: P_r, or on a sparse graph P_r ∩ N[sender], when ``layout`` is a
        function of the sender returning its ShareLayout or None); None when the bytes are anything else, and
        then the caller decodes them generically, which names the defect.

        The dealer ids and length prefixes are compared with the expected bytes in one vectorised
        comparison, the shares' leading bytes (zero: < 2^256 < p) in another, instead of validating n ids
        per message (docs/federation.md §10).  Same object, same checks, as the generic path.
        """
        head = len(MAGIC) + 2
        if len(data) < head or data[:head] != MAGIC + bytes((VERSION, cls.TAG)):
            return None
        try:
            r = Reader(data[head:], cls.__name__)
            digest = r.raw(KEY_SIZE, "session digest")
            epoch, rnd = r.u64("epoch"), r.u64("round")
            sender = r.site_id("sender")
            masked = r.ring("masked vector")
            section = r.raw(len(data) - head - r._pos, "seed shares")
            r.done()
        except InvalidMessage:
            return None
        if callable(layout):  # a sparse graph: the expected list depends on the sender's neighbourhood
            layout = layout(sender)
            if layout is None:
                return None
        if not layout.matches(section):
            return None
        msg = object.__new__(_PackedFastMaskedInput)
        for name, value in (("session_digest", _digest(digest, "session digest")), ("epoch", _id(epoch, "epoch id")),
                            ("round_id", _id(rnd, "round id")), ("sender", sender),
                            ("masked", _frozen_ring(masked)), ("_section", section), ("_layout", layout)):
            object.__setattr__(msg, name, value)
        return msg


class _PackedFastMaskedInput(FastMaskedInput):
    """A FastMaskedInput decoded in bulk (:meth:`FastMaskedInput.decode_expected`): its seed shares stay the
    checked bytes of the message's share list, read through its :class:`ShareLayout` — the (dealer, share)
    pairs are built only if asked for (the blame path, a sparse graph), the coordinator's fast path reads
    :meth:`share_matrix`.  Same values as the generic decoder's object."""

    @property
    def seed_shares(self) -> tuple[tuple[str, bytes], ...]:
        pairs = self.__dict__.get("_pairs")
        if pairs is None:
            pairs = tuple(zip(self._layout.dealers, self._layout.shares(self._section)))
            object.__setattr__(self, "_pairs", pairs)
        return pairs

    @property
    def dealers(self) -> tuple[str, ...]:
        return self._layout.dealers

    def share_matrix(self) -> np.ndarray:
        return self._layout.share_matrix(self._section)


class ShareLayout:
    """The encoding of a (dealer, share) list for fixed, valid, sorted dealers (``u32`` count, then
    ``lp(dealer) ‖ share`` each), with the positions of its id bytes and of each share."""

    def __init__(self, dealers: tuple[str, ...]) -> None:
        self.dealers = check_sorted_ids(dealers, "dealers")
        w = Writer()
        _write_shares(w, tuple((d, b"\x00" * SHARE_SIZE) for d in self.dealers))
        self._template = np.frombuffer(w.getvalue(), np.uint8)  # the ids' bytes, every share zero
        self.size = self._template.size
        starts, pos = [], 4
        for d in self.dealers:
            pos += 4 + len(d.encode("utf-8"))
            starts.append(pos)
            pos += SHARE_SIZE
        self._starts = starts
        # the bytes compared with the template: every id byte, and each share's leading byte (zero: < 2^256 < p)
        self._mask = np.full(self.size, 0xFF, np.uint8)
        for o in starts:
            self._mask[o + 1:o + SHARE_SIZE] = 0
        self._share_bytes = (np.asarray(starts, np.intp)[:, None] + np.arange(SHARE_SIZE)).ravel()

    def matches(self, section: bytes) -> bool:
        """Is ``section`` exactly this layout's encoding, with every share < 2^256?"""
        if len(section) != self.size:
            return False
        return bool(np.array_equal(np.frombuffer(section, np.uint8) & self._mask, self._template))

    def shares(self, section: bytes) -> list[bytes]:
        """The shares of a matching ``section`` (:meth:`matches`), in dealer order."""
        return [section[o:o + SHARE_SIZE] for o in self._starts]

    def share_matrix(self, section: bytes) -> np.ndarray:
        """The shares of a matching ``section`` as a (dealers × SHARE_SIZE) uint8 array."""
        return np.frombuffer(section, np.uint8)[self._share_bytes].reshape(len(self._starts), SHARE_SIZE)


__all__ = [
    "Writer",
    "KIND_KEY",
    "KIND_SEED",
    "AdvertiseKeys",
    "ConsistencyRequest",
    "ConsistencySignature",
    "EncryptedShares",
    "EpochAnnounce",
    "EpochRoster",
    "EpochShares",
    "FastMaskedInput",
    "FastRoundStart",
    "MaskedInput",
    "Message",
    "RoundStart",
    "RoutedShares",
    "ShareKeys",
    "ShareRow",
    "ShareLayout",
    "SignedCommitments",
    "UnmaskRequest",
    "UnmaskResponse",
    "consistency_payload",
    "decode_message",
]
