"""Greedy trees (docs/greedy.md): ``depth`` level rounds of noisy histograms, then the leaf round.

Release kinds: ``level`` — every record in every level (the nodes of a level hold disjoint records: one
release), the exponential mechanism's ε (bounded range) or a Gaussian of σ_s/√2; ``tree`` — the leaves, a
Gaussian of σ/√2.  Budget: ``T·depth`` levels and ``T`` leaf releases per record.
"""
from __future__ import annotations

from fedsbdt.common.accountant import ExponentialEvent
from fedsbdt.common.federation.wire import Purpose

from . import register
from .base import Mode, gaussian


class GreedyTrees(Mode):
    name = "greedy"
    tree_purposes = (Purpose.LEVEL,)

    def tree_event(self, plan, kind):
        cal = plan.calibration()
        if kind == "level":
            hp = plan.hyperparameters
            return ExponentialEvent(cal.eps_select) if hp.selection == "exponential" else gaussian(cal.sigma_select)
        return gaussian(cal.sigma)

    def rounds(self, plan) -> int:
        """Sequential trees a record is in (all of them)."""
        return plan.hyperparameters.accounted_rounds

    def tree_budget(self, plan):
        n = self.rounds(plan)
        return {"level": n * plan.hyperparameters.depth, "tree": n}

    # ---- coordinator side

    def coordinator_rounds(self, plan, records=()):
        from .greedy_coordinator import GreedyRounds

        return GreedyRounds(plan, records)

    def federated_hyperparameters(self, hp, given):
        if "selection" in given:
            return hp
        return hp.replace(selection="histogram")  # a federation selects from noisy histograms

    # ---- site side
    def site_rounds(self, plan, site):
        """This mode's rounds at a site (common/modes/greedy_site.py)."""
        from .greedy_site import GreedySite

        return GreedySite(plan, site)


register(GreedyTrees())
