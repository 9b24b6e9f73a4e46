"""Federated Sarus trees (docs/sarus.md "Federation"): a sketch, ``depth`` levels and the leaves of one tree on
one Poisson subsample.

The tree's releases compose under one subsampling (their Gaussian parts add up to one Gaussian, Thm. 5), so a
tree costs one :func:`~fedsbdt.common.federation.sarus_rounds.tree_event`, charged with its first release (the
sketch); its levels and leaves cost nothing more.  Budget per record: ``T`` sketches, ``T·depth`` levels and
``T`` leaf releases (each stage of a tree carries data once: common/modes/sarus_site.py).
"""
from __future__ import annotations

import math

from fedsbdt.common.federation.sarus_rounds import SKETCH_SHARE, tree_event
from fedsbdt.common.federation.wire import Purpose

from . import register
from .base import Mode


class SarusTrees(Mode):
    name = "sarus"
    tree_purposes = (Purpose.SKETCH, Purpose.LEVEL)

    def tree_event(self, plan, kind):
        if kind != "sketch":
            return None  # inside the tree's subsampled composition, charged with the sketch
        hp, cal = plan.hyperparameters, plan.calibration()
        return tree_event(cal.sigma_sketch * math.sqrt(SKETCH_SHARE), hp.depth, hp.subsample)

    def tree_budget(self, plan):
        hp = plan.hyperparameters
        return {"sketch": hp.accounted_rounds, "level": hp.accounted_rounds * hp.depth, "tree": hp.accounted_rounds}

    # ---- coordinator side

    def coordinator_rounds(self, plan, records=()):
        from .sarus_coordinator import SarusRounds

        return SarusRounds(plan, records)

    # ---- site side
    def site_rounds(self, plan, site):
        """This mode's rounds at a site (common/modes/sarus_site.py)."""
        from .sarus_site import SarusSite

        return SarusSite(plan, site)


register(SarusTrees())
