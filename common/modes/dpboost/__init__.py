"""Federated DPBoost (docs/dpboost.md "Federation"): greedy level rounds on the records of one tree's part.

The same release kinds as greedy trees (Gaussian levels of σ_s/√2, Gaussian leaves of σ/√2), but a tree
reads only the records of its part of the ensemble's partition (that pass GDF): a record is in one tree per
ensemble, so its budget is ``N_e·depth`` levels and ``N_e`` leaf releases — not ``T·depth``.  A retried
level or leaf round of tree k re-reads the records of part k and is charged to exactly them.
"""
from __future__ import annotations

from fedsbdt.common.modes.dpboost import mechanism as dpboost
from fedsbdt.common.modes.dpboost.rounds import check_tree
from fedsbdt.common.federation.wire import Purpose

from fedsbdt.common.modes import register
from fedsbdt.common.modes.greedy import GreedyTrees


class DPBoostTrees(GreedyTrees):
    name = "dpboost"

    def schedule_refusal(self, plan, purpose, tree, level):
        bad = super().schedule_refusal(plan, purpose, tree, level)
        if bad is None and purpose in (Purpose.LEVEL, Purpose.TREE):
            bad = check_tree(plan.hyperparameters, int(tree))
        return bad

    def plan_refusal(self, plan):
        return None  # levels are Gaussian histograms whatever ``selection`` says (GreedyTrees.tree_releases)

    def federated_calibration(self, hp):
        """Federated DPBoost's Gaussian levels and leaves (common/modes/dpboost/rounds.py)."""
        from fedsbdt.common.config import ConfigError
        from fedsbdt.common.modes.dpboost.rounds import calibration_for

        if hp.accountant != "rdp":  # as for every federated plan (check_discrete_noise), said before calibrating
            raise ConfigError("federated DPBoost is accounted by the RDP ledger: the PLD accountant evaluates "
                              "continuous Gaussian noise, which does not dominate the discrete Gaussian shares sites "
                              "add; use accountant = \"rdp\" (docs/privacy.md \"PLD\")")
        return calibration_for(hp)

    def rounds(self, plan) -> int:
        hp = plan.hyperparameters
        return dpboost.ensembles(hp.accounted_rounds, hp.ensemble_trees)

    # ---- coordinator side

    def coordinator_rounds(self, plan, records=()):
        from fedsbdt.common.modes.dpboost.coordinator import DPBoostRounds

        return DPBoostRounds(plan, records)

    def federated_hyperparameters(self, hp, given):
        # ``selection`` stays "exponential" (the central DPBoost builder's setting, which the configuration
        # pins); a federated level is always a Gaussian histogram release (GreedyTrees.tree_releases)
        return hp

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/dpboost/site.py)."""
        from fedsbdt.common.modes.dpboost.site import DPBoostSite

        return DPBoostSite(ctx)


register(DPBoostTrees())
