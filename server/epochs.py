"""The coordinator session's epoch pipeline: one class per stage, explicit transitions.

    NoSetup ──▶ Advertising ──▶ Sharing ──▶ NoSetup      (prepare epoch k+1 while k runs)
                     └─────────────┴──(< t sites: ProtocolAbort)──▶ NoSetup (retry after deadlines.stage)

A stage's :meth:`~PipelineStage.step` returns the next stage when a transition is due (``None``: nothing to
do yet) and appends the events to send; :meth:`~PipelineStage.receive` validates one setup message against
the stage (an unexpected one is :class:`~fedsbdt.server.session_types.Rejected`, naming the stage), and
:meth:`~PipelineStage.resend` gives a (re-)joined site what it must receive again.  The stages read and
update the session (its secure-aggregation coordinator, sites and ready epochs' routed shares) they are
handed; they hold only their own setup's state.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from fedsbdt.common.secagg import AdvertiseKeys, ProtocolAbort, ShareKeys
from fedsbdt.common.secagg.coordinator import StoredRouting
from fedsbdt.common.secagg.errors import InvalidMessage
from fedsbdt.common.federation.wire import Deferred, Purpose, SetupMsg, SetupParts

from .session_types import Outgoing, Rejected  # (Session in annotations: server/session.py)

log = logging.getLogger("fedsbdt.coordinator")


def routed_parts(routed) -> dict[str, tuple]:
    """Each recipient's EpochShares as the parts of its SetupParts: with the coordinator's storage, one part
    read from the stored blobs when the transport writes it (n recipients' messages are never all in memory)."""
    if isinstance(routed, StoredRouting):
        return {s: (Deferred(lambda s=s: routed[s].to_parts(), routed.size(s)),) for s in routed}
    return {s: m.to_parts() for s, m in routed.items()}


class PipelineStage:
    name = "pipeline"

    def step(self, s: Session, now: float, out: list[Outgoing]) -> PipelineStage | None:
        return None

    def receive(self, s: Session, msg) -> None:
        """Validate and record one site's AdvertiseKeys or ShareKeys (refused unless this stage expects it)."""
        raise Rejected(f"{type(msg).__name__} for epoch {msg.epoch} is not expected now "
                       f"(epoch setup stage: {self.name})")

    def resend(self, s: Session, site_id: str) -> list[Outgoing]:
        return []


@dataclass
class NoSetup(PipelineStage):
    retry_after: float = 0.0
    name = "idle"

    def step(self, s, now, out):
        """Announce a new epoch when the ready slots run low, a stalled round needs one, or a site wants one."""
        if now < self.retry_after:
            return None
        work = s.next_work()
        if work is None or not self._wanted(s, work):
            return None
        targets = sorted(x.site_id for x in s.sites.values() if x.connected)
        if len(targets) < s.t:
            return None
        setup, ann = s.coord.begin_epoch(s.plan.epoch_rounds)
        s.next_epoch_id = ann.epoch + 1
        msg = SetupMsg(ann.to_bytes())
        for site in targets:
            s.sites[site].wants_epoch = False
            out.append((site, msg))
        log.info(f"epoch {ann.epoch}: announced rounds {ann.first_round}..{ann.last_round} to {targets}",
                 extra={"event": "epoch_announced", "epoch": ann.epoch, "sites": targets})
        return Advertising(setup, ann, set(targets), now + s.plan.deadlines.stage)

    @staticmethod
    def _wanted(s: Session, work) -> bool:
        E = s.plan.epoch_rounds
        left = (0 if s.has_init else 1) + s.rounds.rounds_left(s.total_trees - len(s.trees)) \
            + (work.purpose != Purpose.EVAL and s.plan.eval_spec is not None)
        slots = s.coord.slots_remaining()
        low = slots <= max(E // 2, 1) and slots < left + 1
        # a new epoch helps a stalled round only if some connected, caught-up site is usable in no ready epoch
        stalled = s.round_stalled() and any(
            x.connected and x.caught_up() and not any(s._usable(x.site_id, e) for e in s.coord.ready_epochs())
            for x in s.sites.values())
        wants = any(x.connected and x.wants_epoch for x in s.sites.values())
        return low or stalled or wants


@dataclass
class Advertising(PipelineStage):
    setup: object  # CoordinatorEpochSetup
    announce: object  # EpochAnnounce
    announced: set[str]
    deadline: float
    name = "advertising"

    def receive(self, s, msg):
        if not (isinstance(msg, AdvertiseKeys) and msg.epoch == self.announce.epoch):
            return super().receive(s, msg)
        try:
            self.setup.receive_advertise(msg)
        except InvalidMessage as e:
            raise Rejected(str(e)) from None

    def step(self, s, now, out):
        """Close the adverts when every announced, connected site advertised (or at the deadline): the roster."""
        got = set(self.setup.advertised)
        waiting = [x for x in self.announced if x not in got and s.sites[x].connected]
        if waiting and now < self.deadline:
            return None
        try:
            roster = self.setup.close_advertise()
        except ProtocolAbort as e:
            log.warning(f"epoch {self.announce.epoch} setup failed: {e}", extra={"event": "epoch_failed"})
            return NoSetup(now + s.plan.deadlines.stage)
        msg = SetupMsg(roster.to_bytes())
        for x in roster.senders:
            out.append((x, msg))
        return Sharing(self.setup, roster, now + s.plan.deadlines.stage)

    def resend(self, s, site_id):
        self.announced.add(site_id)
        s.sites[site_id].wants_epoch = False
        return [(site_id, SetupMsg(self.announce.to_bytes()))]


@dataclass
class Sharing(PipelineStage):
    setup: object
    roster: object  # EpochRoster
    deadline: float
    name = "sharing"

    def receive(self, s, msg):
        if not (isinstance(msg, ShareKeys) and msg.epoch == self.roster.epoch):
            return super().receive(s, msg)
        try:
            self.setup.receive_share_keys(msg)
        except InvalidMessage as e:
            raise Rejected(str(e)) from None

    def step(self, s, now, out):
        """Close the ShareKeys (every connected roster site, or the deadline): route each dealer its shares."""
        received = set(getattr(self.setup.stage, "received", {}) or {})
        waiting = [x for x in self.roster.senders if x not in received and s.sites[x].connected]
        if waiting and now < self.deadline:
            return None
        try:
            routed = self.setup.close_share_keys()
        except ProtocolAbort as e:
            log.warning(f"epoch {self.roster.epoch} setup failed: {e}", extra={"event": "epoch_failed"})
            return NoSetup(now + s.plan.deadlines.stage)
        epoch = self.roster.epoch
        for e in [e for e in s._routed if e not in s.coord.ready_epochs()]:
            del s._routed[e]  # used up: a re-joining site needs only the ready epochs' shares
        s._routed[epoch] = routed_parts(routed)
        for x, parts in s._routed[epoch].items():
            out.append((x, SetupParts(parts)))
        dealers = sorted(routed)
        log.info(f"epoch {epoch} ready with sites {dealers}",
                 extra={"event": "epoch_ready", "epoch": epoch, "sites": dealers})
        return NoSetup()

    def resend(self, s, site_id):
        return [(site_id, SetupMsg(self.roster.to_bytes()))] if site_id in self.roster.senders else []


def skip_epoch(s: Session, epoch_id: int) -> None:
    """Use up the remaining round slots of ``epoch_id`` without sending anything (ids are never reused)."""
    ep = s.coord.epoch(epoch_id)
    skipped = 0
    while epoch_id in s.coord.ready_epochs() and min(s.coord.ready_epochs()) == epoch_id:
        rnd, _ = s.coord.begin_round(2, ep.dealers)
        rnd.abort("slot skipped: a newer epoch has more sites")
        skipped += 1
    s._routed.pop(epoch_id, None)
    log.info(f"epoch {epoch_id}: skipped {skipped} unused round slots for a newer epoch",
             extra={"event": "epoch_skipped", "epoch": epoch_id, "slots": skipped})
