"""Site side of secure aggregation: explicit, transport-free state machines.

A :class:`SecAggSite` is the object a site daemon owns for one session.  It
holds one state machine per epoch and one per round; each machine is a small
stage object (``EpochAdvertised → EpochSharesSent → EpochReady``;
``RoundInputSent → RoundSigned → RoundRevealed``, or in a fast round the
single ``RoundAnsweredFast``, plus ``…Aborted``).  Stage
methods validate an incoming message completely and return the next stage,
the outgoing message and the record to persist; the facade writes the record
to storage *before* switching stage and handing the message back.  So:

* every incoming message is validated, and a refused message
  (:class:`~fedsbdt.common.secagg.errors.InvalidMessage` and subclasses) leaves the
  state unchanged;
* evidence that the protocol cannot continue safely raises
  :class:`~fedsbdt.common.secagg.errors.ProtocolAbort` and moves that epoch/round to
  its aborted stage;
* a site restarted on the same storage resumes where it was and answers a
  repeated request with the byte-identical message it sent before; a request
  that contradicts what it already sent is a :class:`ReplayError`.

The site never sees floats: it masks an int64 vector (optionally plus an
int64 noise share) in Z_{2^64}.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..fixedpoint import FixedPointError, to_ring
from . import shamir
from .config import SessionConfig
from .encoding import Reader, Writer
from .errors import InvalidMessage, OutOfOrder, ProtocolAbort, ReplayError, SecAggError, StorageError
from .messages import (
    CONSISTENCY_DOMAIN,
    KIND_KEY,
    KIND_SEED,
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShares,
    EpochAnnounce,
    EpochRoster,
    EpochShares,
    FastMaskedInput,
    MaskedInput,
    Message,
    RoundStart,
    ShareKeys,
    ShareRow,
    SignedCommitments,
    UnmaskRequest,
    UnmaskResponse,
    consistency_payload,
    decode_message,
)
from .primitives import (
    KEY_SIZE,
    NONCE_SIZE,
    RandBytes,
    aead_decrypt,
    aead_encrypt,
    commit_self_mask_seed,
    commit_share,
    ed25519_public,
    ed25519_sign,
    ed25519_verify,
    pair_mask_key,
    prg_expand,
    row_digest,
    self_mask_key,
    share_associated_data,
    share_encryption_key,
    x25519_agree,
    x25519_agree_many,
    x25519_generate,
)
from .records import (
    WATERMARK_KEY,
    EpochReadyRecord,
    EpochSecretsRecord,
    EpochSharedRecord,
    RoundInputRecord,
    RoundRevealedRecord,
    RoundSignedRecord,
    Watermark,
    epoch_key,
    round_key,
)
from .graph import NeighbourGraph
from .storage import Storage

_SHARE = shamir.SHARE_SIZE


@dataclass(frozen=True)
class SiteContext:
    """Immutable per-site parameters every stage needs."""

    config: SessionConfig
    site_id: str
    identity: Ed25519PrivateKey
    randbytes: RandBytes
    #: optional caller policy: the smallest survivor set |U3| this site signs in a round, as a pure
    #: function of the round's RoundStart (e.g. the federation's k_r + c noise rule); never below t
    min_survivors: Callable[[RoundStart], int] | None = None
    #: whether this site answers a fast RoundStart (one exchange, nothing signed; docs/secagg.md §6)
    allow_fast: bool = True

    @property
    def digest(self) -> bytes:
        return self.config.digest

    @property
    def t(self) -> int:
        return self.config.threshold


def _check_digest(ctx: SiteContext, msg) -> None:
    if msg.session_digest != ctx.digest:
        raise InvalidMessage(
            f"{type(msg).__name__} carries a different session digest (another session, roster or threshold)"
        )


def share_plaintext(dealer: str, recipient: str, epoch: int, num_rounds: int, shares: bytes) -> bytes:
    """Plaintext of one AEAD share blob: ids repeated inside, then 2·E shares (slot-major)."""
    return Writer().text(dealer).text(recipient).u64(epoch).u32(num_rounds).raw(shares).getvalue()


def share_blob_size(dealer: str, recipient: str, num_rounds: int) -> int:
    """Exact ciphertext size of a share blob (plaintext + 16-byte tag)."""
    return len(share_plaintext(dealer, recipient, 0, num_rounds, bytes(2 * num_rounds * _SHARE))) + 16


def share_row_commitments(
    digest: bytes, epoch: int, dealer: str, holder: str, shares: bytes, num_rounds: int
) -> bytes:
    """The 2·E commitments (slot-major) to one holder's shares from one dealer."""
    out = []
    for j in range(num_rounds):
        for kind in (KIND_SEED, KIND_KEY):
            off = (2 * j + kind) * _SHARE
            out.append(commit_share(shares[off : off + _SHARE], digest, epoch, j, kind, dealer, holder))
    return b"".join(out)


# =========================================================================== epoch stages

class EpochStage:
    """Base of the per-epoch stages; every handler not overridden refuses the message as out of order."""

    name = "epoch"

    def on_roster(self, ctx: SiteContext, msg: EpochRoster) -> tuple["EpochStage", ShareKeys, EpochSharedRecord | None]:
        raise OutOfOrder(f"EpochRoster is not expected in stage {self.name}")

    def on_shares(self, ctx: SiteContext, msg: EpochShares) -> tuple["EpochStage", EpochReadyRecord | None]:
        raise OutOfOrder(f"EpochShares is not expected in stage {self.name}")


