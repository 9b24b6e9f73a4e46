"""The coordinator's outboxes (server/outbox.py): raw event bytes equal the generated protobuf serialisation,
a broadcast is encoded once, and what an outbox holds is bounded in events and bytes."""
from __future__ import annotations

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
    TreeMsg,
    event_to_proto,
)
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.server import outbox as ob
from fedsbdt.server.service import FederationService

EVENTS = [
    SetupMsg(b""),
    SetupMsg(bytes(range(256)) * 700),  # > 127 and > 16383 bytes: multi-byte length varints
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
