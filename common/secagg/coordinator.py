"""Coordinator side of secure aggregation: explicit, transport-free state machines.

:class:`SecAggCoordinator` allocates epoch ids and round ids (monotonic, never
reused) and creates one state machine per epoch setup and per round:

* :class:`CoordinatorEpochSetup` — stages ``CollectingAdverts →
  CollectingShareKeys → SetupComplete`` (or ``SetupAborted``);
* :class:`CoordinatorRound` — stages ``CollectingInputs →
  CollectingSignatures → CollectingShares → RoundComplete`` (or
  ``RoundFailed``); a fast round is ``CollectingFastInputs → RoundComplete``
  (one exchange: every participant's masked input and seed shares, finalized
  only when all of P_r sent; docs/secagg.md §6).

``receive_*`` methods validate one site message and either record it or
refuse it with :class:`~fedsbdt.common.secagg.errors.InvalidMessage` (the site is then
treated as silent).  ``close_*`` methods are called by the transport when it
stops waiting (all expected messages in, or a timeout); they move to the next
stage and return the messages to send, or raise
:class:`~fedsbdt.common.secagg.errors.ProtocolAbort` when fewer than ``t`` sites
remain.  :meth:`CoordinatorRound.finalize` reconstructs the needed secrets,
checks every one against its commitment (blaming sites whose shares fail) and
returns the exact int64 sum over the survivor set U3.

By construction the coordinator only ever *accepts* seed shares of U3 members
and mask-key shares of P_r \\ U3 members, so it never holds both unmasking
secrets of one site for one round.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from itertools import filterfalse
from operator import itemgetter
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..fixedpoint import from_ring
from . import shamir
from .config import SessionConfig
from .encoding import Reader, Writer
from .errors import ConfigError, InvalidMessage, OutOfOrder, ProtocolAbort, SecAggError, StorageError
from .messages import (
    CONSISTENCY_DOMAIN,
    KIND_KEY,
    KIND_SEED,
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EpochAnnounce,
    EpochRoster,
    EncryptedShares,
    EpochShares,
    FastMaskedInput,
    FastRoundStart,
    MaskedInput,
    Message,
    RoundStart,
    RoutedShares,
    ShareKeys,
    ShareLayout,
    ShareRow,
    SignedCommitments,
    UnmaskRequest,
    UnmaskResponse,
    consistency_payload,
    decode_message,
)
from .primitives import (
    NONCE_SIZE,
    commit_self_mask_seed,
    commit_share,
    ed25519_verify,
    pair_mask_key,
    prg_expand,
    row_digest,
    self_mask_key,
    x25519_agree_many,
    x25519_public,
)
from .graph import NeighbourGraph
from .site import share_blob_size
from .storage import Storage

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


def _check_digest(config: SessionConfig, msg) -> None:
    if msg.session_digest != config.digest:
        raise InvalidMessage(f"{type(msg).__name__} from {getattr(msg, 'sender', '?')!r} carries a different session digest")


def _known(config: SessionConfig, site: str) -> None:
    if not config.in_roster(site):
        raise InvalidMessage(f"message from {site!r}, which is not in the session roster")


# =========================================================================== ready epoch

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
            lam = self._lagrange[xs] = shamir.lagrange_coefficients.__wrapped__(xs)
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


# =========================================================================== epoch setup stages

class SetupStage:
    name = "setup"

    def receive_advertise(self, setup: "CoordinatorEpochSetup", msg: AdvertiseKeys) -> None:
        raise OutOfOrder(f"AdvertiseKeys is not accepted in epoch stage {self.name}")

    def receive_share_keys(self, setup: "CoordinatorEpochSetup", msg: ShareKeys) -> None:
        raise OutOfOrder(f"ShareKeys is not accepted in epoch stage {self.name}")

    def close(self, setup: "CoordinatorEpochSetup"):
        raise OutOfOrder(f"nothing to close in epoch stage {self.name}")


@dataclass
class CollectingAdverts(SetupStage):
    adverts: dict[str, AdvertiseKeys] = field(default_factory=dict)
    used: set[bytes] = field(default_factory=set)  # every public key of the accepted adverts (O(E) per advert)
    name = "collecting-adverts"

    def receive_advertise(self, setup, msg):
        cfg, ann = setup.config, setup.announce
        _check_digest(cfg, msg)
        _known(cfg, msg.sender)
        if msg.epoch != ann.epoch or msg.first_round != ann.first_round or msg.num_rounds != ann.num_rounds:
            raise InvalidMessage(
                f"advertisement of {msg.sender!r} is for epoch {msg.epoch} / first round {msg.first_round} / "
                f"{msg.num_rounds} keys; expected {ann.epoch} / {ann.first_round} / {ann.num_rounds}"
            )
        prev = self.adverts.get(msg.sender)
        if prev is not None:
            if prev == msg:
                return
            raise InvalidMessage(f"{msg.sender!r} already advertised different keys for epoch {ann.epoch}")
        if not ed25519_verify(cfg.identity_key(msg.sender), AdvertiseKeys.SIGN_DOMAIN, msg.signing_bytes(), msg.signature):
            raise InvalidMessage(f"advertisement of {msg.sender!r} has an invalid signature")
        keys = {msg.encryption_key, *msg.mask_keys}
        if not self.used.isdisjoint(keys):
            raise InvalidMessage(f"advertisement of {msg.sender!r} repeats a public key of another site")
        self.adverts[msg.sender] = msg
        self.used |= keys

    def close(self, setup):
        n = len(self.adverts)
        if n < setup.config.threshold:
            raise ProtocolAbort(f"epoch {setup.announce.epoch}: only {n} sites advertised keys, threshold is {setup.config.threshold}")
        roster = EpochRoster(setup.config.digest, setup.announce.epoch, tuple(self.adverts[s] for s in sorted(self.adverts)))
        nxt = CollectingShareKeys(roster)
        nxt.graph = setup.config.epoch_graph(roster)
        return nxt, roster


@dataclass
class CollectingShareKeys(SetupStage):
    roster: EpochRoster
    received: dict[str, ShareKeys] = field(default_factory=dict)
    name = "collecting-share-keys"

    def __post_init__(self) -> None:
        self.epoch_digest = self.roster.epoch_digest()
        self.holders = self.roster.senders
        self.graph: NeighbourGraph | None = None  # set by CollectingAdverts.close in sparse mode
        self.blobs_digest: dict[str, bytes] = {}  # sender → a digest of its blobs (a resent ShareKeys must match)

    def receive_share_keys(self, setup, msg):
        cfg, ann = setup.config, setup.announce
        _check_digest(cfg, msg)
        _known(cfg, msg.sender)
        s = msg.sender
        if msg.epoch != ann.epoch:
            raise InvalidMessage(f"ShareKeys of {s!r} is for epoch {msg.epoch}, not {ann.epoch}")
        if s not in self.holders:
            raise InvalidMessage(f"ShareKeys from {s!r}, which did not advertise keys this epoch")
        prev = self.received.get(s)
        if prev is not None:  # a resent ShareKeys (its rows and blobs may have been stored and let go)
            if prev == setup._coordinator._kept(msg) and self.blobs_digest[s] == _blobs_digest(msg) and all(
                    row_digest(row.commitments) == dig for (_, dig), row in zip(msg.commitments.row_digests, msg.rows)):
                return
            raise InvalidMessage(f"{s!r} already sent different ShareKeys for epoch {ann.epoch}")
        c = msg.commitments
        if not ed25519_verify(cfg.identity_key(s), SignedCommitments.SIGN_DOMAIN, c.signing_bytes(), c.signature):
            raise InvalidMessage(f"commitments of {s!r} have an invalid signature")
        if c.epoch_digest != self.epoch_digest:
            raise InvalidMessage(f"{s!r} answered a different roster (epoch digest mismatch)")
        e = ann.num_rounds
        if len(c.seed_commitments) != e:
            raise InvalidMessage(f"{s!r} committed to {len(c.seed_commitments)} seeds, expected {e}")
        holders = self.holders if self.graph is None else self.graph.holders(s)
        if tuple(h for h, _ in c.row_digests) != holders or tuple(r.holder for r in msg.rows) != holders:
            raise InvalidMessage(f"ShareKeys of {s!r} does not commit to shares for exactly the epoch's holders")
        for (h, dig), row in zip(c.row_digests, msg.rows):
            if row_digest(row.commitments) != dig:
                raise InvalidMessage(f"commitment row of {s!r} for {h!r} does not match its signed digest")
        recipients = tuple(b.recipient for b in msg.encrypted)
        expected = tuple(h for h in holders if h != s)
        if recipients != expected:
            raise InvalidMessage(f"ShareKeys of {s!r} must carry one encrypted blob for each other holder {list(expected)}")
        for b in msg.encrypted:
            if len(b.ciphertext) != share_blob_size(s, b.recipient, e):
                raise InvalidMessage(f"encrypted shares from {s!r} to {b.recipient!r} have the wrong size")
        self.received[s] = setup._coordinator._keep(self.roster, msg)
        self.blobs_digest[s] = _blobs_digest(msg)

    def close(self, setup):
        cfg, ann = setup.config, setup.announce
        n = len(self.received)
        if n < cfg.threshold:
            raise ProtocolAbort(f"epoch {ann.epoch}: only {n} sites shared keys, threshold is {cfg.threshold}")
        dealers = sorted(self.received)
        if self.graph is not None:
            dealers = _threshold_core(self.graph, dealers)
            if len(dealers) < cfg.threshold:
                raise ProtocolAbort(
                    f"epoch {ann.epoch}: only {len(dealers)} sites shared keys with at least {self.graph.threshold} "
                    f"neighbours that did too, threshold is {cfg.threshold}"
                )
        coord = setup._coordinator
        commitments = {d: self.received[d].commitments for d in dealers}
        rows = coord._rows_of(self.roster, {d: self.received[d].rows for d in dealers})
        epoch = CoordinatorEpoch(ann, self.roster, commitments, rows, self.graph)
        routed = coord._stored_routing(epoch)
        if routed is None:
            senders = _dealers_of_each(self.graph, dealers)
            blobs = {d: {b.recipient: b for b in self.received[d].encrypted} for d in dealers}
            routed = {h: _epoch_shares(cfg, ann.epoch, h, commitments, senders[h], lambda d, h=h: blobs[d][h])
                      for h in dealers}
        if self.graph is not None:  # per-epoch work: each dealer's reconstruction set when nobody drops out
            for d in dealers:
                epoch.lagrange(tuple(sorted(cfg.x_coordinate(h) for h in self.graph.holders(d) if h in routed)[: self.graph.threshold]))
        return SetupComplete(epoch), routed


def _dealers_of_each(graph: NeighbourGraph | None, dealers: Sequence[str]) -> dict[str, list[str]]:
    """Each dealer's EpochShares carries these dealers' shares: all of them, or its closed neighbourhood's."""
    return {h: list(dealers) if graph is None else [d for d in dealers if graph.is_neighbour_or_self(h, d)]
            for h in dealers}


