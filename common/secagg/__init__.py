"""Transport-free secure aggregation for fedsbdt (pairwise masks, double masking, Shamir recovery).

See ``docs/secagg.md`` for the architecture, the message flow and how a
transport drives epochs and rounds.  Modules:

``errors``       exception types
``encoding``     canonical length-prefixed encoding (Writer / Reader)
``primitives``   X25519, Ed25519, HKDF, AES-GCM, AES-CTR PRG, commitments
``shamir``       Shamir sharing over GF(2^256 + 297)
``config``       SessionConfig, roster, session digest, threshold rules
``graph``        the sparse variant's public neighbourhood graph and local threshold (Bell et al.)
``messages``     the protocol messages (dataclasses with to_bytes / from_bytes)
``storage``      Storage protocol, MemoryStorage, FileStorage
``records``      formats of persisted site records
``site``         SecAggSite and its per-epoch / per-round stage machines
``coordinator``  SecAggCoordinator, CoordinatorEpochSetup, CoordinatorRound (a package: one module per stage)
``loopback``     in-process reference transport (tests, benchmark, docs)
"""
from .config import SessionConfig, SiteIdentity, session_digest
from .coordinator import (
    CoordinatorEpoch,
    CoordinatorEpochSetup,
    CoordinatorRound,
    RoundResult,
    SecAggCoordinator,
)
from .errors import (
    ConfigError,
    InvalidMessage,
    OutOfOrder,
    ProtocolAbort,
    ReplayError,
    SecAggError,
    StorageError,
)
from .messages import (
    AdvertiseKeys,
    ConsistencyRequest,
    ConsistencySignature,
    EpochAnnounce,
    EpochRoster,
    EpochShares,
    FastMaskedInput,
    FastRoundStart,
    MaskedInput,
    Message,
    RoundStart,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
    decode_message,
)
from .site import SecAggSite
from .storage import FileStorage, MemoryStorage, Storage

__all__ = [
    "AdvertiseKeys",
    "ConfigError",
    "ConsistencyRequest",
    "ConsistencySignature",
    "CoordinatorEpoch",
    "CoordinatorEpochSetup",
    "CoordinatorRound",
    "EpochAnnounce",
    "EpochRoster",
    "EpochShares",
    "FastMaskedInput",
    "FastRoundStart",
    "FileStorage",
    "InvalidMessage",
    "MaskedInput",
    "MemoryStorage",
    "Message",
    "OutOfOrder",
    "ProtocolAbort",
    "ReplayError",
    "RoundResult",
    "RoundStart",
    "SecAggCoordinator",
    "SecAggError",
    "SecAggSite",
    "SessionConfig",
    "ShareKeys",
    "SiteIdentity",
    "Storage",
    "StorageError",
    "UnmaskRequest",
    "UnmaskResponse",
    "decode_message",
    "session_digest",
]
