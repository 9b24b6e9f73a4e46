"""The coordinator's one object per session: :class:`SecAggCoordinator` allocates epoch ids and round ids
(monotonic, never reused, persisted before they are handed out) and creates one state machine per epoch setup
(:mod:`.epoch_setup`) and per round (:mod:`.round`)."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..config import SessionConfig
from ..encoding import Writer
from ..errors import ConfigError, InvalidMessage, ProtocolAbort, SecAggError, StorageError
from ..messages import (
    EpochAnnounce,
    EpochRoster,
    EncryptedShares,
    FastRoundStart,
    RoundStart,
    ShareKeys,
    ShareRow,
    decode_message,
)
from ..primitives import NONCE_SIZE
from ..storage import Storage
from .store import _META_KEY, _Meta, _blob_key, _decode_head, _epoch_key, _stored_epochs
from .epoch import CoordinatorEpoch, StoredRouting, _dealers_of_each
from .epoch_setup import CoordinatorEpochSetup
from .round import CoordinatorRound


class SecAggCoordinator:
    """Allocates epochs and rounds for one session and creates their state machines.

    Args:
        config: the session parameters.
        storage: optional durable storage; if given, epoch/round id counters
            and ready epochs are persisted (before ids are handed out) and
            restored on construction, so a restarted coordinator never reuses
            an id and can continue a ready epoch.
    """

    def __init__(self, config: SessionConfig, storage: Storage | None = None) -> None:
        self.config = config
        self._storage = storage
        self._meta = _Meta()
        self._epochs: dict[int, CoordinatorEpoch] = {}
        self._excluded: set[str] = set()
        if storage is not None:
            raw = storage.get(_META_KEY)
            if raw is not None:
                self._meta = _Meta.from_bytes(raw)
            for e in _stored_epochs(storage):
                head = storage.get(_epoch_key(e, "head"))
                if head is None:
                    continue  # an epoch whose setup did not finish: its dealers' rows go at the next begin_epoch
                ann, roster, dealers = _decode_head(head)
                if ann.last_round >= self._meta.next_round:
                    commitments = {d: self._stored_share_keys(roster, d).commitments for d in dealers}
                    ep = CoordinatorEpoch(ann, roster, commitments, self._rows_of(roster, None),
                                          config.epoch_graph(roster))
                    self._epochs[ep.epoch] = ep

    # ---------------------------------------------------------------- epochs
    def begin_epoch(self, num_rounds: int) -> tuple[CoordinatorEpochSetup, EpochAnnounce]:
        """Allocate the next epoch id and ``num_rounds`` fresh round ids; returns the setup and its announcement."""
        if not 1 <= num_rounds <= self.config.max_epoch_rounds:
            raise SecAggError(f"num_rounds must be in [1, {self.config.max_epoch_rounds}]")
        m = self._meta
        if self._storage is not None:  # the stored rows of setups that never finished
            for e in _stored_epochs(self._storage):
                if e not in self._epochs and self._storage.get(_epoch_key(e, "head")) is None:
                    self._delete_epoch(e)
        ann = EpochAnnounce(self.config.digest, m.next_epoch, max(m.next_round, m.free_round), num_rounds)
        self._set_meta(_Meta(ann.epoch + 1, m.next_round, ann.last_round + 1))
        return CoordinatorEpochSetup(self, ann), ann

    def _epoch_ready(self, epoch: CoordinatorEpoch) -> None:
        if self._storage is not None:  # its dealers' rows were stored as their ShareKeys arrived
            w = Writer().var(epoch.announce.to_bytes()).var(epoch.roster.to_bytes()).u32(len(epoch.dealers))
            index = {s: i for i, s in enumerate(epoch.roster.senders)}
            for d in epoch.dealers:
                w.u32(index[d])
            self._storage.put(_epoch_key(epoch.epoch, "head"), w.getvalue())
        self._epochs[epoch.epoch] = epoch

    # Storage layout of an epoch: see .store (each dealer's record written as its ShareKeys arrives).

    def _keep(self, roster: EpochRoster, msg: ShareKeys) -> ShareKeys:
        """What the setup keeps of a validated ShareKeys: all of it, or with a storage its signed commitments only,
        once its rows and its blobs (one record per recipient) are stored."""
        if self._storage is not None:
            index = {h: i for i, h in enumerate(roster.senders)}
            i = index[msg.sender]
            self._storage.put(_epoch_key(roster.epoch, f"dealer/{i:05d}"),
                              ShareKeys(msg.session_digest, msg.epoch, msg.sender, msg.commitments, msg.rows, ()).to_bytes())
            for b in msg.encrypted:
                self._storage.put(_blob_key(roster.epoch, index[b.recipient], i), b.nonce + b.ciphertext)
        return self._kept(msg)

    def _kept(self, msg: ShareKeys) -> ShareKeys:
        return msg if self._storage is None else \
            ShareKeys(msg.session_digest, msg.epoch, msg.sender, msg.commitments, (), ())

    def _stored_blob(self, epoch_id: int, recipient_i: int, dealer_i: int, recipient: str) -> EncryptedShares:
        key = _blob_key(epoch_id, recipient_i, dealer_i)
        raw = self._storage.get(key)
        if raw is None or len(raw) <= NONCE_SIZE:
            raise StorageError(f"the stored shares {key!r} are gone (the epoch was used up) or corrupt")
        return EncryptedShares(recipient, raw[:NONCE_SIZE], raw[NONCE_SIZE:])

    def _rows_of(self, roster: EpochRoster, rows: Mapping[str, Sequence[ShareRow]] | None):
        """A ready epoch's ``rows`` argument: the rows in memory, or with a storage a loader of one dealer's."""
        if self._storage is None:
            return {d: {row.holder: row for row in rs} for d, rs in rows.items()}
        return lambda dealer: self._stored_share_keys(roster, dealer).rows

    def _stored_share_keys(self, roster: EpochRoster, dealer: str) -> ShareKeys:
        key = _epoch_key(roster.epoch, f"dealer/{roster.senders.index(dealer):05d}")
        raw = self._storage.get(key)
        try:
            msg = decode_message(raw) if raw is not None else None
        except InvalidMessage as exc:
            raise StorageError(f"corrupt stored ShareKeys {key!r}: {exc}") from None
        if not isinstance(msg, ShareKeys) or msg.sender != dealer or msg.epoch != roster.epoch:
            raise StorageError(f"stored ShareKeys {key!r} is missing or corrupt")
        return msg

    def _delete_epoch(self, epoch_id: int) -> None:
        for key in self._storage.keys(_epoch_key(epoch_id, "")):
            self._storage.delete(key)

    def ready_epochs(self) -> list[int]:
        return sorted(self._epochs)

    def stored_routing(self, epoch_id: int) -> StoredRouting | None:
        """A ready epoch's EpochShares, read from the stored blobs (None without a storage): what a restarted
        coordinator sends a site that joins again, which may not have received its shares before the restart."""
        return self._stored_routing(self._epochs[epoch_id])

    def _stored_routing(self, ep: CoordinatorEpoch) -> StoredRouting | None:
        if self._storage is None:
            return None
        return StoredRouting(self, ep.roster, ep.announce.num_rounds, ep.commitments,
                             _dealers_of_each(ep.graph, ep.dealers))

    def epoch(self, epoch_id: int) -> CoordinatorEpoch:
        return self._epochs[epoch_id]

    def slots_remaining(self) -> int:
        """Unused round slots in ready epochs (prepare the next epoch before this reaches 0)."""
        nxt = self._meta.next_round
        return sum(max(0, ep.announce.last_round - max(nxt, ep.announce.first_round) + 1) for ep in self._epochs.values())

    # ---------------------------------------------------------------- sites
    def exclude(self, site_id: str) -> None:
        """Leave a site out of all later default participant sets (it dropped for good)."""
        self._excluded.add(site_id)

    @property
    def excluded(self) -> frozenset[str]:
        return frozenset(self._excluded)

    # ---------------------------------------------------------------- rounds
    def begin_round(
        self, vector_len: int, participants: tuple[str, ...] | list[str] | None = None, *, fast: bool = False
    ) -> tuple[CoordinatorRound, RoundStart]:
        """Allocate the next round id (next free slot of the earliest ready epoch) and start a round.

        ``participants`` defaults to the epoch's dealers (A2) minus excluded sites.
        A round that fails is retried by calling this again: it gets a new id.
        ``fast=True`` starts a fast round (a :class:`FastRoundStart`: one exchange, every participant's
        input needed; docs/secagg.md §6).  On a sparse graph only a fast-only session has fast rounds, and
        only fast ones (ConfigError otherwise; docs/secagg.md §10).
        """
        if not 1 <= vector_len <= self.config.max_vector_len:
            raise SecAggError(f"vector_len must be in [1, {self.config.max_vector_len}]")
        if fast and self.config.sparse and not self.config.fast_only:
            raise ConfigError("fast rounds are allowed on a sparse graph only in a fast-only session (docs/secagg.md "
                              "§10); use fast=False")
        if not fast and self.config.fast_only:
            raise ConfigError("this session is fast-only: every round must be fast (docs/secagg.md §10)")
        nxt = self._meta.next_round
        candidates = [ep for ep in self._epochs.values() if ep.announce.last_round >= nxt]
        if not candidates:
            raise SecAggError("no ready epoch has a free round slot; set up the next epoch first")
        ep = min(candidates, key=lambda e: e.announce.first_round)
        if participants is None:
            participants = tuple(d for d in ep.dealers if d not in self._excluded)
        participants = tuple(sorted(participants))
        outside = set(participants) - set(ep.dealers)
        if outside:
            raise SecAggError(f"participants {sorted(outside)} did not complete the setup of epoch {ep.epoch}")
        if len(participants) < self.config.threshold:
            raise ProtocolAbort(
                f"only {len(participants)} sites available for a round, threshold is {self.config.threshold}"
            )
        round_id = max(nxt, ep.announce.first_round)
        self._set_meta(_Meta(self._meta.next_epoch, round_id + 1, max(self._meta.free_round, round_id + 1)))
        for e in [e for e, x in self._epochs.items() if x.announce.last_round < round_id + 1]:
            del self._epochs[e]
            if self._storage is not None:
                self._delete_epoch(e)
        start = (FastRoundStart if fast else RoundStart)(self.config.digest, ep.epoch, round_id, vector_len, participants)
        return CoordinatorRound(self.config, ep, start), start

    def _set_meta(self, meta: _Meta) -> None:
        if self._storage is not None:
            self._storage.put(_META_KEY, meta.to_bytes())
        self._meta = meta
