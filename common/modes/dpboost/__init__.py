"""Federated DPBoost (docs/dpboost.md "Federation"): greedy level rounds on the records of one tree's part.

The same release kinds as greedy trees (Gaussian levels of σ_s/√2, Gaussian leaves of σ/√2), but a tree
reads only the records of its part of the ensemble's partition (that pass GDF): a record is in one tree per
ensemble, so its budget is ``N_e·depth`` levels and ``N_e`` leaf releases — not ``T·depth``.  A retried
level or leaf round of tree k re-reads the records of part k and is charged to exactly them.
Central builder: DPBoost's exponential mechanism and Laplace leaves on the GDF parts
(common/modes/dpboost/builder.py); calibration: :func:`fedsbdt.common.modes.dpboost.mechanism.calibrate_dpboost`.
"""
from __future__ import annotations

import fedsbdt.common.modes.dpboost.mechanism as dpboost
import fedsbdt.common.modes.dpboost.rounds as dpboost_rounds
from fedsbdt.common.config import ConfigError
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.dpboost.builder import DPBoostTrees as DPBoostTreeBuilder
from fedsbdt.common.modes.dpboost.coordinator import DPBoostRounds
from fedsbdt.common.modes.dpboost.site import DPBoostSite
from fedsbdt.common.modes.greedy import GREEDY_DEFAULTS, GreedyTrees

#: what a DPBoost run takes for keys it is not given (docs/dpboost.md): the paper's g*_l = 1 (GDF threshold),
#: λ = 0.1 and half of each tree's budget for the splits, no initial score (the paper starts at 0); every
#: record in every ensemble (no subsampling) on the greedy builder's public grid
DPBOOST_DEFAULTS = {**GREEDY_DEFAULTS, "grad_clip": 1.0, "l2": 0.1, "selection_share": 0.5, "init_share": 0.0}


class DPBoostTrees(GreedyTrees):
    name = "dpboost"
    summary = ("DPBoost (Li et al.): gradient-based data filtering, an ensemble of ensembles on disjoint parts, "
               "splits by the exponential mechanism (docs/dpboost.md)")
    explicit_leaf_records = True
    defaults = DPBOOST_DEFAULTS
    exclusive = {"ensemble_trees": "the ensemble of ensembles is DPBoost's (set tree_builder = 'dpboost')"}
    drawn_trees = False
    algorithm = ("The algorithm is DPBoost (Li et al.): gradient-based data filtering, trees of one ensemble on "
                 "disjoint parts of the records, splits chosen by the exponential mechanism over the gain, "
                 "geometric leaf clipping and Laplace leaves, composed in a Rényi-DP ledger.")
    epsilon_curve = Mode.epsilon_curve  # the receipt's σ (Gaussian leaves) drive the curve, as for random trees

    def check_hyperparameters(self, hp, bad) -> None:
        """What DPBoost mode (docs/dpboost.md) needs on top of the greedy checks."""
        super().check_hyperparameters(hp, bad)
        if hp.selection != "exponential" or hp.sketch_share != 0:
            raise ConfigError("DPBoost selects splits with the exponential mechanism on the public grid "
                              "(selection = 'exponential', sketch_share = 0)")
        if hp.ensemble_trees < 0:
            raise bad("ensemble_trees", "must be ≥ 0 (0 = all trees in one ensemble)")
        if hp.learning_rate > 1:
            raise bad("learning_rate", "DPBoost's geometric leaf clipping (1−η)^(t−1) needs η ≤ 1")

    def calibrate(self, hp):
        return dpboost.calibrate_dpboost(hp.epsilon, hp.delta, hp.accounted_rounds, hp.ensemble_trees, hp.depth,
                                         hp.selection_share, hp.init_share, hp.eps_ds, hp.accountant)

    def central_builder(self, schema, hp, cal):
        return DPBoostTreeBuilder(schema, hp, cal.eps_select, eps_leaf=cal.eps_leaf)

    def release_receipt(self, cal, federated):
        """Federated: Gaussian levels and leaves (docs/dpboost.md "Federation"); central: both ε, the paper's
        and ours."""
        return dpboost_rounds.receipt(cal) if federated else dpboost.receipt(cal)

    def account(self, hp, cal, federated, res, human):
        res.update(self.release_receipt(cal, federated))
        return (dpboost_rounds.account_lines if federated else dpboost.account_lines)(cal, hp.epsilon)

    def report_rows(self, p):
        d = p.get("dpboost")
        if not isinstance(d, dict):
            return []
        return [("DPBoost ε: paper / ours", f"{d.get('epsilon_paper', 0):.4g} (pure) / "
                 f"{d.get('epsilon_ledger', 0):.4g} (δ above)", "what the paper's composition (Thm. 7, 8: "
                 "N_e·ε_t) claims for these trees, and our RDP ledger (docs/dpboost.md)")]

    def schedule_refusal(self, plan, purpose, tree, level):
        bad = super().schedule_refusal(plan, purpose, tree, level)
        if bad is None and purpose in (Purpose.LEVEL, Purpose.TREE):
            bad = dpboost_rounds.check_tree(plan.hyperparameters, int(tree))
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
        return DPBoostRounds(plan, records)

    def federated_hyperparameters(self, hp, given):
        # ``selection`` stays "exponential" (the central DPBoost builder's setting, which the configuration
        # pins); a federated level is always a Gaussian histogram release (GreedyTrees.tree_releases)
        return hp

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/dpboost/site.py)."""
        return DPBoostSite(ctx)


register(DPBoostTrees())
