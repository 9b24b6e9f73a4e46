"""The site's one privacy gate: every value derived from records passes here before it leaves the site.

The gate is mode-agnostic.  It asks the pinned plan's mode (:func:`fedsbdt.common.modes.mode_for`) for the
schedule, the release kinds, their privacy events and the per-record budget, and it

1. **checks the request against the plan's schedule** (:meth:`Gate.refusal`): a purpose the plan does not
   run (an INIT_SCORE, TREE, LEVEL or SKETCH round in an evaluation-only plan; a LEVEL round in a
   random-tree plan), a tree or level outside the plan — refused before anything is computed;
2. **applies the site's failure policy** (:meth:`Gate.attempt`): a further attempt of a stage the site
   already answered means the coordinator failed the earlier ones; once it has failed one round more than
   ``--max-failed-attempts`` times, or all rounds together more than ``--max-failed-attempts-per-session``
   times (counted in the plan's ledger: a restart keeps the count), the site leaves the session
   (:class:`LeaveSession`, one line naming what the coordinator did);
3. **admits the records the release reads** (:meth:`Gate.admit`): each record's charges in this plan must
   stay a sub-multiset of the plan's schedule (the mode's :meth:`~fedsbdt.common.modes.base.Mode.budget`);
   a release that would exceed it carries no data (zeros plus the noise share: not charged) and the
   operator is told so — once per round, not once per attempt;
4. **charges exactly those records** (:meth:`Gate.charge`) in the lifetime ledger (common/lifetime.py), in
   the one account of the site's population (``--population``; by record id where the schema has an
   ``id_column``): every attempt that carries data, whatever the mode.  The caller runs it inside the round's
   transaction, after secure aggregation accepted the round and before the masked vector is returned: the
   lifetime row commits first (a crash then over-charges, never under-charges), the plan's ledger with the send.

Every round of a plan's trees is driven by :meth:`Gate.tree_round` in one fixed order — the mode's check, the
vector length (or the replay of a round answered before), catch-up, **attempt**, the mode's declaration of the
release, **admit**, the mode's **compute** (from the admitted records only), the **noise** share
(client/noise.py ``draw_share``: the site's one noise rule), then **charge and send** in one transaction.  The
mode (common/modes/site_rounds.py) never calls the gate: it is handed a ``RoundInput`` and returns what it
declares and computes.

Before joining, :meth:`Gate.admission_refusal` checks the plan against ``--max-epsilon`` (training ε plus
ε_eval), ``--max-eval-epsilon`` and ``--lifetime-epsilon`` (the population's lifetime ε, at
``--lifetime-delta``, after the whole plan on every record it reads).
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from fedsbdt.common.accountant import compose
from fedsbdt.common.lifetime import FILE, LifetimeLedger, RecordSource, projected_lifetime
from fedsbdt.common.modes import mode_for
from fedsbdt.common.modes.base import PURPOSE_KIND
from fedsbdt.common.modes.site_rounds import Computed, RoundInput, catch_up_or_refusal

from .noise import draw_share
from fedsbdt.common.federation.wire import Purpose, Refusal

log = logging.getLogger("fedsbdt.site")


class LeaveSession(RuntimeError):
    """The site leaves the session (the message is one line for its operator)."""


class ModeStoreView:
    """A mode's durable state at a site (common/modes/site_rounds.py ``ModeStore``): exactly these methods of the
    plan's site ledger (client/ledger.py), and nothing else of it."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger) -> None:
        self._ledger = ledger

    def mode_state(self, key: str) -> bytes | None:
        return self._ledger.mode_state(key)

    def set_mode_state(self, key: str, blob: bytes) -> None:
        self._ledger.set_mode_state(key, blob)

    def keep_mode_state(self, key: str, blob: bytes) -> None:
        self._ledger.keep_mode_state(key, blob)

    def released_splits(self, tree: int):
        return self._ledger.released_splits(tree)

    def remember_splits(self, tree: int, features, thresholds) -> None:
        self._ledger.remember_splits(tree, features, thresholds)


