"""The first two stages of a round (docs/secagg.md: MaskedInput, Consistency): :class:`CollectingInputs` closes
into :class:`CollectingSignatures` with the survivor set U3, which closes into the unmasking stage."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidMessage, ProtocolAbort
from ..messages import (
    CONSISTENCY_DOMAIN,
    ConsistencyRequest,
    ConsistencySignature,
    MaskedInput,
    UnmaskRequest,
    consistency_payload,
)
from ..primitives import ed25519_verify
from .round_base import RoundStage, _check_input
from .unmask import CollectingShares, CollectingSharesOnGraph


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
