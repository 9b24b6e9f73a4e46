"""The site side of S-BDT's random trees (binary, regression and multi-class): one leaf round per tree.

A tree's leaf round reads the records present at that tree (``arrival <= k``), on the plan's public random
splits of the tree (recomputed here from the plan's seed, never taken from the coordinator); the records'
sums are Poisson-subsampled (and, with ``filter = true``, filtered by the per-record Rényi ledger) by the
contribution (common/boosting.py).  The leaf-noise share is drawn ahead (``site.noise``): variance σ²/k_r
(distributed noise), or, central noise, a full fresh share on a retry.  Level-round modes
(common/modes/greedy/site.py) override the hooks this class calls: the request check, the vector length,
the records, the splits, the contribution and the level input.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.federation.wire import Purpose, Refusal
from fedsbdt.common.multiclass import round_vector_len
from fedsbdt.common.splits import random_splits

from fedsbdt.common.modes.site_rounds import SiteRounds, catch_up_or_refusal


class RandomSite(SiteRounds):
    """Leaf rounds on the plan's public random splits."""

    def __init__(self, plan, site) -> None:
        super().__init__(plan, site)
        self._splits: dict[int, object] = {}

    # ------------------------------------------------------------------ hooks (level-round modes override them)

    def request_refusal(self, ev) -> str | None:
        """Why a request must not be answered, checked before anything is computed (None: answer it)."""
        return None

    def vector_len(self, ev) -> int:
        """The vector length of a request's round."""
        return round_vector_len(self.plan.schema, self.plan.hyperparameters)

    def records(self, tree: int) -> np.ndarray:
        """The records tree ``tree``'s releases read: those present at that tree."""
        return self.site.local.arrival <= tree

    def release_splits(self, ev):
        """The splits the leaf release of a (checked) request sums over: the plan's public random splits."""
        return self.splits(ev.tree)

    def contribution(self, splits, tree: int, read: np.ndarray):
        """The leaf round's contribution (Poisson subsample, the filter's charges) over the admitted ``read``."""
        site = self.site
        return site.local.contribution(splits, tree, site.randomness, site.table)

    def remember(self, ev) -> None:
        """Bookkeeping in the round's transaction besides the charge and the contribution log."""

    def level_input(self, ev, start):  # pragma: no cover - the schedule has no level rounds
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

    def round_start(self, ev, start) -> list:
        site, plan, local, r = self.site, self.plan, self.site.local, start.round_id
        bad = self.request_refusal(ev)  # before anything is computed
        if bad is not None:
            return [Refusal(f"round {r}: {bad}", r)]
        expected_len = self.vector_len(ev)
        settled = site.settled_input(ev, start, expected_len)  # another length, or a round answered before
        if settled is not None:
            return settled

        c = None
        if ev.purpose == Purpose.LEVEL:
            kind, tree, level = "level", ev.tree, ev.level
            x, noise, read = self.level_input(ev, start)
            with_data = read is not None
        else:
            k, level = ev.tree, None
            late = catch_up_or_refusal(site, k)
            if late is not None:
                return [Refusal(f"round {r}: {late}", r)]
            kind, tree = "tree", k
            site.gate.attempt("tree", k)
            read = site.gate.admit("tree", self.records(k), tree=k, partial=site.gate.mode.explicit_leaf_records)
            if read is None:
                x, with_data = np.zeros(expected_len, np.int64), False
            else:
                c = self.contribution(self.release_splits(ev), k, read)
                x, with_data = np.asarray(c.sums, dtype=np.int64), True
                if site.table is not None and c.new_spent is not None:  # the filter: the records it charged
                    read = np.asarray(c.new_spent) != np.asarray(local.spent)
            noise = None
            p = len(start.participants)
            if site.noise is not None and plan.threshold <= p <= plan.n:  # otherwise secagg refuses the round
                noise = site.noise.take(plan.noise_divisor(p))  # variance σ²/k_r, k_r from the public plan
            elif plan.noise == "central" and site.ledger.tree_attempts(k) > 0:
                noise = site.randomness.discrete_gaussian(site.retry_scales[0])  # a retry: a full, fresh share

        def record() -> None:
            if read is not None:  # the gate: this release, charged to exactly the records it read
                site.gate.charge(kind, read, tree, level, r)
            if c is not None and c.new_spent is not None:
                site.ledger.charge(local.ids, local.spent, c.new_spent)
            site.ledger.log_contribution(r, kind, tree, with_data, None if c is None else c.active,
                                         None if c is None else c.sampled, level)
            self.remember(ev)

        replies = site.masked_input(ev, start, x, noise, record)
        if isinstance(replies[0], Refusal):
            return replies
        # Durable: only now does the masked vector leave this function.
        if c is not None:
            local.commit(c)
            site.remember_leaf_index(tree, c.leaf)
        return replies
