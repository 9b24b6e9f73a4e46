"""S-BDT's random trees (binary, regression and multi-class): one leaf round per tree on a Poisson subsample.

Release kinds: ``init`` (the initial score) and ``tree`` — a Poisson-subsampled Gaussian sum (noise
multiplier σ/√2, common/accountant.py).  Budget: every record at most ``accounted_rounds`` tree releases;
with ``filter = true`` the individual Rényi filter bounds each record instead (client/ledger.py).
Central builder: public random splits (common/modes/random/builder.py); calibration: Alg. 6
(:func:`fedsbdt.common.accountant.calibrate`).
"""
from __future__ import annotations

from fedsbdt.common.accountant import calibrate
from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.random.builder import RandomTrees as RandomTreeBuilder
from fedsbdt.common.modes.random.site import RandomSite
from fedsbdt.common.modes.releases import LeafNoise, Release


class RandomTrees(Mode):
    name = "random"
    summary = "public random splits (S-BDT): they cost no privacy, all of ε goes to the leaves"
    uniform_tree_rounds = True
    isolated_sampler = True
    multiclass = True
    auditable = True
    public_splits = True
    algorithm = ("The algorithm is S-BDT (Peinemann, Kirschte et al.): random public splits, Poisson "
                 "subsampling, leaf-balanced Gaussian noise and a subsampled-RDP accountant.")

    def check_hyperparameters(self, hp, bad) -> None:
        if hp.sketch_share != 0:
            raise bad("sketch_share", "the adaptive Hessian sketch is for greedy trees (set tree_builder = 'greedy')")
        if hp.selection != "exponential":
            raise bad("selection", "chooses how greedy trees select splits; random trees have no selection "
                      "(set tree_builder = 'greedy')")
        super().check_hyperparameters(hp, bad)

    def calibrate(self, hp):
        """Alg. 6: σ of the Poisson-subsampled Gaussian trees for the plan's ε (cached)."""
        return calibrate(hp.epsilon, hp.delta, hp.subsample, hp.accounted_rounds, hp.init_share, hp.eps_ds,
                         hp.accountant, eps_candidates=hp.eps_candidates)

    def central_builder(self, schema, hp, cal):
        return RandomTreeBuilder(schema, hp)

    def tree_releases(self, plan):
        hp = plan.hyperparameters
        return {"tree": Release("tree", LeafNoise(hp, plan.encoding, plan.calibration().sigma), rate=hp.subsample)}

    def tree_budget(self, plan):
        hp = plan.hyperparameters
        return {"tree": None if hp.filter else hp.accounted_rounds}

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/random/site.py)."""
        return RandomSite(ctx)


register(RandomTrees())
