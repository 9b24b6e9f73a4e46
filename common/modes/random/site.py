"""The site side of S-BDT's random trees (binary, regression and multi-class): one leaf round per tree.

A tree's leaf round reads the records present at that tree (``arrival <= k``), on the plan's public random
splits of the tree (recomputed here from the plan's seed, never taken from the coordinator); the records'
sums are Poisson-subsampled (and, with ``filter = true``, filtered by the per-record Rényi ledger) by the
contribution (common/boosting.py).  The gate (client/gate.py) orders the round and draws the noise share;
this module only declares the release and computes its vector.  Level-round modes (common/modes/greedy/site.py)
override the hooks: the request check, the vector length, the records, the splits, the contribution and the
level vector.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.multiclass import round_vector_len
from fedsbdt.common.splits import random_splits

from fedsbdt.common.modes.site_rounds import Computed, Declared, RoundInput, SiteContext, SiteRounds


class RandomSite(SiteRounds):
    """Leaf rounds on the plan's public random splits."""

    #: the leaf release is computed from an explicit record set, so records whose budget is spent may sit it out
    explicit_leaf_records = False

    def __init__(self, ctx: SiteContext) -> None:
        super().__init__(ctx)
        self._splits: dict[int, object] = {}

    # ------------------------------------------------------------------ hooks (level-round modes override them)

    def check(self, rin: RoundInput) -> str | None:
        return None

    def vector_len(self, rin: RoundInput) -> int:
        return round_vector_len(self.plan.schema, self.plan.hyperparameters)

    def records(self, tree: int) -> np.ndarray:
        """The records tree ``tree``'s releases read: those present at that tree."""
        return self.ctx.local.arrival <= tree

    def release_splits(self, rin: RoundInput):
        """The splits the leaf release of a (checked) request sums over: the plan's public random splits."""
        return self.splits(rin.tree)

    def contribution(self, splits, tree: int, read: np.ndarray):
        """The leaf round's contribution (Poisson subsample, the filter's charges) over the admitted ``read``."""
        ctx = self.ctx
        return ctx.local.contribution(splits, tree, ctx.randomness, ctx.table)

    def level_vector(self, rin: RoundInput, admitted: np.ndarray) -> np.ndarray:  # pragma: no cover - no levels
        raise NotImplementedError

    # ------------------------------------------------------------------ the public random splits

    def splits(self, k: int):
        """The plan's public random splits of tree ``k`` (cached: needed for the contribution and the check)."""
        sp = self._splits.get(k)
        if sp is None:
            hp = self.plan.hyperparameters
            sp = self._splits[k] = random_splits(self.plan.schema, hp.depth, hp.seed, k, hp.cyclical,
                                                 hp.split_candidates)
        return sp

    def released_splits(self, t):
        sp = self.splits(t.index)
        self._splits = {k: v for k, v in self._splits.items() if k > t.index}
        return sp

    # ------------------------------------------------------------------ a round

    def declare(self, rin: RoundInput) -> Declared:
        """A level reads the tree's records (spent ones sit out); the leaves read them too, all or none unless
        the mode computes them from an explicit record set."""
        if rin.purpose == Purpose.LEVEL:
            return Declared(self.records(rin.tree), partial=True, where={"tree": rin.tree, "level": rin.level})
        return Declared(self.records(rin.tree), partial=self.explicit_leaf_records)

    def compute(self, rin: RoundInput, declared: Declared, admitted: np.ndarray) -> Computed:
        if rin.purpose == Purpose.LEVEL:
            return Computed(self.level_vector(rin, admitted))
        local = self.ctx.local
        c = self.contribution(self.release_splits(rin), rin.tree, admitted)
        read = None
        if self.ctx.table is not None and c.new_spent is not None:  # the filter: the records it charged
            read = np.asarray(c.new_spent) != np.asarray(local.spent)
        return Computed(np.asarray(c.sums, dtype=np.int64), read=read, active=c.active, sampled=c.sampled,
                        new_spent=c.new_spent, commit=lambda: local.commit(c), leaf=c.leaf)