class Gate:
    """The gate of one site in one plan.

    Args:
        plan: the pinned plan.
        policy: the site's :class:`~fedsbdt.client.policy.SitePolicy`.
        ledger: the plan's :class:`~fedsbdt.client.ledger.SiteLedger` (attempt counts).
        state_dir: where the lifetime ledger lives.
        site_id: for messages.
    """

    def __init__(self, plan, policy, ledger, state_dir, site_id: str) -> None:
        self.plan, self.policy, self.ledger, self.site_id = plan, policy, ledger, site_id
        self.mode = mode_for(plan)
        self.budget = self.mode.budget(plan)
        self.state_dir = Path(state_dir)
        self.lifetime: LifetimeLedger | None = None
        self.datasets: dict[str, tuple[str, int]] = {}  # role ("train" / "eval") -> (record set key, records)
        self._counts: dict[str, np.ndarray] = {}
        self._kinds = [k for k, v in self.budget.items() if v is not None]
        self._told: set[tuple] = set()  # (role, kind, tree) whose spent records the operator was told about

    # ------------------------------------------------------------------ before joining

    def training_event(self):
        """The plan's training releases for a worst-case record (without the evaluation)."""
        return compose(*[compose(self.mode.event(self.plan, k), count=n) if n is not None else
                         self.mode.unbudgeted_event(self.plan, k)
                         for k, n in self.budget.items() if k != "eval" and self.mode.event(self.plan, k) is not None])

    def admission_refusal(self, epsilon: float, max_epsilon: float | None, max_eval_epsilon: float | None,
                          sources: dict[str, RecordSource]) -> str | None:
        """Why the site does not join (one sentence naming the flag), or None.  ``sources``: role -> the record set
        the plan reads (common/lifetime.py ``record_source``).  Reads the lifetime ledger, writes nothing."""
        plan, spec = self.plan, self.plan.eval_spec
        trains = self.mode.trains(plan)
        eps_eval = float(spec.epsilon) if spec is not None else 0.0
        if spec is not None and max_eval_epsilon is not None and eps_eval > max_eval_epsilon:
            return (f"the plan's evaluation budget ε_eval = {eps_eval:g} exceeds this site's limit "
                    f"--max-eval-epsilon {max_eval_epsilon:g}; refusing to take part")
        total = (epsilon if trains else 0.0) + eps_eval
        if max_epsilon is not None and total > max_epsilon:
            parts = ([f"ε = {epsilon:.6g}"] if trains else []) + ([f"ε_eval = {eps_eval:g}"] if spec is not None else [])
            what = " + ".join(parts) + (f" = {total:.6g}" if len(parts) > 1 else "")
            return (f"the plan's privacy budget {what} exceeds this site's limit --max-epsilon "
                    f"{max_epsilon:g}; refusing to take part")
        if not sources:
            return None
        policy = self.policy
        cap, delta, population = policy.lifetime_epsilon, policy.lifetime_delta, policy.population
        extra = [(src, self.training_event() if role == "train" else self.mode.event(plan, "eval"))
                 for role, src in sources.items()]
        if (self.state_dir / FILE).exists():
            lt = LifetimeLedger(self.state_dir)
            try:
                after = lt.lifetime(population, delta, extra=extra, exclude_plan=plan.sha256)
                now = lt.lifetime(population, delta)
            finally:
                lt.close()
        else:  # nothing released yet (and nothing written before joining)
            after, now = projected_lifetime(delta, extra), projected_lifetime(delta, ())
        where = f"this site's records (population {population})"
        if math.isinf(after.epsilon):
            return (f"joining would spend δ = {after.approx_delta:.3g} of {where}, not less than --lifetime-delta "
                    f"{delta:g}: central runs stated only as (ε, δ) spent it (`fedsbdt ledger --state "
                    f"{self.state_dir}`); refusing to take part")
        if after.epsilon > cap:
            return (f"joining would bring the lifetime ε of {where} to {after.epsilon:.6g} at --lifetime-delta "
                    f"{delta:g} (now {now.epsilon:.6g}: every plan, evaluation and central run on them, `fedsbdt "
                    f"ledger --state {self.state_dir}`), above --lifetime-epsilon {cap:g}; refusing to take part")
        return None

    def open(self, sources: dict[str, RecordSource]) -> None:
        """Register the plan's record sets in the population's account and load this plan's charges so far."""
        self.lifetime = LifetimeLedger(self.state_dir)
        for role, src in sources.items():
            key = self.lifetime.record_set(self.policy.population, src)
            self.datasets[role] = (key, int(src.ids.size))
            self._counts[role] = self.lifetime.plan_counts(key, self.plan.sha256, self._kinds)

    def lifetime_receipt(self) -> dict:
        """The population's lifetime (ε, δ) for the site's receipt, under each role the plan read."""
        policy = self.policy
        lt = LifetimeLedger(self.state_dir)
        try:
            life = lt.lifetime(policy.population, policy.lifetime_delta)
        finally:
            lt.close()
        one = {"population": policy.population, "epsilon": life.epsilon, "delta": life.delta}
        return {role: dict(one) for role in self.datasets}

    def close(self) -> None:
        if self.lifetime is not None:
            self.lifetime.close()

    # ------------------------------------------------------------------ a request

    def refusal(self, purpose, tree, level) -> str | None:
        """Why the pinned plan does not schedule this request (one sentence), or None."""
        return self.mode.schedule_refusal(self.plan, purpose, tree, level)

    def kind(self, purpose) -> str:
        return PURPOSE_KIND[purpose]

    def attempt(self, kind: str, tree: int | None, level: int | None = None) -> None:
        """A new attempt of a stage: raises :class:`LeaveSession` once the coordinator has failed this stage
        (a round this site answered and the coordinator did not release) more than ``--max-failed-attempts``
        times, or the rounds of this session together more than ``--max-failed-attempts-per-session`` times.
        Counted from the plan's ledger (every masked input after the first of its stage), so a restarted site
        keeps the count.  A dropout or a coordinator restart fails one attempt of one round, which is normal; a
        coordinator that asks for the same round again and again is not, nor one that fails every round a few
        times (each data-carrying retry spends budget, which the gate charges in any case)."""
        failed = self.ledger.attempts_any(kind, tree, level)  # every earlier attempt of this stage failed
        limit = self.policy.max_failed_attempts
        where = "the initial score" if kind == "init" else f"the {kind} round of tree {tree}" + (
            f" level {level}" if level is not None else "")
        if failed > limit:
            raise LeaveSession(
                f"leaving the session: the coordinator failed {where} {failed} times after this site had answered "
                f"it (it released nothing) and asks again; each retry that carries data spends privacy budget, so "
                f"this site stops at --max-failed-attempts {limit}")
        in_session = self.ledger.failed_attempts() + int(failed > 0)  # this stage's last attempt failed too
        cap = self.policy.session_failure_limit(self.plan)
        if in_session > cap:
            raise LeaveSession(
                f"leaving the session: the coordinator failed {in_session} rounds of this session after this site "
                f"had answered them (it released nothing) and asks for {where} again; each retry that carries data "
                f"spends privacy budget, so this site stops at --max-failed-attempts-per-session {cap}")

    def admit(self, kind: str, mask: np.ndarray, role: str = "train", tree: int | None = None,
              partial: bool = False) -> np.ndarray | None:
        """The records the release may read: ``mask`` where every record can afford it.  Otherwise, with
        ``partial`` (a mode whose vector is computed from an explicit record set), ``mask`` without the
        records whose budget is spent — each record's exclusion depends only on its own (data-independent)
        charges, as in an individual filter; without ``partial``, or if none is left, None: the release carries
        no data (an all-zero vector plus the noise share, not charged).  The operator is told (one warning)."""
        mask = np.asarray(mask, bool)
        cap = self.budget.get(kind)
        if cap is None or role not in self._counts:
            return mask
        counts = self._counts[role][:, self._kinds.index(kind)]
        over = mask & (counts >= cap)
        if not over.any():
            return mask
        keep = mask & ~over if partial else None
        sits_out = keep is not None and bool(keep.any())  # only the spent records sit out; else no data at all
        if (role, kind, tree) not in self._told:  # told once per round, not again at each of its retries
            self._told.add((role, kind, tree))
            what = kind if tree is None else f"the {kind} round of tree {tree}"
            if sits_out:
                log.warning(f"{self.site_id}: {int(over.sum())} records have been charged all {cap} {kind} releases "
                            f"the plan schedules for them (the coordinator failed rounds this site had answered): they "
                            f"sit out {what}", extra={"event": "records_spent", "site": self.site_id, "kind": kind,
                                                      "tree": tree, "records": int(over.sum())})
            else:
                log.warning(f"{self.site_id}: {int(over.sum())} records have been charged all {cap} {kind} releases "
                            f"the plan schedules for them (the coordinator failed rounds this site had answered): "
                            f"{what} carries no data from this site (not charged)",
                            extra={"event": "budget_exhausted", "site": self.site_id, "kind": kind, "tree": tree})
        return keep if sits_out else None

    def charge(self, kind: str, mask: np.ndarray | None, tree: int | None = None, level: int | None = None,
               round_id: int | None = None, role: str = "train") -> None:
        """Charge the release to exactly the records of ``mask`` (None: all); committed when this returns."""
        if role not in self.datasets:
            return
        key, n = self.datasets[role]
        event = self.mode.event(self.plan, kind)
        delta = self.plan.eval_spec.delta if kind == "eval" else self.plan.hyperparameters.delta
        m = None if mask is None else np.asarray(mask, bool)
        self.lifetime.charge(key, kind, compose() if event is None else event, delta, m, self.plan.sha256,
                             tree, level, round_id)
        if kind in self._kinds and role in self._counts:
            j = self._kinds.index(kind)
            self._counts[role][:, j] += 1 if m is None else m

    def spent(self, kind: str, role: str = "train") -> np.ndarray:
        """Releases of ``kind`` charged to each record in this plan."""
        return self._counts[role][:, self._kinds.index(kind)].copy()

    # ------------------------------------------------------------------ a tree round, driven

    def tree_round(self, rounds, site, ev, start) -> list:
        """The replies to a RoundStart of one of the plan's tree rounds (the schedule already admitted it).

        The one order every mode's round goes through: ``rounds.check`` → the vector length, or the stored input
        of a round started before (``site.settled_input``) → catch-up → :meth:`attempt` → ``rounds.declare`` →
        :meth:`admit` → ``rounds.compute`` (nothing computed for a release that carries no data: zeros) →
        ``draw_share`` → ``site.masked_input``, which runs the charge (:meth:`charge`), the filter's charges, the
        contribution log and ``rounds.remember`` in the round's transaction before the masked vector is returned.
        ``site`` is the site machine (client/site.py): its ledger, randomness, shares drawn ahead and secure
        aggregation; ``rounds`` the plan's mode's ``SiteRounds``."""
        r, kind = start.round_id, self.kind(ev.purpose)
        level = ev.level if ev.purpose == Purpose.LEVEL else None
        rin = RoundInput(ev, kind, int(ev.tree), level, len(site.trees), site.init is not None)
        bad = rounds.check(rin)  # before anything is computed
        if bad is not None:
            return [Refusal(f"round {r}: {bad}", r)]
        expected = rounds.vector_len(rin)
        settled = site.settled_input(ev, start, expected)  # another length, or a round answered before
        if settled is not None:
            return settled
        late = catch_up_or_refusal(rin)
        if late is not None:
            return [Refusal(f"round {r}: {late}", r)]
        self.attempt(kind, rin.tree, level)
        declared = rounds.declare(rin)
        ledger = self.ledger
        first = not declared.once or ledger.attempts(kind, rin.tree, level, with_data=True) == 0
        admitted = self.admit(kind, declared.records, tree=rin.tree, partial=declared.partial) if first else None
        computed = None if admitted is None else rounds.compute(rin, declared, admitted)
        x = np.zeros(expected, np.int64) if computed is None else np.asarray(computed.x, dtype=np.int64)
        noise = draw_share(self.plan, self.plan.releases[kind], site.randomness, participants=len(start.participants),
                           retry=ledger.attempts_any(kind, rin.tree, level) > 0, where=declared.where,
                           ahead=site.noise if kind == "tree" else None)
        read = None if computed is None else (admitted if computed.read is None else computed.read)
        c = computed or Computed(x)
        sampled = declared.sampled if c.sampled is None else c.sampled

        def record() -> None:
            if read is not None:  # this release, charged to exactly the records it read
                self.charge(kind, read, rin.tree, level, r)
            if c.new_spent is not None:  # the individual filter's per-record units
                ledger.charge(site.local.ids, site.local.spent, c.new_spent)
            ledger.log_contribution(r, kind, rin.tree, read is not None, c.active, sampled, level)
            rounds.remember(rin)

        replies = site.masked_input(ev, start, x, noise, record)
        if isinstance(replies[0], Refusal):
            return replies
        # Durable: only now does the masked vector leave this function.
        if c.commit is not None:
            c.commit()
        if c.leaf is not None:
            site.remember_leaf_index(rin.tree, c.leaf)
        return replies
