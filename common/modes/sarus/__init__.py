"""Federated Sarus trees (docs/sarus.md "Federation"): a sketch, ``depth`` levels and the leaves of one tree on
one Poisson subsample.

The tree's releases compose under one subsampling (their Gaussian parts add up to one Gaussian, Thm. 5), so a
tree costs one Poisson-subsampled composition of its Gaussians (the event of :meth:`SarusTrees.tree_releases`,
equal to :func:`~fedsbdt.common.modes.sarus.rounds.tree_event`), charged with its first release (the
sketch); its levels and leaves cost nothing more.  Budget per record: ``T`` sketches, ``T·depth`` levels and
``T`` leaf releases (each stage of a tree carries data once: common/modes/sarus/site.py).
Central builder: Laplace sketch, noisy node counts, the exponential mechanism and Laplace leaves on one
Poisson subsample (common/modes/sarus/builder.py); calibration:
:func:`fedsbdt.common.modes.sarus.mechanism.calibrate_sarus`.
"""
from __future__ import annotations

import math

import fedsbdt.common.modes.sarus.mechanism as sarus
import fedsbdt.common.modes.sarus.rounds as sarus_rounds
from fedsbdt.common.config import ConfigError
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.releases import Release, SarusLevelNoise, SketchNoise
from fedsbdt.common.modes.sarus.builder import SarusTrees as SarusTreeBuilder
from fedsbdt.common.modes.sarus.coordinator import SarusRounds
from fedsbdt.common.modes.sarus.site import SarusSite
from fedsbdt.common.modes.sarus.rounds import SarusGrid, plan_calibration, plan_refusal, share_coordinates

#: what a Sarus run takes for keys it is not given: the paper's §5 settings (20 trees, λ = 0.1, η = 0.3,
#: subsample 0.1, min_child_weight 50, g* = 1), XGBoost's depth 6, 32 sketch candidates, every feature per node
SARUS_DEFAULTS = {"trees": 20, "l2": 0.1, "learning_rate": 0.3, "subsample": 0.1, "min_child_weight": 50,
                  "grad_clip": 1.0, "depth": 6, "split_candidates": 32, "cyclical": False}


