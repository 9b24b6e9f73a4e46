"""The coordinator's outboxes (server/outbox.py): raw event bytes equal the generated protobuf serialisation,
a broadcast is encoded once, and what an outbox holds is bounded in events and bytes."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fedsbdt.common.federation.wire import (
    AbortedMsg,
    FinishedMsg,
    InitScoreMsg,
    Purpose,
    RoundMsg,
    RoundStartMsg,
    SetupMsg,
    Deferred,
    SetupParts,
    TreeMsg,
    event_to_proto,
)
from fedsbdt.common.secagg import StorageError
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.server import outbox as ob
from fedsbdt.server.service import FederationService, WriteBudget, _Abort

EVENTS = [
    SetupMsg(b""),
    SetupMsg(bytes(range(256)) * 700),  # > 127 and > 16383 bytes: multi-byte length varints
    SetupParts((b"head", bytes(range(256)) * 70, b"", b"tail" * 40)),  # written as the joined bytes
    SetupParts(()),
    RoundMsg(b"FSA\x01\x08" + b"x" * 300),
    RoundStartMsg(Purpose.TREE, 7, b"secagg" * 40),
    RoundStartMsg(Purpose.LEVEL, 3, b"s", level=2, features=(1, 4, 0), thresholds=(0.5, -1.25, 3.0), sketch=(9, 0, 2)),
    InitScoreMsg(0.25, 3, ("a", "b")),
    InitScoreMsg(0.0, None, ()),
    TreeMsg(5, 1 << 20, ("site-a", "site-b"), np.array([1, 2, 3], np.int32), np.array([0.5, 1.5, 2.5]),
            np.arange(8, dtype=np.float64)),
    FinishedMsg("ab" * 32, 12),
    AbortedMsg("because é"),
]


@pytest.mark.parametrize("ev", EVENTS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("seq", [1, 127, 128, 300, 1 << 40])
def test_event_bytes_are_the_protobuf_serialisation(ev, seq):
    raw = ob.event_bytes(ob.Held(seq, ob.encode_event(ev)))
    assert raw == event_to_proto(ev, seq).SerializeToString()
    assert ob.Held(seq, ob.encode_event(ev)).size == len(raw)


@pytest.mark.parametrize("processed,rejected", [(0, []), (1, []), (300, ["no", "ü" * 200])])
def test_batches_are_the_protobuf_serialisation(processed, rejected):
    held = [ob.Held(i + 1, ob.encode_event(ev)) for i, ev in enumerate(EVENTS)]
    out = list(ob.batches(held, processed, rejected))
    assert len(out) == 1
    want = pb.EventBatch(events=[event_to_proto(ev, i + 1) for i, ev in enumerate(EVENTS)], processed=processed,
                         rejected=rejected)
    assert out[0] == want.SerializeToString()
    assert list(ob.batches([], processed, rejected)) == [pb.EventBatch(processed=processed,
                                                                       rejected=rejected).SerializeToString()]


def test_large_events_are_split_into_batches_in_order(monkeypatch):
    monkeypatch.setattr(ob, "MAX_MESSAGE_BYTES", 4 * 100_000)
    held = [ob.Held(i + 1, ob.encode_event(SetupMsg(bytes([i]) * 60_000))) for i in range(5)]
    out = [pb.EventBatch.FromString(b) for b in ob.batches(held, 4, ["r"])]
    assert len(out) == 5  # 60 kB each, at most 100 kB per batch
    assert [e.seq for b in out for e in b.events] == [1, 2, 3, 4, 5]
    assert [b.processed for b in out] == [0, 0, 0, 0, 4] and list(out[-1].rejected) == ["r"]


def test_outbox_holds_a_bounded_number_of_events_and_bytes(monkeypatch):
    monkeypatch.setattr(ob, "OUTBOX_EVENTS", 50)
    box = ob.Outbox(b"t")
    small = ob.encode_event(RoundMsg(b"x" * 10))
    for _ in range(120):
        box.append(small)
    assert len(box.events) == 50 and box.floor == 71 and box.last_seq == 120
    assert [e.seq for e in box.after(117)] == [118, 119, 120] and box.after(120) == []
    big = ob.encode_event(SetupMsg(b"y" * (ob.OUTBOX_BYTES // 3)))
    for _ in range(4):
        box.append(big)
        assert box.held_bytes == sum(e.body.size for e in box.events)
        assert box.held_bytes <= ob.OUTBOX_BYTES or len(box.events) == ob.OUTBOX_MIN_EVENTS
    for _ in range(ob.OUTBOX_MIN_EVENTS):
        box.append(small)
    assert box.held_bytes <= ob.OUTBOX_BYTES and box.held_bytes == sum(e.body.size for e in box.events)
    assert sum(e.body is big for e in box.events) == 2  # three are more than the budget
    assert [e.seq for e in box.events] == list(range(box.floor, 133))
    huge = ob.encode_event(SetupMsg(b"z" * (2 * ob.OUTBOX_BYTES)))  # above the budget: the newest are kept
    for _ in range(ob.OUTBOX_MIN_EVENTS + 3):
        box.append(huge)
    assert len(box.events) == ob.OUTBOX_MIN_EVENTS and box.last_seq == 132 + ob.OUTBOX_MIN_EVENTS + 3


def test_a_broadcast_is_encoded_once_and_numbered_per_site():
    svc = FederationService.__new__(FederationService)
    svc.outboxes = {s: ob.Outbox(s.encode()) for s in ("a", "b", "c")}
    svc.session = type("S", (), {"trees": []})()
    svc.observers = []
    svc.outboxes["c"].append(ob.encode_event(AbortedMsg("earlier")))
    tree, start = EVENTS[7], EVENTS[3]
    svc.dispatch([(s, tree) for s in ("a", "b", "c")] + [(s, start) for s in ("a", "c")] + [("gone", tree)])
    a, b, c = (svc.outboxes[s].events for s in ("a", "b", "c"))
    assert a[0].body is b[0].body is c[1].body and a[1].body is c[2].body
    assert [e.seq for e in a] == [1, 2] and [e.seq for e in b] == [1] and [e.seq for e in c] == [1, 2, 3]
    assert pb.Event.FromString(ob.event_bytes(c[2])) == event_to_proto(start, 3)


def test_setup_parts_are_referenced_not_copied():
    shared = bytes(range(256)) * 4000  # one dealer's commitments, in every recipient's EpochShares
    a, b = SetupParts((b"to a", shared)), SetupParts((b"to b", shared))
    assert isinstance(a, SetupMsg) and a.secagg == b"to a" + shared
    ea, eb = ob.encode_event(a), ob.encode_event(b)
    assert ea.parts[-1] is shared and eb.parts[-1] is shared  # held once however many outboxes hold it
    assert ob.event_bytes(ob.Held(3, ea)) == event_to_proto(SetupMsg(a.secagg), 3).SerializeToString()


class _Stream:
    """A stream whose writes complete when the test says (as gRPC's do when the site has read them)."""

    def __init__(self, log):
        self.log, self.done = log, asyncio.Event()

    async def write(self, data):
        self.log.append(("start", len(data)))
        await self.done.wait()
        self.log.append(("end", len(data)))


def test_write_budget_bounds_large_writes_in_flight_and_a_stalled_write_lets_go():
    async def main():
        budget = WriteBudget(limit=250, small=10, hold_seconds=0.2)
        log = []
        streams = [_Stream(log) for _ in range(4)]
        tasks = [asyncio.ensure_future(budget.write(s, [b"x" * 50, b"y" * 50])) for s in streams]
        small = _Stream(log)
        small.done.set()
        assert await budget.write(small, [b"z" * 10]) == 10  # small messages never wait
        await asyncio.sleep(0.05)
        assert [e for e in log if e[0] == "start"] == [("start", 10)] + [("start", 100)] * 2  # 2 x 100 <= 250
        assert budget.used == 200
        streams[0].done.set()  # one site reads: the next large write starts
        await asyncio.sleep(0.05)
        assert sum(e == ("start", 100) for e in log) == 3 and budget.used == 200
        await asyncio.sleep(0.3)  # the other two sites read nothing: their writes let go of the budget
        assert sum(e == ("start", 100) for e in log) == 4 and budget.peak == 200
        for s in streams:
            s.done.set()
        assert await asyncio.gather(*tasks) == [100] * 4
        assert budget.used == 0

    asyncio.run(main())


def test_a_deferred_part_is_read_only_when_written_and_the_bytes_are_the_same():
    body = bytes(range(256)) * 3000  # an EpochShares read from the coordinator's storage
    reads = []

    def load():
        reads.append(1)
        return (body[:100], body[100:])

    ev = SetupParts((b"head", Deferred(load, len(body))))
    held = ob.Held(4, ob.encode_event(ev))
    assert reads == [] and held.size == len(ob.event_bytes(ob.Held(4, ob.encode_event(SetupParts((b"head", body))))))
    assert reads == []
    assert ob.event_bytes(held) == event_to_proto(SetupMsg(b"head" + body), 4).SerializeToString()
    assert list(ob.batches([held], 1, [])) == [pb.EventBatch(events=[event_to_proto(SetupMsg(b"head" + body), 4)],
                                                             processed=1).SerializeToString()]
    with pytest.raises(ValueError, match="declared"):
        SetupParts((Deferred(load, len(body) + 1),)).secagg


def test_write_budget_reads_a_deferred_message_only_once_it_has_room_and_gone_shares_end_the_stream():
    async def main():
        budget = WriteBudget(limit=150, small=10, hold_seconds=5)
        log, reads = [], []

        def deferred(tag):
            return Deferred(lambda: reads.append(tag) or (b"x" * 100,), 100)

        first, second = _Stream(log), _Stream(log)
        t1 = asyncio.ensure_future(budget.write(first, [deferred("a")]))
        t2 = asyncio.ensure_future(budget.write(second, [deferred("b")]))
        await asyncio.sleep(0.05)
        assert reads == ["a"]  # the second message is not read while the first holds the budget
        first.done.set()
        await asyncio.sleep(0.05)
        assert reads == ["a", "b"]
        second.done.set()
        assert await asyncio.gather(t1, t2) == [100, 100]

        def gone():
            raise StorageError("the stored shares 'x' are gone")
        with pytest.raises(_Abort) as exc:
            await budget.write(_Stream(log), [Deferred(gone, 100)])
        assert exc.value.code.name == "OUT_OF_RANGE" and budget.used == 0

    asyncio.run(main())
