"""Greedy trees (docs/greedy.md): ``depth`` level rounds of noisy histograms, then the leaf round.

Release kinds: ``level`` — every record in every level (the nodes of a level hold disjoint records: one
release), a Gaussian of σ_s/√2 (noisy histograms); ``tree`` — the leaves, a Gaussian of σ/√2.  Budget: ``T·depth`` levels and ``T`` leaf releases per record.
"""
from __future__ import annotations

from fedsbdt.common.federation.wire import Purpose

from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.releases import LeafNoise, LevelNoise, Release


class GreedyTrees(Mode):
    name = "greedy"
    tree_purposes = (Purpose.LEVEL,)

    def tree_releases(self, plan):
        """A level is a Gaussian histogram release of σ_s whatever ``hp.selection`` says (a federation selects
        from noisy histograms: no party holds the exact gains the exponential mechanism needs); the leaves a
        Gaussian of σ.  Both events come from the noise the sites draw (common/modes/releases.py)."""
        cal, enc = plan.calibration(), plan.encoding
        return {"level": Release("level", LevelNoise(plan.greedy_grid, enc.grad.bound_units, cal.sigma_select)),
                "tree": Release("tree", LeafNoise(plan.hyperparameters, enc, cal.sigma))}

    def rounds(self, plan) -> int:
        """Sequential trees a record is in (all of them)."""
        return plan.hyperparameters.accounted_rounds

    def tree_budget(self, plan):
        n = self.rounds(plan)
        return {"level": n * plan.hyperparameters.depth, "tree": n}

    # ---- coordinator side

    def coordinator_rounds(self, plan, records=()):
        from fedsbdt.common.modes.greedy.coordinator import GreedyRounds

        return GreedyRounds(plan, records)

    def federated_hyperparameters(self, hp, given):
        if "selection" in given:
            return hp
        return hp.replace(selection="histogram")  # a federation selects from noisy histograms

    # ---- site side
    def site_rounds(self, plan, site):
        """This mode's rounds at a site (common/modes/greedy/site.py)."""
        from fedsbdt.common.modes.greedy.site import GreedySite

        return GreedySite(plan, site)


register(GreedyTrees())
