"""S-BDT's random trees (binary, regression and multi-class): one leaf round per tree on a Poisson subsample.

Release kinds: ``init`` (the initial score) and ``tree`` — a Poisson-subsampled Gaussian sum (noise
multiplier σ/√2, common/accountant.py).  Budget: every record at most ``accounted_rounds`` tree releases;
with ``filter = true`` the individual Rényi filter bounds each record instead (client/ledger.py).
"""
from __future__ import annotations

from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.releases import LeafNoise, Release


class RandomTrees(Mode):
    name = "random"
    uniform_tree_rounds = True
    isolated_sampler = True

    def tree_releases(self, plan):
        hp = plan.hyperparameters
        return {"tree": Release("tree", LeafNoise(hp, plan.encoding, plan.calibration().sigma), rate=hp.subsample)}

    def tree_budget(self, plan):
        hp = plan.hyperparameters
        return {"tree": None if hp.filter else hp.accounted_rounds}

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/random/site.py)."""
        from fedsbdt.common.modes.random.site import RandomSite

        return RandomSite(ctx)


register(RandomTrees())
