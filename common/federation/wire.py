"""The federation's envelope types and their protobuf conversion (shared by coordinator and site).

The state machines (:mod:`fedsbdt.server.session`, :mod:`fedsbdt.client.site`) speak these
frozen dataclasses; :mod:`fedsbdt.server.service` and :mod:`fedsbdt.client.daemon` convert
them to and from the ``fedsbdt.v1`` protobuf messages with the pure
functions below.  Conversion validates structure (sizes, kinds, finite
numbers) and raises :class:`WireError`; meaning (stage, membership, replay)
is checked by the state machines.

Size limits.  gRPC refuses messages above ``MAX_MESSAGE_BYTES`` in either
direction.  The largest legitimate messages are an epoch's ``ShareKeys``
(commitment rows for every holder plus one encrypted blob per other holder:
about ``E·(32 + 130·n)`` bytes) and ``EpochShares`` (about
``n·(98·E + 40·n)``), and a ``MaskedInput`` (``2·2^depth`` uint64, 64 KiB at
depth 12).  :func:`estimated_largest_message` bounds them; a plan that would
need more than half the limit is refused when it is loaded.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Union

import numpy as np

#: gRPC send/receive limit, both directions, both parties.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: A round start carries at most 2^this − 1 splits (a complete tree of the deepest allowed depth)
MAX_SPLITS_LOG2 = 16
#: longest evaluation sum a Finished event may carry (fed_eval.EvalSpec.length is far below)
MAX_EVAL_LENGTH = 1 << 20
#: Largest number of trees one GetTrees answer carries (the answer also stays below half the size limit).
MAX_TREES_PER_PAGE = 4096

GRPC_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # This gRPC version waits for a keepalive ping's ack for ping_timeout_ms (default 60 s), not for
    # keepalive_timeout_ms: without it a black-holed connection is noticed only after ~70 s and a call in
    # flight on it hangs until its deadline (tests/hardening/test_service_faults.py).
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS = GRPC_OPTIONS + (
    # one coordinator per address: with SO_REUSEPORT a second server on the same port would bind too and the
    # kernel would spread the sites' connections over both (common/instance.py names the holder instead)
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
)


class WireError(ValueError):
    """A protobuf message is structurally invalid."""


def estimated_largest_message(n_sites: int, epoch_rounds: int, depth: int, vector_len: int = 0,
                              classes: int = 1, holders: int | None = None) -> int:
    """Upper estimate (bytes) of the largest message a session with these parameters sends
    (``vector_len``: the longest secure-aggregation vector, if longer than a tree's ``2·2^depth``;
    ``classes``: K class trees per round for a multiclass task; ``holders``: the K = k + 1 share
    holders per site of a sparse secure-aggregation graph, default all n)."""
    e, n = int(epoch_rounds), int(n_sites)
    h = n if holders is None else min(int(holders), n)
    depth = max(depth, math.ceil(math.log2(max(vector_len, 2) / 2)))
    share_keys = e * (32 + 140 * h) + 200 * h + 4096
    epoch_shares = h * (100 * e + 48 * h + 400) + 4096
    roster = n * (32 * e + 256) + 4096
    masked = 16 * max(classes, 1) * 2**depth + 4096
    trees = 0  # GetTrees pages are cut to fit
    return max(share_keys, epoch_shares, roster, masked, trees)


class Purpose(enum.IntEnum):
    INIT_SCORE = 1
    TREE = 2
    LEVEL = 3  # greedy trees: the noisy histograms of one level of one tree (docs/greedy.md)
    EVAL = 4  # federated evaluation of the released model (common/fed_eval.py); no proto change: open enum
    SKETCH = 5  # Sarus trees: the noisy equal-width count histograms of one tree (docs/sarus.md "Federation")


# --------------------------------------------------------------------------- coordinator → site


@dataclass(frozen=True)
class SetupMsg:
    """EpochAnnounce, EpochRoster or EpochShares (canonical secagg bytes)."""

    secagg: bytes


class Deferred:
    """A part of a message read only when the message is written: ``load()`` returns byte strings of exactly
    ``size`` bytes in all (the coordinator's EpochShares built from its stored blobs, server/session.py)."""

    __slots__ = ("load", "size")

    def __init__(self, load, size: int) -> None:
        self.load, self.size = load, size

    def __len__(self) -> int:
        return self.size

    def resolve(self) -> tuple[bytes, ...]:
        parts = tuple(self.load())
        got = sum(len(p) for p in parts)
        if got != self.size:
            raise ValueError(f"a deferred message part is {got} bytes, {self.size} were declared")
        return parts


def join_parts(parts) -> bytes:
    """``b"".join(parts)``, reading each :class:`Deferred` part."""
    return b"".join([x for p in parts for x in (p.resolve() if isinstance(p, Deferred) else (p,))])


class SetupParts(SetupMsg):
    """A :class:`SetupMsg` whose secagg bytes are the concatenation of ``parts`` (byte strings shared with other
    messages: the coordinator's EpochShares, whose dealers' commitments and blobs it holds once).

    The coordinator's outboxes write the parts without joining them first (``server/outbox.py``); anything
    else reads ``secagg``, which joins them on each access.  A part may be :class:`Deferred` (read when
    written).
    """

    def __init__(self, parts=(), secagg: bytes | None = None) -> None:  # noqa: D107 (frozen: set once)
        # ``secagg``: one part (what ``dataclasses.replace(msg, secagg=...)`` passes)
        object.__setattr__(self, "parts", tuple(parts) if secagg is None else (bytes(secagg),))

    @property
    def secagg(self) -> bytes:  # type: ignore[override]
        return join_parts(self.parts)


@dataclass(frozen=True)
class RoundStartMsg:
    purpose: Purpose
    tree: int
    secagg: bytes
    # greedy trees (LEVEL, and TREE): the level asked for and the splits released so far (heap order)
    level: int = 0
    features: tuple[int, ...] = ()
    thresholds: tuple[float, ...] = ()
    # Sarus trees (LEVEL, TREE): the tree's released noisy sketch histograms (sites recompute the candidates)
    sketch: tuple[int, ...] = ()


@dataclass(frozen=True)
class RoundMsg:
    """ConsistencyRequest or UnmaskRequest."""

    secagg: bytes


@dataclass(frozen=True)
class InitScoreMsg:
    score: float
    round_id: int | None  # None: no initial-score round (init_share = 0)
    sites: tuple[str, ...]
    scores: tuple[float, ...] = ()  # multiclass: one initial margin per public class

    @property
    def value(self):
        """The initial score as the model holds it: ``score``, or the class margins ``scores``."""
        return self.scores if self.scores else self.score


@dataclass(frozen=True, eq=False)
class TreeMsg:
    index: int
    round_id: int
    sites: tuple[str, ...]
    features: np.ndarray  # int32
    thresholds: np.ndarray  # float64
    leaves: np.ndarray  # float64

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TreeMsg):
            return NotImplemented
        return (self.index == other.index and self.round_id == other.round_id and self.sites == other.sites
                and np.array_equal(self.features, other.features)
                and np.array_equal(self.thresholds, other.thresholds)
                and np.array_equal(self.leaves, other.leaves))

    def record(self) -> dict:
        """The public per-round record ``{tree, round_id, sites}``."""
        return {"tree": self.index, "round_id": self.round_id, "sites": list(self.sites)}


