"""The coordinator's side of federated Sarus trees (docs/sarus.md "Federation"): a sketch, ``depth`` levels and
the leaves of one tree.

The tree in progress is its released sketch (and the candidate grid the sites recompute from it), the splits
chosen per level and which nodes of each chosen level stopped.  Everything here is post-processing of noisy
sums (:mod:`fedsbdt.common.federation.sarus_rounds`); every request after the sketch carries the sketch and the
splits chosen so far.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.federation.sarus_rounds import leaf_values, select
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.splits import Splits

from .coordinator import Step, TreeRounds, level_record, level_splits


class SarusRounds(TreeRounds):
    """Sarus trees' tree in progress: sketch, chosen levels and their stopped nodes."""

    leaf_noise_ahead = False  # the leaf noise is the grid's (drawn per tree)

    def __init__(self, plan, records=()) -> None:
        self.grid = plan.sarus_grid
        self.weight = plan.hyperparameters.hess_clip_for(plan.schema.task)  # h: every record's Hessian taken as h*
        super().__init__(plan, records)

    def reset(self) -> None:
        super().reset()
        self.sketch, self.tree_grid, self.stopped = None, None, []

    def next_round(self):
        if self.sketch is None:
            return Purpose.SKETCH, len(self.levels)
        return (Purpose.LEVEL if len(self.levels) < self.hp.depth else Purpose.TREE), len(self.levels)

    def vector_len(self, purpose, tree, level):
        if purpose == Purpose.SKETCH:
            return self.grid.sketch_len
        if purpose == Purpose.LEVEL:
            return self.tree_grid.layout(0, level).length
        return super().vector_len(purpose, tree, level)

    def request(self, purpose, tree, level):
        if purpose == Purpose.SKETCH:
            return {}
        return self.split_fields(level) | {"sketch": tuple(int(x) for x in self.sketch)}

    def central_noise_scales(self, purpose, tree, level):
        g = self.enc.grad.bound_units
        if purpose == Purpose.SKETCH:
            return self.grid.sketch_noise_scales(self.cal.sigma_sketch)
        if purpose == Purpose.LEVEL:
            return self.grid.level_noise_scales(self.tree_grid.layout(0, level), g, self.cal.sigma_select)
        return self.grid.leaf_noise_scales(g, self.cal.sigma)

    def release(self, purpose, tree, level, noisy):
        if purpose == Purpose.SKETCH:
            return Step("sketch", {"sketch": np.asarray(noisy, np.int64).tolist()}, "sketch released")
        if purpose != Purpose.LEVEL:
            return super().release(purpose, tree, level, noisy)
        parent = np.zeros(2**level, bool) if level == 0 else np.repeat(self.stopped[level - 1], 2)
        c, stopped = select(self.tree_grid, self.grid.counts_of(noisy), level, parent, self.enc.scale,
                            self.hp.min_child_weight, self.hp.l2, self.weight)
        cand = self.tree_grid.candidates
        record = level_record(cand.feature[c], cand.threshold[c]) | {"stopped": np.asarray(stopped, bool).tolist()}
        return Step("level", record, f"level {level}: splits chosen")

    def apply(self, kind, record):
        if kind == "sketch":
            self.sketch = np.asarray(record["sketch"], np.int64)
            self.tree_grid = self.grid.tree_grid(self.sketch)
        elif kind == "level":
            self.levels.append(level_splits(record))
            self.stopped.append(np.asarray(record["stopped"], bool))
        else:
            super().apply(kind, record)

    def leaf_values(self, noisy, tree):
        return leaf_values(self.grid.counts_of(noisy), np.concatenate(self.stopped), self.hp.depth, self.enc.scale,
                           self.hp.min_child_weight, self.hp.l2, self.weight, self.hp.leaf_clip)

    def splits(self, tree):
        return Splits(*self.chosen_splits())
