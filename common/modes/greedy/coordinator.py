"""The coordinator's side of greedy trees (docs/greedy.md "Federated greedy"): ``depth`` level rounds, then the
leaf round on the splits they chose.

A level's noisy histograms become one split per node of the level (:meth:`GreedyGrid.select
<fedsbdt.common.modes.greedy.rounds.GreedyGrid.select>`, post-processing); every later request of the
tree carries the splits chosen so far, and the released tree has exactly them.
"""
from __future__ import annotations

from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.splits import Splits

from fedsbdt.common.modes.coordinator import Step, TreeRounds, level_record, level_splits

class GreedyRounds(TreeRounds):
    """Greedy trees' tree in progress: the splits chosen per level so far."""

    def __init__(self, plan, records=()) -> None:
        self.grid = plan.greedy_grid
        super().__init__(plan, records)

    def rounds_per_tree(self) -> int:
        return self.hp.depth + 1  # d levels + the leaves

    def next_round(self):
        if len(self.levels) < self.hp.depth:
            return Purpose.LEVEL, len(self.levels)
        return Purpose.TREE, 0

    def vector_len(self, purpose, tree, level):
        if purpose == Purpose.LEVEL:
            return self.grid.layout(tree, level).length
        return super().vector_len(purpose, tree, level)

    def request(self, purpose, tree, level):
        return self.split_fields(level)

    def noise_layout(self, purpose, tree, level):
        return {"tree": tree, "level": level} if purpose == Purpose.LEVEL else {}

    def release(self, purpose, tree, level, noisy):
        if purpose != Purpose.LEVEL:
            return super().release(purpose, tree, level, noisy)
        features, thresholds = self.grid.select(noisy, tree, level, self.enc.scale, self.hp.l2,
                                                self.cal.sigma_select)
        return Step("level", level_record(features, thresholds), f"level {level}: splits chosen")

    def apply(self, kind, record):
        if kind != "level":
            return super().apply(kind, record)
        self.levels.append(level_splits(record))

    def splits(self, tree):
        return Splits(*self.chosen_splits())