@dataclass(frozen=True)
class EvalRelease:
    """What the evaluation round released, sent to the sites with Finished: the noisy sum of the sites'
    evaluation vectors and the sites it sums (each site recomputes the metrics from it:
    release.evaluation_receipt), or why nothing was released."""

    total: tuple[int, ...] = ()
    sites: tuple[str, ...] = ()
    round_id: int = 0
    failed: str = ""


@dataclass(frozen=True)
class FinishedMsg:
    model_sha256: str
    trees: int
    evaluation: EvalRelease | None = None  # plans with [evaluation]


@dataclass(frozen=True)
class AbortedMsg:
    reason: str


Event = Union[SetupMsg, RoundStartMsg, RoundMsg, InitScoreMsg, TreeMsg, FinishedMsg, AbortedMsg]


# --------------------------------------------------------------------------- site → coordinator


@dataclass(frozen=True)
class SetupReply:
    secagg: bytes


@dataclass(frozen=True)
class InputReply:
    purpose: Purpose
    tree: int
    secagg: bytes


@dataclass(frozen=True)
class RoundReply:
    secagg: bytes


@dataclass(frozen=True)
class Refusal:
    """The site refuses a request (it will not answer it); ``detail`` says why, ``round_id`` which round."""

    detail: str
    round_id: int | None = None


