"""The site side of federated Sarus trees (docs/sarus.md "Federation").

Per tree the site draws its Poisson subsample once (from the plan's randomness: the OS CSPRNG in a real
plan) and keeps it in its database (this mode's state, keys ``sarus_subsample/<tree>`` and
``sarus_sketch/<tree>``), so the tree's sketch, level and leaf rounds — and a restarted site —
use the same records.  Before anything is computed a request is checked against the pinned plan and the
site's database: the tree is the next one; a sketch is asked for once per tree; a level or leaf request
carries the tree's released sketch (the first one seen is stored; another one is refused), its splits are
among the candidates the site recomputes from that sketch, lie below the depth and repeat every split of
the tree released before.  A refused request computes, stores and charges nothing.

Each stage of a tree (its sketch, each level, its leaves) carries this site's data in at most one masked
input: a retried round gets an all-zero data vector plus a fresh noise share (data-independent), so no
record enters more releases than the plan accounts, whatever the coordinator retries.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common import kernels
from fedsbdt.common.boosting import TASK_CODE
from fedsbdt.common.modes.sarus.rounds import SarusRequestError, SarusTree
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.splits import Splits

from fedsbdt.common.modes.greedy.site import released_splits_refusal, request_refusal
from fedsbdt.common.modes.site_rounds import (Computed, Declared, RoundInput, SiteContext, SiteRounds,
                                              catch_up_or_refusal)


def subsample_key(tree: int) -> str:
    """The site database key of tree ``tree``'s subsample (the number of records, 8 bytes, then one bit each)."""
    return f"sarus_subsample/{int(tree)}"


def sketch_key(tree: int) -> str:
    """The site database key of tree ``tree``'s released sketch (int64 little-endian)."""
    return f"sarus_sketch/{int(tree)}"


