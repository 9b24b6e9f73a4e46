"""What every round stage shares: the result of a round (:class:`RoundResult`), the unmasking sum
(:func:`remove_masks`, pure), the stage base class and the terminal stages, and the checks of a masked input."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ...fixedpoint import from_ring
from ..errors import InvalidMessage, OutOfOrder
from ..primitives import pair_mask_key, prg_expand, self_mask_key, x25519_agree_many


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
class RoundComplete(RoundStage):
    result: RoundResult
    name = "complete"


@dataclass
class RoundFailed(RoundStage):
    reason: str
    name = "failed"
