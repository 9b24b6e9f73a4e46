"""The coordinator's storage layout (``coordinator/meta``, ``coordinator/epoch/<id>/…``) and its id counters.

``dealer/<i>`` is the ShareKeys of the roster's i-th site without its encrypted shares (signed commitments and
per-share commitment rows: O(n·E) bytes), written as it arrives, so no step holds or writes the whole epoch's
O(n²·E) rows at once; ``blob/<recipient>/<dealer>`` is one encrypted share blob; ``head`` (the announcement, the
roster and the dealers) is written when the epoch is ready.  ``meta`` holds the id counters (:class:`_Meta`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..encoding import Reader, Writer
from ..errors import InvalidMessage, StorageError
from ..messages import EpochAnnounce, EpochRoster, decode_message
from ..storage import Storage


_META_KEY = "coordinator/meta"
_EPOCHS = "coordinator/epoch/"


def _epoch_key(epoch_id: int, name: str) -> str:
    return f"{_EPOCHS}{epoch_id:020d}/{name}"


def _blob_key(epoch_id: int, recipient_i: int, dealer_i: int) -> str:
    """The record of the blob from the roster's ``dealer_i``-th site to its ``recipient_i``-th."""
    return _epoch_key(epoch_id, f"blob/{recipient_i:05d}/{dealer_i:05d}")


def _stored_epochs(storage: Storage) -> list[int]:
    """The ids of the epochs with records in ``storage`` (ready or not)."""
    ids = set()
    for key in storage.keys(_EPOCHS):
        head, sep, _ = key[len(_EPOCHS):].partition("/")
        if not sep or not head.isdigit():
            raise StorageError(f"stored coordinator epoch {key!r} is in an earlier version's format; finish this "
                               "session with the version that began it")
        ids.add(int(head))
    return sorted(ids)


def _decode_head(data: bytes) -> tuple[EpochAnnounce, EpochRoster, tuple[str, ...]]:
    """A stored ready epoch's announcement, roster and dealers (``CoordinatorEpoch`` storage layout)."""
    try:
        r = Reader(data, "coordinator epoch")
        ann = decode_message(r.var("announce", 1 << 20))
        roster = decode_message(r.var("roster", 1 << 30))
        if not isinstance(ann, EpochAnnounce) or not isinstance(roster, EpochRoster):
            raise InvalidMessage("unexpected record types")
        dealers = tuple(roster.senders[r.u32("dealer")] for _ in range(r.count("dealers", 1 << 16)))
        r.done()
    except (InvalidMessage, IndexError) as exc:
        raise StorageError(f"corrupt stored coordinator epoch: {exc}") from None
    return ann, roster, dealers


@dataclass(frozen=True)
class _Meta:
    next_epoch: int = 0  # next epoch id to announce
    next_round: int = 0  # next round id a round may use
    free_round: int = 0  # first round id not covered by an announced epoch

    def to_bytes(self) -> bytes:
        return Writer().u64(self.next_epoch).u64(self.next_round).u64(self.free_round).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "_Meta":
        try:
            r = Reader(data, "coordinator meta")
            out = cls(r.u64("next epoch"), r.u64("next round"), r.u64("free round"))
            r.done()
            return out
        except InvalidMessage as exc:
            raise StorageError(str(exc)) from None
