"""The coordinator's session: a transport-free, clocked state machine.

It drives one plan from the first join to the released model.  Inputs are
method calls (a site joined, subscribed, sent bytes, reported; the clock
ticked) with the current time ``now``; outputs are ``(site id, event)``
pairs for the transport to deliver in order.  Nothing here touches a
socket, a thread or the wall clock, so tests drive it directly.

Stages (one class each, explicit transitions)::

    session:  Gathering ──▶ Running ──▶ Finishing ──▶ Finished
                               └──────────────┴────▶ Failed

    Running has two sub-machines that run side by side:
    epochs:   NoSetup ──▶ Advertising ──▶ Sharing ──▶ NoSetup      (prepare epoch k+1 while k runs)
    rounds:   Between ──▶ CollectingInputs ──▶ CollectingSignatures ──▶ CollectingShares ──▶ Between
                               │   (any stage: < t left, ProtocolAbort) ──▶ Between (retry in a new slot)
                               └──(fast round: every input, with its seed shares, arrived)──▶ Between

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
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fedsbdt.common.boosting import init_score
from fedsbdt.common.modes import mode_for
from fedsbdt.common.multiclass import init_vector_len
from fedsbdt.common.secagg import (
    AdvertiseKeys,
    ConsistencySignature,
    FastMaskedInput,
    MaskedInput,
    ProtocolAbort,
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
    Deferred,
    EvalRelease,
    Event,
    FinishedMsg,
    InitScoreMsg,
    Purpose,
    RoundMsg,
    RoundStartMsg,
    SetupMsg,
    SetupParts,
    TreeMsg,
)

log = logging.getLogger("fedsbdt.coordinator")

Outgoing = tuple[str, Event]


def _routed_parts(routed) -> dict[str, tuple]:
    """Each recipient's EpochShares as the parts of its SetupParts: with the coordinator's storage, one part
    read from the stored blobs when the transport writes it (n recipients' messages are never all in memory)."""
    if isinstance(routed, StoredRouting):
        return {s: (Deferred(lambda s=s: routed[s].to_parts(), routed.size(s)),) for s in routed}
    return {s: m.to_parts() for s, m in routed.items()}


class Rejected(Exception):
    """A site's message was refused; the state did not change.  The transport reports ``str(e)``."""


# =========================================================================== per-site bookkeeping


@dataclass
class SiteState:
    site_id: str
    token: bytes | None = None
    joins: int = 0
    connected: bool = False
    trees_applied: int = 0
    released_at_join: int = 0
    suspended_from_epoch: int | None = None  # usable again only in epochs with id ≥ this
    wants_epoch: bool = False  # joined/suspended since it was last announced an epoch
    finished_sha256: str | None = None
    note: str = ""

    def caught_up(self) -> bool:
        return self.trees_applied >= self.released_at_join


@dataclass(frozen=True)
class Work:
    purpose: Purpose
    tree: int = 0
    level: int = 0  # Purpose.LEVEL: the level of tree ``tree`` whose histograms are summed

    def __str__(self) -> str:
        if self.purpose == Purpose.LEVEL:
            return f"tree {self.tree} level {self.level}"
        if self.purpose == Purpose.SKETCH:
            return f"tree {self.tree} sketch"
        if self.purpose == Purpose.EVAL:
            return "evaluation"
        return "initial score" if self.purpose == Purpose.INIT_SCORE else f"tree {self.tree}"


# =========================================================================== epoch pipeline stages


class PipelineStage:
    name = "pipeline"


@dataclass
class NoSetup(PipelineStage):
    retry_after: float = 0.0
    name = "idle"


@dataclass
class Advertising(PipelineStage):
    setup: object  # CoordinatorEpochSetup
    announce: object  # EpochAnnounce
    announced: set[str]
    deadline: float
    name = "advertising"


@dataclass
class Sharing(PipelineStage):
    setup: object
    roster: object  # EpochRoster
    deadline: float
    name = "sharing"


# =========================================================================== round stages


class RoundPhase:
    name = "round"


@dataclass
class Between(RoundPhase):
    waiting_since: float | None = None
    name = "between-rounds"


@dataclass
class RoundInFlight(RoundPhase):
    rnd: object  # CoordinatorRound
    work: Work
    request: object  # the message the awaited sites must answer
    deadline: float
    refused: set[str] = field(default_factory=set)


@dataclass
class CollectingInputs(RoundInFlight):
    name = "collecting-inputs"


@dataclass
class CollectingSignatures(RoundInFlight):
    name = "collecting-signatures"


@dataclass
class CollectingShares(RoundInFlight):
    name = "collecting-shares"


# =========================================================================== session stages


class SessionStage:
    name = "session"


@dataclass
class Gathering(SessionStage):
    deadline: float
    name = "gathering"


@dataclass
class Running(SessionStage):
    name = "running"


@dataclass
class Finishing(SessionStage):
    model_sha256: str
    deadline: float
    name = "finishing"


@dataclass
class Finished(SessionStage):
    model_sha256: str
    mismatched: tuple[str, ...] = ()
    name = "finished"


@dataclass
class Failed(SessionStage):
    reason: str
    name = "failed"


# =========================================================================== the session


class Session:
    """The coordinator's state for one plan.

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
            e: _routed_parts(r) for e in self.coord.ready_epochs() if (r := self.coord.stored_routing(e)) is not None}
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
        ph = self.phase
        if isinstance(ph, RoundInFlight) and round_id == ph.rnd.round_id and site_id in ph.rnd.awaiting():
            ph.refused.add(site_id)
            self._suspend(site_id, "refused a round request")
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
        p = self.pipeline
        try:
            if isinstance(msg, AdvertiseKeys) and isinstance(p, Advertising) and msg.epoch == p.announce.epoch:
                p.setup.receive_advertise(msg)
            elif isinstance(msg, ShareKeys) and isinstance(p, Sharing) and msg.epoch == p.roster.epoch:
                p.setup.receive_share_keys(msg)
            else:
                raise Rejected(f"{type(msg).__name__} for epoch {msg.epoch} is not expected now "
                               f"(epoch setup stage: {p.name})")
        except InvalidMessage as e:
            raise Rejected(str(e)) from None
        return self._advance(now)

    def submit_input(self, site_id: str, purpose: Purpose, tree: int, data: bytes, now: float) -> list[Outgoing]:
        ph = self.phase
        fast = isinstance(ph, CollectingInputs) and ph.rnd.fast  # the reply carries the seed shares too
        msg = self._decode(site_id, data, (FastMaskedInput,) if fast else (MaskedInput,),
                           ph.rnd.decode if fast else decode_message)  # a fast reply: decoded in bulk
        if not isinstance(ph, CollectingInputs) or (purpose, tree if purpose != Purpose.INIT_SCORE else 0) != \
                (ph.work.purpose, ph.work.tree):
            raise Rejected(f"no round for {Work(purpose, tree)} is collecting inputs now")
        try:
            ph.rnd.receive(msg)
        except InvalidMessage as e:
            raise Rejected(str(e)) from None
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
        ph = self.phase
        if not isinstance(ph, (CollectingSignatures, CollectingShares)):
            raise Rejected(f"no round is collecting {type(msg).__name__} now")
        try:
            ph.rnd.receive(msg)
        except InvalidMessage as e:
            raise Rejected(str(e)) from None
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
        st = self.stage
        if isinstance(st, Gathering):
            connected = [s for s in self.sites.values() if s.connected]
            if len(connected) == len(self.sites) or (len(connected) >= self.t and now >= st.deadline):
                log.info(f"starting with {len(connected)} of {len(self.sites)} sites connected",
                         extra={"event": "started", "sites": [s.site_id for s in connected]})
                self.stage = Running()
                return True
            return False
        if isinstance(st, Running):
            if isinstance(self.phase, Between) and self.next_work() is None:
                self._finish(now, out)
                return True
            return self._step_pipeline(now, out) or self._step_rounds(now, out)
        if isinstance(st, Finishing):
            # Every roster site, connected or not: a site that crashed near the end and restarts within
            # deadlines.finish re-joins, is sent Finished (_pending_for) and still gets the verified model.
            waiting = [s.site_id for s in self.sites.values() if s.finished_sha256 is None]
            if not waiting or now >= st.deadline:
                mismatched = tuple(s.site_id for s in self.sites.values()
                                   if s.finished_sha256 is not None and s.finished_sha256 != st.model_sha256)
                self.stage = Finished(st.model_sha256, mismatched)
                if waiting:
                    log.warning(f"{len(waiting)} site(s) did not confirm the model within "
                                f"{self.plan.deadlines.finish:g} s: {', '.join(waiting)}",
                                extra={"event": "unconfirmed", "sites": waiting})
                log.info("session finished", extra={"event": "done", "model_sha256": st.model_sha256,
                                                    "unconfirmed": waiting, "mismatched": list(mismatched)})
                return True
            return False
        return False

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

    def _step_pipeline(self, now: float, out: list[Outgoing]) -> bool:
        p = self.pipeline
        E = self.plan.epoch_rounds
        if isinstance(p, NoSetup):
            if now < p.retry_after:
                return False
            work = self.next_work()
            if work is None:
                return False
            left = (0 if self.has_init else 1) + self.rounds.rounds_left(self.total_trees - len(self.trees)) \
                + (work.purpose != Purpose.EVAL and self.plan.eval_spec is not None)
            slots = self.coord.slots_remaining()
            low = slots <= max(E // 2, 1) and slots < left + 1
            # a new epoch helps a stalled round only if some connected, caught-up site is usable in no ready epoch
            stalled = (isinstance(self.phase, Between) and self.phase.waiting_since is not None
                       and any(s.connected and s.caught_up() and not any(self._usable(s.site_id, e)
                                                                         for e in self.coord.ready_epochs())
                               for s in self.sites.values()))
            wants = any(s.connected and s.wants_epoch for s in self.sites.values())
            if not (low or stalled or wants):
                return False
            targets = sorted(s.site_id for s in self.sites.values() if s.connected)
            if len(targets) < self.t:
                return False
            setup, ann = self.coord.begin_epoch(E)
            self.next_epoch_id = ann.epoch + 1
            msg = SetupMsg(ann.to_bytes())
            for s in targets:
                self.sites[s].wants_epoch = False
                out.append((s, msg))
            self.pipeline = Advertising(setup, ann, set(targets), now + self.plan.deadlines.stage)
            log.info(f"epoch {ann.epoch}: announced rounds {ann.first_round}..{ann.last_round} to {targets}",
                     extra={"event": "epoch_announced", "epoch": ann.epoch, "sites": targets})
            return True
        if isinstance(p, Advertising):
            got = set(p.setup.advertised)
            waiting = [s for s in p.announced if s not in got and self.sites[s].connected]
            if waiting and now < p.deadline:
                return False
            try:
                roster = p.setup.close_advertise()
            except ProtocolAbort as e:
                log.warning(f"epoch {p.announce.epoch} setup failed: {e}", extra={"event": "epoch_failed"})
                self.pipeline = NoSetup(now + self.plan.deadlines.stage)
                return True
            msg = SetupMsg(roster.to_bytes())
            for s in roster.senders:
                out.append((s, msg))
            self.pipeline = Sharing(p.setup, roster, now + self.plan.deadlines.stage)
            return True
        if isinstance(p, Sharing):
            waiting = [s for s in p.roster.senders if s not in self._share_keys_received(p.setup)
                       and self.sites[s].connected]
            if waiting and now < p.deadline:
                return False
            try:
                routed = p.setup.close_share_keys()
            except ProtocolAbort as e:
                log.warning(f"epoch {p.roster.epoch} setup failed: {e}", extra={"event": "epoch_failed"})
                self.pipeline = NoSetup(now + self.plan.deadlines.stage)
                return True
            epoch = p.roster.epoch
            for e in [e for e in self._routed if e not in self.coord.ready_epochs()]:
                del self._routed[e]  # used up: a re-joining site needs only the ready epochs' shares
            self._routed[epoch] = _routed_parts(routed)
            for s, parts in self._routed[epoch].items():
                out.append((s, SetupParts(parts)))
            dealers = sorted(routed)
            log.info(f"epoch {epoch} ready with sites {dealers}",
                     extra={"event": "epoch_ready", "epoch": epoch, "sites": dealers})
            self.pipeline = NoSetup()
            return True
        return False

    @staticmethod
    def _share_keys_received(setup) -> set[str]:
        stage = setup.stage
        return set(getattr(stage, "received", {}) or {})

    def _skip_epoch(self, epoch_id: int) -> None:
        """Use up the remaining round slots of ``epoch_id`` without sending anything (ids are never reused)."""
        ep = self.coord.epoch(epoch_id)
        skipped = 0
        while epoch_id in self.coord.ready_epochs() and min(self.coord.ready_epochs()) == epoch_id:
            rnd, _ = self.coord.begin_round(2, ep.dealers)
            rnd.abort("slot skipped: a newer epoch has more sites")
            skipped += 1
        self._routed.pop(epoch_id, None)
        log.info(f"epoch {epoch_id}: skipped {skipped} unused round slots for a newer epoch",
                 extra={"event": "epoch_skipped", "epoch": epoch_id, "slots": skipped})

    # ------------------------------------------------------------------ rounds

    def _step_rounds(self, now: float, out: list[Outgoing]) -> bool:
        ph = self.phase
        if isinstance(ph, Between):
            return self._maybe_begin(ph, now, out)
        assert isinstance(ph, RoundInFlight)
        awaiting = ph.rnd.awaiting()
        if now < ph.deadline and any(self.sites[s].connected and s not in ph.refused for s in awaiting):
            return False  # (checked lazily: this runs after every message)
        waiting = [s for s in awaiting if self.sites[s].connected and s not in ph.refused]
        for s in waiting:  # connected but silent past the deadline
            self._suspend(s, f"missed the {ph.name} deadline of round {ph.rnd.round_id}")
        if log.isEnabledFor(logging.DEBUG):
            log.debug(f"round {ph.rnd.round_id}: closing {ph.name}", extra={"event": "stage_closed", "at": now})
        try:
            if isinstance(ph, CollectingInputs) and not ph.rnd.fast:
                need = self._min_survivors(ph)
                got = len(ph.rnd.survivors)
                if got < need:  # every honest site would refuse to sign U3: do not ask, retry in a new slot
                    p = len(ph.request.participants)
                    reason = (f"only {got} of {p} participants sent their masked input; their noise shares are "
                              f"split {self.plan.noise_divisor(p)} ways, so at least {need} must survive "
                              f"(dropout_slack = {self.plan.dropout_slack})")
                    ph.rnd.abort(reason)
                    raise ProtocolAbort(reason)
                req = ph.rnd.close_inputs()
                msg = RoundMsg(req.to_bytes())  # one event object: the transport converts it once
                for s in req.survivors:
                    out.append((s, msg))
                self.phase = CollectingSignatures(ph.rnd, ph.work, req, now + self.plan.deadlines.stage)
            elif isinstance(ph, CollectingSignatures):
                req = ph.rnd.close_consistency()
                msg = RoundMsg(req.to_bytes())
                for s, _ in req.signatures:
                    out.append((s, msg))
                self.phase = CollectingShares(ph.rnd, ph.work, req, now + self.plan.deadlines.stage)
            else:  # the shares, or a fast round's inputs (they carry the seed shares; any missing: ProtocolAbort)
                result = ph.rnd.finalize()
                for s in result.blamed:
                    self._suspend(s, f"revealed shares that fail their commitments in round {result.round_id}")
                self._release(ph.work, result, now, out)
                self.phase = Between()
        except ProtocolAbort as e:
            for s in getattr(e, "blame", ()) or ():
                self._suspend(s, f"blamed in round {ph.rnd.round_id}: {e}")
            self._round_failed(ph, str(e), now, out)
        return True

    def _min_survivors(self, ph: RoundInFlight) -> int:
        """The survivor count the sites require before signing U3 (client/site.py applies the same rule).

        Distributed noise, tree and evaluation rounds: k_r + c with k_r = max(t, |P_r| − s) − c.  Otherwise t.
        """
        return self._required_survivors(ph.work, len(ph.request.participants))

    def _required_survivors(self, work: Work, participants: int) -> int:
        """:meth:`_min_survivors` for a round of ``work`` with this many participants (before it starts)."""
        if self.plan.noise != "distributed" or work.purpose == Purpose.INIT_SCORE:
            return self.t
        return self.plan.min_survivors(participants)

    def _maybe_begin(self, ph: Between, now: float, out: list[Outgoing]) -> bool:
        work = self.next_work()
        if work is None:
            return False
        ready = self.coord.ready_epochs()
        if ready:
            current = ready[0]
            eligible = self._eligible(current)
            best = max(ready, key=lambda e: (len(self._eligible(e)), -e))
            if len(self._eligible(best)) > len(eligible) and len(self._eligible(best)) >= self.t:
                self._skip_epoch(current)
                return True
            if len(eligible) >= self.t:
                return self._begin(work, current, eligible, now, out)
        if ph.waiting_since is None:
            ph.waiting_since = now
            usable = sorted({s for e in ready for s in self._eligible(e)})
            log.info(f"waiting for {self.t} usable sites for {work} (usable now: {usable})",
                     extra={"event": "waiting", "usable": usable})
            return True
        if now - ph.waiting_since > self.plan.deadlines.quorum:
            self._fail(f"fewer than t = {self.t} sites were available for {self.plan.deadlines.quorum:g} s", out)
            return True
        return False

    def _begin(self, work: Work, epoch_id: int, participants: list[str], now: float, out: list[Outgoing]) -> bool:
        if work.purpose == Purpose.EVAL:
            d = self.plan.eval_spec.length
        elif work.purpose == Purpose.INIT_SCORE:
            d = init_vector_len(self.plan.schema)
        else:
            d = self.rounds.vector_len(work.purpose, work.tree, work.level)
        fast = self.plan.fast_round(self._required_survivors(work, len(participants)), len(participants))
        try:
            rnd, start = self.coord.begin_round(d, participants, fast=fast)
        except SecAggError as e:  # pragma: no cover - eligibility is checked above
            self._fail(f"cannot start a round: {e}", out)
            return True
        msg = self._round_start_msg(work, start)
        for s in start.participants:
            out.append((s, msg))
        self.phase = CollectingInputs(rnd, work, start, now + self.plan.deadlines.stage)
        if log.isEnabledFor(logging.DEBUG):
            k = self.plan.noise_divisor(len(start.participants)) if work.purpose != Purpose.INIT_SCORE else None
            log.debug(f"round {start.round_id} ({work}) started with {list(start.participants)}, noise divisor {k}",
                      extra={"event": "round_started", "round_id": start.round_id, "work": str(work), "at": now,
                             "noise_divisor": k, "fast": fast})
        return True

    def _round_start_msg(self, work: Work, start) -> RoundStartMsg:
        """The round request; a tree's rounds add what the mode's requests carry (the level, the tree's splits
        chosen so far, a released sketch)."""
        if work.purpose in (Purpose.INIT_SCORE, Purpose.EVAL):
            return RoundStartMsg(work.purpose, work.tree, start.to_bytes())
        return RoundStartMsg(work.purpose, work.tree, start.to_bytes(),
                             **self.rounds.request(work.purpose, work.tree, work.level))

    def _round_failed(self, ph: RoundInFlight, reason: str, now: float, out: list[Outgoing]) -> None:
        self.rounds_failed += 1
        n = self.attempts[ph.work] = self.attempts.get(ph.work, 0) + 1
        log.warning(f"round {ph.rnd.round_id} ({ph.work}) failed, attempt {n}/{self.plan.max_attempts}: {reason}",
                    extra={"event": "round_failed", "round_id": ph.rnd.round_id, "work": str(ph.work),
                           "reason": reason})
        self.phase = Between()
        if n >= self.plan.max_attempts and ph.work.purpose == Purpose.EVAL:  # the model stands without it
            self.evaluation = {"failed": f"evaluation failed {n} times (last: {reason})"}
        elif n >= self.plan.max_attempts:
            self._fail(f"{ph.work} failed {n} times (last: {reason})", out)

    def _release_step(self, work: Work, result, now: float) -> None:
        """A tree's round before its leaves (a level's splits, a sketch): the mode post-processes the noisy sum
        (central noise mode: plus the coordinator's noise); the step is checkpointed before any later request
        carries it, then joins the tree in progress."""
        total = np.asarray(result.total, dtype=np.int64)
        if self.plan.noise == "central":
            total = total + self.randomness.discrete_gaussian(
                self.rounds.central_noise_scales(work.purpose, work.tree, work.level))
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

    def _release(self, work: Work, result, now: float, out: list[Outgoing]) -> None:
        if work.purpose not in (Purpose.INIT_SCORE, Purpose.TREE, Purpose.EVAL):
            return self._release_step(work, result, now)
        total = np.asarray(result.total, dtype=np.int64)
        central = self.plan.noise == "central"
        if work.purpose == Purpose.EVAL:  # sites added the noise in either mode; only metrics are released
            self.evaluation = evaluation_receipt(self.plan, total, result.round_id, result.survivors)
            log.info(f"evaluation released (round {result.round_id}, sites {list(result.survivors)}, "
                     f"ε_eval = {self.plan.eval_epsilon:g})", extra={"event": "evaluation", "evaluation": self.evaluation})
            return
        if work.purpose == Purpose.INIT_SCORE:
            if central:
                total = total + self.randomness.discrete_laplace(self.plan.releases["init"].scales())
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
            if central and not self.rounds.leaf_noise_ahead:
                total = total + self.randomness.discrete_gaussian(
                    self.rounds.central_noise_scales(work.purpose, work.tree, work.level))
            elif central:
                if self.central_noise is None:  # drawn ahead in a background thread (data-independent)
                    self.central_noise = NoiseShares(
                        self.randomness, self.rounds.central_noise_scales(work.purpose, work.tree, work.level))
                total = total + self.central_noise.take()
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
        out: list[Outgoing] = []
        st = self.stage
        if isinstance(st, Failed):
            return [(site_id, AbortedMsg(st.reason))]
        if isinstance(st, (Finishing, Finished)):
            return [(site_id, self._finished_msg(st.model_sha256))]
        for e in self.coord.ready_epochs():
            parts = self._routed.get(e, {}).get(site_id)
            if parts is not None:
                out.append((site_id, SetupParts(parts)))
        p = self.pipeline
        if isinstance(p, Advertising):
            p.announced.add(site_id)
            self.sites[site_id].wants_epoch = False
            out.append((site_id, SetupMsg(p.announce.to_bytes())))
        elif isinstance(p, Sharing) and site_id in p.roster.senders:
            out.append((site_id, SetupMsg(p.roster.to_bytes())))
        ph = self.phase
        if isinstance(ph, RoundInFlight) and site_id in ph.rnd.awaiting():
            if isinstance(ph, CollectingInputs):
                out.append((site_id, self._round_start_msg(ph.work, ph.request)))
            else:
                out.append((site_id, RoundMsg(ph.request.to_bytes())))
        return out