@dataclass
class EpochAdvertised(EpochStage):
    """Keys advertised; waiting for the roster of advertisements (A1)."""

    secrets: EpochSecretsRecord
    name = "advertised"

    @property
    def announce(self) -> EpochAnnounce:
        return self.secrets.announce

    def on_roster(self, ctx: SiteContext, msg: EpochRoster):
        ann = self.announce
        cfg = ctx.config
        me = ctx.site_id
        _check_digest(ctx, msg)
        if msg.epoch != ann.epoch:
            raise InvalidMessage(f"roster is for epoch {msg.epoch}, not {ann.epoch}")
        seen: set[bytes] = set()
        for a in msg.adverts:
            if not cfg.in_roster(a.sender):
                raise InvalidMessage(f"roster lists {a.sender!r}, which is not in the session roster")
            if a.first_round != ann.first_round or a.num_rounds != ann.num_rounds:
                raise InvalidMessage(f"advertisement of {a.sender!r} is for another round range or E")
            if a.sender == me:
                if a != self.secrets.advert:
                    raise InvalidMessage("roster alters this site's own advertisement")
            elif not ed25519_verify(cfg.identity_key(a.sender), AdvertiseKeys.SIGN_DOMAIN, a.signing_bytes(), a.signature):
                raise InvalidMessage(f"advertisement of {a.sender!r} has an invalid signature")
            for k in (a.encryption_key, *a.mask_keys):
                if k in seen:
                    raise InvalidMessage(f"advertisement of {a.sender!r} repeats a public key of another site")
                seen.add(k)
        senders = msg.senders
        if me not in senders:
            raise ProtocolAbort(f"epoch {ann.epoch}: roster omits this site")
        if len(senders) < ctx.t:
            raise ProtocolAbort(f"epoch {ann.epoch}: only {len(senders)} sites advertised keys, threshold is {ctx.t}")
        return self._share(ctx, msg)

    def _share(self, ctx: SiteContext, roster: EpochRoster):
        cfg, me, sec = ctx.config, ctx.site_id, self.secrets
        epoch, e = sec.announce.epoch, sec.announce.num_rounds
        digest = ctx.digest
        edig = roster.epoch_digest()
        graph = cfg.epoch_graph(roster)  # None: complete graph, every site of A1 holds shares
        holders = roster.senders if graph is None else graph.holders(me)
        threshold = ctx.t if graph is None else graph.threshold
        if threshold > len(holders):
            raise ProtocolAbort(f"epoch {epoch}: {len(holders)} holders cannot meet the local threshold {threshold}")
        xs = [cfg.x_coordinate(h) for h in holders]
        secrets = [shamir.secret_to_int(s) for s in sec.seeds] + [shamir.secret_to_int(k) for k in sec.mask_private]
        table = shamir.split_many(secrets, threshold, xs, ctx.randbytes)  # table[i][k]
        enc = shamir.encode_share
        rows, row_digests, blobs = [], [], []
        own = b""
        adverts = {a.sender: a for a in roster.adverts}
        for k, h in enumerate(holders):
            shares = b"".join(enc(table[j][k]) + enc(table[e + j][k]) for j in range(e))
            commitments = share_row_commitments(digest, epoch, me, h, shares, e)
            rows.append(ShareRow(h, commitments))
            row_digests.append((h, row_digest(commitments)))
            if h == me:
                own = shares
                continue
            shared = x25519_agree(sec.encryption_private, adverts[h].encryption_key)
            key = share_encryption_key(shared, digest, epoch, edig, me, h)
            nonce = ctx.randbytes(NONCE_SIZE)
            ad = share_associated_data(digest, epoch, edig, me, h)
            blobs.append(EncryptedShares(h, nonce, aead_encrypt(key, nonce, share_plaintext(me, h, epoch, e, shares), ad)))
        seed_commitments = tuple(commit_self_mask_seed(s, digest, epoch, j, me) for j, s in enumerate(sec.seeds))
        unsigned = SignedCommitments(digest, epoch, me, edig, seed_commitments, tuple(row_digests), bytes(64))
        signed = SignedCommitments(
            digest, epoch, me, edig, seed_commitments, tuple(row_digests),
            ed25519_sign(ctx.identity, SignedCommitments.SIGN_DOMAIN, unsigned.signing_bytes()),
        )
        msg = ShareKeys(digest, epoch, me, signed, tuple(rows), tuple(blobs))
        record = EpochSharedRecord(roster, msg, own)
        return EpochSharesSent(sec, record), msg, record


