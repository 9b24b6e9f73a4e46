"""A set-up epoch as the coordinator keeps it (:class:`CoordinatorEpoch`: public material only), each
recipient's EpochShares (read back from the storage: :class:`StoredRouting`), and the checks every stage applies
to a site message (session digest, roster membership)."""
from __future__ import annotations

import hashlib
from typing import Mapping, Sequence

from ..shamir import lagrange_coefficients
from ..config import SessionConfig
from ..errors import InvalidMessage, SecAggError
from ..messages import (
    EpochAnnounce,
    EpochRoster,
    EncryptedShares,
    EpochShares,
    RoutedShares,
    ShareKeys,
    ShareLayout,
    ShareRow,
    SignedCommitments,
)
from ..primitives import NONCE_SIZE
from ..graph import NeighbourGraph
from ..site import share_blob_size


def _check_digest(config: SessionConfig, msg) -> None:
    if msg.session_digest != config.digest:
        raise InvalidMessage(f"{type(msg).__name__} from {getattr(msg, 'sender', '?')!r} carries a different session digest")


def _known(config: SessionConfig, site: str) -> None:
    if not config.in_roster(site):
        raise InvalidMessage(f"message from {site!r}, which is not in the session roster")


class CoordinatorEpoch:
    """Everything the coordinator keeps about a set-up epoch (public material only).

    ``rows`` is each dealer's per-share commitment rows (dealer → holder → row; n·K·E·64 bytes per epoch, used
    only to blame a bad share), or, when the epoch is stored, a function of a dealer giving its rows from the
    storage (each dealer's record is read back only if one of its shares must be blamed).
    """

    def __init__(self, announce: EpochAnnounce, roster: EpochRoster, commitments: Mapping[str, SignedCommitments],
                 rows, graph: NeighbourGraph | None = None) -> None:
        self.announce, self.roster, self.graph = announce, roster, graph  # graph: sparse mode's; None = complete
        self.epoch_digest = roster.epoch_digest()
        self.mask_keys = {a.sender: a.mask_keys for a in roster.adverts}
        self.dealers = tuple(sorted(commitments))
        self.commitments = dict(commitments)  # signed: seeds, row digests
        self._rows: dict[str, dict[str, ShareRow]] = rows if isinstance(rows, dict) else {}
        self._load_rows = None if isinstance(rows, dict) else rows
        self._lagrange: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._layouts: dict[tuple[str, ...], ShareLayout] = {}

    def share_layout(self, participants: tuple[str, ...]):
        """The expected seed-share list of a fast round over ``participants`` (kept for a few sets): a
        ShareLayout, or on a sparse graph a function of the sender giving the layout of P_r ∩ N[sender]
        (None for a sender outside P_r), each built once."""
        lay = self._layouts.get(participants)
        if lay is None:
            if len(self._layouts) >= 4:
                self._layouts.clear()
            if self.graph is None:
                lay = ShareLayout(participants)
            else:
                g, pset, built = self.graph, frozenset(participants), {}

                def lay(sender: str) -> ShareLayout | None:
                    if sender not in pset:
                        return None
                    out = built.get(sender)
                    if out is None:
                        out = built[sender] = ShareLayout(tuple(v for v in g.holders(sender) if v in pset))
                    return out
            self._layouts[participants] = lay
        return lay

    def row(self, dealer: str, holder: str) -> ShareRow:
        """The commitment row of ``dealer``'s shares held by ``holder`` (the blame path; read back if stored)."""
        rows = self._rows.get(dealer)
        if rows is None:
            rows = self._rows[dealer] = {row.holder: row for row in self._load_rows(dealer)}
        return rows[holder]

    def lagrange(self, xs: tuple[int, ...]) -> tuple[int, ...]:
        """Lagrange coefficients at 0 for holders at ``xs``, kept for the epoch (sparse graph: one set per dealer)."""
        lam = self._lagrange.get(xs)
        if lam is None:
            lam = self._lagrange[xs] = lagrange_coefficients.__wrapped__(xs)
        return lam

    @property
    def epoch(self) -> int:
        return self.announce.epoch

    def slot(self, round_id: int) -> int:
        a = self.announce
        if not a.first_round <= round_id <= a.last_round:
            raise SecAggError(f"round {round_id} is not a slot of epoch {a.epoch}")
        return round_id - a.first_round


def _blobs_digest(msg: ShareKeys) -> bytes:
    """A digest of a ShareKeys' blobs (recipients, nonces, ciphertexts): a resent ShareKeys must repeat them."""
    h = hashlib.sha256()
    for b in msg.encrypted:
        h.update(b.recipient.encode() + b"\0" + b.nonce)
        h.update(b.ciphertext)
    return h.digest()


class StoredRouting(Mapping):
    """The EpochShares of each recipient of an epoch whose blobs are stored (a coordinator with a storage),
    read from the storage when asked for: the coordinator never holds an epoch's O(n²·E) blobs at once, and
    ``size(h)`` gives the encoded size of h's message without reading anything (the transport writes it
    when it has room; server/session.py)."""

    def __init__(self, coordinator: "SecAggCoordinator", roster: EpochRoster, num_rounds: int,
                 commitments: Mapping[str, SignedCommitments], senders: Mapping[str, Sequence[str]]) -> None:
        self._coord, self._roster, self._num_rounds = coordinator, roster, num_rounds
        self._commitments, self._senders = commitments, senders
        self._index = {s: i for i, s in enumerate(roster.senders)}  # a site's record number in the storage

    def __getitem__(self, recipient: str) -> EpochShares:
        index, epoch = self._index, self._roster.epoch
        return self._message(recipient, lambda d: self._coord._stored_blob(epoch, index[recipient], index[d], recipient))

    def __contains__(self, recipient: object) -> bool:
        return recipient in self._senders

    def __iter__(self):
        return iter(self._senders)

    def __len__(self) -> int:
        return len(self._senders)

    def size(self, recipient: str) -> int:
        zeros: dict[int, bytes] = {}

        def blank(d: str) -> EncryptedShares:
            n = share_blob_size(d, recipient, self._num_rounds)
            return EncryptedShares(recipient, bytes(NONCE_SIZE), zeros.setdefault(n, bytes(n)))
        return sum(len(p) for p in self._message(recipient, blank).to_parts())

    def _message(self, recipient: str, blob) -> EpochShares:
        return _epoch_shares(self._coord.config, self._roster.epoch, recipient, self._commitments,
                             self._senders[recipient], blob)


def _epoch_shares(cfg: SessionConfig, epoch: int, recipient: str, commitments: Mapping[str, SignedCommitments],
                  dealers: Sequence[str], blob) -> EpochShares:
    """``recipient``'s EpochShares: each dealer's signed commitments and ``blob(dealer)`` (none for itself)."""
    return EpochShares(cfg.digest, epoch, recipient, tuple(
        RoutedShares(commitments[d], None if d == recipient else blob(d)) for d in dealers))


def _dealers_of_each(graph: NeighbourGraph | None, dealers: Sequence[str]) -> dict[str, list[str]]:
    """Each dealer's EpochShares carries these dealers' shares: all of them, or its closed neighbourhood's."""
    return {h: list(dealers) if graph is None else [d for d in dealers if graph.is_neighbour_or_self(h, d)]
            for h in dealers}
