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


def partition_key(ensemble: int) -> str:
    """The site database key of ensemble ``ensemble``'s partition."""
    return f"dpboost_partition/{int(ensemble)}"


class DPBoostSite(GreedySite):
    """Greedy rounds whose releases read the records of the tree's part (that pass GDF)."""

    def __init__(self, plan, site) -> None:
        super().__init__(plan, site)
        ledger = site.ledger
        self.partition = SitePartition(plan.hyperparameters, site.local.ids,
                                       lambda e: ledger.mode_state(partition_key(e)),
                                       lambda e, blob: ledger.set_mode_state(partition_key(e), blob))

    def call(self, f, *args):
        """A partition step; a stored partition that does not fit this site's data ends the session."""
        try:
            return f(*args)
        except DPBoostRequestError as e:
            raise self.site.abort(str(e)) from None

    def records(self, tree: int):
        return self.call(self.partition.records, tree, self.site.local)

    def contribution(self, splits, tree: int, read):
        return self.call(self.partition.contribution, splits, tree, self.site.local, read)
