"""The site side of federated DPBoost (docs/dpboost.md "Federation"): greedy level rounds and leaves on the
records of one tree's part of the ensemble's partition.

The partition of each ensemble is drawn once from the OS CSPRNG and kept in the site's database (this mode's
state, keys ``dpboost_partition/<ensemble>``) before any vector that depends on it leaves the site
(common/modes/dpboost/rounds.py ``SitePartition``); a stored partition that does not fit this site's
data ends the session.
"""
from __future__ import annotations

from fedsbdt.common.modes.dpboost.rounds import DPBoostRequestError, SitePartition

from fedsbdt.common.modes.greedy.site import GreedySite
from fedsbdt.common.modes.site_rounds import SiteContext


def partition_key(ensemble: int) -> str:
    """The site database key of ensemble ``ensemble``'s partition."""
    return f"dpboost_partition/{int(ensemble)}"


class DPBoostSite(GreedySite):
    """Greedy rounds whose releases read the records of the tree's part (that pass GDF)."""

    explicit_leaf_records = True  # a tree's leaves sum an explicit part: records whose budget is spent sit out

    def __init__(self, ctx: SiteContext) -> None:
        super().__init__(ctx)
        store = ctx.store
        self.partition = SitePartition(ctx.plan.hyperparameters, ctx.local.ids,
                                       lambda e: store.mode_state(partition_key(e)),
                                       lambda e, blob: store.set_mode_state(partition_key(e), blob))

    def call(self, f, *args):
        """A partition step; a stored partition that does not fit this site's data ends the session."""
        try:
            return f(*args)
        except DPBoostRequestError as e:
            raise self.ctx.abort(str(e)) from None

    def records(self, tree: int):
        return self.call(self.partition.records, tree, self.ctx.local)

    def contribution(self, splits, tree: int, read):
        return self.call(self.partition.contribution, splits, tree, self.ctx.local, read)
