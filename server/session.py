"""The coordinator's session: a transport-free, clocked state machine.

It drives one plan from the first join to the released model.  Inputs are
method calls (a site joined, subscribed, sent bytes, reported; the clock
ticked) with the current time ``now``; outputs are ``(site id, event)``
pairs for the transport to deliver in order.  Nothing here touches a
socket, a thread or the wall clock, so tests drive it directly.

Stages (one class each, explicit transitions: a stage's ``step`` returns the next stage, ``None`` when
nothing is due; the Session is the thin driver that takes every due transition, then commits)::

    session:  Gathering ──▶ Running ──▶ Finishing ──▶ Finished          (this module)
                               └──────────────┴────▶ Failed

    Running has two sub-machines that run side by side:
    epochs:   NoSetup ──▶ Advertising ──▶ Sharing ──▶ NoSetup      (server/epochs.py; prepare epoch k+1 while k runs)
    rounds:   Between ──▶ CollectingInputs ──▶ CollectingSignatures ──▶ CollectingShares ──▶ Between
                               │   (any stage: < t left, ProtocolAbort) ──▶ Between (retry in a new slot)
                               └──(fast round: every input, with its seed shares, arrived)──▶ Between
                                                                                  (server/rounds.py)

Every site message is decoded and checked here (sender, type), then validated by the stage it is meant for,
which refuses it (:class:`Rejected`, naming the stage) unless it expects it now.

A round is *fast* (plan ``[secure_aggregation] fast_path``, :meth:`Plan.fast_round`) when it tolerates
no missing input anyway: each site's one reply carries its masked input and its self-mask seed
shares, and the inputs stage closes straight into the release (2n messages instead of 6n); a
missing participant fails the round like any other failed round (docs/federation.md §7, §10).

Work items, in order: the initial-score round (if ``init_share > 0``), then
trees 0 … T_regular + T_extra − 1, then (plan ``[evaluation]``) one evaluation
round whose noisy sum becomes the released metrics (docs/federated-evaluation.md;
an evaluation-only plan starts with an existing model's trees released).  A round's participants are the *eligible*
dealers of the earliest ready epoch: connected (subscribed), not suspended,
and caught up (they applied every tree released before they joined; later
trees reach them through their ordered event stream before the next
RoundStart).  A stage closes when every awaited site has answered or
disconnected, or at its deadline; a connected site that misses a deadline
or refuses is suspended until it takes part in a fresh epoch setup (or
re-joins).  A failed round is retried for the same work item with a new
round id; after ``max_attempts`` failures the session fails.  When a newer
ready epoch has more eligible sites than the current one (a site came back),
the current epoch's remaining slots are skipped.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fedsbdt.common.boosting import init_score
from fedsbdt.common.modes import mode_for
from fedsbdt.common.modes.base import PURPOSE_KIND
from fedsbdt.common.modes.coordinator import central_noise
from fedsbdt.common.multiclass import init_vector_len
from fedsbdt.common.secagg import (
    AdvertiseKeys,
    ConsistencySignature,
    SecAggCoordinator,
    ShareKeys,
    UnmaskResponse,
    decode_message,
)
from fedsbdt.common.secagg.coordinator import StoredRouting
from fedsbdt.common.secagg.errors import InvalidMessage, SecAggError
from fedsbdt.common.noise_shares import NoiseShares

from .checkpoint import CoordinatorStore, Restored
from fedsbdt.common.federation.plan import Plan
from fedsbdt.common.federation.release import build_model, evaluation_receipt, model_bytes, model_sha256
from fedsbdt.common.federation.wire import (
    AbortedMsg,
    EvalRelease,
    FinishedMsg,
    InitScoreMsg,
    Purpose,
    RoundStartMsg,
    SetupParts,
    TreeMsg,
)

from .epochs import Advertising, NoSetup, PipelineStage, Sharing, routed_parts
from .rounds import (
    Between,
    CollectingInputs,
    CollectingShares,
    CollectingSignatures,
    RoundInFlight,
    RoundPhase,
)
from .session_types import Outgoing, Rejected, SiteState, Work

log = logging.getLogger("fedsbdt.coordinator")

__all__ = [  # the stages of the sub-machines, and the shared types, are importable from here as before
    "Advertising", "Between", "CollectingInputs", "CollectingShares", "CollectingSignatures", "Failed",
    "Finished", "Finishing", "Gathering", "NoSetup", "Outgoing", "PipelineStage", "Rejected", "RoundInFlight",
    "RoundPhase", "Running", "Session", "SessionStage", "Sharing", "SiteState", "Work",
]


# =========================================================================== session stages


class SessionStage:
    name = "session"

    def step(self, s: "Session", now: float, out: list[Outgoing]) -> "SessionStage | None":
        """The next stage when a transition is due (``None``: nothing to do); events appended to ``out``."""
        return None

    def resend(self, s: "Session", site_id: str) -> list[Outgoing]:
        """What a (re)joined site must receive again in this stage: the ready epochs' shares routed to it, and
        the open requests of the epoch pipeline and of the round in flight."""
        out: list[Outgoing] = []
        for e in s.coord.ready_epochs():
            parts = s._routed.get(e, {}).get(site_id)
            if parts is not None:
                out.append((site_id, SetupParts(parts)))
        return out + s.pipeline.resend(s, site_id) + s.phase.resend(s, site_id)


@dataclass
class Gathering(SessionStage):
    deadline: float
    name = "gathering"

    def step(self, s, now, out):
        """Start once every site is connected, or t of them at the join deadline."""
        connected = [x for x in s.sites.values() if x.connected]
        if len(connected) == len(s.sites) or (len(connected) >= s.t and now >= self.deadline):
            log.info(f"starting with {len(connected)} of {len(s.sites)} sites connected",
                     extra={"event": "started", "sites": [x.site_id for x in connected]})
            return Running()
        return None


@dataclass
class Running(SessionStage):
    name = "running"

    def step(self, s, now, out):
        """Finish when no work is left; otherwise one transition of the epoch pipeline or, if none is due, of
        the rounds.  Returns this stage, or Failed when a round failed the session (``Session._fail``)."""
        if isinstance(s.phase, Between) and s.next_work() is None:
            s._finish(now, out)
            return s.stage
        return s.stage if s._step_pipeline(now, out) or s._step_rounds(now, out) else None


@dataclass
class Finishing(SessionStage):
    model_sha256: str
    deadline: float
    name = "finishing"

    def step(self, s, now, out):
        """Finished once every roster site confirmed the model, or at the finish deadline."""
        # Every roster site, connected or not: a site that crashed near the end and restarts within
        # deadlines.finish re-joins, is sent Finished (resend) and still gets the verified model.
        waiting = [x.site_id for x in s.sites.values() if x.finished_sha256 is None]
        if waiting and now < self.deadline:
            return None
        mismatched = tuple(x.site_id for x in s.sites.values()
                           if x.finished_sha256 is not None and x.finished_sha256 != self.model_sha256)
        if waiting:
            log.warning(f"{len(waiting)} site(s) did not confirm the model within "
                        f"{s.plan.deadlines.finish:g} s: {', '.join(waiting)}",
                        extra={"event": "unconfirmed", "sites": waiting})
        log.info("session finished", extra={"event": "done", "model_sha256": self.model_sha256,
                                            "unconfirmed": waiting, "mismatched": list(mismatched)})
        return Finished(self.model_sha256, mismatched)

    def resend(self, s, site_id):
        return [(site_id, s._finished_msg(self.model_sha256))]


@dataclass
class Finished(SessionStage):
    model_sha256: str
    mismatched: tuple[str, ...] = ()
    name = "finished"

    def resend(self, s, site_id):
        return [(site_id, s._finished_msg(self.model_sha256))]


@dataclass
class Failed(SessionStage):
    reason: str
    name = "failed"

    def resend(self, s, site_id):
        return [(site_id, AbortedMsg(self.reason))]


# =========================================================================== the session


class Session:
    """The coordinator's state for one plan, and the thin driver of its stages: each input is decoded and
    handed to the stage it is meant for, then :meth:`_advance` takes every due transition (``stage.step``) in
    one checkpoint transaction.  What is released (the initial score, the mode's steps and trees, the
    evaluation), with the coordinator's central noise, is decided here (:meth:`_release`).

    Args:
        plan: the verified plan.
        randomness: DP randomness (used only in central noise mode).
        now: the current time (seconds, monotonic).
        store: the durable checkpoint (released trees, secure-aggregation state); restored on
            construction.  Every step runs in one of its transactions, committed before the
            step's events are returned.  ``None`` keeps everything in memory (tests).
        randbytes: source of session tokens.
        released: an evaluation-only plan (``evaluation.model_sha256``): the existing model's initial score
            and trees (:func:`~fedsbdt.common.federation.release.released_from_model`), released from the start.
    """

    def __init__(self, plan: Plan, randomness, now: float, store: CoordinatorStore | None = None,
                 randbytes: Callable[[int], bytes] = os.urandom, released=None) -> None:
        self.plan = plan
        self.hp = plan.hyperparameters
        self.enc = plan.encoding
        self.cal = plan.verify_privacy()
        self.randomness = randomness
        self.checkpoint = store
        self._randbytes = randbytes
        self.coord = SecAggCoordinator(plan.secagg_config(), None if store is None else store.storage)
        self.sites = {s: SiteState(s) for s in plan.site_ids}
        restored = store.load() if store is not None else Restored()
        self.central_noise = None
        self.init: InitScoreMsg | None = restored.init
        self.has_init = restored.has_init
        if self.hp.init_share == 0:  # no initial-score round: the score is 0 (as in fedsbdt.common.engine)
            self.init, self.has_init = InitScoreMsg(0.0, None, ()), True
        self.trees: list[TreeMsg] = restored.trees
        # the mode's state of the tree in progress (common/modes/coordinator.py): the session never names the mode
        self.rounds = mode_for(plan).coordinator_rounds(plan, restored.steps)
        if (released is None) != (plan.eval_model_sha256 is None):
            raise ValueError("an evaluation-only plan needs the existing model's trees, and only such a plan")
        if released is not None:  # nothing is trained: the model's trees count as released
            (self.init, self.trees), self.has_init = released, True
        self.rounds_failed = restored.rounds_failed
        self.total_trees = self.hp.total_rounds
        self.attempts: dict[Work, int] = {}
        self.next_epoch_id = max(self.coord.ready_epochs(), default=-1) + 1
        # ready epoch -> site -> its EpochShares as parts (the dealers' commitments shared: O(n²) not O(n³));
        # a restarted coordinator reads its ready epochs' shares back from its checkpoint
        self._routed: dict[int, dict[str, tuple[bytes, ...]]] = {
            e: routed_parts(r) for e in self.coord.ready_epochs() if (r := self.coord.stored_routing(e)) is not None}
        self.pipeline: PipelineStage = NoSetup()
        self.phase: RoundPhase = Between()
        self.model_json: bytes | None = None
        self.evaluation: dict | None = None  # the evaluation receipt once released (or why it failed)
        resumed = bool(restored.trees) or restored.has_init
        if restored.finished_sha256 is not None:
            model = build_model(plan, self.init, self.trees)
            self.model_json = model_bytes(model)
            self.stage: SessionStage = Finishing(restored.finished_sha256, now + plan.deadlines.finish)
        else:
            wait = plan.deadlines.stage if resumed else plan.deadlines.join
            self.stage = Gathering(now + wait)
        self._warm_up()
        if resumed:
            log.info(f"resuming session at tree {len(self.trees)}/{self.total_trees}",
                     extra={"event": "resumed", "trees_released": len(self.trees)})

    def _warm_up(self) -> None:
        """Compile the leaf-value kernel now rather than under the first round's deadline."""
        self.rounds.warm_up()
        init_score(np.zeros(init_vector_len(self.plan.schema), np.int64), self.plan.schema.task, self.enc)

    def close(self) -> None:
        if self.central_noise is not None:
            self.central_noise.close()

    # ------------------------------------------------------------------ views

    @property
    def levels(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The splits chosen per level of the tree in progress (modes with level rounds)."""
        return self.rounds.levels

    @property
    def t(self) -> int:
        return self.plan.threshold

    @property
    def done(self) -> bool:
        return isinstance(self.stage, (Finished, Failed))

    @property
    def exit_code(self) -> int:
        if isinstance(self.stage, Finished):
            return 0 if not self.stage.mismatched else 1
        return 1 if isinstance(self.stage, Failed) else 0

    def next_work(self) -> Work | None:
        if not self.has_init:
            return Work(Purpose.INIT_SCORE)
        if len(self.trees) < self.total_trees:  # the mode's rounds of the tree in progress
            purpose, level = self.rounds.next_round()
            return Work(purpose, len(self.trees), level)
        if self.plan.eval_spec is not None and self.evaluation is None:
            return Work(Purpose.EVAL)
        return None

    def status(self) -> dict:
        st = self.stage
        detail = getattr(st, "reason", "")
        if isinstance(st, Running):
            detail = f"epochs: {self.pipeline.name}; round: {self.phase.name}"
            w = getattr(self.phase, "work", None)
            if w is not None:
                detail += f" ({w}, round {self.phase.rnd.round_id}{', fast' if self.phase.rnd.fast else ''})"
        return {
            "stage": st.name, "plan_sha256": self.plan.sha256, "trees_released": len(self.trees),
            "trees_total": self.total_trees, "rounds_failed": self.rounds_failed,
            "model_sha256": getattr(st, "model_sha256", "") or "", "detail": detail,
            "sites": [{"site_id": s.site_id, "connected": s.connected,
                       "eligible": self._usable(s.site_id, self._current_epoch()),
                       "trees_applied": s.trees_applied, "note": s.note} for s in self.sites.values()],
        }

    def catch_up(self, from_index: int, max_trees: int) -> tuple[InitScoreMsg | None, bool, list[TreeMsg]]:
        """The initial score (if released) and up to ``max_trees`` released trees from ``from_index`` on."""
        return self.init, self.has_init, self.trees[from_index:from_index + max_trees]

    def fresh_join_nonce(self, site_id: str, nonce: bytes) -> bool:
        """True the first time ``site_id`` presents this signed Join nonce (in the checkpoint: across restarts)."""
        if self.checkpoint is not None:
            return self.checkpoint.remember_join_nonce(site_id, nonce)
        seen = self.__dict__.setdefault("_join_nonces", set())
        if (site_id, bytes(nonce)) in seen:
            return False
        seen.add((site_id, bytes(nonce)))
        return True

    def authenticate(self, site_id: str, token: bytes) -> SiteState:
        st = self.sites.get(site_id)
        if st is None or st.token is None or not token or st.token != token:
            raise Rejected(f"site {site_id!r} has no valid session token (join first)")
        return st

    # ------------------------------------------------------------------ site lifecycle

    def join(self, site_id: str, trees_applied: int, now: float) -> tuple[bytes, list[Outgoing]]:
        """Register (or re-register) a site whose identity the transport has verified."""
        st = self.sites.get(site_id)
        if st is None:
            raise Rejected(f"site {site_id!r} is not in the plan's roster")
        st.token = self._randbytes(32)
        st.joins += 1
        st.connected = False
        st.trees_applied = min(int(trees_applied), len(self.trees))
        st.released_at_join = len(self.trees)
        st.suspended_from_epoch = None
        st.wants_epoch = not any(site_id in self.coord.epoch(e).dealers for e in self.coord.ready_epochs())
        st.note = ""
        log.info(f"{site_id} joined (has {st.trees_applied} of {len(self.trees)} released trees)",
                 extra={"event": "joined", "site": site_id, "trees_applied": st.trees_applied})
        with self._transaction():
            out = self._pending_for(site_id, now)
            out += self._advance(now)
        return st.token, out

    def subscribed(self, site_id: str, token: bytes, now: float) -> list[Outgoing]:
        st = self.authenticate(site_id, token)
        if not st.connected:
            log.info(f"{site_id} connected (event stream open)", extra={"event": "connected", "site": site_id})
        st.connected = True
        return self._advance(now)

    def unsubscribed(self, site_id: str, token: bytes, now: float) -> list[Outgoing]:
        st = self.sites.get(site_id)
        if st is None or st.token != token:
            return []  # a stale stream of an earlier incarnation
        if st.connected:
            log.info(f"{site_id} disconnected", extra={"event": "disconnected", "site": site_id})
        st.connected = False
        return self._advance(now)

    def report_progress(self, site_id: str, trees_applied: int, now: float) -> list[Outgoing]:
        st = self.sites[site_id]
        st.trees_applied = max(st.trees_applied, min(int(trees_applied), len(self.trees)))
        return self._advance(now)

    def report_refusal(self, site_id: str, detail: str, now: float, round_id: int | None = None) -> list[Outgoing]:
        """A site will not answer a request; if it is about the round in flight, stop waiting for it."""
        st = self.sites[site_id]
        st.note = detail[:500]
        log.warning(f"{site_id} refused: {detail}", extra={"event": "refused", "site": site_id, "detail": detail,
                                                           "round_id": round_id})
        self.phase.refused_by(self, site_id, round_id)
        return self._advance(now)

    def report_finished(self, site_id: str, sha: str, now: float) -> list[Outgoing]:
        st = self.sites[site_id]
        st.finished_sha256 = sha
        mine = getattr(self.stage, "model_sha256", None)
        if mine is not None and sha != mine:
            log.error(f"{site_id} rebuilt a model with hash {sha}, the coordinator's is {mine}",
                      extra={"event": "model_mismatch", "site": site_id})
        else:
            log.info(f"{site_id} confirmed the model", extra={"event": "site_finished", "site": site_id})
        self._say_whom_we_await(now)
        return self._advance(now)

    def _say_whom_we_await(self, now: float) -> None:
        """While finishing: one line naming the sites whose confirmation the coordinator still waits for."""
        st = self.stage
        waiting = [s.site_id for s in self.sites.values() if s.finished_sha256 is None]
        if isinstance(st, Finishing) and waiting:
            log.info(f"waiting up to {max(st.deadline - now, 0.0):.0f} s more for {len(waiting)} site(s) to "
                     f"confirm the model: {', '.join(waiting)}",
                     extra={"event": "awaiting_confirmations", "sites": waiting})

    # ------------------------------------------------------------------ site messages

    def _decode(self, site_id: str, data: bytes, types: tuple[type, ...], decode=decode_message):
        try:
            msg = decode(data)
        except InvalidMessage as e:
            raise Rejected(f"malformed secure-aggregation message: {e}") from None
        if not isinstance(msg, types):
            raise Rejected(f"a {type(msg).__name__} is not accepted here")
        if msg.sender != site_id:
            raise Rejected(f"message names sender {msg.sender!r}, but it comes from {site_id!r}")
        return msg

    def submit_setup(self, site_id: str, data: bytes, now: float) -> list[Outgoing]:
        msg = self._decode(site_id, data, (AdvertiseKeys, ShareKeys))
        self.pipeline.receive(self, msg)
        return self._advance(now)

    def submit_input(self, site_id: str, purpose: Purpose, tree: int, data: bytes, now: float) -> list[Outgoing]:
        ph = self.phase
        msg = self._decode(site_id, data, *ph.input_decoding())
        ph.receive_input(self, msg, Work(purpose, tree))
        if log.isEnabledFor(logging.DEBUG):  # the hardening tests match these against the sites' ledgers
            log.debug(f"round {msg.round_id} ({ph.work}): masked input from {site_id}",
                      extra={"event": "input_received", "site": site_id, "round_id": msg.round_id,
                             "work": str(ph.work)})
        st = self.sites[site_id]
        if purpose in (Purpose.TREE, Purpose.LEVEL):
            st.trees_applied = max(st.trees_applied, min(tree, len(self.trees)))
        return self._advance(now)

    def submit_round(self, site_id: str, data: bytes, now: float) -> list[Outgoing]:
        msg = self._decode(site_id, data, (ConsistencySignature, UnmaskResponse))
        self.phase.receive_round(self, msg)
        return self._advance(now)

    def tick(self, now: float) -> list[Outgoing]:
        return self._advance(now)

    # ------------------------------------------------------------------ transitions

    def _transaction(self):
        return self.checkpoint.transaction() if self.checkpoint is not None else contextlib.nullcontext()

    def _advance(self, now: float) -> list[Outgoing]:
        """Take every transition that is due; durable effects commit (one fsync) before events are returned."""
        out: list[Outgoing] = []
        with self._transaction():
            for _ in range(10_000):  # every transition makes progress; the bound only guards against bugs
                if not self._step(now, out):
                    return out
        raise RuntimeError("session did not settle")  # pragma: no cover

    def _step(self, now: float, out: list[Outgoing]) -> bool:
        """One transition of the session stage (which drives the epoch and round sub-machines)."""
        nxt = self.stage.step(self, now, out)
        if nxt is None:
            return False
        self.stage = nxt
        return True

    def _step_pipeline(self, now: float, out: list[Outgoing]) -> bool:
        """One transition of the epoch pipeline (server/epochs.py), if one is due."""
        nxt = self.pipeline.step(self, now, out)
        if nxt is None:
            return False
        self.pipeline = nxt
        return True

    def _step_rounds(self, now: float, out: list[Outgoing]) -> bool:
        """One transition of the rounds (server/rounds.py), if one is due."""
        nxt = self.phase.step(self, now, out)
        if nxt is None:
            return False
        self.phase = nxt
        return True

    # ------------------------------------------------------------------ epochs

    def _current_epoch(self) -> int | None:
        return min(self.coord.ready_epochs(), default=None)

    def _usable(self, site_id: str, epoch_id: int | None) -> bool:
        """Connected, a dealer of the epoch, not suspended for it, caught up."""
        if epoch_id is None:
            return False
        st = self.sites[site_id]
        if not st.connected or site_id not in self.coord.epoch(epoch_id).dealers:
            return False
        if st.suspended_from_epoch is not None and epoch_id < st.suspended_from_epoch:
            return False
        return st.caught_up()

    def _eligible(self, epoch_id: int) -> list[str]:
        return [s for s in self.coord.epoch(epoch_id).dealers if self._usable(s, epoch_id)]

    def _suspend(self, site_id: str, why: str) -> None:
        st = self.sites[site_id]
        if st.suspended_from_epoch is None or st.suspended_from_epoch < self.next_epoch_id:
            st.suspended_from_epoch = self.next_epoch_id
            st.wants_epoch = True
            st.note = why
            log.warning(f"{site_id} suspended until it joins a new epoch: {why}",
                        extra={"event": "suspended", "site": site_id, "reason": why})

    def round_stalled(self) -> bool:
        """Between rounds and waiting for t usable sites."""
        return isinstance(self.phase, Between) and self.phase.waiting_since is not None

    # ------------------------------------------------------------------ rounds

    def _required_survivors(self, work: Work, participants: int) -> int:
        """The survivor count the sites require before signing U3 (client/site.py applies the same rule), for a
        round of ``work`` with this many participants.

        Distributed noise, tree and evaluation rounds: k_r + c with k_r = max(t, |P_r| − s) − c.  Otherwise t.
        """
        if self.plan.noise != "distributed" or work.purpose == Purpose.INIT_SCORE:
            return self.t
        return self.plan.min_survivors(participants)

    def _round_start_msg(self, work: Work, start) -> RoundStartMsg:
        """The round request; a tree's rounds add what the mode's requests carry (the level, the tree's splits
        chosen so far, a released sketch)."""
        if work.purpose in (Purpose.INIT_SCORE, Purpose.EVAL):
            return RoundStartMsg(work.purpose, work.tree, start.to_bytes())
        return RoundStartMsg(work.purpose, work.tree, start.to_bytes(),
                             **self.rounds.request(work.purpose, work.tree, work.level))

    def _round_failed(self, ph: RoundInFlight, reason: str, now: float, out: list[Outgoing]) -> Between:
        """Count the failure; after max_attempts the session fails (an evaluation: the model stands without it)."""
        self.rounds_failed += 1
        n = self.attempts[ph.work] = self.attempts.get(ph.work, 0) + 1
        log.warning(f"round {ph.rnd.round_id} ({ph.work}) failed, attempt {n}/{self.plan.max_attempts}: {reason}",
                    extra={"event": "round_failed", "round_id": ph.rnd.round_id, "work": str(ph.work),
                           "reason": reason})
        if n >= self.plan.max_attempts and ph.work.purpose == Purpose.EVAL:  # the model stands without it
            self.evaluation = {"failed": f"evaluation failed {n} times (last: {reason})"}
        elif n >= self.plan.max_attempts:
            self._fail(f"{ph.work} failed {n} times (last: {reason})", out)
        return Between()

    def _release_step(self, work: Work, result, now: float) -> None:
        """A tree's round before its leaves (a level's splits, a sketch): the mode post-processes the noisy sum
        (central noise mode: plus the coordinator's noise); the step is checkpointed before any later request
        carries it, then joins the tree in progress."""
        total = self._with_central_noise(work, np.asarray(result.total, dtype=np.int64))
        step = self.rounds.release(work.purpose, work.tree, work.level, total)
        if self.checkpoint is not None:
            self.checkpoint.append_step(step.kind, work.tree, work.level, result.round_id, result.survivors,
                                        step.record, self.rounds_failed)
        self.rounds.apply(step.kind, step.record)
        log.info(f"tree {work.tree + 1}/{self.total_trees} {step.what} (round {result.round_id}, "
                 f"sites {list(result.survivors)})",
                 extra={"event": step.kind, "tree": work.tree, "tree_level": work.level,
                        "round_id": result.round_id, "sites": list(result.survivors), "vector_len": int(total.size),
                        "at": round(now, 6), "cpu": round(time.process_time(), 4)})

    def _with_central_noise(self, work: Work, total: np.ndarray) -> np.ndarray:
        """``total`` plus the coordinator's noise for the round (central noise mode; common/modes/coordinator.py
        ``central_noise``, the one rule); a tree's leaf noise, the same every tree, is drawn ahead in a background
        thread where the mode allows (data-independent)."""
        kind, ahead = PURPOSE_KIND[work.purpose], None
        if self.plan.noise == "central" and work.purpose == Purpose.TREE and self.rounds.leaf_noise_ahead:
            if self.central_noise is None:
                self.central_noise = NoiseShares(
                    self.randomness, self.rounds.central_noise_scales(work.purpose, work.tree, work.level))
            ahead = self.central_noise
        noise = central_noise(self.plan, kind, self.randomness, self.rounds.noise_layout(work.purpose, work.tree,
                                                                                          work.level), ahead)
        return total if noise is None else total + noise

    def _release(self, work: Work, result, now: float, out: list[Outgoing]) -> None:
        if work.purpose not in (Purpose.INIT_SCORE, Purpose.TREE, Purpose.EVAL):
            return self._release_step(work, result, now)
        total = self._with_central_noise(work, np.asarray(result.total, dtype=np.int64))
        if work.purpose == Purpose.EVAL:  # sites added the noise in either mode; only metrics are released
            self.evaluation = evaluation_receipt(self.plan, total, result.round_id, result.survivors)
            log.info(f"evaluation released (round {result.round_id}, sites {list(result.survivors)}, "
                     f"ε_eval = {self.plan.eval_epsilon:g})", extra={"event": "evaluation", "evaluation": self.evaluation})
            return
        if work.purpose == Purpose.INIT_SCORE:
            score = init_score(total, self.plan.schema.task, self.enc)
            multi = np.ndim(score) > 0  # multiclass: one margin per class
            msg = InitScoreMsg(0.0 if multi else float(score), result.round_id, tuple(result.survivors),
                               tuple(float(x) for x in score) if multi else ())
            if self.checkpoint is not None:
                self.checkpoint.append_init(msg)
            self.init, self.has_init = msg, True
            log.info(f"initial score released (round {result.round_id}, sites {list(result.survivors)})",
                     extra={"event": "init", "round_id": result.round_id, "sites": list(result.survivors)})
        else:
            values = self.rounds.leaf_values(total, work.tree)  # post-processing, the mode's rule
            splits = self.rounds.splits(work.tree)
            msg = TreeMsg(work.tree, result.round_id, tuple(result.survivors), splits.features,
                          splits.thresholds, np.asarray(values, dtype=np.float64).reshape(-1))
            if self.checkpoint is not None:
                self.checkpoint.append_tree(msg, self.rounds_failed)
            self.trees.append(msg)
            self.rounds.reset()
            log.info(f"tree {work.tree + 1}/{self.total_trees} released (round {result.round_id}, "
                     f"sites {list(result.survivors)})",
                     extra={"event": "tree", "tree": work.tree, "round_id": result.round_id,
                            "sites": list(result.survivors), "trees_released": len(self.trees),
                            "total": self.total_trees, "at": round(now, 6), "cpu": round(time.process_time(), 4)})
        for s in self.sites.values():
            if s.token is not None:
                out.append((s.site_id, msg))

    def trees_with_data(self) -> dict[str, int]:
        """Per roster site, the released trees whose noisy sum included its input (its own receipt says
        whether each of them carried its data, client/site.py ``receipt``)."""
        return {s: sum(s in t.sites for t in self.trees) for s in self.plan.site_ids}

    def data_summary(self) -> str:
        """One line: how many trees were released and how many of them each site contributed to."""
        per = self.trees_with_data()
        total = len(self.trees)
        if self.plan.eval_model_sha256 is not None:
            return f"evaluated an existing model of {total} trees (an evaluation-only plan: no training rounds)"
        parts = []
        for s, n in per.items():
            if n == total:
                parts.append(f"{s} {n}")
            else:
                last = max((t.index for t in self.trees if s in t.sites), default=None)
                parts.append(f"{s} {n}" + (" (none)" if last is None else f" (last at tree {last})"))
        full = sum(n == total for n in per.values())
        everyone = ("every site took part in all of them" if full == len(per) else
                    f"{full} of the {len(per)} sites took part in all of them")
        line = (f"trained {total} trees, each released from a sum over at least t = {self.plan.threshold} sites; "
                f"trees per site: {', '.join(parts)} ({everyone})")
        if self.rounds_failed:  # a failed attempt a site answered spends one of its records' scheduled releases
            budget = mode_for(self.plan).budget(self.plan)
            if any(n is not None for k, n in budget.items() if k not in ("init", "eval")):
                line += (f"; {self.rounds_failed} round(s) failed, and each one a site had answered spent one of the "
                         f"releases this plan schedules for its records, so up to {min(self.rounds_failed, total)} "
                         "of the last trees may carry no data from such a site (its receipt lists them)")
        return line

    def _finish(self, now: float, out: list[Outgoing]) -> None:
        model = build_model(self.plan, self.init, self.trees)
        self.model_json = model_bytes(model)
        sha = model_sha256(model)
        if self.checkpoint is not None:
            path = self.checkpoint.finish(self.model_json, sha)
            log.info(f"model written to {path}", extra={"event": "model_written", "path": str(path)})
        self.stage = Finishing(sha, now + self.plan.deadlines.finish)
        log.info(f"all {len(self.trees)} trees released; model {sha}",
                 extra={"event": "finished", "model_sha256": sha, "trees": len(self.trees),
                        "rounds_failed": self.rounds_failed, "trees_per_site": self.trees_with_data()})
        log.info(self.data_summary(), extra={"event": "trees_per_site", "trees_per_site": self.trees_with_data()})
        self._say_whom_we_await(now)  # at most deadlines.finish, then the coordinator exits
        for s in self.sites.values():
            if s.token is not None:
                out.append((s.site_id, self._finished_msg(sha)))

    def _finished_msg(self, sha: str) -> FinishedMsg:
        """Finished, with what the evaluation round released (the noisy sum and its sites; the sites recompute
        the metrics from it) or why it released nothing."""
        ev = self.evaluation
        if ev is None:
            return FinishedMsg(sha, len(self.trees))
        if "metrics" not in ev:
            return FinishedMsg(sha, len(self.trees), EvalRelease(failed=str(ev.get("failed", ""))))
        return FinishedMsg(sha, len(self.trees), EvalRelease(tuple(ev["sum"]), tuple(ev["sites"]), ev["round_id"]))

    def _fail(self, reason: str, out: list[Outgoing]) -> None:
        self.stage = Failed(reason)
        log.error(f"session failed: {reason}", extra={"event": "session_failed", "reason": reason})
        for s in self.sites.values():
            if s.token is not None:
                out.append((s.site_id, AbortedMsg(reason)))

    # ------------------------------------------------------------------ re-sends after a (re-)join

    def _pending_for(self, site_id: str, now: float) -> list[Outgoing]:
        """What a (re)joined site must receive again: its open requests (secagg answers them idempotently)."""
        return self.stage.resend(self, site_id)