class SarusTrees(Mode):
    name = "sarus"
    summary = ("Sarus DP-XGBoost (Grislain & Gonzalvez): a Hessian sketch, noisy node counts and the exponential "
               "mechanism per level, Laplace leaves (docs/sarus.md)")
    tree_purposes = (Purpose.SKETCH, Purpose.LEVEL)
    defaults = SARUS_DEFAULTS
    exclusive = {"min_child_weight": "is for Sarus trees (set tree_builder = 'sarus')"}
    accountants = ("rdp", "pure")
    algorithm = ("The algorithm is Sarus DP-XGBoost (Grislain & Gonzalvez) with both flaws of its original fixed: a "
                 "Laplace Hessian sketch, noisy node counts and the exponential mechanism over every split "
                 "candidate, Laplace leaves; pure-DP releases composed in a Rényi-DP ledger.")

    def check_hyperparameters(self, hp, bad) -> None:
        """What the Sarus builder (docs/sarus.md) needs on top of the common checks."""
        if hp.filter:
            raise ConfigError("the individual Rényi filter does not apply to Sarus trees (pure-DP releases); "
                              "drop the filter")
        if hp.accountant not in self.accountants:
            raise bad("accountant", "Sarus trees are accounted by 'rdp' (our RDP ledger) or 'pure' (the paper's "
                      "pure-DP composition)")
        if hp.sketch_share != 0 or hp.selection != "exponential":
            raise ConfigError("sketch_share and selection are greedy-tree settings; Sarus trees split their "
                              "budget as the paper does (docs/sarus.md)")
        if not 1 <= hp.split_candidates <= 63:
            raise bad("split_candidates", "Sarus trees sketch 1..63 candidates per feature from a fine grid of "
                      "4× as many equal-width bins (e.g. 32)")
        if hp.min_child_weight < 0:
            raise bad("min_child_weight", "must be ≥ 0")
        if hp.min_child_weight + hp.l2 <= 0:
            raise bad("min_child_weight", "with l2 = 0 it must be ≥ 1 (else a leaf's sensitivity is unbounded)")
        super().check_hyperparameters(hp, bad)

    def calibrate(self, hp):
        return sarus.calibrate_sarus(hp.epsilon, hp.delta, hp.accounted_rounds, hp.depth, hp.subsample,
                                     hp.init_share, hp.eps_ds, hp.accountant)

    def central_builder(self, schema, hp, cal):
        return SarusTreeBuilder(schema, hp, sarus.TreeBudget.split(cal.eps_sketch / sarus.SKETCH_SHARE, hp.depth))

    def receipt_fields(self, hp, cal):
        return {"min_child_weight": hp.min_child_weight, "eps_sketch": cal.eps_sketch, "eps_leaf": cal.eps_leaf,
                "eps_paper": cal.eps_paper, "eps_rdp": cal.eps_rdp}

    def gaussian_leaves(self, federated):
        return federated  # central Sarus trees: Laplace leaves, no σ_leaf or ρ

    def account(self, hp, cal, federated, res, human):
        if federated:
            return human + (f"\nsigma_select {cal.sigma_select:.6g}   (level histograms)\nsigma_sketch "
                            f"{cal.sigma_sketch:.6g}   (sketch histograms; federated Sarus trees, docs/sarus.md "
                            "\"Federation\")")
        res.update(eps_sketch=cal.eps_sketch, eps_leaf=cal.eps_leaf, eps_paper=cal.eps_paper, eps_rdp=cal.eps_rdp)
        return human + (f"\nper tree     ε_sketch {cal.eps_sketch:.6g}, ε per level {cal.eps_select:.6g} "
                        f"(exponential) + {cal.eps_select:.6g} (node counts), ε_leaf {cal.eps_leaf:.6g}   "
                        f"(docs/sarus.md)\npaper claims ε = {cal.eps_paper:.6g} (pure DP: subsampling "
                        f"amplification, basic composition)\nour ledger   ε = {cal.eps_rdp:.6g} at δ = "
                        f"{hp.delta:.3g} (RDP)")

    def report_rows(self, p):
        return [("ε per Sarus tree", f"sketch {p.get('eps_sketch', 0):.4g}, per level {p.get('eps_select', 0):.4g} + "
                 f"{p.get('eps_select', 0):.4g}, leaves {p.get('eps_leaf', 0):.4g}", "Laplace Hessian sketch, noisy "
                 "node counts + exponential mechanism per level, Laplace leaves (docs/sarus.md)"),
                ("ε the paper claims", p.get("eps_paper"), "Sarus' own accounting: subsampling amplification, basic "
                 "composition (pure DP)"),
                ("ε by our ledger", p.get("eps_rdp"), f"RDP ledger at δ = {p.get('delta') or 'the plan δ'}")]

    def epsilon_curve(self, privacy, points=40, depth=0):
        """By the model's own accountant: a federated model's Gaussian releases (it has a sketch σ), or a central
        model's pure-DP releases (:func:`fedsbdt.common.modes.sarus.mechanism.epsilon_curve`)."""
        if float(privacy.get("sigma_sketch", 0.0) or 0.0) > 0:
            return sarus_rounds.epsilon_curve(privacy, points, depth)
        return sarus.epsilon_curve(privacy, points, depth)

    def tree_releases(self, plan):
        """The sketch, each level and the leaves, each with its own noise; the tree's event — their Gaussians
        composed on one Poisson subsample — is charged with the sketch, the levels and leaves inside it."""
        hp, cal, grid, g = plan.hyperparameters, plan.calibration(), plan.sarus_grid, plan.encoding.grad.bound_units
        level = SarusLevelNoise(grid, g, cal.sigma_select)
        leaves = SarusLevelNoise(grid, g, cal.sigma, leaves=True)
        return {"sketch": Release("sketch", SketchNoise(grid, cal.sigma_sketch), rate=hp.subsample,
                                  composed=((level, hp.depth), (leaves, 1))),
                "level": Release("level", level, charged_with="sketch"),
                "tree": Release("tree", leaves, charged_with="sketch")}

    def plan_refusal(self, plan):
        return plan_refusal(plan.hyperparameters, plan.schema)

    def federated_calibration(self, hp):
        return plan_calibration(hp)

    def plan_grids(self, plan):
        """The fine sketch grid and the shapes of a tree's rounds (docs/sarus.md "Federation")."""
        return {"sarus_grid": SarusGrid.for_plan(plan.schema, plan.hyperparameters, plan.encoding.grad.bound_units)}

    def max_vector_len(self, plan):
        grid = plan.sarus_grid
        return max(super().max_vector_len(plan), grid.sketch_len, grid.max_level_len())

    def share_coordinates(self, plan):
        """Sketch, level and leaf entries (Δ = g* units or C, common/modes/sarus/rounds.py)."""
        return share_coordinates(plan)

    def max_share_scale(self, plan, shares):
        return max([0.0] + [S / math.sqrt(shares) for group in self.share_coordinates(plan) for S, _ in group])

    def tree_budget(self, plan):
        hp = plan.hyperparameters
        return {"sketch": hp.accounted_rounds, "level": hp.accounted_rounds * hp.depth, "tree": hp.accounted_rounds}

    # ---- coordinator side

    def coordinator_rounds(self, plan, records=()):
        return SarusRounds(plan, records)

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/sarus/site.py)."""
        return SarusSite(ctx)


register(SarusTrees())
