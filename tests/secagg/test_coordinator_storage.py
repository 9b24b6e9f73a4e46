"""The coordinator's stored epochs (common/secagg/coordinator/store.py, the storage layout): each dealer's
commitment rows are one record and each of its blobs another, written as its ShareKeys arrives; the coordinator
keeps neither in memory, routes each recipient's EpochShares from the storage (``StoredRouting``), reads a ready
epoch back after a restart (rows only when a share must be blamed), and removes the records of a setup that
never finished."""
from __future__ import annotations

import pytest

from fedsbdt.common.secagg import MemoryStorage, StorageError
from fedsbdt.common.secagg.coordinator import SecAggCoordinator, StoredRouting

from .conftest import make_federation


class CountingStorage(MemoryStorage):
    """A MemoryStorage that remembers the largest value written."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def put(self, key: str, value: bytes) -> None:
        self.largest = max(self.largest, len(value))
        super().put(key, value)


def _setup(fed, rounds: int, finish: bool = True):
    setup, ann = fed.coordinator.begin_epoch(rounds)
    for s in fed.config.site_ids:
        setup.receive_advertise(fed.sites[s].handle_epoch_announce(ann))
    roster = setup.close_advertise()
    sent = {s: fed.sites[s].handle_epoch_roster(roster) for s in roster.senders}
    for m in sent.values():
        setup.receive_share_keys(m)
        setup.receive_share_keys(m)  # a resend is accepted as the same message once its rows are let go
    if finish:
        setup.close_share_keys()
    return ann, sent, setup


def test_each_dealer_is_one_record_and_no_rows_stay_in_memory():
    storage = CountingStorage()
    fed = make_federation(6, 4, coordinator_storage=storage)
    ann, sent, setup = _setup(fed, 8, finish=False)
    # stored as they arrived, then let go
    assert all(m.rows == () and m.encrypted == () for m in setup.stage.received.values())
    routed = setup.close_share_keys()
    assert isinstance(routed, StoredRouting)
    for h in routed:  # each recipient's message from the stored blobs: the dealers' own blobs, of the stated size
        msg = routed[h]
        assert routed.size(h) == len(msg.to_bytes())
        for e in msg.entries:
            if e.encrypted is not None:
                want = {b.recipient: b for b in sent[e.dealer].encrypted}[h]
                assert (e.encrypted.nonce, e.encrypted.ciphertext) == (want.nonce, want.ciphertext)
    one_dealer = max(len(m.to_bytes()) for m in sent.values())
    # nothing stored in one piece is larger than one dealer's ShareKeys (the whole epoch's rows are 6 of them)
    assert storage.largest <= one_dealer
    ep = fed.coordinator.epoch(ann.epoch)
    assert ep._rows == {}  # nothing read back yet
    d, h = ep.dealers[2], ep.dealers[4]
    want = {r.holder: r.commitments for r in sent[d].rows}[h]
    assert ep.row(d, h).commitments == want
    assert set(ep._rows) == {d}  # only the blamed dealer's record was read


def test_a_restarted_coordinator_reads_the_ready_epoch_back():
    storage = MemoryStorage()
    fed = make_federation(5, 3, coordinator_storage=storage)
    ann, sent, _ = _setup(fed, 8)
    again = SecAggCoordinator(fed.config, storage)
    ep, before = again.epoch(ann.epoch), fed.coordinator.epoch(ann.epoch)
    assert ep.dealers == before.dealers and ep.commitments == before.commitments
    assert ep.epoch_digest == before.epoch_digest
    for d in ep.dealers:
        assert all(ep.row(d, r.holder).commitments == r.commitments for r in sent[d].rows)


def test_an_unfinished_setup_leaves_nothing_behind():
    storage = MemoryStorage()
    fed = make_federation(4, 3, coordinator_storage=storage)
    ann, _, _ = _setup(fed, 4, finish=False)
    assert len(storage.keys(f"coordinator/epoch/{ann.epoch:020d}/dealer/")) == 4
    again = SecAggCoordinator(fed.config, storage)  # the coordinator restarted during the setup
    assert again.ready_epochs() == []
    again.begin_epoch(4)
    assert storage.keys("coordinator/epoch/") == []


def test_a_stored_epoch_of_the_earlier_format_is_refused_in_one_line():
    storage = MemoryStorage()
    fed = make_federation(4, 3, coordinator_storage=storage)
    storage.put("coordinator/epoch/00000000000000000000", b"an epoch in one piece")
    with pytest.raises(StorageError, match="earlier version's format") as exc:
        SecAggCoordinator(fed.config, storage)
    assert "\n" not in str(exc.value)


def test_a_resent_share_keys_with_other_blobs_is_refused():
    import dataclasses

    from fedsbdt.common.secagg import InvalidMessage

    storage = MemoryStorage()
    fed = make_federation(4, 3, coordinator_storage=storage)
    ann, sent, setup = _setup(fed, 4, finish=False)
    m = next(iter(sent.values()))
    b = m.encrypted[0]
    other = dataclasses.replace(b, ciphertext=bytes([b.ciphertext[0] ^ 1]) + b.ciphertext[1:])
    with pytest.raises(InvalidMessage, match="already sent different ShareKeys"):
        setup.receive_share_keys(dataclasses.replace(m, encrypted=(other,) + m.encrypted[1:]))


def test_shares_of_a_used_up_epoch_are_gone_with_a_clear_error():
    storage = MemoryStorage()
    fed = make_federation(4, 3, coordinator_storage=storage)
    setup, ann = fed.coordinator.begin_epoch(1)
    for s in fed.config.site_ids:
        setup.receive_advertise(fed.sites[s].handle_epoch_announce(ann))
    roster = setup.close_advertise()
    for s in roster.senders:
        setup.receive_share_keys(fed.sites[s].handle_epoch_roster(roster))
    routed = setup.close_share_keys()
    fed.coordinator.begin_round(4)  # uses the epoch's only slot
    fed.coordinator.begin_epoch(1)
    with pytest.raises(StorageError, match="are gone"):
        routed[roster.senders[0]]