def _threshold_core(graph: NeighbourGraph, dealers: list[str]) -> list[str]:
    """Dealers left after repeatedly removing those with fewer than t_k dealers in their closed neighbourhood
    (their secrets could never be recovered, and they could not meet the local threshold themselves)."""
    alive = set(dealers)
    changed = True
    while changed:
        changed = False
        for d in sorted(alive):
            if sum(1 for h in graph.holders(d) if h in alive) < graph.threshold:
                alive.discard(d)
                changed = True
    return sorted(alive)


@dataclass
class SetupComplete(SetupStage):
    epoch: CoordinatorEpoch
    name = "complete"


@dataclass
class SetupAborted(SetupStage):
    reason: str
    name = "aborted"


class CoordinatorEpochSetup:
    """State machine of one epoch's setup at the coordinator."""

    def __init__(self, coordinator: "SecAggCoordinator", announce: EpochAnnounce) -> None:
        self._coordinator = coordinator
        self.config = coordinator.config
        self.announce = announce
        self.stage: SetupStage = CollectingAdverts()

    @property
    def epoch(self) -> int:
        return self.announce.epoch

    @property
    def advertised(self) -> tuple[str, ...]:
        st = self.stage
        if isinstance(st, CollectingAdverts):
            return tuple(sorted(st.adverts))
        if isinstance(st, CollectingShareKeys):
            return st.holders
        if isinstance(st, SetupComplete):
            return st.epoch.roster.senders
        return ()

    def receive_advertise(self, msg: AdvertiseKeys) -> None:
        """Validate and record one site's advertisement."""
        self.stage.receive_advertise(self, msg)

    def close_advertise(self) -> EpochRoster:
        """Stop collecting advertisements; returns the roster to broadcast to every advertiser (A1)."""
        if not isinstance(self.stage, CollectingAdverts):
            raise OutOfOrder(f"cannot close advertisements in epoch stage {self.stage.name}")
        return self._close()

    def receive_share_keys(self, msg: ShareKeys) -> None:
        """Validate and record one site's ShareKeys."""
        self.stage.receive_share_keys(self, msg)

    def close_share_keys(self) -> dict[str, EpochShares]:
        """Stop collecting ShareKeys; returns the EpochShares to send to each dealer (A2). The epoch is then ready."""
        if not isinstance(self.stage, CollectingShareKeys):
            raise OutOfOrder(f"cannot close share keys in epoch stage {self.stage.name}")
        routed = self._close()
        assert isinstance(self.stage, SetupComplete)
        self._coordinator._epoch_ready(self.stage.epoch)
        return routed

    def _close(self):
        try:
            self.stage, out = self.stage.close(self)
        except ProtocolAbort as exc:
            self.stage = SetupAborted(str(exc))
            raise
        return out