@dataclass(frozen=True)
class Done:
    """The site rebuilt the model from the released trees; this is its hash."""

    model_sha256: str


Reply = Union[SetupReply, InputReply, RoundReply, Refusal, Done]


# --------------------------------------------------------------------------- protobuf conversion


def _pb():
    from fedsbdt.proto.v1 import federation_pb2

    return federation_pb2


def _ids(xs) -> tuple[str, ...]:
    from fedsbdt.common.secagg.encoding import check_site_id
    from fedsbdt.common.secagg.errors import InvalidMessage

    out = []
    for x in xs:
        try:
            out.append(check_site_id(x))
        except InvalidMessage as e:
            raise WireError(str(e)) from None
    if list(out) != sorted(set(out)):
        raise WireError("site lists must be sorted and free of duplicates")
    return tuple(out)


def _purpose(v: int) -> Purpose:
    try:
        return Purpose(int(v))
    except ValueError:
        raise WireError(f"unknown round purpose {v}") from None


def tree_to_proto(t: TreeMsg):
    pb = _pb()
    return pb.TreeRecord(index=t.index, round_id=t.round_id, sites=list(t.sites),
                         features=t.features.astype(np.int64).tolist(), thresholds=t.thresholds.tolist(),
                         leaves=t.leaves.tolist())


def tree_from_proto(m) -> TreeMsg:
    features = np.asarray(m.features, dtype=np.int32)
    thresholds = np.asarray(m.thresholds, dtype=np.float64)
    leaves = np.asarray(m.leaves, dtype=np.float64)
    n_inner = features.size
    if (n_inner < 1 or thresholds.size != n_inner or leaves.size < n_inner + 1 or leaves.size % (n_inner + 1)
            or (n_inner + 1) & n_inner):
        raise WireError(f"tree {m.index}: {n_inner} inner nodes, {thresholds.size} thresholds and "
                        f"{leaves.size} leaves do not describe a complete tree")
    if not (np.isfinite(thresholds).all() and np.isfinite(leaves).all()):
        raise WireError(f"tree {m.index}: non-finite threshold or leaf value")
    return TreeMsg(int(m.index), int(m.round_id), _ids(m.sites), features, thresholds, leaves)


def init_to_proto(i: InitScoreMsg):
    return _pb().InitScore(score=i.score, round_id=0 if i.round_id is None else i.round_id, sites=list(i.sites),
                           scores=list(i.scores))


def init_from_proto(m) -> InitScoreMsg:
    if not (math.isfinite(m.score) and all(math.isfinite(x) for x in m.scores)):
        raise WireError("non-finite initial score")
    sites = _ids(m.sites)
    return InitScoreMsg(float(m.score), int(m.round_id) if sites else None, sites, tuple(float(x) for x in m.scores))


