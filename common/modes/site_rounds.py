"""The site side of a mode: what the site's gate (client/gate.py) hands a mode's tree rounds, and what it asks.

Once a site has accepted a plan it asks the plan's mode (:func:`fedsbdt.common.modes.mode_for`) for its
:class:`SiteRounds` — ``mode_for(plan).site_rounds(ctx)`` with a :class:`SiteContext` — and the gate drives
every round of the plan's trees (every purpose but the initial score and the evaluation, which the site
answers itself) through one fixed order (:meth:`fedsbdt.client.gate.Gate.tree_round`)::

    check → vector length / replay → catch-up → attempt → declare → admit → compute → noise → charge → send

A mode only **checks** a request against what it knows (:meth:`SiteRounds.check`), says its **vector length**
(:meth:`SiteRounds.vector_len`), **declares** the release of one attempt — the records it reads, whether spent
records may sit it out, whether only the first attempt carries data, the layout of its noise
(:meth:`SiteRounds.declare`, a :class:`Declared`) — and **computes** a vector from the records the gate
admitted (:meth:`SiteRounds.compute`, a :class:`Computed`).  It never calls the gate, draws a noise share,
charges a record or touches secure aggregation: the gate alone orders attempt → admit → compute → noise →
charge → send, and the noise rule exists once (client/noise.py ``draw_share``).

What a mode may read is exactly the :class:`SiteContext` (the plan, the site's records, its randomness, the
Rényi filter, its own durable state through a :class:`ModeStore`, and how to end the session) and the
:class:`RoundInput` of each round (the request and what the site has released so far).  Nothing here imports
the site.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np


class NeedCatchUp(Exception):
    """The event needs released trees this site has not applied yet; fetch them (GetTrees) and retry."""

    def __init__(self, have: int, need: int) -> None:
        super().__init__(f"have {have} trees, need {need}")
        self.have, self.need = have, need


class ModeStore(Protocol):
    """A mode's durable state at a site (the site database, namespaced by the plan): keys the mode names, and the
    splits the coordinator's requests carried.  Writes marked *in the round* run in the round's transaction."""

    def mode_state(self, key: str) -> bytes | None: ...

    def set_mode_state(self, key: str, blob: bytes) -> None: ...

    def keep_mode_state(self, key: str, blob: bytes) -> None: ...  # in the round

    def released_splits(self, tree: int) -> tuple[np.ndarray, np.ndarray]: ...

    def remember_splits(self, tree: int, features, thresholds) -> None: ...  # in the round


@dataclass(frozen=True)
class SiteContext:
    """Everything a mode's site rounds may read, fixed when the site accepts a plan.

    Args:
        plan: the pinned, verified plan.
        local: the site's records (common/boosting.py ``LocalData``; multi-class: its subclass).
        randomness: the plan's DP randomness (Poisson subsamples, a mode's own random draws).
        table: the individual Rényi filter's table (random trees with ``filter = true``), or None.
        store: the mode's durable state (:class:`ModeStore`).
        abort: ``raise ctx.abort(reason)`` ends the session at this site (one line for the operator).
    """

    plan: Any
    local: Any
    randomness: Any
    table: Any
    store: ModeStore
    abort: Callable[[str], Exception]


@dataclass(frozen=True)
class RoundInput:
    """One round request of a plan's tree, as the gate hands it to the mode.

    ``request`` is the coordinator's RoundStartMsg (purpose, tree, level, the splits and sketch it carries);
    ``kind`` its release kind; ``level`` the level of a LEVEL round (None otherwise); ``trees_applied`` and
    ``has_init`` what this site has applied when the request arrived."""

    request: Any
    kind: str
    tree: int
    level: int | None
    trees_applied: int
    has_init: bool

    @property
    def purpose(self):
        return self.request.purpose


@dataclass(frozen=True)
class Declared:
    """The release of one attempt, declared before anything is computed.

    Args:
        records: the release's input set (a mask over the site's records): what the gate admits and charges.
        partial: records whose budget is spent may sit the release out (the vector is computed from an explicit
            record set); False: all of ``records`` or none.
        once: only the first attempt of this stage carries data; a retry sends zeros plus its noise share.
        where: what fixes the layout of the release's noise (``Noise.scales(..., **where)``).
        sampled: the subsample size to log (a mode that draws its subsample before the attempt), or None.
    """

    records: np.ndarray
    partial: bool = False
    once: bool = False
    where: Mapping[str, Any] = field(default_factory=dict)
    sampled: int | None = None


@dataclass(frozen=True)
class Computed:
    """A mode's vector for one admitted attempt.

    Args:
        x: the vector (int64, the round's length).
        read: the records charged, if not the admitted ones (the Rényi filter charges what it sampled).
        active, sampled: the counts the contribution log keeps (None: not known).
        new_spent: the filter's per-record spent units after this release (None: no filter).
        commit: run once the masked vector has left (e.g. the contribution joins the local model state).
        leaf: the records' leaf index on the tree's splits (kept to apply the released tree), or None.
    """

    x: np.ndarray
    read: np.ndarray | None = None
    active: int | None = None
    sampled: int | None = None
    new_spent: np.ndarray | None = None
    commit: Callable[[], None] | None = None
    leaf: np.ndarray | None = None


def catch_up_or_refusal(rin: RoundInput) -> str | None:
    """Why a request for tree ``rin.tree`` comes too late (it was released), or None; raises :class:`NeedCatchUp`
    for a tree this site has not reached."""
    if not rin.has_init or rin.trees_applied < rin.tree:
        raise NeedCatchUp(rin.trees_applied, rin.tree)
    if rin.trees_applied > rin.tree:
        return f"tree {rin.tree} was already released; refusing to contribute to it again"
    return None


class SiteRounds:
    """A mode's tree rounds at one site.  The base serves no tree round (a plan that trains nothing)."""

    #: the site draws every tree's leaf-noise share ahead (client/noise.py ``NoiseShares``); False: each tree
    #: round's share is drawn when it is needed
    leaf_shares_ahead = True

    def __init__(self, ctx: SiteContext) -> None:
        self.ctx, self.plan = ctx, ctx.plan

    def check(self, rin: RoundInput) -> str | None:
        """Why the request must not be answered (one sentence; public checks against what this site knows), or
        None.  May raise :class:`NeedCatchUp`.  Nothing is computed, stored or charged before it passes."""
        return "this plan trains no trees"

    def vector_len(self, rin: RoundInput) -> int:  # pragma: no cover - check refuses every request
        raise NotImplementedError

    def declare(self, rin: RoundInput) -> Declared:  # pragma: no cover
        """The release of this attempt (the gate counted the attempt; nothing is admitted yet)."""
        raise NotImplementedError

    def compute(self, rin: RoundInput, declared: Declared, admitted: np.ndarray) -> Computed:  # pragma: no cover
        """The vector of the admitted records (a sub-mask of ``declared.records``)."""
        raise NotImplementedError

    def remember(self, rin: RoundInput) -> None:
        """Bookkeeping in the round's transaction (the mode's store), whether or not the attempt carries data."""

    def released_splits(self, t):
        """The splits of released tree ``t`` (a TreeMsg), checked against what this site knows of them
        (raises ``ctx.abort(...)`` where the coordinator released anything else)."""
        raise self.ctx.abort(f"tree {t.index} was released, but this plan trains no trees")
