"""The coordinator's side of federated Sarus trees (docs/sarus.md "Federation"): a sketch, ``depth`` levels and
the leaves of one tree.

The tree in progress is a :class:`~fedsbdt.common.modes.sarus.rounds.SarusTree` (its released sketch, the
candidate grid the sites recompute from it, which nodes of each chosen level stopped) and the splits chosen per
level.  Everything here is post-processing of noisy sums; every request after the sketch carries the sketch
and the splits chosen so far.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.modes.sarus.rounds import SarusTree
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.splits import Splits

from fedsbdt.common.modes.coordinator import Step, TreeRounds, level_record, level_splits


class SarusRounds(TreeRounds):
    """Sarus trees' tree in progress: sketch, chosen levels and their stopped nodes."""

    leaf_noise_ahead = False  # the leaf noise is the grid's (drawn per tree)
    # rounds_per_tree stays the base's 1, as the session's slot estimate always had it for Sarus trees (its
    # d + 2 rounds are undercounted: the next epoch is then set up when a round finds no slot, not ahead)

    def __init__(self, plan, records=()) -> None:
        self.tree = SarusTree(plan)
        super().__init__(plan, records)

    def reset(self) -> None:
        super().reset()
        self.tree.reset()

    def next_round(self):
        return self.tree.next_purpose(len(self.levels)), len(self.levels)

    def vector_len(self, purpose, tree, level):
        if purpose in (Purpose.SKETCH, Purpose.LEVEL):
            return self.tree.vector_len(purpose, level)
        return super().vector_len(purpose, tree, level)

    def request(self, purpose, tree, level):
        if purpose == Purpose.SKETCH:
            return {}
        return self.split_fields(level) | {"sketch": tuple(int(x) for x in self.tree.sketch)}

    def noise_layout(self, purpose, tree, level):
        return {"layout": self.tree.tree_grid.layout(0, level)} if purpose == Purpose.LEVEL else {}

    def release(self, purpose, tree, level, noisy):
        if purpose == Purpose.SKETCH:
            return Step("sketch", {"sketch": np.asarray(noisy, np.int64).tolist()}, "sketch released")
        if purpose != Purpose.LEVEL:
            return super().release(purpose, tree, level, noisy)
        features, thresholds, stopped = self.tree.choose(noisy, level)
        record = level_record(features, thresholds) | {"stopped": np.asarray(stopped, bool).tolist()}
        return Step("level", record, f"level {level}: splits chosen")

    def apply(self, kind, record):
        if kind == "sketch":
            self.tree.set_sketch(np.asarray(record["sketch"], np.int64))
        elif kind == "level":
            self.levels.append(level_splits(record))
            self.tree.stopped.append(np.asarray(record["stopped"], bool))
        else:
            super().apply(kind, record)

    def leaf_values(self, noisy, tree):
        return self.tree.leaf_values(noisy)

    def splits(self, tree):
        return Splits(*self.chosen_splits())