# =========================================================================== round stages

@dataclass(frozen=True)
class RoundResult:
    """Outcome of a completed round: the exact int64 sum of the survivors' inputs."""

    epoch: int
    round_id: int
    participants: tuple[str, ...]
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    total: np.ndarray
    blamed: tuple[str, ...] = ()


def remove_masks(
    masked: Iterable[np.ndarray],
    vector_len: int,
    self_seeds: Mapping[str, bytes],
    dropped: Mapping[str, tuple[bytes, Sequence[tuple[str, bytes]]]],
    *,
    digest: bytes,
    epoch: int,
    round_id: int,
) -> np.ndarray:
    """The exact int64 sum over the survivors, from their masked inputs and the recovered secrets (§2).

    ``Σ_{u∈U3} y_u − Σ_{v∈U3} PRG(k_self,v) − Σ_{w dropped} Σ_{v peers of w} sign(v,w)·PRG(k_vw)``
    (mod 2^64), read as int64.  ``self_seeds`` maps every survivor v to its seed b_{v,r};
    ``dropped`` maps each dropped site w to its recovered round mask key and the (site, mask public
    key) pairs of the survivors it masked with (all of U3 on the complete graph, its surviving
    neighbours on a sparse one, none in a fast round, where nobody dropped).  Pure: no state, no I/O.
    """
    d = vector_len
    total = np.zeros(d, dtype=np.uint64)
    for y in masked:
        total += y
    for v, seed in self_seeds.items():
        total -= prg_expand(self_mask_key(seed, digest, epoch, round_id, v, d), d)
    for w, (key, peers) in dropped.items():
        for (v, _), s in zip(peers, x25519_agree_many(key, [pk for _, pk in peers])):
            m = prg_expand(pair_mask_key(s, digest, epoch, round_id, v, w, d), d)
            if v < w:  # v added +PRG(s_vw)
                total -= m
            else:
                total += m
    return from_ring(total).copy()