class SarusSite(SiteRounds):
    """Sketch, level and leaf rounds of one tree on one Poisson subsample, at one site (``ctx``: its plan, data,
    randomness and store)."""

    leaf_shares_ahead = False  # the tree's rounds draw their own shares

    def __init__(self, ctx: SiteContext) -> None:
        super().__init__(ctx)
        self.grid = ctx.plan.sarus_grid
        self.codes = self.grid.fine_codes(ctx.local.X)
        self._trees: dict[int, tuple[bytes, SarusTree, np.ndarray]] = {}  # tree -> (sketch, state, grid codes)

    # ------------------------------------------------------------------ per-tree public and private state

    def subsample(self, tree: int) -> np.ndarray:
        """This site's Poisson subsample for tree ``tree`` (drawn once, kept in the database), present records."""
        local, store = self.ctx.local, self.ctx.store
        blob = store.mode_state(subsample_key(tree))
        if blob is None:
            mask = np.asarray(self.ctx.randomness.subsample(self.plan.hyperparameters.subsample, local.ids, tree),
                              bool)
            store.set_mode_state(subsample_key(tree), np.int64(mask.size).astype("<i8").tobytes()
                                 + np.packbits(mask).tobytes())
        else:
            records = int(np.frombuffer(blob[:8], "<i8")[0])
            if records != local.n:
                raise self.ctx.abort(f"the stored subsample of tree {tree} covers {records} records, the data "
                                     f"{local.n}")
            mask = np.unpackbits(np.frombuffer(blob[8:], np.uint8), count=records).astype(bool)
        return mask & (local.arrival <= tree)

    def released_sketch(self, tree: int) -> np.ndarray | None:
        """The noisy sketch of tree ``tree`` the coordinator's requests carried (the first one seen), or None."""
        blob = self.ctx.store.mode_state(sketch_key(tree))
        return None if blob is None else np.frombuffer(blob, "<i8").astype(np.int64)

    def tree(self, tree: int, sketch) -> tuple[SarusTree, np.ndarray]:
        """The tree's state from its released sketch (candidates recomputed here) and the records' codes."""
        key = np.asarray(sketch, np.int64).tobytes()
        hit = self._trees.get(tree)
        if hit is None or hit[0] != key:
            state = SarusTree(self.plan, np.asarray(sketch, np.int64))
            hit = self._trees[tree] = (key, state, state.tree_grid.codes(self.ctx.local.X))
            self._trees = {k: v for k, v in self._trees.items() if k >= tree}
        return hit[1], hit[2]

    def state(self, rin: RoundInput) -> SarusTree | None:
        """The tree's state for a checked level or leaf request (None for a sketch request)."""
        return None if rin.purpose == Purpose.SKETCH else self.tree(rin.tree, rin.request.sketch)[0]

    # ------------------------------------------------------------------ checks

    def check(self, rin: RoundInput) -> str | None:
        """Why a request must not be answered, or None (raises NeedCatchUp for a tree not yet reached)."""
        ev, k = rin.request, rin.tree
        late = catch_up_or_refusal(rin)
        if late is not None:
            return late
        known = self.released_sketch(k)
        if ev.purpose == Purpose.SKETCH:
            if ev.features or ev.sketch:
                return "a sketch request carries no splits and no sketch"
            if known is not None:
                return f"the sketch of tree {k} was already released; refusing to sketch it again"
            return None
        if ev.purpose not in (Purpose.LEVEL, Purpose.TREE):
            return f"{ev.purpose.name} rounds are not part of Sarus trees"
        try:
            sketch = self.grid.check_sketch(ev.sketch)
        except SarusRequestError as e:
            return f"the request for tree {k} does not carry its released sketch ({e})"
        if known is not None and not np.array_equal(known, sketch):
            return f"the request carries another sketch of tree {k} than the one released before"
        state, _ = self.tree(k, sketch)
        return request_refusal(self.ctx, rin, state.tree_grid)

    # ------------------------------------------------------------------ a round

    def vector_len(self, rin: RoundInput) -> int:
        state = self.state(rin)
        return self.grid.sketch_len if state is None else state.vector_len(rin.purpose, rin.level)

    def declare(self, rin: RoundInput) -> Declared:
        """Every stage of a tree reads the tree's subsample and carries data in its first attempt only; the charge
        covers every present record (the tree's event is Poisson-subsampled: the input set is the population)."""
        present = self.subsample(rin.tree)
        state = self.state(rin)
        where = {"layout": state.tree_grid.layout(0, rin.level)} if rin.purpose == Purpose.LEVEL else {}
        return Declared(self.ctx.local.arrival <= rin.tree, once=True, where=where, sampled=int(present.sum()))

    def compute(self, rin: RoundInput, declared: Declared, admitted: np.ndarray) -> Computed:
        return Computed(self._vector(rin.request, self.state(rin), self.subsample(rin.tree)))  # stored: the same

    def remember(self, rin: RoundInput) -> None:
        state = self.state(rin)
        if state is not None:
            ev, store = rin.request, self.ctx.store
            store.keep_mode_state(sketch_key(ev.tree), np.asarray(state.sketch, "<i8").tobytes())
            store.remember_splits(ev.tree, ev.features, ev.thresholds)

    def _vector(self, ev, state, present: np.ndarray) -> np.ndarray:
        """This site's sums for a checked request on its subsample ``present``."""
        if state is None:
            return self.grid.sketch_vector(self.codes, present)
        local, enc = self.ctx.local, self.ctx.local.enc
        tg, codes = state.tree_grid, self.tree(ev.tree, ev.sketch)[1]
        depth = ev.level if ev.purpose == Purpose.LEVEL else self.plan.hyperparameters.depth
        node = tg.route(codes, tg.candidate_index(ev.tree, ev.features, ev.thresholds), depth)
        gq, _ = kernels.grad_hess_units(local.pred, local.y, TASK_CODE[local.task], enc.scale, enc.grad.bound_units,
                                        enc.hess.bound_units)
        if ev.purpose == Purpose.LEVEL:
            return self.grid.level_vector(codes, node, gq, present, tg.layout(ev.tree, ev.level))
        return self.grid.leaf_vector(node, gq, present)

    # ------------------------------------------------------------------ released trees

    def released_splits(self, t):
        """A released tree's splits, checked against the candidates of its released sketch (if this site saw
        it) and the splits the requests carried; ends the session (``ctx.abort``) if they are not."""
        try:
            return self._released_splits(t)
        except SarusRequestError as e:
            raise self.ctx.abort(str(e)) from None

    def _released_splits(self, t):
        hp = self.plan.hyperparameters
        if t.features.size != hp.leaves - 1:
            raise SarusRequestError(f"tree {t.index} has {t.features.size} splits, not a tree of the plan's depth")
        sketch = self.released_sketch(t.index)
        if sketch is not None:
            try:
                self.tree(t.index, sketch)[0].tree_grid.candidate_index(t.index, t.features, t.thresholds)
            except ValueError as e:
                raise SarusRequestError(f"tree {t.index} has splits off its released sketch ({e})") from None
        bad = released_splits_refusal(self.ctx, t)
        if bad is not None:
            raise SarusRequestError(bad)
        return Splits(t.features, t.thresholds)
