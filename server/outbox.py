"""The coordinator's per-site outboxes: numbered events, each event's protobuf encoding made once.

A broadcast (a released tree, the next RoundStart, a ConsistencyRequest…) goes to every site; the
service encodes it once (:func:`encode_event`) and every outbox holds a reference to those bytes with its
own sequence number.  Streams write raw bytes (:func:`event_bytes`, :func:`batches`) that are exactly the
protobuf serialisation of ``Event`` / ``EventBatch`` (``tests/federation/test_outbox.py`` checks this
against the generated classes), so sites parse them as before.

An outbox holds at most ``OUTBOX_EVENTS`` events and, beyond its newest ``OUTBOX_MIN_EVENTS``, at most
``OUTBOX_BYTES`` of them (each event counted in full, shared or not): the coordinator's memory is bounded
per site whatever the number of rounds.  A site that resumes from an older event is told
``OUT_OF_RANGE`` and re-joins (the session hands a re-joined site what it still needs: the EpochShares of
ready epochs and its open requests; trees come from ``GetTrees``).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from fedsbdt.common.federation.wire import (MAX_MESSAGE_BYTES, RoundMsg, SetupMsg, SetupParts, event_to_proto,
                                            join_parts)

OUTBOX_EVENTS = 4096
#: bytes of events an outbox holds beyond its newest OUTBOX_MIN_EVENTS (a stream that broke for longer
#: than that many bytes of events re-joins instead of resuming)
OUTBOX_BYTES = 1 << 18
OUTBOX_MIN_EVENTS = 8

_SEQ = b"\x08"  # Event.seq: field 1, varint
_EVENTS = b"\x0a"  # EventBatch.events: field 1, length-delimited
_PROCESSED = b"\x10"  # EventBatch.processed: field 2, varint
_REJECTED = b"\x1a"  # EventBatch.rejected: field 3, length-delimited
_SECAGG = b"\x0a"  # SecAggMessage.secagg: field 1, length-delimited
_SECAGG_KIND = {SetupMsg: b"\x12", SetupParts: b"\x12", RoundMsg: b"\x22"}  # Event.setup (2), Event.round (4)


def varint(v: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@dataclass(frozen=True)
class Encoded:
    """An event's protobuf fields other than ``seq``, as byte strings joined when written (a secure-aggregation
    message's bytes are referenced, not copied)."""

    parts: tuple[bytes, ...]
    size: int


def encode_event(ev) -> Encoded:
    """The encoding of one session event without its sequence number (once per event, however many sites)."""
    kind = _SECAGG_KIND.get(type(ev))
    if kind is not None:
        inner = ev.parts if isinstance(ev, SetupParts) else (ev.secagg,)  # referenced, not joined
        n = sum(len(x) for x in inner)
        head = _SECAGG + varint(n) if n else b""  # proto3 leaves an empty bytes field out
        head = kind + varint(len(head) + n) + head
        return Encoded((head, *inner), len(head) + n)
    data = event_to_proto(ev, 0).SerializeToString()  # seq 0 is not serialised (proto3 default)
    return Encoded((data,), len(data))


@dataclass(frozen=True)
class Held:
    """One numbered event of one outbox."""

    seq: int
    body: Encoded

    @property
    def size(self) -> int:
        return 1 + len(varint(self.seq)) + self.body.size


def event_parts(e: Held) -> list[bytes]:
    """The serialised ``Event`` (what a Subscribe stream writes) as byte strings to join."""
    return [_SEQ, varint(e.seq), *e.body.parts]


def event_bytes(e: Held) -> bytes:
    """The serialised ``Event``."""
    return join_parts(event_parts(e))


@dataclass
class Outbox:
    token: bytes
    events: deque = field(default_factory=deque)  # Held, consecutive seqs, oldest first
    next_seq: int = 1
    superseded: bool = False
    waiters: set = field(default_factory=set)  # the asyncio.Events of the streams that follow this outbox
    held_bytes: int = 0

    @property
    def floor(self) -> int:
        """Lowest sequence number still held (events below it were dropped)."""
        return self.events[0].seq if self.events else self.next_seq

    @property
    def last_seq(self) -> int:
        """Sequence number of the newest event (0 before the first)."""
        return self.next_seq - 1

    def append(self, body: Encoded) -> None:
        """Number and hold one event; drop the oldest beyond the count and byte limits."""
        self.events.append(Held(self.next_seq, body))
        self.next_seq += 1
        self.held_bytes += body.size
        while len(self.events) > OUTBOX_MIN_EVENTS and (len(self.events) > OUTBOX_EVENTS
                                                         or self.held_bytes > OUTBOX_BYTES):
            self.held_bytes -= self.events.popleft().body.size

    def after(self, seq: int) -> list[Held]:
        """The held events with a sequence number above ``seq``, in order (O(result): seqs are contiguous)."""
        k = min(self.next_seq - 1 - seq, len(self.events))
        return list(itertools.islice(reversed(self.events), max(k, 0)))[::-1]

    def notify(self) -> None:
        for w in self.waiters:
            w.set()


def batch_parts(events: list[Held], processed: int, rejected: list[str]):
    """Serialised ``EventBatch`` messages for ``events`` (in order, each well below the message size limit),
    each as byte strings to join; the last one carries ``processed`` and ``rejected``."""
    parts: list[bytes] = []
    size = 0
    for e in events:
        n = e.size
        if parts and size + n > MAX_MESSAGE_BYTES // 4:
            yield parts
            parts, size = [], 0
        parts += (_EVENTS, varint(n), _SEQ, varint(e.seq), *e.body.parts)
        size += n
    if processed:
        parts += (_PROCESSED, varint(processed))
    for r in rejected:
        data = r.encode("utf-8")
        parts += (_REJECTED, varint(len(data)), data)
    yield parts


def batches(events: list[Held], processed: int, rejected: list[str]):
    """:func:`batch_parts`, each batch joined."""
    for parts in batch_parts(events, processed, rejected):
        yield join_parts(parts)


def raw_or(serialize):
    """A gRPC response serializer that passes bytes through (streams write pre-encoded messages)."""
    def ser(m):
        return m if isinstance(m, bytes) else serialize(m)
    return ser