@dataclass
class EpochSharesSent(EpochStage):
    """Shares sent; waiting for the dealers' shares routed to this site (A2)."""

    secrets: EpochSecretsRecord
    shared: EpochSharedRecord
    name = "shares-sent"

    def __post_init__(self) -> None:
        self.epoch_digest = self.shared.roster.epoch_digest()
        self.adverts = {a.sender: a for a in self.shared.roster.adverts}

    @property
    def announce(self) -> EpochAnnounce:
        return self.secrets.announce

    def on_roster(self, ctx: SiteContext, msg: EpochRoster):
        if msg == self.shared.roster:  # repeated request: answer identically
            return self, self.shared.share_keys, None
        raise ReplayError(f"epoch {self.announce.epoch}: already answered a different roster")

    def on_shares(self, ctx: SiteContext, msg: EpochShares):
        me, cfg = ctx.site_id, ctx.config
        ann = self.announce
        epoch, e = ann.epoch, ann.num_rounds
        _check_digest(ctx, msg)
        if msg.epoch != epoch:
            raise InvalidMessage(f"EpochShares is for epoch {msg.epoch}, not {epoch}")
        if msg.recipient != me:
            raise InvalidMessage(f"EpochShares is addressed to {msg.recipient!r}, not to this site")
        a1 = self.shared.roster.senders
        graph = cfg.epoch_graph(self.shared.roster)  # None: complete graph
        for d in msg.dealers:
            if d not in self.adverts:
                raise InvalidMessage(f"EpochShares lists dealer {d!r}, which did not advertise keys this epoch")
            if graph is not None and not graph.is_neighbour_or_self(me, d):
                raise InvalidMessage(f"EpochShares lists dealer {d!r}, which is not a neighbour of this site in the epoch's graph")
        if me not in msg.dealers:
            raise ProtocolAbort(f"epoch {epoch}: the coordinator did not accept this site's shares")
        need = ctx.t if graph is None else graph.threshold
        if len(msg.dealers) < need:
            what = "sites" if graph is None else "sites of this site's neighbourhood"
            raise ProtocolAbort(f"epoch {epoch}: only {len(msg.dealers)} {what} shared keys, threshold is {need}")
        held: list[tuple[str, bytes]] = []
        size = 2 * e * _SHARE
        for entry in msg.entries:
            d, c = entry.dealer, entry.commitments
            if d == me:
                if c != self.shared.share_keys.commitments:
                    raise InvalidMessage("EpochShares alters this site's own commitments")
                held.append((me, self.shared.own_shares))
                continue
            if not ed25519_verify(cfg.identity_key(d), SignedCommitments.SIGN_DOMAIN, c.signing_bytes(), c.signature):
                raise InvalidMessage(f"commitments of {d!r} have an invalid signature")
            if c.epoch_digest != self.epoch_digest:
                raise ProtocolAbort(f"epoch {epoch}: dealer {d!r} was shown a different roster (coordinator equivocation)")
            if len(c.seed_commitments) != e:
                raise InvalidMessage(f"commitments of {d!r} cover {len(c.seed_commitments)} slots, expected {e}")
            if tuple(h for h, _ in c.row_digests) != (a1 if graph is None else graph.holders(d)):
                raise InvalidMessage(f"commitments of {d!r} are not over the holders of this epoch")
            blob = entry.encrypted
            assert blob is not None  # structure checked by EpochShares
            if len(blob.ciphertext) != share_blob_size(d, me, e):
                raise InvalidMessage(f"share blob from {d!r} has the wrong size")
            shared = x25519_agree(self.secrets.encryption_private, self.adverts[d].encryption_key)
            key = share_encryption_key(shared, ctx.digest, epoch, self.epoch_digest, d, me)
            ad = share_associated_data(ctx.digest, epoch, self.epoch_digest, d, me)
            plain = aead_decrypt(key, blob.nonce, blob.ciphertext, ad)
            r = Reader(plain, f"share blob from {d!r}")
            if r.text("dealer", 64) != d or r.text("recipient", 64) != me:
                raise InvalidMessage(f"share blob from {d!r} names another sender or recipient inside")
            if r.u64("epoch") != epoch or r.u32("slots") != e:
                raise InvalidMessage(f"share blob from {d!r} is for another epoch")
            shares = r.raw(size, "shares")
            r.done()
            for off in range(0, size, _SHARE):
                if int.from_bytes(shares[off : off + _SHARE], "big") >= shamir.PRIME:
                    raise InvalidMessage(f"share blob from {d!r} contains a value outside the field")
            mine = dict(c.row_digests)[me]
            if row_digest(share_row_commitments(ctx.digest, epoch, d, me, shares, e)) != mine:
                raise InvalidMessage(f"shares from {d!r} do not match its signed commitments")
            held.append((d, shares))
        record = EpochReadyRecord(tuple(held))
        return EpochReady(self.secrets, self.shared, record, graph), record


@dataclass
class EpochReady(EpochStage):
    """Setup complete: the epoch's round slots can be used, each exactly once."""

    secrets: EpochSecretsRecord
    shared: EpochSharedRecord
    ready: EpochReadyRecord
    graph: NeighbourGraph | None = None  # the epoch's public graph in sparse mode; None = complete graph
    name = "ready"

    def __post_init__(self) -> None:
        self.epoch_digest = self.shared.roster.epoch_digest()
        self.mask_keys = {a.sender: a.mask_keys for a in self.shared.roster.adverts}
        self.held = dict(self.ready.held)
        self.dealers = tuple(d for d, _ in self.ready.held)

    def in_view(self, me: str, sites) -> tuple[str, ...]:
        """The sites this site can check: all of them (complete graph) or its closed neighbourhood."""
        g = self.graph
        return tuple(sites) if g is None else tuple(v for v in sites if g.is_neighbour_or_self(me, v))

    @property
    def announce(self) -> EpochAnnounce:
        return self.secrets.announce

    def on_roster(self, ctx, msg):
        if msg == self.shared.roster:
            return self, self.shared.share_keys, None
        raise ReplayError(f"epoch {self.announce.epoch}: already answered a different roster")

    def on_shares(self, ctx, msg):
        if msg.session_digest == ctx.digest and msg.recipient == ctx.site_id and msg.dealers == self.dealers:
            return self, None
        raise ReplayError(f"epoch {self.announce.epoch} is already set up with dealers {list(self.dealers)}")

    # ---------------------------------------------------------------- round work
    def slot(self, round_id: int) -> int:
        ann = self.announce
        if not ann.first_round <= round_id <= ann.last_round:
            raise InvalidMessage(f"round {round_id} is not a slot of epoch {ann.epoch}")
        return round_id - ann.first_round

    def masked_input(self, ctx: SiteContext, start: RoundStart, value: np.ndarray) -> MaskedInput:
        """y_u = x_u + PRG(b_{u,r}) + Σ_{v∈P_r, v≠u} ±PRG(s_{u,v,r})  (mod 2^64)."""
        me, digest = ctx.site_id, ctx.digest
        epoch, r, d = start.epoch, start.round_id, start.vector_len
        j = self.slot(r)
        acc = np.array(value, dtype=np.uint64, copy=True)
        acc += prg_expand(self_mask_key(self.secrets.seeds[j], digest, epoch, r, me, d), d)
        peers = [v for v in start.participants if v != me and (self.graph is None or self.graph.adjacent(me, v))]
        shared = x25519_agree_many(self.secrets.mask_private[j], [self.mask_keys[v][j] for v in peers])
        for v, s in zip(peers, shared):
            m = prg_expand(pair_mask_key(s, digest, epoch, r, me, v, d), d)
            if me < v:
                acc += m
            else:
                acc -= m
        return MaskedInput(digest, epoch, r, me, acc)

    def fast_input(self, ctx: SiteContext, start: RoundStart, value: np.ndarray) -> FastMaskedInput:
        """The answer to a fast RoundStart: y_u as in :meth:`masked_input` plus this site's shares of the
        self-mask seeds b_{v,r} of every v ∈ P_r (never a mask-key share)."""
        y = self.masked_input(ctx, start, value)
        seeds, _ = self.reveal(start.round_id, start.participants, ())
        return FastMaskedInput(y.session_digest, y.epoch, y.round_id, y.sender, y.masked, seeds)

    def reveal(self, round_id: int, survivors: tuple[str, ...], dropped: tuple[str, ...]):
        """This site's shares: seed shares of survivors, mask-key shares of dropped sites — never both."""
        if set(survivors) & set(dropped):
            raise ProtocolAbort("refusing to reveal both shares of one site")
        j = self.slot(round_id)
        if self.graph is not None:  # only the neighbourhood's shares are held
            survivors = tuple(v for v in survivors if v in self.held)
            dropped = tuple(w for w in dropped if w in self.held)

        def share(dealer: str, kind: int) -> bytes:
            off = (2 * j + kind) * _SHARE
            return self.held[dealer][off : off + _SHARE]

        return (
            tuple((v, share(v, KIND_SEED)) for v in survivors),
            tuple((w, share(w, KIND_KEY)) for w in dropped),
        )


