"""What a mode (a way of building trees, or of evaluating a model) declares to the site's gate.

A mode is a plug-in: one module with one :class:`Mode` subclass and a :func:`fedsbdt.common.modes.register`
call.  The site's gate (``client/gate.py``) and the coordinator's session never name a mode; they ask the
mode of the pinned plan (:func:`fedsbdt.common.modes.mode_for`):

* **schedule** — which round purposes the plan runs (:meth:`Mode.purposes`) and whether one request
  (purpose, tree, level) is a round of the plan (:meth:`Mode.schedule_refusal`);
* **release kind** — every data-carrying release is of one *kind* (``init``, ``level``, ``tree``,
  ``sketch``, ``eval``; :meth:`Mode.kind`), with
* **its declaration** — one :class:`~fedsbdt.common.modes.releases.Release` per kind (:meth:`Mode.releases`):
  the noise every site draws for it (and the coordinator adds in central noise mode) and, computed from
  that very noise and the records' clip bounds, the accountant event (common/accountant.py, in the spirit
  of dp-accounting's DpEvent) one release costs a worst-case record it reads (:meth:`Mode.event`).  A mode
  declares noises, never events: what the gate charges cannot differ from what the sites draw, and the
  plan's ε is checked against the composition of these events (``Plan.check_release_accounting``), and
* **its budget** — how many releases of each kind one record may be charged in this plan
  (:meth:`Mode.budget`): the plan's schedule as a multiset.  A record's charges stay a sub-multiset of the
  schedule, so its privacy loss is at most the plan's event (:meth:`Mode.plan_event`) whatever the
  accountant — retries, restarts and a coordinator that fails rounds on purpose included.  ``None``: the
  kind is bounded per record by the plan's individual Rényi filter (random trees with ``filter = true``).

Which records a release reads is the site's to compute (its data); the gate charges exactly those.
"""
from __future__ import annotations

from fedsbdt.common.accountant import ComposedEvent, compose
from fedsbdt.common.federation.wire import Purpose

from .releases import EvalNoise, InitNoise, Release

KINDS = ("init", "sketch", "level", "tree", "eval")
PURPOSE_KIND = {Purpose.INIT_SCORE: "init", Purpose.SKETCH: "sketch", Purpose.LEVEL: "level", Purpose.TREE: "tree",
                Purpose.EVAL: "eval"}


