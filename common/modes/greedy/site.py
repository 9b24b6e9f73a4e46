"""The site side of greedy trees (docs/greedy.md): ``depth`` level rounds on the plan's candidate grid, then
the leaves on the splits the coordinator selected.

Every request is checked against the pinned plan and this site's database before anything is computed
(:func:`request_refusal`): the tree is the next one, the level lies below the depth, the splits so far are
2^level − 1 (all of them for the leaves) candidates of the plan's grid, and they repeat every split of the
tree released before — no request may rewrite a released split or go back to a released level.  The splits a
request carried are remembered in the round's transaction; a released tree must repeat them.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.boosting import TASK_CODE
from fedsbdt.common.modes.greedy.rounds import GreedyRequestError
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes.greedy.levels import level_sums
from fedsbdt.common.splits import Splits

from fedsbdt.common.modes.random.site import RandomSite
from fedsbdt.common.modes.site_rounds import catch_up_or_refusal


def request_refusal(site, ev, grid) -> str | None:
    """Why a level-round tree's request (a level, or the leaves) on candidate grid ``grid`` must not be
    answered, or None (raises NeedCatchUp for a tree this site has not reached).

    Checked against the pinned plan and this site's records only: the tree is the next one, the level lies
    below the depth, the splits so far are 2^level − 1 (all of them for the leaves) candidates of the grid,
    and they repeat every split of this tree released before.
    """
    hp, k = site.plan.hyperparameters, ev.tree
    late = catch_up_or_refusal(site, k)
    if late is not None:
        return late
    if ev.purpose == Purpose.LEVEL and not 0 <= ev.level < hp.depth:
        return f"level {ev.level} requested, but the plan's trees have depth {hp.depth} (levels 0..{hp.depth - 1})"
    n = 2**ev.level - 1 if ev.purpose == Purpose.LEVEL else hp.leaves - 1
    what = f"level {ev.level}" if ev.purpose == Purpose.LEVEL else "the leaves"
    if len(ev.features) != n:
        return f"the request for {what} of tree {k} carries {len(ev.features)} splits, expected {n}"
    try:
        grid.candidate_index(k, ev.features, ev.thresholds)
    except GreedyRequestError as e:
        return f"the splits of tree {k} are not the plan's candidates ({e})"
    known_f, known_t = site.ledger.released_splits(k)
    if known_f.size > n:
        return f"{what} of tree {k} was already passed ({known_f.size} of its splits were released)"
    if not (np.array_equal(known_f, np.asarray(ev.features[:known_f.size], np.int64))
            and np.array_equal(known_t, np.asarray(ev.thresholds[:known_f.size], np.float64))):
        return f"the request rewrites splits of tree {k} that were released before"
    return None


class GreedySite(RandomSite):
    """Level rounds of noisy histograms on the plan's public grid, then the leaves on the requested splits."""

    def __init__(self, plan, site) -> None:
        super().__init__(plan, site)
        self.grid = plan.greedy_grid  # the public candidate grid and level layouts
        self.codes = self.grid.codes(site.local.X)

    def request_refusal(self, ev) -> str | None:
        return request_refusal(self.site, ev, self.grid)

    def vector_len(self, ev) -> int:
        if ev.purpose == Purpose.LEVEL:
            return self.grid.layout(ev.tree, ev.level).length
        return super().vector_len(ev)

    def release_splits(self, ev):
        """The leaves sum over the splits of the (checked) request."""
        return Splits(np.asarray(ev.features, np.int32), np.asarray(ev.thresholds, np.float64))

    def remember(self, ev) -> None:
        self.site.ledger.remember_splits(ev.tree, ev.features, ev.thresholds)

    def level_input(self, ev, start) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(level vector, noise share, the records it reads or None: no data) for a checked level request.

        The gate charges the level to exactly the records it reads, every attempt (client/gate.py).
        Distributed noise: a share of variance 1/k_r of the level's noise, k_r from the plan and the
        participant set; central noise: a retry carries a full, fresh share."""
        site, plan, grid = self.site, self.plan, self.grid
        local = site.local
        k, enc = ev.tree, local.enc
        layout = grid.layout(k, ev.level)
        site.gate.attempt("level", k, ev.level)
        use = site.gate.admit("level", self.records(k), tree=k, partial=True)
        if use is None:
            x = np.zeros(layout.length, np.int64)
        else:
            node = grid.route(self.codes, grid.candidate_index(k, ev.features, ev.thresholds), ev.level)
            gq, _ = kernels.grad_hess_units(local.pred, local.y, TASK_CODE[local.task], enc.scale,
                                            enc.grad.bound_units, enc.hess.bound_units)
            x = level_sums(self.codes, node, gq, use, layout)
        noise = None
        p = len(start.participants)
        if plan.noise == "distributed" and plan.threshold <= p <= plan.n:  # otherwise secagg refuses the round
            noise = site.randomness.discrete_gaussian(plan.level_share_scales(k, ev.level, plan.noise_divisor(p)))
        elif plan.noise == "central" and site.ledger.level_attempts(k, ev.level) > 0:
            noise = site.randomness.discrete_gaussian(plan.level_share_scales(k, ev.level, 1))
        return x, noise, use

    def released_splits(self, t):
        """A released tree's splits, if they are on the plan's grid and repeat those released before."""
        site = self.site
        if t.features.size != self.plan.hyperparameters.leaves - 1:
            raise site.abort(f"tree {t.index} has {t.features.size} splits, not a tree of the plan's depth")
        try:
            self.grid.candidate_index(t.index, t.features, t.thresholds)
        except GreedyRequestError as e:
            raise site.abort(f"tree {t.index} does not use the plan's candidate grid ({e})") from None
        known_f, known_t = site.ledger.released_splits(t.index)
        if not (np.array_equal(known_f, t.features[:known_f.size].astype(np.int64))
                and np.array_equal(known_t, t.thresholds[:known_f.size])):
            raise site.abort(f"tree {t.index} has other splits than the coordinator's requests released")
        return Splits(t.features, t.thresholds)
