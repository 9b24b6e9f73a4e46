"""The coordinator's epoch setup: stages ``CollectingAdverts → CollectingShareKeys → SetupComplete`` (or
``SetupAborted``), one class each, driven by :class:`CoordinatorEpochSetup` (docs/secagg.md: AdvertiseKeys,
ShareKeys).  A stage's ``close`` returns the next stage and what to send."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidMessage, OutOfOrder, ProtocolAbort
from ..messages import AdvertiseKeys, EpochAnnounce, EpochRoster, EpochShares, ShareKeys, SignedCommitments
from ..primitives import ed25519_verify, row_digest
from ..graph import NeighbourGraph
from ..site import share_blob_size
from .epoch import CoordinatorEpoch, _blobs_digest, _check_digest, _dealers_of_each, _epoch_shares, _known


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