@dataclass
class EpochAborted(EpochStage):
    """Terminal: the epoch's setup was abandoned; its material is never used."""

    reason: str
    announce: EpochAnnounce | None = None
    name = "aborted"

    def on_roster(self, ctx, msg):
        raise ProtocolAbort(f"epoch setup was aborted: {self.reason}")

    def on_shares(self, ctx, msg):
        raise ProtocolAbort(f"epoch setup was aborted: {self.reason}")


# =========================================================================== round stages

class RoundStage:
    """Base of the per-round stages."""

    name = "round"

    def on_consistency(self, ctx: SiteContext, epoch: EpochReady, msg: ConsistencyRequest):
        raise OutOfOrder(f"ConsistencyRequest is not expected in round stage {self.name}")

    def on_unmask(self, ctx: SiteContext, epoch: EpochReady, msg: UnmaskRequest):
        raise OutOfOrder(f"UnmaskRequest is not expected in round stage {self.name}")


@dataclass
class RoundInputSent(RoundStage):
    """Masked input sent; waiting for the survivor set U3 to sign."""

    start: RoundStart
    sent: MaskedInput
    name = "input-sent"

    def on_consistency(self, ctx, epoch, msg):
        _check_digest(ctx, msg)
        s = self.start
        if msg.epoch != s.epoch:
            raise InvalidMessage(f"ConsistencyRequest names epoch {msg.epoch}, round {s.round_id} belongs to {s.epoch}")
        u3 = msg.survivors
        outside = set(u3) - set(s.participants)
        if outside:
            raise ProtocolAbort(f"round {s.round_id}: survivor set lists non-participants {sorted(outside)}")
        if ctx.site_id not in u3:
            raise ProtocolAbort(
                f"round {s.round_id}: survivor set omits this site although it sent its masked input"
            )
        if len(u3) < ctx.t:
            raise ProtocolAbort(f"round {s.round_id}: only {len(u3)} survivors, threshold is {ctx.t}")
        if ctx.min_survivors is not None:
            need = int(ctx.min_survivors(s))
            if len(u3) < need:
                raise ProtocolAbort(f"round {s.round_id}: only {len(u3)} survivors of {len(s.participants)} "
                                    f"participants; this site signs only survivor sets of at least {need} here")
        payload = consistency_payload(ctx.digest, s.epoch, epoch.epoch_digest, s.round_id, s.vector_len, s.participants, u3)
        sig = ConsistencySignature(
            ctx.digest, s.epoch, s.round_id, ctx.site_id, ed25519_sign(ctx.identity, CONSISTENCY_DOMAIN, payload)
        )
        record = RoundSignedRecord(msg, sig)
        return RoundSigned(s, self.sent, msg, sig), sig, record


