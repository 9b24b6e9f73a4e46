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

import numpy as np

from fedsbdt.common.accountant import ComposedEvent, compose, epsilon_rdp
from fedsbdt.common.federation.wire import Purpose

from . import tree_builders
from .coordinator import TreeRounds
from .releases import KINDS, PURPOSE_KIND, EvalNoise, InitNoise, Release  # noqa: F401 - KINDS: the kinds' names
from .site_rounds import SiteRounds



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

    # what the rest of the package asks a tree builder (the registry is the only source of mode names: config,
    # CLI, engine, receipt, report, audit, multiclass and the plan never name one)
    #: builds trees: a ``--tree-builder`` choice (False: the evaluation-only mode)
    is_tree_builder: bool = True
    #: one line for ``--tree-builder``'s help and the report's "tree builder" row
    summary: str = ""
    #: the plan keys a run of this mode takes when they are not given (``config.builder_defaults``)
    defaults: dict = {}
    #: hyperparameters only this mode may set away from their default → why another mode refuses them
    exclusive: dict = {}
    #: the accountants this mode's calibration supports
    accountants: tuple = ("rdp", "pld")
    #: trains ``task = 'multiclass'`` (K class trees per round on one set of splits)
    multiclass: bool = False
    #: the central privacy audit (common/audit.py) trains it (its splits spend no privacy)
    auditable: bool = False
    #: the splits and the missing values' default directions are public, drawn from the plan's seed
    public_splits: bool = False
    #: the privacy report draws a small model's trees (trees chosen to be read)
    drawn_trees: bool = False
    #: the privacy report's sentence on the algorithm ("About this report")
    algorithm: str = ""

    # ------------------------------------------------------------------ hyperparameters and central training

    def check_hyperparameters(self, hp, bad) -> None:
        """Refuse what this mode cannot train (``bad(name, why)`` makes the one-line ConfigError); called last by
        ``Hyperparameters.__post_init__``.  The base refuses another mode's exclusive settings and an accountant
        the mode's calibration does not support."""
        fields = type(hp).__dataclass_fields__
        for other in tree_builders().values():
            for key, why in other.exclusive.items():
                if key not in self.exclusive and getattr(hp, key) != fields[key].default:
                    raise bad(key, why)
        if hp.accountant not in self.accountants:
            owners = [n for n, m in tree_builders().items() if hp.accountant in m.accountants]
            raise bad("accountant", f"must be {' or '.join(map(repr, self.accountants))} with tree_builder = "
                      f"{self.name!r}" + (f" ({hp.accountant!r} is for tree_builder = "
                                          f"{' or '.join(map(repr, owners))})" if owners else ""))

    def calibrate(self, hp):  # pragma: no cover - every tree builder overrides it
        """The :class:`~fedsbdt.common.accountant.PrivacyCalibration` of ``hp`` (Alg. 6 for random trees): the
        noise of every release that makes the model's ε."""
        raise NotImplementedError(f"mode {self.name} trains no trees")

    def central_builder(self, schema, hp, cal):  # pragma: no cover - every tree builder overrides it
        """The central tree builder (common/builders.py ``TreeBuilder``) of this mode, calibrated by ``cal``."""
        raise NotImplementedError(f"mode {self.name} trains no trees")

    def receipt_fields(self, hp, cal) -> dict:
        """The mode's own entries of the privacy receipt (engine.privacy_receipt)."""
        return {}

    def release_receipt(self, cal, federated: bool) -> dict:
        """Entries the released model's receipt adds last (after the multi-class sensitivity)."""
        return {}

    def gaussian_leaves(self, federated: bool) -> bool:
        """Are the leaves a Gaussian release (σ_leaf and ρ mean something in ``fedsbdt account``)?"""
        return True

    def account(self, hp, cal, federated: bool, res: dict, human: str) -> str:
        """``fedsbdt account``'s text for this mode (``res``, the JSON, may gain entries): ``human`` plus the
        mode's lines."""
        return human

    def report_rows(self, privacy: dict) -> list:
        """The privacy report's rows (name, value, what it means) of this mode's receipt entries."""
        return []

    def epsilon_curve(self, privacy: dict, points: int = 40, depth: int = 0):
        """ε after r accounted trees (RDP accountant at the receipt's σ), for a grid of r up to the total: the
        Poisson-subsampled Gaussian trees of S-BDT (Thm. 23) with the initial score."""
        T = int(privacy.get("rounds_accounted", 0) or 0)
        sigma = float(privacy.get("sigma", 0) or 0)
        if T < 1 or not sigma > 0:
            return np.zeros(0), np.zeros(0)
        rs = np.unique(np.linspace(1, T, min(points, T)).round().astype(int))
        e_init, e_ds = float(privacy.get("eps_init", 0.0)), float(privacy.get("eps_ds", 0.0))
        eps = [epsilon_rdp(sigma, float(privacy["subsample"]), int(r), float(privacy["delta"]), e_init, e_ds)[0]
               for r in rs]
        return rs, np.asarray(eps)

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
        return SiteRounds(ctx)
