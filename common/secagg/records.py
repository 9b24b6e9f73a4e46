"""Formats of the records a site persists (see ``storage.py`` for the storage contract).

Each record is written once, before the message it covers leaves the site:

=======================  ==========================================================
key                      content
=======================  ==========================================================
``meta/watermark``       highest epoch announced, highest round id started
``epoch/<e>/secrets``    the announce, X25519 encryption and mask private keys,
                         self-mask seeds b_{u,j}, and the signed AdvertiseKeys
``epoch/<e>/shared``     the EpochRoster answered, the ShareKeys sent, this site's
                         shares of its own secrets
``epoch/<e>/ready``      the dealers A2 and every share received from them
``round/<r>/input``      the RoundStart accepted and the MaskedInput sent; in a fast
                         round the FastRoundStart and the FastMaskedInput (seed shares
                         included): this one write is also "round r was answered fast"
``round/<r>/signed``     the ConsistencyRequest accepted and the signature sent
``round/<r>/revealed``   the UnmaskRequest accepted and the UnmaskResponse sent
=======================  ==========================================================

Epoch and round records are deleted when a later round starts (the watermark
keeps old ids from being reused).  Decoding failures raise
:class:`~fedsbdt.common.secagg.errors.StorageError`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .encoding import MAX_EPOCH_ROUNDS, MAX_SITES, Reader, Writer
from .errors import InvalidMessage, StorageError
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EpochAnnounce,
    EpochRoster,
    FastMaskedInput,
    MaskedInput,
    RoundStart,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from .primitives import KEY_SIZE
from .shamir import SHARE_SIZE

_NONE = (1 << 64) - 1  # "no value" for optional u64 fields


def epoch_key(epoch: int, part: str) -> str:
    return f"epoch/{epoch:020d}/{part}"


def round_key(round_id: int, part: str) -> str:
    return f"round/{round_id:020d}/{part}"


WATERMARK_KEY = "meta/watermark"


def _decode(cls, what: str, data: bytes):
    try:
        r = Reader(data, what)
        out = cls._read(r)
        r.done()
        return out
    except InvalidMessage as exc:
        raise StorageError(f"corrupt stored record {what}: {exc}") from None


def _msg(r: Reader, cls, field: str):
    try:
        m = decode_message(r.var(field, 1 << 30))
    except InvalidMessage as exc:
        raise InvalidMessage(f"{field}: {exc}") from None
    if not isinstance(m, cls):
        raise InvalidMessage(f"{field} holds a {type(m).__name__}, expected {cls.__name__}")
    return m


def _opt(v: int | None) -> int:
    return _NONE if v is None else v


def _unopt(v: int) -> int | None:
    return None if v == _NONE else v


@dataclass(frozen=True)
class Watermark:
    """Monotonic high-water marks; ids at or below them are never accepted again."""

    max_epoch: int | None = None
    max_last_round: int | None = None  # last round id of the highest announced epoch
    max_round: int | None = None  # highest round id ever started

    def _write(self, w: Writer) -> None:
        w.u64(_opt(self.max_epoch)).u64(_opt(self.max_last_round)).u64(_opt(self.max_round))

    @classmethod
    def _read(cls, r: Reader) -> "Watermark":
        return cls(_unopt(r.u64("max epoch")), _unopt(r.u64("max last round")), _unopt(r.u64("max round")))

    def to_bytes(self) -> bytes:
        w = Writer()
        self._write(w)
        return w.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Watermark":
        return _decode(cls, "watermark", data)


@dataclass(frozen=True)
class EpochSecretsRecord:
    announce: EpochAnnounce
    encryption_private: bytes
    mask_private: tuple[bytes, ...]
    seeds: tuple[bytes, ...]
    advert: AdvertiseKeys

    def to_bytes(self) -> bytes:
        w = Writer().var(self.announce.to_bytes()).raw(self.encryption_private).u32(len(self.mask_private))
        for k in self.mask_private:
            w.raw(k)
        for s in self.seeds:
            w.raw(s)
        return w.var(self.advert.to_bytes()).getvalue()

    @classmethod
    def _read(cls, r: Reader) -> "EpochSecretsRecord":
        ann = _msg(r, EpochAnnounce, "announce")
        enc = r.raw(KEY_SIZE, "encryption key")
        n = r.count("mask keys", MAX_EPOCH_ROUNDS)
        masks = tuple(r.raw(KEY_SIZE, "mask key") for _ in range(n))
        seeds = tuple(r.raw(KEY_SIZE, "seed") for _ in range(n))
        return cls(ann, enc, masks, seeds, _msg(r, AdvertiseKeys, "advert"))

    @classmethod
    def from_bytes(cls, data: bytes) -> "EpochSecretsRecord":
        return _decode(cls, "epoch secrets", data)


@dataclass(frozen=True)
class EpochSharedRecord:
    roster: EpochRoster
    share_keys: ShareKeys
    own_shares: bytes  # 2·E·33 bytes, slot-major (seed share, key share)

    def to_bytes(self) -> bytes:
        return Writer().var(self.roster.to_bytes()).var(self.share_keys.to_bytes()).var(self.own_shares).getvalue()

    @classmethod
    def _read(cls, r: Reader) -> "EpochSharedRecord":
        roster = _msg(r, EpochRoster, "roster")
        sk = _msg(r, ShareKeys, "share keys")
        return cls(roster, sk, r.var("own shares", 2 * SHARE_SIZE * MAX_EPOCH_ROUNDS))

    @classmethod
    def from_bytes(cls, data: bytes) -> "EpochSharedRecord":
        return _decode(cls, "epoch shared", data)


@dataclass(frozen=True)
class EpochReadyRecord:
    """Shares held from each dealer of A2 (the site itself included), 2·E·33 bytes each."""

    held: tuple[tuple[str, bytes], ...]

    def to_bytes(self) -> bytes:
        w = Writer().u32(len(self.held))
        for d, b in self.held:
            w.text(d).var(b)
        return w.getvalue()

    @classmethod
    def _read(cls, r: Reader) -> "EpochReadyRecord":
        n = r.count("dealers", MAX_SITES)
        return cls(tuple((r.site_id("dealer"), r.var("shares", 2 * SHARE_SIZE * MAX_EPOCH_ROUNDS)) for _ in range(n)))

    @classmethod
    def from_bytes(cls, data: bytes) -> "EpochReadyRecord":
        return _decode(cls, "epoch ready", data)


def _pair_record(first_cls, second_cls, what: str, check=None):
    """A record of one request and the reply sent; ``check(request, response)`` may refuse a pairing."""
    @dataclass(frozen=True)
    class _Pair:
        request: first_cls  # type: ignore[valid-type]
        response: second_cls  # type: ignore[valid-type]

        def to_bytes(self) -> bytes:
            return Writer().var(self.request.to_bytes()).var(self.response.to_bytes()).getvalue()

        @classmethod
        def _read(cls, r: Reader):
            out = cls(_msg(r, first_cls, "request"), _msg(r, second_cls, "response"))
            if check is not None and not check(out.request, out.response):
                raise InvalidMessage(f"{what}: the stored reply does not answer the stored request")
            return out

        @classmethod
        def from_bytes(cls, data: bytes):
            return _decode(cls, what, data)

    _Pair.__name__ = _Pair.__qualname__ = what.title().replace(" ", "") + "Record"
    return _Pair


def _answers(start: RoundStart, sent) -> bool:
    """A fast RoundStart is answered by a FastMaskedInput, any other by a MaskedInput."""
    return start.fast == isinstance(sent, FastMaskedInput)


#: ``response`` is a FastMaskedInput exactly when ``request.fast``: the record then also says
#: "round r was answered fast" (same write, so no crash can separate the two facts).
RoundInputRecord = _pair_record(RoundStart, (MaskedInput, FastMaskedInput), "round input", _answers)
RoundSignedRecord = _pair_record(ConsistencyRequest, ConsistencySignature, "round signed")
RoundRevealedRecord = _pair_record(UnmaskRequest, UnmaskResponse, "round revealed")
