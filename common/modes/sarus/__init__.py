"""Federated Sarus trees (docs/sarus.md "Federation"): a sketch, ``depth`` levels and the leaves of one tree on
one Poisson subsample.

The tree's releases compose under one subsampling (their Gaussian parts add up to one Gaussian, Thm. 5), so a
tree costs one Poisson-subsampled composition of its Gaussians (the event of :meth:`SarusTrees.tree_releases`,
equal to :func:`~fedsbdt.common.modes.sarus.rounds.tree_event`), charged with its first release (the
sketch); its levels and leaves cost nothing more.  Budget per record: ``T`` sketches, ``T·depth`` levels and
``T`` leaf releases (each stage of a tree carries data once: common/modes/sarus/site.py).
"""
from __future__ import annotations

from fedsbdt.common.federation.wire import Purpose

from fedsbdt.common.modes import register
from fedsbdt.common.modes.base import Mode
from fedsbdt.common.modes.releases import Release, SarusLevelNoise, SketchNoise


class SarusTrees(Mode):
    name = "sarus"
    tree_purposes = (Purpose.SKETCH, Purpose.LEVEL)

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
        from fedsbdt.common.modes.sarus.rounds import plan_refusal

        return plan_refusal(plan.hyperparameters, plan.schema)

    def federated_calibration(self, hp):
        from fedsbdt.common.modes.sarus.rounds import plan_calibration

        return plan_calibration(hp)

    def plan_grids(self, plan):
        """The fine sketch grid and the shapes of a tree's rounds (docs/sarus.md "Federation")."""
        from fedsbdt.common.modes.sarus.rounds import SarusGrid

        return {"sarus_grid": SarusGrid.for_plan(plan.schema, plan.hyperparameters, plan.encoding.grad.bound_units)}

    def max_vector_len(self, plan):
        grid = plan.sarus_grid
        return max(super().max_vector_len(plan), grid.sketch_len, grid.max_level_len())

    def share_coordinates(self, plan):
        """Sketch, level and leaf entries (Δ = g* units or C, common/modes/sarus/rounds.py)."""
        from fedsbdt.common.modes.sarus.rounds import share_coordinates

        return share_coordinates(plan)

    def max_share_scale(self, plan, shares):
        import math

        return max([0.0] + [S / math.sqrt(shares) for group in self.share_coordinates(plan) for S, _ in group])

    def tree_budget(self, plan):
        hp = plan.hyperparameters
        return {"sketch": hp.accounted_rounds, "level": hp.accounted_rounds * hp.depth, "tree": hp.accounted_rounds}

    # ---- coordinator side

    def coordinator_rounds(self, plan, records=()):
        from fedsbdt.common.modes.sarus.coordinator import SarusRounds

        return SarusRounds(plan, records)

    # ---- site side
    def site_rounds(self, ctx):
        """This mode's rounds at a site (common/modes/sarus/site.py)."""
        from fedsbdt.common.modes.sarus.site import SarusSite

        return SarusSite(ctx)


register(SarusTrees())
