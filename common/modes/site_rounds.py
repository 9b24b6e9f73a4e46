"""The site side of a mode: what a site's round handler (client/site.py) asks the pinned plan's mode.

Once a site has accepted a plan, it asks the plan's mode (:func:`fedsbdt.common.modes.mode_for`) for its
:class:`SiteRounds` — ``mode_for(plan).site_rounds(plan, site)`` — and hands it every round of the
plan's trees (every purpose but the initial score and the evaluation, which the site answers itself)
and every released tree to check.  The site never asks which mode it is.

``site`` is duck-typed (the site machine, client/site.py): the mode reads ``site.local`` (the site's
records, common/boosting.py ``LocalData``), ``site.ledger`` (its database: ``attempts``,
``tree_attempts``, ``level_attempts``, ``released_splits``/``remember_splits``, ``log_contribution``,
``charge`` and the mode's own state, ``mode_state``/``set_mode_state``/``keep_mode_state``, under keys
the mode names), ``site.gate`` (``attempt``/``admit``/``charge``: client/gate.py), ``site.randomness``,
``site.noise`` (leaf-noise shares drawn ahead, or None), ``site.table`` (the Rényi filter or None),
``site.cal``, ``site.retry_scales``, ``site.trees``/``site.init`` (what was released so far), and calls
``site.masked_input`` (masks a vector and runs the round's bookkeeping in one ledger transaction),
``site.settled_input`` (a refusal of another vector length, or the stored input of a round answered
before), ``site.remember_leaf_index`` and ``site.abort(reason)`` (an exception that ends the session).
Nothing here imports the site.
"""
from __future__ import annotations


class NeedCatchUp(Exception):
    """The event needs released trees this site has not applied yet; fetch them (GetTrees) and retry."""

    def __init__(self, have: int, need: int) -> None:
        super().__init__(f"have {have} trees, need {need}")
        self.have, self.need = have, need


def catch_up_or_refusal(site, tree: int) -> str | None:
    """Why a request for tree ``tree`` comes too late (it was released), or None; raises :class:`NeedCatchUp`
    for a tree this site has not reached."""
    if site.init is None or len(site.trees) < tree:
        raise NeedCatchUp(len(site.trees), tree)
    if len(site.trees) > tree:
        return f"tree {tree} was already released; refusing to contribute to it again"
    return None


class SiteRounds:
    """A mode's tree rounds at one site.  The base serves no tree round (a plan that trains nothing)."""

    #: the site draws every tree's leaf-noise share ahead (client/noise.py ``NoiseShares``; ``site.noise``);
    #: False: the mode draws its own shares, per round
    leaf_shares_ahead = True

    def __init__(self, plan, site) -> None:
        self.plan, self.site = plan, site

    def round_start(self, ev, start) -> list:
        """The replies to a RoundStart of one of the plan's tree rounds (the gate admitted its schedule):
        a refusal, a replayed input, or a new masked input charged by the gate before it leaves."""
        from fedsbdt.common.federation.wire import Refusal

        return [Refusal(f"round {start.round_id}: this plan trains no trees", start.round_id)]

    def released_splits(self, t):
        """The splits of released tree ``t`` (a TreeMsg), checked against what this site knows of them
        (raises ``site.abort(...)`` where the coordinator released anything else)."""
        raise self.site.abort(f"tree {t.index} was released, but this plan trains no trees")