def _check_input(rnd: "CoordinatorRound", inputs: dict, msg, what: str) -> None:
    """Checks shared by a MaskedInput and a FastMaskedInput: round, sender ∈ P_r, length, no second version."""
    rnd._check_common(msg)
    if msg.sender not in rnd.participants:
        raise InvalidMessage(f"round {rnd.round_id}: {what} from non-participant {msg.sender!r}")
    if msg.masked.shape[0] != rnd.vector_len:
        raise InvalidMessage(
            f"round {rnd.round_id}: masked input of {msg.sender!r} has length {msg.masked.shape[0]}, expected {rnd.vector_len}"
        )
    prev = inputs.get(msg.sender)
    if prev is not None and prev != msg:
        raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} sent two different {what}s")


class RoundStage:
    name = "round"

    def receive(self, rnd: "CoordinatorRound", msg) -> None:
        raise OutOfOrder(f"{type(msg).__name__} is not accepted in round stage {self.name}")


@dataclass
class CollectingInputs(RoundStage):
    inputs: dict[str, MaskedInput] = field(default_factory=dict)
    name = "collecting-inputs"

    def receive(self, rnd, msg):
        if not isinstance(msg, MaskedInput):
            return super().receive(rnd, msg)
        _check_input(rnd, self.inputs, msg, "masked input")
        self.inputs[msg.sender] = msg

    def close(self, rnd):
        u3 = tuple(sorted(self.inputs))
        if len(u3) < rnd.t:
            raise ProtocolAbort(f"round {rnd.round_id}: only {len(u3)} masked inputs, threshold is {rnd.t}")
        req = ConsistencyRequest(rnd.config.digest, rnd.epoch.epoch, rnd.round_id, u3)
        return CollectingSignatures(self.inputs, req), req