@dataclass
class RoundSigned(RoundStage):
    """Survivor set signed; waiting for ≥ t signatures on it before revealing shares."""

    start: RoundStart
    sent: MaskedInput
    request: ConsistencyRequest
    signature: ConsistencySignature
    name = "signed"

    def on_consistency(self, ctx, epoch, msg):
        if msg == self.request:
            return self, self.signature, None
        raise ReplayError(f"round {self.start.round_id}: already signed a different survivor set")

    def on_unmask(self, ctx, epoch, msg):
        _check_digest(ctx, msg)
        s = self.start
        r = s.round_id
        if msg.epoch != s.epoch:
            raise InvalidMessage(f"UnmaskRequest names epoch {msg.epoch}, round {r} belongs to {s.epoch}")
        u3 = self.request.survivors
        if msg.survivors != u3:
            raise ProtocolAbort(f"round {r}: unmask request names a survivor set different from the one this site signed")
        both = set(msg.survivors) & set(msg.dropped)
        if both:
            raise ProtocolAbort(f"round {r}: unmask request lists {sorted(both)} as both alive and dropped")
        if set(msg.survivors) | set(msg.dropped) != set(s.participants):
            raise ProtocolAbort(f"round {r}: alive and dropped sets do not partition the participant set")
        signers = [signer for signer, _ in msg.signatures]
        outside = set(signers) - set(u3)
        if outside:
            raise ProtocolAbort(f"round {r}: consistency signatures from non-survivors {sorted(outside)}")
        if len(signers) < ctx.t:
            raise ProtocolAbort(f"round {r}: only {len(signers)} consistency signatures, threshold is {ctx.t}")
        # Sparse graph: only signatures from this site's closed neighbourhood count, and t_k of them are needed.
        need = ctx.t if epoch.graph is None else epoch.graph.threshold
        counted = set(epoch.in_view(ctx.site_id, signers))
        if len(counted) < need:
            raise ProtocolAbort(
                f"round {r}: only {len(counted)} consistency signatures from this site's neighbourhood, local threshold is {need}"
            )
        payload = consistency_payload(ctx.digest, s.epoch, epoch.epoch_digest, r, s.vector_len, s.participants, u3)
        cfg = ctx.config
        # The decision needs t valid signatures on U3: this site's own one (compared byte-wise) first,
        # then the others in signer order until t are verified.  Signatures beyond the t-th are not
        # needed for the decision and are not verified; an invalid one met before that is refused.
        own = dict(msg.signatures).get(ctx.site_id)
        if own is not None and own != self.signature.signature:
            raise InvalidMessage(f"round {r}: this site's own consistency signature was altered")
        valid = 0 if own is None else 1
        verified: set[str] = set()
        if epoch.graph is not None:
            # Sparse graph: reveal a neighbour's seed share only if that neighbour signed this very statement, so
            # it masked with this site over the same participant set (docs/secagg.md §10, guarantee 3).
            alive = [v for v in u3 if v != ctx.site_id and epoch.graph.adjacent(ctx.site_id, v)]
            sigs = dict(msg.signatures)
            missing = [v for v in alive if v not in sigs]
            if missing:
                raise ProtocolAbort(f"round {r}: surviving neighbours {missing} did not sign this survivor set")
            for v in alive:
                if not ed25519_verify(cfg.identity_key(v), CONSISTENCY_DOMAIN, payload, sigs[v]):
                    raise InvalidMessage(f"round {r}: invalid consistency signature from {v!r}")
            verified, valid = set(alive), valid + len(alive)
        for signer, sig in msg.signatures:
            if valid >= need:
                break
            if signer == ctx.site_id or signer not in counted or signer in verified:
                continue
            if not ed25519_verify(cfg.identity_key(signer), CONSISTENCY_DOMAIN, payload, sig):
                raise InvalidMessage(f"round {r}: invalid consistency signature from {signer!r}")
            valid += 1
        seeds, keys = epoch.reveal(r, msg.survivors, msg.dropped)
        resp = UnmaskResponse(ctx.digest, s.epoch, r, ctx.site_id, seeds, keys)
        record = RoundRevealedRecord(msg, resp)
        return RoundRevealed(s, self.sent, msg, resp), resp, record


@dataclass
class RoundRevealed(RoundStage):
    """Terminal: shares revealed once; a repeated identical request gets the identical answer."""

    start: RoundStart
    sent: MaskedInput | None
    request: UnmaskRequest
    response: UnmaskResponse
    name = "revealed"

    def on_consistency(self, ctx, epoch, msg):
        raise ReplayError(f"round {self.start.round_id}: shares already revealed")

    def on_unmask(self, ctx, epoch, msg):
        if msg == self.request:
            return self, self.response, None
        raise ReplayError(f"round {self.start.round_id}: already revealed shares for a different request")


@dataclass
class RoundAnsweredFast(RoundStage):
    """Terminal: the round was answered fast (masked input and seed shares of all of P_r in one message).

    The site signs nothing and reveals nothing more for this round: any ConsistencyRequest or
    UnmaskRequest is evidence of a coordinator mixing the two paths, and aborts the round here.
    """

    start: RoundStart
    sent: FastMaskedInput
    name = "answered-fast"

    def _refuse(self, what: str):
        raise ProtocolAbort(f"round {self.start.round_id} was answered fast: refusing a {what} for it "
                            "(the fast path signs nothing and reveals no mask-key share)")

    def on_consistency(self, ctx, epoch, msg):
        self._refuse("ConsistencyRequest")

    def on_unmask(self, ctx, epoch, msg):
        self._refuse("UnmaskRequest")


@dataclass
class RoundAborted(RoundStage):
    """Terminal: this site reveals nothing more for the round."""

    round_id: int
    reason: str
    name = "aborted"

    def on_consistency(self, ctx, epoch, msg):
        raise ProtocolAbort(f"round {self.round_id} was aborted: {self.reason}")

    def on_unmask(self, ctx, epoch, msg):
        raise ProtocolAbort(f"round {self.round_id} was aborted: {self.reason}")


# =========================================================================== facade

