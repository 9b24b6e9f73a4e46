"""The central builder of random trees (S-BDT): public, data-independent random splits
(:func:`fedsbdt.common.splits.random_splits`); they cost no privacy."""
from __future__ import annotations

from dataclasses import dataclass

from fedsbdt.common.boosting import LocalData
from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.schema import Schema
from fedsbdt.common.splits import Splits, random_splits


@dataclass(frozen=True)
class RandomTrees:
    """S-BDT's public random splits (Alg. 4 line 2): data-independent, free of privacy cost."""

    schema: Schema
    hp: Hyperparameters

    def splits(self, round_id: int, local: LocalData, randomness) -> Splits:
        hp = self.hp
        return random_splits(self.schema, hp.depth, hp.seed, round_id, hp.cyclical, hp.split_candidates)