@dataclass
class CollectingSignatures(RoundStage):
    inputs: dict[str, MaskedInput]
    request: ConsistencyRequest
    signatures: dict[str, bytes] = field(default_factory=dict)
    name = "collecting-signatures"

    def __post_init__(self) -> None:
        self._payload: bytes | None = None

    def receive(self, rnd, msg):
        if not isinstance(msg, ConsistencySignature):
            return super().receive(rnd, msg)
        rnd._check_common(msg)
        if msg.sender not in self.request.survivors:
            raise InvalidMessage(f"round {rnd.round_id}: consistency signature from non-survivor {msg.sender!r}")
        if self._payload is None:
            self._payload = consistency_payload(
                rnd.config.digest, rnd.epoch.epoch, rnd.epoch.epoch_digest, rnd.round_id, rnd.vector_len,
                rnd.participants, self.request.survivors,
            )
        if not ed25519_verify(rnd.config.identity_key(msg.sender), CONSISTENCY_DOMAIN, self._payload, msg.signature):
            raise InvalidMessage(f"round {rnd.round_id}: invalid consistency signature from {msg.sender!r}")
        self.signatures[msg.sender] = msg.signature

    def close(self, rnd):
        if len(self.signatures) < rnd.t:
            raise ProtocolAbort(f"round {rnd.round_id}: only {len(self.signatures)} consistency signatures, threshold is {rnd.t}")
        u3 = self.request.survivors
        silent = [] if rnd.epoch.graph is None else [s for s in u3 if s not in self.signatures]
        if silent:  # on a sparse graph their neighbours reveal only to a set they signed (site.py)
            raise ProtocolAbort(f"round {rnd.round_id}: survivors {silent} did not sign the survivor set")
        dropped = tuple(p for p in rnd.participants if p not in self.inputs)
        req = UnmaskRequest(
            rnd.config.digest, rnd.epoch.epoch, rnd.round_id, u3, dropped,
            tuple(sorted(self.signatures.items())),
        )
        stage = CollectingShares if rnd.epoch.graph is None else CollectingSharesOnGraph
        return stage(self.inputs, self.request, req), req


