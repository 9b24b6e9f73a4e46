"""Greedy trees (docs/greedy.md): ``depth`` level rounds of noisy histograms, then the leaf round.

Release kinds: ``level`` — every record in every level (the nodes of a level hold disjoint records: one
release), a Gaussian of σ_s/√2 (noisy histograms); ``tree`` — the leaves, a Gaussian of σ/√2.  Budget: ``T·depth`` levels and ``T`` leaf releases per record.
Central builder: DP-XGB's exponential mechanism per level, or noisy level histograms
(common/modes/greedy/builder.py); calibration: :func:`fedsbdt.common.accountant.calibrate_greedy`.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.accountant import calibrate_greedy, event_epsilon_rdp, greedy_training_event
from fedsbdt.common.config import ConfigError
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.greedy.builder import GreedyTrees as GreedyTreeBuilder
from fedsbdt.common.modes.greedy.coordinator import GreedyRounds
from fedsbdt.common.modes.greedy.site import GreedySite
from fedsbdt.common.modes.releases import LeafNoise, LevelNoise, Release

#: what a greedy run takes for keys it is not given (``config.builder_defaults``): every record in every tree
#: (the paper's DP-XGB does not subsample), a public grid of 32 candidate thresholds per feature, and every
#: feature at every node (greedy trees are chosen for interactions, which cyclical trees miss; ``cyclical =
#: true`` gives the paper's XGB_cyc)
GREEDY_DEFAULTS = {"subsample": 1.0, "split_candidates": 32, "cyclical": False}


class GreedyTrees(Mode):
    name = "greedy"
    summary = "splits chosen by the exponential mechanism over the gain (DP-XGB, docs/greedy.md)"
    tree_purposes = (Purpose.LEVEL,)
    defaults = GREEDY_DEFAULTS
    drawn_trees = True
    algorithm = ("The algorithm is DP-XGB (Revisiting DP-XGBoost, greedy trees): splits chosen by the exponential "
                 "mechanism over the gain, S-BDT's Gaussian leaf release, a Rényi-DP accountant with the "
                 "bounded-range bound.")

    def check_hyperparameters(self, hp, bad) -> None:
        """What the greedy builder (docs/greedy.md) needs on top of the common checks."""
        super().check_hyperparameters(hp, bad)
        if hp.filter:
            raise ConfigError("the individual Rényi filter does not apply to greedy trees (the exponential "
                              "mechanism's cost does not depend on a record's gradient); use tree_builder = "
                              "'random' with the filter, or drop the filter")
        if hp.subsample != 1.0:
            raise bad("subsample", "greedy trees use every record in every tree (paper Alg. 1): set subsample = 1")
        if not 1 <= hp.split_candidates <= 255:
            raise bad("split_candidates", "greedy trees choose among a public grid of 1..255 candidates per "
                      "feature (e.g. 32)")
        if not 0 < hp.selection_share < 1:
            raise bad("selection_share", "the node-selection share of the budget must be in (0, 1)")
        if not 0 <= hp.sketch_share < 1 or not hp.selection_share + hp.sketch_share < 1:
            raise bad("sketch_share", "must be in [0, 1) with selection_share + sketch_share < 1 (the rest is "
                      "for the leaves; paper: 0.1 with selection_share 0.6)")
        if hp.sketch_share > 0 and hp.selection != "exponential":
            raise bad("sketch_share", "the adaptive Hessian sketch works with selection = 'exponential'")

    def calibrate(self, hp):
        return calibrate_greedy(hp.epsilon, hp.delta, hp.accounted_rounds, hp.depth, hp.selection_share,
                                hp.init_share, hp.eps_ds, hp.accountant, selection=hp.selection,
                                sketch_share=hp.sketch_share)

    def central_builder(self, schema, hp, cal):
        return GreedyTreeBuilder(schema, hp, cal.eps_select if hp.selection == "exponential" else cal.sigma_select,
                                 cal.sigma_sketch)

    def account(self, hp, cal, federated, res, human):
        if hp.selection == "exponential":
            return human + (f"\neps_select   {cal.eps_select:.6g}   (exponential mechanism per level, Δ = 3·g*²; "
                            f"bounded-range RDP, Thm. 1)")
        return human + f"\nsigma_select {cal.sigma_select:.6g}   (noise of the level histograms, docs/greedy.md)"

    def report_rows(self, p):
        if p.get("selection", "exponential") != "exponential":
            return []
        return [("ε_select", p.get("eps_select"), "exponential mechanism per tree level (bounded-range RDP, Thm. 1 "
                 "of 'Revisiting DP-XGBoost')")]

    def epsilon_curve(self, privacy, points=40, depth=0):
        """Greedy trees (``depth`` levels each) are charged by the same event ledger as in training
        (:func:`fedsbdt.common.accountant.greedy_training_event`)."""
        T = int(privacy.get("rounds_accounted", 0) or 0)
        sigma = float(privacy.get("sigma", 0) or 0)
        if T < 1 or not sigma > 0 or depth < 1:
            return np.zeros(0), np.zeros(0)
        rs = np.unique(np.linspace(1, T, min(points, T)).round().astype(int))
        delta = float(privacy["delta"])
        e_init, e_ds = float(privacy.get("eps_init", 0.0)), float(privacy.get("eps_ds", 0.0))
        selection = str(privacy.get("selection", "exponential"))
        select = float(privacy["eps_select"] if selection == "exponential" else privacy["sigma_select"])
        sk = float(privacy.get("sigma_sketch", 0.0) or 0.0)
        eps = [event_epsilon_rdp(greedy_training_event(select, sigma, depth, int(r), e_init, e_ds, selection, sk),
                                 delta)[0] for r in rs]
        return rs, np.asarray(eps)

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
        return GreedyRounds(plan, records)

    def federated_hyperparameters(self, hp, given):
        if "selection" in given:
            return hp
        return hp.replace(selection="histogram")  # a federation selects from noisy histograms

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/greedy/site.py)."""
        return GreedySite(ctx)


register(GreedyTrees())