class SecAggSite:
    """All secure-aggregation state of one site in one session.

    Args:
        config: the session parameters (identical at every party).
        site_id: this site's id; must be in the roster.
        identity_key: this site's Ed25519 private key; its public key must be the pinned one.
        storage: durable storage (see ``storage.py``); state is restored from it on construction.
        randbytes: source of secure randomness; ``os.urandom`` unless testing.
        min_survivors: optional policy ``RoundStart -> int``: the site refuses (ProtocolAbort, the
            round is aborted at this site) to sign a survivor set smaller than this, and to answer a
            fast RoundStart whose participant set P_r is smaller than this.  It must be a pure
            function of public data so that a restarted site applies the same rule.
        allow_fast: whether to answer a :class:`FastRoundStart`; with False it is refused
            (ProtocolAbort) and the coordinator retries the round on the signed path.

    Each ``handle_*`` method validates one incoming message and returns the
    reply to send (or ``None``).  Replies are persisted before they are
    returned.
    """

    def __init__(
        self,
        config: SessionConfig,
        site_id: str,
        identity_key: Ed25519PrivateKey,
        storage: Storage,
        randbytes: Callable[[int], bytes] = os.urandom,
        min_survivors: Callable[[RoundStart], int] | None = None,
        allow_fast: bool = True,
    ) -> None:
        if not config.in_roster(site_id):
            raise SecAggError(f"site {site_id!r} is not in the session roster")
        pinned = config.roster[config.x_coordinate(site_id) - 1].public_key
        if ed25519_public(identity_key) != pinned:
            raise SecAggError(f"identity key of {site_id!r} does not match the pinned key in the roster")
        self.ctx = SiteContext(config, site_id, identity_key, randbytes, min_survivors, bool(allow_fast))
        self._storage = storage
        self._epochs: dict[int, EpochStage] = {}
        self._rounds: dict[int, RoundStage] = {}
        self._wm = Watermark()
        self._restore()

    # ------------------------------------------------------------------ introspection
    @property
    def site_id(self) -> str:
        return self.ctx.site_id

    @property
    def watermark(self) -> Watermark:
        return self._wm

    def epoch_stage(self, epoch: int) -> str | None:
        """Stage name of an epoch (``advertised``, ``shares-sent``, ``ready``, ``aborted``) or None."""
        st = self._epochs.get(epoch)
        return st.name if st else None

    def round_stage(self, round_id: int) -> str | None:
        """Stage name of a round (``input-sent``, ``signed``, ``revealed``, ``answered-fast``, ``aborted``) or None."""
        st = self._rounds.get(round_id)
        return st.name if st else None

    def ready_epochs(self) -> list[int]:
        return sorted(e for e, st in self._epochs.items() if isinstance(st, EpochReady))

    # ------------------------------------------------------------------ generic dispatch
    def handle(
        self, message: Message | bytes, value: np.ndarray | None = None, noise: np.ndarray | None = None
    ) -> Message | None:
        """Dispatch any coordinator→site message (object or canonical bytes) to its handler."""
        msg = decode_message(message) if isinstance(message, (bytes, bytearray, memoryview)) else message
        if isinstance(msg, EpochAnnounce):
            return self.handle_epoch_announce(msg)
        if isinstance(msg, EpochRoster):
            return self.handle_epoch_roster(msg)
        if isinstance(msg, EpochShares):
            return self.handle_epoch_shares(msg)
        if isinstance(msg, RoundStart):
            return self.handle_round_start(msg, value, noise)
        if isinstance(msg, ConsistencyRequest):
            return self.handle_consistency_request(msg)
        if isinstance(msg, UnmaskRequest):
            return self.handle_unmask_request(msg)
        raise InvalidMessage(f"a site does not accept {type(msg).__name__} messages")

    # ------------------------------------------------------------------ epoch setup
    def handle_epoch_announce(self, msg: EpochAnnounce) -> AdvertiseKeys:
        """Draw the epoch's fresh keys and seeds, persist them, and return the signed advertisement."""
        ctx = self.ctx
        _check_digest(ctx, msg)
        existing = self._epochs.get(msg.epoch)
        if existing is not None:
            if isinstance(existing, EpochAborted):
                raise ReplayError(f"epoch {msg.epoch} was aborted: {existing.reason}")
            secrets = existing.secrets  # type: ignore[attr-defined]
            if secrets.announce == msg:
                return secrets.advert
            raise ReplayError(f"epoch {msg.epoch} was already announced with different parameters")
        if msg.num_rounds > ctx.config.max_epoch_rounds:
            raise InvalidMessage(f"epoch announces {msg.num_rounds} rounds, the session allows {ctx.config.max_epoch_rounds}")
        wm = self._wm
        if wm.max_epoch is not None and msg.epoch <= wm.max_epoch:
            raise ReplayError(f"epoch {msg.epoch} is not newer than epoch {wm.max_epoch}")
        for bound, what in ((wm.max_last_round, "an earlier epoch's rounds"), (wm.max_round, "a round already started")):
            if bound is not None and msg.first_round <= bound:
                raise ReplayError(f"epoch {msg.epoch} starts at round {msg.first_round}, overlapping {what} (≤ {bound})")
        e = msg.num_rounds
        enc_sk, enc_pk = x25519_generate(ctx.randbytes)
        masks = [x25519_generate(ctx.randbytes) for _ in range(e)]
        seeds = tuple(ctx.randbytes(KEY_SIZE) for _ in range(e))  # fresh, independent b_{u,j}
        unsigned = AdvertiseKeys(ctx.digest, msg.epoch, msg.first_round, ctx.site_id, enc_pk, tuple(pk for _, pk in masks), bytes(64))
        advert = AdvertiseKeys(
            ctx.digest, msg.epoch, msg.first_round, ctx.site_id, enc_pk, unsigned.mask_keys,
            ed25519_sign(ctx.identity, AdvertiseKeys.SIGN_DOMAIN, unsigned.signing_bytes()),
        )
        record = EpochSecretsRecord(msg, enc_sk, tuple(sk for sk, _ in masks), seeds, advert)
        self._put(epoch_key(msg.epoch, "secrets"), record.to_bytes())
        self._set_watermark(Watermark(msg.epoch, msg.last_round, wm.max_round))
        self._epochs[msg.epoch] = EpochAdvertised(record)
        return advert

    def handle_epoch_roster(self, msg: EpochRoster) -> ShareKeys:
        """Validate the roster of advertisements (A1); Shamir-share seeds and mask keys; return ShareKeys."""
        stage = self._epoch(msg.epoch, msg)
        try:
            new, reply, record = stage.on_roster(self.ctx, msg)
        except ProtocolAbort as exc:
            self._abort_epoch(msg.epoch, stage, str(exc))
            raise
        if record is not None:
            self._put(epoch_key(msg.epoch, "shared"), record.to_bytes())
        self._epochs[msg.epoch] = new
        return reply

    def handle_epoch_shares(self, msg: EpochShares) -> None:
        """Validate and store the shares routed to this site (A2); the epoch becomes ready."""
        stage = self._epoch(msg.epoch, msg)
        try:
            new, record = stage.on_shares(self.ctx, msg)
        except ProtocolAbort as exc:
            self._abort_epoch(msg.epoch, stage, str(exc))
            raise
        if record is not None:
            self._put(epoch_key(msg.epoch, "ready"), record.to_bytes())
        self._epochs[msg.epoch] = new
        return None

    # ------------------------------------------------------------------ rounds
    def handle_round_start(
        self, msg: RoundStart, value: np.ndarray | None, noise: np.ndarray | None = None
    ) -> MaskedInput | FastMaskedInput:
        """Mask ``value`` (+ ``noise``) for round ``msg.round_id`` and return the MaskedInput.

        A fast RoundStart (``msg.fast``) is answered with a FastMaskedInput that also carries this site's
        shares of the self-mask seeds of all of P_r; the round is then closed at this site (it signs and
        reveals nothing more for it).  It is refused (ProtocolAbort, persisted) when ``allow_fast`` is
        off, on a sparse graph unless the session is fast-only, or when |P_r| is below ``min_survivors(msg)``;
        in a fast-only session a signed RoundStart is refused instead.

        ``value`` and ``noise`` are int64 vectors of length ``msg.vector_len``
        (fixed-point units); floats are refused.  If this round was already
        started (e.g. before a restart) with the identical RoundStart, the
        stored MaskedInput is returned and ``value``/``noise`` are ignored —
        check :meth:`round_stage` first if that matters to the caller.
        """
        ctx = self.ctx
        _check_digest(ctx, msg)
        r = msg.round_id
        existing = self._rounds.get(r)
        if existing is not None:
            sent = getattr(existing, "sent", None)
            if getattr(existing, "start", None) == msg and sent is not None:
                return sent
            if isinstance(existing, RoundAborted):
                raise ReplayError(f"round {r} was aborted: {existing.reason}")
            raise ReplayError(f"round {r} was already started with a different participant set or parameters")
        if self._wm.max_round is not None and r <= self._wm.max_round:
            raise ReplayError(f"round {r} is not newer than round {self._wm.max_round} (round ids are never reused)")
        epoch = self._epochs.get(msg.epoch)
        if not isinstance(epoch, EpochReady):
            raise OutOfOrder(f"round {r}: epoch {msg.epoch} is not set up at this site")
        epoch.slot(r)
        if msg.vector_len > ctx.config.max_vector_len:
            raise InvalidMessage(f"round {r}: vector length {msg.vector_len} exceeds the session limit {ctx.config.max_vector_len}")
        p = msg.participants
        problem = None
        outside = set(epoch.in_view(ctx.site_id, p)) - set(epoch.dealers)
        if outside:
            problem = f"round {r}: participants {sorted(outside)} did not complete this epoch's setup"
        elif ctx.site_id not in p:
            problem = f"round {r}: participant set does not include this site"
        elif len(p) < ctx.t:
            problem = f"round {r}: only {len(p)} participants, threshold is {ctx.t}"
        elif epoch.graph is not None and len(epoch.in_view(ctx.site_id, p)) < epoch.graph.threshold:
            problem = (f"round {r}: only {len(epoch.in_view(ctx.site_id, p))} participants in this site's neighbourhood, "
                       f"local threshold is {epoch.graph.threshold}: its secrets could not be recovered")
        elif msg.fast:
            problem = self._fast_problem(msg, epoch)
        elif ctx.config.fast_only:  # no signed round, ever: no mask-key share may leave (docs/secagg.md §10)
            problem = f"round {r}: this session is fast-only; the signed path is refused"
        if problem is not None:
            self._abort_round(r, problem)
            raise ProtocolAbort(problem)
        x = self._check_value(value, msg.vector_len, "input")
        ring = to_ring(x).copy()
        if noise is not None:
            ring += to_ring(self._check_value(noise, msg.vector_len, "noise"))
        sent = (epoch.fast_input if msg.fast else epoch.masked_input)(ctx, msg, ring)
        # one write: the input record of a fast round is also the persisted "answered fast"
        self._put(round_key(r, "input"), RoundInputRecord(msg, sent).to_bytes())
        self._set_watermark(Watermark(self._wm.max_epoch, self._wm.max_last_round, r))
        self._rounds[r] = RoundAnsweredFast(msg, sent) if msg.fast else RoundInputSent(msg, sent)
        self._prune(r)
        return sent

    def handle_consistency_request(self, msg: ConsistencyRequest) -> ConsistencySignature:
        """Check the survivor set U3 and sign it (once per round)."""
        return self._round_step(msg, "on_consistency", "signed")

    def handle_unmask_request(self, msg: UnmaskRequest) -> UnmaskResponse:
        """Check ≥ t signatures on the signed U3; reveal seed shares (U3) or key shares (dropped)."""
        return self._round_step(msg, "on_unmask", "revealed")

    def _fast_problem(self, msg: RoundStart, epoch: EpochReady) -> str | None:
        """Why this site will not answer the fast RoundStart ``msg`` (None: it will)."""
        ctx, r = self.ctx, msg.round_id
        if not ctx.allow_fast:
            return f"round {r}: fast rounds are disabled by this site's plan"
        if epoch.graph is not None and not ctx.config.fast_only:
            return (f"round {r}: fast rounds are allowed on a sparse graph only in a fast-only session "
                    "(docs/secagg.md §10)")
        if ctx.min_survivors is not None:
            need = int(ctx.min_survivors(msg))
            if len(msg.participants) < need:
                return (f"round {r}: a fast round over {len(msg.participants)} participants; this site releases "
                        f"only sums over at least {need} sites here")
        return None

    # ------------------------------------------------------------------ internals
    def _round_step(self, msg, method: str, part: str):
        _check_digest(self.ctx, msg)
        r = msg.round_id
        stage = self._rounds.get(r)
        if stage is None:
            if self._wm.max_round is not None and r < self._wm.max_round:
                raise ReplayError(f"round {r} is older than the current round {self._wm.max_round}")
            raise OutOfOrder(f"{type(msg).__name__} for round {r}, which this site has not started")
        epoch = self._epochs.get(getattr(stage, "start", msg).epoch)
        if not isinstance(stage, RoundAborted) and not isinstance(epoch, EpochReady):
            raise OutOfOrder(f"round {r}: its epoch is no longer available at this site")
        try:
            new, reply, record = getattr(stage, method)(self.ctx, epoch, msg)
        except ProtocolAbort as exc:
            if not isinstance(stage, RoundAborted):
                self._abort_round(r, str(exc))
            raise
        if record is not None:
            self._put(round_key(r, part), record.to_bytes())
        self._rounds[r] = new
        return reply

    def _abort_epoch(self, epoch: int, stage: EpochStage, reason: str) -> None:
        """Persist and enter the aborted stage: this epoch's material is never used again."""
        self._put(epoch_key(epoch, "aborted"), reason.encode())
        self._epochs[epoch] = EpochAborted(reason, getattr(stage, "announce", None))

    def _abort_round(self, round_id: int, reason: str) -> None:
        """Persist and enter the aborted stage: nothing more is sent or revealed for this round."""
        self._put(round_key(round_id, "aborted"), reason.encode())
        self._rounds[round_id] = RoundAborted(round_id, reason)

    def _epoch(self, epoch: int, msg) -> EpochStage:
        _check_digest(self.ctx, msg)
        stage = self._epochs.get(epoch)
        if stage is None:
            if self._wm.max_epoch is not None and epoch < self._wm.max_epoch:
                raise ReplayError(f"epoch {epoch} is older than the latest epoch {self._wm.max_epoch}")
            raise OutOfOrder(f"{type(msg).__name__} for epoch {epoch}, which was not announced to this site")
        return stage

    def _check_value(self, value, d: int, what: str) -> np.ndarray:
        if value is None:
            raise TypeError(f"round {what} is required (an int64 vector)")
        arr = np.asarray(value)
        if arr.dtype != np.int64:
            raise TypeError(f"round {what} must be an int64 vector in fixed-point units, got dtype {arr.dtype}")
        if arr.shape != (d,):
            raise ValueError(f"round {what} must have shape ({d},), got {arr.shape}")
        cfg = self.ctx.config
        bound = cfg.max_abs_input if what == "input" else cfg.noise_bound
        if bound is not None and d and (int(arr.max()) > bound or int(arr.min()) < -bound):
            raise FixedPointError(f"round {what} has an entry beyond the agreed bound {bound}")
        return arr

    def _put(self, key: str, value: bytes) -> None:
        self._storage.put(key, value)

    def _set_watermark(self, wm: Watermark) -> None:
        self._put(WATERMARK_KEY, wm.to_bytes())
        self._wm = wm

    def _prune(self, current: int) -> None:
        """Forget rounds before ``current`` and epochs whose range ended before it."""
        for r in [r for r in self._rounds if r < current]:
            del self._rounds[r]
        for key in self._storage.keys("round/"):
            if int(key.split("/")[1]) < current:
                self._storage.delete(key)
        for e, st in list(self._epochs.items()):
            ann = getattr(st, "announce", None)
            if ann is not None and ann.last_round < current:
                del self._epochs[e]
                for part in ("secrets", "shared", "ready"):
                    self._storage.delete(epoch_key(e, part))

    def _restore(self) -> None:
        st = self._storage
        raw = st.get(WATERMARK_KEY)
        if raw is not None:
            self._wm = Watermark.from_bytes(raw)
        epochs: dict[int, dict[str, bytes]] = {}
        for key in st.keys("epoch/"):
            _, e, part = key.split("/")
            epochs.setdefault(int(e), {})[part] = st.get(key)  # type: ignore[assignment]
        for e, parts in epochs.items():
            if "secrets" not in parts:
                raise StorageError(f"stored epoch {e} has no secrets record")
            sec = EpochSecretsRecord.from_bytes(parts["secrets"])
            stage: EpochStage = EpochAdvertised(sec)
            if "shared" in parts:
                shared = EpochSharedRecord.from_bytes(parts["shared"])
                stage = EpochSharesSent(sec, shared)
                if "ready" in parts:
                    stage = EpochReady(
                        sec, shared, EpochReadyRecord.from_bytes(parts["ready"]), self.ctx.config.epoch_graph(shared.roster)
                    )
            if "aborted" in parts:
                stage = EpochAborted(parts["aborted"].decode("utf-8", "replace"), sec.announce)
            self._epochs[e] = stage
            wm = self._wm
            if wm.max_epoch is None or e > wm.max_epoch:  # crash between the record and the watermark
                self._wm = Watermark(e, sec.announce.last_round, wm.max_round)
        rounds: dict[int, dict[str, bytes]] = {}
        for key in st.keys("round/"):
            _, r, part = key.split("/")
            rounds.setdefault(int(r), {})[part] = st.get(key)  # type: ignore[assignment]
        for r, parts in rounds.items():
            if "aborted" in parts:
                self._rounds[r] = RoundAborted(r, parts["aborted"].decode("utf-8", "replace"))
                if "input" not in parts:
                    continue
            elif "input" not in parts:
                raise StorageError(f"stored round {r} has no input record")
            inp = RoundInputRecord.from_bytes(parts["input"])
            rstage: RoundStage = RoundInputSent(inp.request, inp.response)
            if inp.request.fast:
                if "signed" in parts or "revealed" in parts:
                    raise StorageError(f"stored round {r} was answered fast but also has signed/revealed records")
                rstage = RoundAnsweredFast(inp.request, inp.response)
            elif "signed" in parts:
                sig = RoundSignedRecord.from_bytes(parts["signed"])
                rstage = RoundSigned(inp.request, inp.response, sig.request, sig.response)
                if "revealed" in parts:
                    rev = RoundRevealedRecord.from_bytes(parts["revealed"])
                    rstage = RoundRevealed(inp.request, inp.response, rev.request, rev.response)
            if "aborted" not in parts:
                self._rounds[r] = rstage
            if self._wm.max_round is None or r > self._wm.max_round:
                self._wm = Watermark(self._wm.max_epoch, self._wm.max_last_round, r)