@dataclass
class CollectingShares(RoundStage):
    inputs: dict[str, MaskedInput]
    consistency: ConsistencyRequest
    request: UnmaskRequest
    responses: dict[str, UnmaskResponse] = field(default_factory=dict)
    name = "collecting-shares"

    def receive(self, rnd, msg):
        if not isinstance(msg, UnmaskResponse):
            return super().receive(rnd, msg)
        rnd._check_common(msg)
        req = self.request
        if msg.sender not in req.survivors:
            raise InvalidMessage(f"round {rnd.round_id}: unmask response from non-survivor {msg.sender!r}")
        survivors, dropped = self._expected(rnd, msg.sender)
        if tuple(map(itemgetter(0), msg.seed_shares)) != survivors:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} must reveal seed shares for exactly the survivors")
        if tuple(map(itemgetter(0), msg.key_shares)) != dropped:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} must reveal mask-key shares for exactly the dropped sites")
        prev = self.responses.get(msg.sender)
        if prev is not None and prev != msg:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} sent two different unmask responses")
        self.responses[msg.sender] = msg

    def _expected(self, rnd, sender: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The dealers whose seed shares / mask-key shares ``sender`` must reveal."""
        return self.request.survivors, self.request.dropped

    def finalize(self, rnd) -> RoundResult:
        t = rnd.t
        if len(self.responses) < t:
            raise ProtocolAbort(f"round {rnd.round_id}: only {len(self.responses)} unmask responses, threshold is {t}")
        ep, slot = rnd.epoch, rnd.slot
        holders = sorted(self.responses, key=rnd.config.x_coordinate)
        blamed: set[str] = set()
        seed_tab = {h: dict(self.responses[h].seed_shares) for h in holders}
        key_tab = {h: dict(self.responses[h].key_shares) for h in holders}
        seeds = rnd._recover(self.request.survivors, seed_tab, holders, KIND_SEED, rnd.seed_matches, blamed)
        keys = rnd._recover(self.request.dropped, key_tab, holders, KIND_KEY, rnd.key_matches, blamed)
        u3 = self.request.survivors
        peers = tuple((v, ep.mask_keys[v][slot]) for v in u3)
        total = rnd.unmask([self.inputs[u].masked for u in u3], seeds, {w: (keys[w], peers) for w in self.request.dropped})
        return RoundResult(ep.epoch, rnd.round_id, rnd.participants, u3, self.request.dropped, total, tuple(sorted(blamed)))


@dataclass
class CollectingSharesOnGraph(CollectingShares):
    """Unmask stage on a sparse graph: each holder reveals for its closed neighbourhood only; every secret
    is reconstructed from t_k holders of that dealer's neighbourhood (O(n·k) work instead of O(n²))."""

    name = "collecting-shares"

    def __post_init__(self) -> None:
        self._alive, self._dropped = frozenset(self.request.survivors), frozenset(self.request.dropped)

    def _expected(self, rnd, sender):
        holders = rnd.epoch.graph.holders(sender)  # sorted, like the request's lists: O(k), not O(n)
        return tuple(v for v in holders if v in self._alive), tuple(w for w in holders if w in self._dropped)

    def finalize(self, rnd) -> RoundResult:
        g = rnd.epoch.graph
        ep, slot, r = rnd.epoch, rnd.slot, rnd.round_id
        blamed: set[str] = set()
        seed_tab = {h: dict(m.seed_shares) for h, m in self.responses.items()}
        key_tab = {h: dict(m.key_shares) for h, m in self.responses.items()}
        u3, dropped = self.request.survivors, self.request.dropped
        seeds = _recover_on_graph(rnd, u3, seed_tab, KIND_SEED, rnd.seed_matches, blamed)
        keys = _recover_on_graph(rnd, dropped, key_tab, KIND_KEY, rnd.key_matches, blamed)
        alive = set(u3)
        total = rnd.unmask(
            [self.inputs[u].masked for u in u3], seeds,
            {w: (keys[w], tuple((v, ep.mask_keys[v][slot]) for v in g.neighbours(w) if v in alive)) for w in dropped},
        )
        return RoundResult(ep.epoch, r, rnd.participants, u3, dropped, total, tuple(sorted(blamed)))


def _recover_on_graph(rnd, dealers, table, kind, check, blamed: set[str]) -> dict[str, bytes]:
    """Each dealer's secret from t_k holders of its closed neighbourhood (sparse graph; ``table``: holder →
    dealer → share).  Interpolates from the first t_k holders; on a commitment failure the general recovery
    checks every share, blames bad holders and retries with the valid ones."""
    g, ep, r, x = rnd.epoch.graph, rnd.epoch, rnd.round_id, rnd.config.x_coordinate
    tk = g.threshold
    out: dict[str, bytes] = {}
    for v in dealers:
        holders = sorted((h for h in g.holders(v) if h in table), key=x)
        if len(holders) < tk:
            raise ProtocolAbort(f"round {r}: only {len(holders)} neighbours of {v!r} revealed shares, local threshold is {tk}")
        lam = ep.lagrange(tuple(x(h) for h in holders[:tk]))
        value = sum(c * int.from_bytes(table[h][v], "big") for c, h in zip(lam, holders)) % shamir.PRIME
        secret = value.to_bytes(32, "big") if value < 2**256 else b""
        if secret and check(v, secret):
            out[v] = secret
        else:
            out.update(rnd._recover((v,), table, holders, kind, check, blamed, t=tk))
    return out


@dataclass
class CollectingFastInputs(RoundStage):
    """The only stage of a fast round: each participant's masked input with its seed shares of all of P_r."""

    inputs: dict[str, FastMaskedInput] = field(default_factory=dict)
    name = "collecting-fast-inputs"

    def receive(self, rnd, msg):
        if not isinstance(msg, FastMaskedInput):
            return super().receive(rnd, msg)
        _check_input(rnd, self.inputs, msg, "fast input")
        g = rnd.epoch.graph
        expected = rnd.participants if g is None else rnd._layout(msg.sender).dealers
        if msg.dealers != expected:
            raise InvalidMessage(f"round {rnd.round_id}: {msg.sender!r} must send seed shares for exactly the participants"
                                 + ("" if g is None else " in its neighbourhood"))
        self.inputs[msg.sender] = msg

    def finalize(self, rnd) -> RoundResult:
        p, r = rnd.participants, rnd.round_id
        missing = list(filterfalse(self.inputs.__contains__, p))
        if missing:  # nobody may drop in a fast round: without their inputs the self-masks would not cancel
            raise ProtocolAbort(f"round {r}: fast round without the inputs of {missing}; nothing is released "
                                "(retry in a new round)")
        blamed: set[str] = set()
        if rnd.epoch.graph is not None:  # a fast-only sparse session: each seed from its neighbourhood's shares
            seeds = _recover_on_graph(rnd, p, {h: dict(self.inputs[h].seed_shares) for h in p}, KIND_SEED,
                                      rnd.seed_matches, blamed)
            total = rnd.unmask([self.inputs[u].masked for u in p], seeds, {})
            return RoundResult(rnd.epoch.epoch, r, p, p, (), total, tuple(sorted(blamed)))
        holders = sorted(p, key=rnd.config.x_coordinate)
        # every reply lists the shares in P_r's order (checked on receipt): the first t holders' share bytes
        # interpolated at once, without a per-holder dict (built only if a share must be blamed)
        xs = [rnd.config.x_coordinate(h) for h in holders[:rnd.t]]
        values = shamir.reconstruct_many_packed(xs, [self.inputs[h].share_matrix() for h in holders[:rnd.t]], rnd.t)
        seed_tab = _Lazy(lambda: {h: dict(self.inputs[h].seed_shares) for h in holders})
        seeds = rnd._recover(p, seed_tab, holders, KIND_SEED, rnd.seed_matches, blamed, values=values)
        total = rnd.unmask([self.inputs[u].masked for u in p], seeds, {})
        return RoundResult(rnd.epoch.epoch, r, p, p, (), total, tuple(sorted(blamed)))


class _Lazy:
    """A mapping built on first use (the per-holder share tables of the blame path)."""

    def __init__(self, build) -> None:
        self._build, self._table = build, None

    def __getitem__(self, key):
        if self._table is None:
            self._table = self._build()
        return self._table[key]


@dataclass
class RoundComplete(RoundStage):
    result: RoundResult
    name = "complete"


@dataclass
class RoundFailed(RoundStage):
    reason: str
    name = "failed"


class CoordinatorRound:
    """State machine of one round at the coordinator (create with :meth:`SecAggCoordinator.begin_round`)."""

    def __init__(self, config: SessionConfig, epoch: CoordinatorEpoch, start: RoundStart) -> None:
        self.config = config
        self.epoch = epoch
        self.start = start
        self.round_id = start.round_id
        self.vector_len = start.vector_len
        self.participants = start.participants
        self.slot = epoch.slot(start.round_id)
        self.t = config.threshold
        self.stage: RoundStage = CollectingFastInputs() if start.fast else CollectingInputs()
        self._layout = epoch.share_layout(self.participants) if start.fast else None

    @property
    def fast(self) -> bool:
        """True for a fast round (one exchange; finalize needs every participant's input)."""
        return self.start.fast

    # ---------------------------------------------------------------- incoming
    def receive(self, message: Message | bytes) -> None:
        """Validate and record any site→coordinator round message (object or canonical bytes)."""
        if isinstance(message, (bytes, bytearray, memoryview)):
            message = self.decode(message)
        self.stage.receive(self, message)

    def decode(self, data: bytes) -> Message:
        """:func:`decode_message`; a fast round's reply of the expected shape (seed shares for exactly P_r)
        is decoded in bulk (:meth:`FastMaskedInput.decode_expected`), anything else generically."""
        if self._layout is not None and isinstance(self.stage, CollectingFastInputs):
            msg = FastMaskedInput.decode_expected(bytes(data), self._layout)
            if msg is not None:
                return msg
        return decode_message(data)

    receive_masked_input = receive
    receive_consistency = receive
    receive_unmask = receive

    # ---------------------------------------------------------------- transitions
    def close_inputs(self) -> ConsistencyRequest:
        """Stop collecting masked inputs; returns the ConsistencyRequest to send to every survivor (U3)."""
        return self._advance(CollectingInputs, "close inputs")

    def close_consistency(self) -> UnmaskRequest:
        """Stop collecting signatures; returns the UnmaskRequest to send to the signers (U4)."""
        return self._advance(CollectingSignatures, "close consistency")

    def finalize(self) -> RoundResult:
        """Reconstruct, unmask and return the exact sum over U3 (needs ≥ t unmask responses).

        In a fast round: straight from the inputs, the exact sum over P_r; ProtocolAbort naming the
        missing sites unless every participant sent its input.
        """
        st = self.stage
        if not isinstance(st, (CollectingShares, CollectingFastInputs)):
            raise OutOfOrder(f"cannot finalize in round stage {st.name}")
        try:
            result = st.finalize(self)
        except ProtocolAbort as exc:
            self.stage = RoundFailed(str(exc))
            raise
        self.stage = RoundComplete(result)
        return result

    def abort(self, reason: str) -> None:
        """Abandon the round (e.g. on a transport timeout); nothing more is accepted."""
        self.stage = RoundFailed(reason)

    # ---------------------------------------------------------------- views for the transport
    @property
    def survivors(self) -> tuple[str, ...]:
        st = self.stage
        if isinstance(st, (CollectingInputs, CollectingFastInputs)):
            return tuple(sorted(st.inputs))
        req = getattr(st, "request", None)
        if isinstance(req, ConsistencyRequest):
            return req.survivors
        if isinstance(req, UnmaskRequest):
            return req.survivors
        if isinstance(st, RoundComplete):
            return st.result.survivors
        return ()

    def awaiting(self) -> tuple[str, ...]:
        """Sites whose message the current stage still waits for."""
        st = self.stage  # (filterfalse: called after every message, so O(n) per call stays in C)
        if isinstance(st, (CollectingInputs, CollectingFastInputs)):
            return tuple(filterfalse(st.inputs.__contains__, self.participants))
        if isinstance(st, CollectingSignatures):
            return tuple(filterfalse(st.signatures.__contains__, st.request.survivors))
        if isinstance(st, CollectingShares):
            return tuple(filterfalse(st.responses.__contains__, map(itemgetter(0), st.request.signatures)))
        return ()

    # ---------------------------------------------------------------- internals
    def _advance(self, expected: type, what: str):
        st = self.stage
        if not isinstance(st, expected):
            raise OutOfOrder(f"cannot {what} in round stage {st.name}")
        try:
            self.stage, out = st.close(self)
        except ProtocolAbort as exc:
            self.stage = RoundFailed(str(exc))
            raise
        return out

    def seed_matches(self, dealer: str, secret: bytes) -> bool:
        """Does ``secret`` open the dealer's signed commitment to its self-mask seed of this round?"""
        ep, slot = self.epoch, self.slot
        return commit_self_mask_seed(secret, self.config.digest, ep.epoch, slot, dealer) == \
            ep.commitments[dealer].seed_commitments[slot]

    def key_matches(self, dealer: str, secret: bytes) -> bool:
        """Is ``secret`` the private key of the dealer's advertised mask key of this round?"""
        return x25519_public(secret) == self.epoch.mask_keys[dealer][self.slot]

    def unmask(self, masked, self_seeds, dropped) -> np.ndarray:
        """:func:`remove_masks` with this round's context."""
        return remove_masks(masked, self.vector_len, self_seeds, dropped,
                            digest=self.config.digest, epoch=self.epoch.epoch, round_id=self.round_id)

    def _check_common(self, msg) -> None:
        _check_digest(self.config, msg)
        _known(self.config, msg.sender)
        if msg.round_id != self.round_id or msg.epoch != self.epoch.epoch:
            raise InvalidMessage(
                f"{type(msg).__name__} from {msg.sender!r} is for epoch {msg.epoch} round {msg.round_id}, "
                f"not epoch {self.epoch.epoch} round {self.round_id}"
            )

    def _recover(self, dealers, table, holders, kind, check, blamed: set[str], t: int | None = None,
                 values=None) -> dict[str, bytes]:
        """Reconstruct one secret per dealer; verify it against the dealer's commitment.

        Fast path: interpolate from the first t responders (one set of Lagrange
        coefficients for all dealers).  If a result fails its commitment, check
        every share against the dealer's per-share commitments, blame holders
        whose shares fail, and retry with valid shares only.
        """
        t, ep, slot = self.t if t is None else t, self.epoch, self.slot
        out: dict[str, bytes] = {}
        if not dealers:
            return out
        xs = [self.config.x_coordinate(h) for h in holders]
        if values is None:  # the interpolation of each dealer's shares from the first t holders
            rows = [[int.from_bytes(table[h][dlr], "big") for h in holders[:t]] for dlr in dealers]
            values = shamir.reconstruct_many(xs, rows, t)
        for dlr, value in zip(dealers, values):
            if value < 2**256:
                secret = value.to_bytes(32, "big")
                if check(dlr, secret):
                    out[dlr] = secret
                    continue
            good = []
            for h, x in zip(holders, xs):
                share = table[h][dlr]
                expected = ep.row(dlr, h).commitment(slot, kind)
                if commit_share(share, self.config.digest, ep.epoch, slot, kind, dlr, h) == expected:
                    good.append((x, int.from_bytes(share, "big")))
                else:
                    blamed.add(h)
            if len(good) < t:
                raise ProtocolAbort(
                    f"round {self.round_id}: only {len(good)} valid shares for {dlr!r} (threshold {t}); "
                    f"shares failing their commitments came from {sorted(blamed)}",
                    blame=tuple(sorted(blamed)),
                )
            value = shamir.reconstruct(good, t)
            secret = value.to_bytes(32, "big") if value < 2**256 else b""
            if not secret or not check(dlr, secret):
                raise ProtocolAbort(
                    f"round {self.round_id}: shares dealt by {dlr!r} are inconsistent with its commitment",
                    blame=(dlr,),
                )
            out[dlr] = secret
        return out


# =========================================================================== facade

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

    # Storage layout of an epoch (``coordinator/epoch/<id>/…``): ``dealer/<i>`` is the ShareKeys of the roster's
    # i-th site without its encrypted shares (signed commitments and per-share commitment rows: O(n·E) bytes),
    # written as it arrives, so no step holds or writes the whole epoch's O(n²·E) rows at once; ``head`` (the
    # announcement, the roster and the dealers) is written when the epoch is ready.

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
