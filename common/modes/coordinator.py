"""The coordinator's side of a mode: the state of the tree in progress (docs/plugins.md "The coordinator side").

The coordinator's session (``server/session.py``) never names a mode.  For the trees of a plan it asks one
:class:`TreeRounds` object, made by the plan's mode (:meth:`fedsbdt.common.modes.base.Mode.coordinator_rounds`):

* the next round of the tree in progress (:meth:`TreeRounds.next_round`: its purpose and level) and how many
  tree rounds are left (:meth:`TreeRounds.rounds_left`, for the epoch pipeline's slot estimate);
* a round's vector length (:meth:`TreeRounds.vector_len`) and what its request carries besides the
  secure-aggregation start (:meth:`TreeRounds.request`: the level, the splits chosen so far, a sketch);
* the layout of a round's noise (:meth:`TreeRounds.noise_layout`); the noise the coordinator adds in central
  noise mode is :func:`central_noise`, the coordinator's one noise rule, for every round of every mode;
* what an aggregated noisy sum of a round before the leaves releases (:meth:`TreeRounds.release`: a
  :class:`Step` — post-processing only) and how it joins the tree in progress (:meth:`TreeRounds.apply`);
* the leaf values of the tree from the leaf round's noisy sum and the released tree's splits
  (:meth:`TreeRounds.leaf_values`, :meth:`TreeRounds.splits`), then :meth:`TreeRounds.reset` for the next tree.

A :class:`Step`'s ``record`` is JSON: the session writes it to the coordinator's checkpoint (kind = the round
purpose's name, ``level`` or ``sketch``) before any later request carries it, and a restarted coordinator
rebuilds the tree in progress by :meth:`TreeRounds.apply`-ing the checkpointed records in order — the same
method a live release goes through, so a restart resumes exactly where the live session was.

This base class is S-BDT's random trees: one leaf round per tree on the public random splits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsbdt.common.boosting import leaf_values
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.multiclass import round_vector_len
from fedsbdt.common.splits import Splits, random_splits

from .releases import PURPOSE_KIND


def central_noise(plan, kind: str, randomness, where=None, ahead=None):
    """The noise the coordinator adds to the released sum of a ``kind`` round, or None: the coordinator's one noise
    rule, for every release kind of every mode.

    Central noise mode: the full noise of the release as the plan declares it (``plan.releases[kind]``, the very
    declaration the sites' shares and the gates' charges come from), at layout ``where``, drawn with the
    release's mechanism (discrete Gaussian or discrete Laplace), or taken from ``ahead`` (a
    :class:`~fedsbdt.client.noise.NoiseShares`-like source of full-noise vectors drawn beforehand).  None in
    distributed noise mode (the sites' shares are the noise) and for a release every site noises in full itself
    (``Noise.central`` False: the evaluation)."""
    release = plan.releases[kind]
    if plan.noise != "central" or not release.noise.central:
        return None
    if ahead is not None:
        return ahead.take()
    draw = randomness.discrete_gaussian if release.noise.mechanism == "gaussian" else randomness.discrete_laplace
    return draw(release.scales(1, **dict(where or {})))


@dataclass(frozen=True)
class Step:
    """A released round before the leaves: its checkpoint record kind, the JSON record (what later requests
    and the tree need) and the log line's words (``"level 2: splits chosen"``)."""

    kind: str
    record: dict
    what: str


class TreeRounds:
    """The coordinator's state of the tree in progress (base: one leaf round per tree, public random splits).

    Args:
        plan: the verified plan.
        records: the checkpointed ``(kind, record)`` pairs of the tree in progress, in order (a restart).
    """

    #: the central leaf noise is the same for every tree: the session draws it ahead in a background thread
    leaf_noise_ahead = True

    def __init__(self, plan, records=()) -> None:
        self.plan, self.hp, self.enc = plan, plan.hyperparameters, plan.encoding
        self.cal = plan.calibration()
        self.levels: list[tuple[np.ndarray, np.ndarray]] = []  # the splits chosen per level of the tree so far
        self.reset()
        for kind, record in records:
            self.apply(kind, record)

    # ------------------------------------------------------------------ the schedule of one tree

    def rounds_per_tree(self) -> int:
        return 1

    def rounds_left(self, trees_left: int) -> int:
        """The tree rounds still to run (the tree in progress's chosen levels done), for the slot estimate."""
        return trees_left * self.rounds_per_tree() - len(self.levels)

    def next_round(self) -> tuple[Purpose, int]:
        """(purpose, level) of the tree in progress's next round."""
        return Purpose.TREE, 0

    # ------------------------------------------------------------------ a round's request

    def vector_len(self, purpose: Purpose, tree: int, level: int) -> int:
        if purpose != Purpose.TREE:
            raise ValueError(f"{Purpose(purpose).name.lower()} rounds are not rounds of {type(self).__name__}")
        return round_vector_len(self.plan.schema, self.hp)

    def request(self, purpose: Purpose, tree: int, level: int) -> dict:
        """The request's fields besides purpose, tree and the secure-aggregation start
        (:class:`~fedsbdt.common.federation.wire.RoundStartMsg`)."""
        return {}

    def central_noise_scales(self, purpose: Purpose, tree: int, level: int) -> np.ndarray:
        """Per-entry std (integer units) of the noise the coordinator adds to a round in central noise mode: the
        full noise of the round's release as the plan declares it (``plan.releases``, the sites' very draw)."""
        return self.plan.releases[PURPOSE_KIND[Purpose(purpose)]].scales(1, **self.noise_layout(purpose, tree, level))

    def noise_layout(self, purpose: Purpose, tree: int, level: int) -> dict:
        """What fixes the layout of a round's noise (the ``where`` of common/modes/releases.py); base: nothing."""
        return {}

    # ------------------------------------------------------------------ rounds before the leaves

    def release(self, purpose: Purpose, tree: int, level: int, noisy: np.ndarray) -> Step:
        """The :class:`Step` a round before the leaves releases from its noisy sum (post-processing); the tree
        in progress changes only when the session :meth:`apply`-s it (after checkpointing it)."""
        raise ValueError(f"{Purpose(purpose).name.lower()} rounds are not rounds of {type(self).__name__}")

    def apply(self, kind: str, record: dict) -> None:
        """Add a released step (live, or read back from the checkpoint) to the tree in progress."""
        raise ValueError(f"a {kind!r} record is not a step of {type(self).__name__}'s trees")

    # ------------------------------------------------------------------ the leaves

    def leaf_values(self, noisy: np.ndarray, tree: int) -> np.ndarray:
        """The tree's leaf values from the leaf round's noisy sums (post-processing)."""
        return leaf_values(noisy, self.hp, self.enc)

    def splits(self, tree: int) -> Splits:
        """The released tree's splits."""
        return random_splits(self.plan.schema, self.hp.depth, self.hp.seed, tree, self.hp.cyclical,
                             self.hp.split_candidates)

    def reset(self) -> None:
        """Forget the tree in progress (its tree was released)."""
        self.levels = []

    def warm_up(self) -> None:
        """Compile the leaf-value kernel now rather than under the first round's deadline."""
        leaf_values(np.zeros(round_vector_len(self.plan.schema, self.hp), np.int64), self.hp, self.enc)

    # ------------------------------------------------------------------ for level-round modes

    def chosen_splits(self) -> tuple[np.ndarray, np.ndarray]:
        """The splits chosen for the tree in progress so far, heap order (all of them once every level is)."""
        return (np.concatenate([f for f, _ in self.levels] or [np.zeros(0, np.int32)]).astype(np.int32),
                np.concatenate([t for _, t in self.levels] or [np.zeros(0)]).astype(np.float64))

    def split_fields(self, level: int) -> dict:
        """A request's level and splits chosen so far (wire types)."""
        features, thresholds = self.chosen_splits()
        return {"level": level, "features": tuple(int(f) for f in features),
                "thresholds": tuple(float(t) for t in thresholds)}


def level_record(features: np.ndarray, thresholds: np.ndarray) -> dict:
    """A level's chosen splits as a checkpoint record."""
    return {"features": np.asarray(features).astype(int).tolist(), "thresholds": [float(x) for x in thresholds]}


def level_splits(record: dict) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(record["features"], np.int32), np.asarray(record["thresholds"], np.float64)
