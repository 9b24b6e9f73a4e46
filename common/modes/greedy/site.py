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
from fedsbdt.common.modes.site_rounds import RoundInput, SiteContext, catch_up_or_refusal


def request_refusal(ctx: SiteContext, rin: RoundInput, grid) -> str | None:
    """Why a level-round tree's request (a level, or the leaves) on candidate grid ``grid`` must not be
    answered, or None (raises NeedCatchUp for a tree this site has not reached).

    Checked against the pinned plan and this site's records only: the tree is the next one, the level lies
    below the depth, the splits so far are 2^level − 1 (all of them for the leaves) candidates of the grid,
    and they repeat every split of this tree released before.
    """
    hp, ev, k = ctx.plan.hyperparameters, rin.request, rin.tree
    late = catch_up_or_refusal(rin)
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
    known_f, known_t = ctx.store.released_splits(k)
    if known_f.size > n:
        return f"{what} of tree {k} was already passed ({known_f.size} of its splits were released)"
    if not (np.array_equal(known_f, np.asarray(ev.features[:known_f.size], np.int64))
            and np.array_equal(known_t, np.asarray(ev.thresholds[:known_f.size], np.float64))):
        return f"the request rewrites splits of tree {k} that were released before"
    return None


def released_splits_refusal(ctx: SiteContext, t) -> str | None:
    """Why released tree ``t`` does not repeat the splits this site's requests carried (one sentence), or None."""
    known_f, known_t = ctx.store.released_splits(t.index)
    if not (np.array_equal(known_f, t.features[:known_f.size].astype(np.int64))
            and np.array_equal(known_t, t.thresholds[:known_f.size])):
        return f"tree {t.index} has other splits than the coordinator's requests released"
    return None


class GreedySite(RandomSite):
    """Level rounds of noisy histograms on the plan's public grid, then the leaves on the requested splits."""

    def __init__(self, ctx: SiteContext) -> None:
        super().__init__(ctx)
        self.grid = ctx.plan.greedy_grid  # the public candidate grid and level layouts
        self.codes = self.grid.codes(ctx.local.X)

    def check(self, rin: RoundInput) -> str | None:
        return request_refusal(self.ctx, rin, self.grid)

    def vector_len(self, rin: RoundInput) -> int:
        if rin.purpose == Purpose.LEVEL:
            return self.grid.layout(rin.tree, rin.level).length
        return super().vector_len(rin)

    def release_splits(self, rin: RoundInput):
        """The leaves sum over the splits of the (checked) request."""
        ev = rin.request
        return Splits(np.asarray(ev.features, np.int32), np.asarray(ev.thresholds, np.float64))

    def remember(self, rin: RoundInput) -> None:
        ev = rin.request
        self.ctx.store.remember_splits(ev.tree, ev.features, ev.thresholds)

    def level_vector(self, rin: RoundInput, admitted: np.ndarray) -> np.ndarray:
        """A checked level request's histograms ``[gradient | count]`` over the admitted records."""
        grid, local, ev = self.grid, self.ctx.local, rin.request
        k, enc = ev.tree, local.enc
        node = grid.route(self.codes, grid.candidate_index(k, ev.features, ev.thresholds), ev.level)
        gq, _ = kernels.grad_hess_units(local.pred, local.y, TASK_CODE[local.task], enc.scale,
                                        enc.grad.bound_units, enc.hess.bound_units)
        return level_sums(self.codes, node, gq, admitted, grid.layout(k, ev.level))

    def released_splits(self, t):
        """A released tree's splits, if they are on the plan's grid and repeat those released before."""
        ctx = self.ctx
        if t.features.size != self.plan.hyperparameters.leaves - 1:
            raise ctx.abort(f"tree {t.index} has {t.features.size} splits, not a tree of the plan's depth")
        try:
            self.grid.candidate_index(t.index, t.features, t.thresholds)
        except GreedyRequestError as e:
            raise ctx.abort(f"tree {t.index} does not use the plan's candidate grid ({e})") from None
        bad = released_splits_refusal(ctx, t)
        if bad is not None:
            raise ctx.abort(bad)
        return Splits(t.features, t.thresholds)