class Mode:
    """The base: initial score, ``total_rounds`` tree rounds and the plan's optional evaluation."""

    name = "base"
    #: the round purposes of one tree, besides TREE (the leaves); e.g. (Purpose.LEVEL,) for greedy trees
    tree_purposes: tuple = ()
    #: the site draws this mode's noise shares ahead in a child process (client/isolated_noise.py); False for
    #: modes that draw a share per level on demand (a child per draw would be slow)
    isolated_sampler: bool = False
    #: every tree round is the same Poisson-subsampled Gaussian, so ε after k trees follows from the plan's
    #: calibration under RDP (accountant.epsilon_so_far; the status pages); False: the plan's ε bounds it
    uniform_tree_rounds: bool = False

    #: the mode can run in a federation (a plan refuses a tree builder whose mode says False)
    federated: bool = True

    # ------------------------------------------------------------------ the plan's mode-specific parts

    def plan_refusal(self, plan) -> str | None:
        """Why a federated plan cannot run this mode with its hyperparameters and schema (one sentence), or
        None: the mode's part of ``Plan``'s validation (common/federation/plan.py)."""
        return None

    def federated_calibration(self, hp):
        """The accountant's calibration of a federation that builds this mode's trees with ``hp`` (raises
        ``ConfigError`` or ``AccountingError`` with one sentence), or None: the central calibration of ``hp``
        (common/federation/accounting.py ``federated_calibration`` then asks the engine)."""
        return None

    def plan_grids(self, plan) -> dict:
        """The public grids every party recomputes from the plan, by the plan's attribute name (e.g.
        ``{"greedy_grid": …}``); base: none (random trees: the splits come from the plan's seed)."""
        return {}

    def max_vector_len(self, plan) -> int:
        """The longest vector of one of the plan's tree rounds (base: a tree's leaf sums)."""
        from fedsbdt.common.multiclass import round_vector_len

        return round_vector_len(plan.schema, plan.hyperparameters)

    def share_coordinates(self, plan) -> list:
        """Besides the leaves: per release of a tree round, the (full noise std, sensitivity) of the coordinates
        one record touches, in integer units (the plan's share-closeness check, ``Plan.share_closeness``)."""
        return []

    def max_share_scale(self, plan, shares: int) -> float:
        """Besides the leaves: the largest per-entry scale of one of ``shares`` shares of a tree round's noise
        (the plan's range and capacity checks, ``Plan.noise_sigma_units``)."""
        return 0.0

    # ------------------------------------------------------------------ schedule

    def trains(self, plan) -> bool:
        return True

    def purposes(self, plan) -> frozenset:
        """The round purposes the plan schedules."""
        out = set()
        if self.trains(plan):
            out |= {Purpose.TREE, *self.tree_purposes}
            if plan.hyperparameters.init_share > 0:
                out.add(Purpose.INIT_SCORE)
        if plan.eval_spec is not None:
            out.add(Purpose.EVAL)
        return frozenset(out)

    def schedule_refusal(self, plan, purpose, tree: int | None, level: int | None) -> str | None:
        """Why (purpose, tree, level) is not a round of the plan (one sentence), or None."""
        if purpose not in self.purposes(plan):
            if purpose == Purpose.EVAL:
                return "the pinned plan declares no federated evaluation ([evaluation] section); refusing to evaluate"
            return (f"{Purpose(purpose).name.lower()} rounds are not in this plan's schedule (mode {self.name}: "
                    f"{', '.join(sorted(p.name for p in self.purposes(plan))) or 'no rounds'})")
        hp = plan.hyperparameters
        if purpose in (Purpose.TREE, Purpose.LEVEL, Purpose.SKETCH) and not 0 <= int(tree) < hp.total_rounds:
            return f"tree {tree} is not a tree of the plan ({hp.total_rounds} trees)"
        if purpose == Purpose.LEVEL and not 0 <= int(level) < hp.depth:
            return f"level {level} requested, but the plan's trees have depth {hp.depth} (levels 0..{hp.depth - 1})"
        return None

    # ------------------------------------------------------------------ releases and their cost

    def kind(self, purpose) -> str:
        return PURPOSE_KIND[Purpose(purpose)]

    def releases(self, plan) -> dict[str, Release]:
        """Every release kind ``plan`` schedules → its :class:`~fedsbdt.common.modes.releases.Release` (the noise
        the parties draw for it and the event derived from that noise).  Read it through ``plan.releases``
        (computed once per plan): the sites' draws, the coordinator's central noise and the gate's charges
        all do."""
        out: dict[str, Release] = {}
        if self.trains(plan):
            cal = plan.calibration()
            if plan.hyperparameters.init_share > 0 and (cal.eps_init > 0 or cal.eps_ds > 0):
                out["init"] = Release("init", InitNoise(plan.hyperparameters, plan.encoding, cal))
            out.update(self.tree_releases(plan))
        if plan.eval_spec is not None:
            out["eval"] = Release("eval", EvalNoise(plan.eval_spec))
        return out

    def tree_releases(self, plan) -> dict[str, Release]:  # pragma: no cover - every training mode overrides it
        """The releases of the plan's trees (kinds ``sketch``, ``level``, ``tree``), declared by their noise."""
        raise NotImplementedError

    def release(self, plan, kind: str) -> Release:
        """The declaration of ``kind`` in ``plan`` (a kind the plan does not release is an error)."""
        try:
            return plan.releases[kind]
        except KeyError:
            raise ValueError(f"the plan releases no {kind!r} (mode {self.name}: "
                             f"{', '.join(plan.releases) or 'no releases'})") from None

    def event(self, plan, kind: str):
        """The event one data-carrying release of ``kind`` costs a worst-case record it reads (None: it is part of
        another kind's event): always the event of the noise the parties draw for it (:meth:`releases`)."""
        return self.release(plan, kind).event

    def budget(self, plan) -> dict[str, int | None]:
        """Releases of each kind one record may be charged in this plan (the schedule as a multiset)."""
        out: dict[str, int | None] = {}
        if self.trains(plan):
            if plan.hyperparameters.init_share > 0:
                out["init"] = 1
            out.update(self.tree_budget(plan))
        if plan.eval_spec is not None:
            out["eval"] = 1
        return out

    def tree_budget(self, plan) -> dict[str, int | None]:  # pragma: no cover
        raise NotImplementedError

    def plan_event(self, plan, without: tuple[str, ...] = ()) -> ComposedEvent:
        """The whole plan for a worst-case record (training and evaluation): what joining it may cost; ``without``
        leaves out releases of those kinds (e.g. ``("eval",)``: what the training records alone may cost).  The
        composition of the declared releases' events over the schedule (:meth:`budget`), which the plan's
        stated ε must equal (``Plan.check_release_accounting``)."""
        budget = {k: n for k, n in self.budget(plan).items() if k not in without}
        parts = [compose(self.event(plan, k), count=n or 0) for k, n in budget.items()
                 if n and self.event(plan, k) is not None]
        parts += [self.unbudgeted_event(plan, k) for k, n in budget.items() if n is None]
        return compose(*parts)

    def unbudgeted_event(self, plan, kind: str):
        """The cost of a kind the individual filter bounds: its accounted rounds at the worst case."""
        return compose(self.event(plan, kind), count=plan.hyperparameters.accounted_rounds)

    # ------------------------------------------------------------------ retries

    def retry_is_a_new_release(self, kind: str) -> bool:
        """False where a retried round resends the stored vector (initial score, evaluation): not charged."""
        return kind not in ("init", "eval")

    def describe(self) -> str:
        return self.name

    # ------------------------------------------------------------------ coordinator side

    def coordinator_rounds(self, plan, records=()):
        """The coordinator's state of the tree in progress (:class:`~fedsbdt.common.modes.coordinator.TreeRounds`):
        what the session asks for every round of a tree, restored from the checkpointed ``records`` ((kind,
        record) pairs, in order) of that tree.  Base: one leaf round per tree on the public random splits."""
        from .coordinator import TreeRounds

        return TreeRounds(plan, records)

    def federated_hyperparameters(self, hp, given):
        """The hyperparameters ``fedsbdt plan`` pins for this mode: ``hp`` with the mode's federation defaults
        for the keys the user did not give (``given``: the hyperparameter flags set)."""
        return hp

    # ------------------------------------------------------------------ site side

    def site_rounds(self, ctx):
        """The site's part of this mode's tree rounds (common/modes/site_rounds.py ``SiteRounds``), built from
        what the mode may read at a site (``ctx``: a ``SiteContext``); the site's gate (client/gate.py) drives
        it through every tree round and hands it every released tree.  The base serves none (a plan that trains
        nothing)."""
        from .site_rounds import SiteRounds

        return SiteRounds(ctx)