def event_to_proto(ev: Event, seq: int):
    pb = _pb()
    if isinstance(ev, SetupMsg):
        return pb.Event(seq=seq, setup=pb.SecAggMessage(secagg=ev.secagg))
    if isinstance(ev, RoundStartMsg):
        return pb.Event(seq=seq, round_start=pb.RoundStart(purpose=int(ev.purpose), tree=ev.tree, secagg=ev.secagg,
                                                           level=ev.level, features=list(ev.features),
                                                           thresholds=list(ev.thresholds), sketch=list(ev.sketch)))
    if isinstance(ev, RoundMsg):
        return pb.Event(seq=seq, round=pb.SecAggMessage(secagg=ev.secagg))
    if isinstance(ev, InitScoreMsg):
        return pb.Event(seq=seq, init_score=init_to_proto(ev))
    if isinstance(ev, TreeMsg):
        return pb.Event(seq=seq, tree=tree_to_proto(ev))
    if isinstance(ev, FinishedMsg):
        f = pb.Finished(model_sha256=ev.model_sha256, trees=ev.trees)
        if ev.evaluation is not None:
            e = ev.evaluation
            f.evaluation.CopyFrom(pb.EvaluationRelease(sum=list(e.total), sites=list(e.sites), round_id=e.round_id,
                                                       failed=e.failed))
        return pb.Event(seq=seq, finished=f)
    if isinstance(ev, AbortedMsg):
        return pb.Event(seq=seq, aborted=pb.Aborted(reason=ev.reason))
    raise TypeError(f"not an event: {type(ev).__name__}")


def event_from_proto(m) -> Event:
    kind = m.WhichOneof("kind")
    if kind == "setup":
        return SetupMsg(bytes(m.setup.secagg))
    if kind == "round_start":
        rs = m.round_start
        features, thresholds = tuple(int(f) for f in rs.features), tuple(float(t) for t in rs.thresholds)
        if len(features) != len(thresholds) or len(features) >= 2**MAX_SPLITS_LOG2:
            raise WireError(f"round start: {len(features)} features and {len(thresholds)} thresholds")
        if not all(math.isfinite(t) for t in thresholds):
            raise WireError("round start: non-finite threshold")
        return RoundStartMsg(_purpose(rs.purpose), int(rs.tree), bytes(rs.secagg), int(rs.level), features,
                             thresholds, tuple(int(x) for x in rs.sketch))
    if kind == "round":
        return RoundMsg(bytes(m.round.secagg))
    if kind == "init_score":
        return init_from_proto(m.init_score)
    if kind == "tree":
        return tree_from_proto(m.tree)
    if kind == "finished":
        h = m.finished.model_sha256
        if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise WireError("finished event without a SHA-256 model hash")
        release = None
        if m.finished.HasField("evaluation"):
            e = m.finished.evaluation
            if len(e.sum) > MAX_EVAL_LENGTH:
                raise WireError(f"finished event: an evaluation sum of {len(e.sum)} entries")
            release = EvalRelease(tuple(int(x) for x in e.sum), _ids(e.sites), int(e.round_id), e.failed[:2000])
        return FinishedMsg(h, int(m.finished.trees), release)
    if kind == "aborted":
        return AbortedMsg(m.aborted.reason[:2000])
    raise WireError(f"unknown event kind {kind!r}")


# --------------------------------------------------------------------------- join signature

JOIN_DOMAIN = b"fedsbdt/v1/join\x00"
NONCE_BYTES = 32


def join_statement(plan_sha256: str, site_id: str, nonce: bytes) -> bytes:
    """What a site signs with its pinned Ed25519 identity key to join: plan hash, site id, fresh nonce."""
    return JOIN_DOMAIN + plan_sha256.encode("ascii") + b"\x00" + site_id.encode("utf-8") + b"\x00" + bytes(nonce)


def sign_join(identity_key, plan_sha256: str, site_id: str, nonce: bytes) -> bytes:
    from fedsbdt.common.secagg.primitives import ed25519_sign

    return ed25519_sign(identity_key, b"federation-join", join_statement(plan_sha256, site_id, nonce))


def verify_join(public_key_raw: bytes, plan_sha256: str, site_id: str, nonce: bytes, signature: bytes) -> bool:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from fedsbdt.common.secagg.primitives import ed25519_verify

    if len(nonce) != NONCE_BYTES:
        return False
    key = Ed25519PublicKey.from_public_bytes(public_key_raw)
    return ed25519_verify(key, b"federation-join", join_statement(plan_sha256, site_id, nonce), bytes(signature))
