"""The coordinator's side of federated DPBoost (docs/dpboost.md "Federation"): greedy trees' level rounds, and
leaf values ``V = Σg/(n+λ)`` clipped by GLC and clamped (:func:`fedsbdt.common.modes.dpboost.rounds.leaf_values`,
post-processing)."""
from __future__ import annotations

import fedsbdt.common.modes.dpboost.rounds as dpboost_rounds

from fedsbdt.common.modes.greedy.coordinator import GreedyRounds


class DPBoostRounds(GreedyRounds):
    def leaf_values(self, noisy, tree):
        return dpboost_rounds.leaf_values(noisy, self.hp, self.enc, tree)
