"""One round at the coordinator: :class:`CoordinatorRound` drives its stages (``CollectingInputs →
CollectingSignatures → CollectingShares → RoundComplete``, or ``CollectingFastInputs → RoundComplete``; any
stage ``→ RoundFailed``) and holds the round's context (epoch, slot, commitments) the stages check against."""
from __future__ import annotations

from itertools import filterfalse
from operator import itemgetter

import numpy as np

from ..shamir import reconstruct, reconstruct_many
from ..config import SessionConfig
from ..errors import InvalidMessage, OutOfOrder, ProtocolAbort
from ..messages import ConsistencyRequest, FastMaskedInput, Message, RoundStart, UnmaskRequest, decode_message
from ..primitives import commit_self_mask_seed, commit_share, x25519_public
from .epoch import CoordinatorEpoch, _check_digest, _known
from .round_base import RoundComplete, RoundFailed, RoundResult, RoundStage, remove_masks
from .unmask import CollectingShares
from .fast import CollectingFastInputs
from .masked_input import CollectingInputs, CollectingSignatures


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
            values = reconstruct_many(xs, rows, t)
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
            value = reconstruct(good, t)
            secret = value.to_bytes(32, "big") if value < 2**256 else b""
            if not secret or not check(dlr, secret):
                raise ProtocolAbort(
                    f"round {self.round_id}: shares dealt by {dlr!r} are inconsistent with its commitment",
                    blame=(dlr,),
                )
            out[dlr] = secret
        return out
