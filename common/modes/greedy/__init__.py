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

    def plan_refusal(self, plan):
        if plan.hyperparameters.selection != "histogram":
            return ("a federation selects greedy splits from noisy level histograms (the coordinator never sees "
                    "exact gains): set selection = \"histogram\" (`fedsbdt plan` does so for --tree-builder greedy; "
                    "docs/greedy.md)")
        return None

    def plan_grids(self, plan):
        """The public candidate grid and level layouts (docs/greedy.md; DPBoost's too, docs/dpboost.md)."""
        from fedsbdt.common.modes.greedy.rounds import GreedyGrid

        return {"greedy_grid": GreedyGrid.for_plan(plan.schema, plan.hyperparameters)}

    def max_vector_len(self, plan):
        return max(super().max_vector_len(plan), plan.greedy_grid.max_vector_len())

    def share_coordinates(self, plan):
        """A level: F gradient entries (Δ = g* units) and F counts (Δ = 1)."""
        level = plan.releases["level"].scales(1, tree=0, level=0)
        return [((float(level[0]), plan.encoding.grad.bound_units), (float(level[-1]), 1))]

    def max_share_scale(self, plan, shares):
        return plan.greedy_grid.max_noise_scale(plan.encoding.grad.bound_units, plan.calibration().sigma_select,
                                                shares)

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
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/greedy/site.py)."""
        from fedsbdt.common.modes.greedy.site import GreedySite

        return GreedySite(ctx)


register(GreedyTrees())
