"""The coordinator session's rounds: one class per stage, explicit transitions.

    Between ──▶ CollectingInputs ──▶ CollectingSignatures ──▶ CollectingShares ──▶ Between
                     │   (any stage: < t left, ProtocolAbort) ──▶ Between (retry in a new slot)
                     └──(fast round: every input, with its seed shares, arrived)──▶ Between

:meth:`Between.step` starts the next work item's round over the eligible sites of the earliest ready epoch;
an in-flight stage closes (:meth:`RoundInFlight.step`) when every awaited site answered, refused or
disconnected, or at its deadline, and returns the next stage (``None``: nothing due yet; ``self``: progress
without a new stage).  Each stage validates the messages it accepts (:meth:`~RoundPhase.receive_input`,
:meth:`~RoundPhase.receive_round`: anything else is :class:`~fedsbdt.server.session_types.Rejected`, naming
the stage) and knows what a (re-)joined site must receive again (:meth:`~RoundPhase.resend`).  What a round
releases, and the noise added to it, is the session's (``Session._release``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fedsbdt.common.multiclass import init_vector_len
from fedsbdt.common.secagg import FastMaskedInput, MaskedInput, ProtocolAbort, decode_message
from fedsbdt.common.secagg.errors import InvalidMessage, SecAggError
from fedsbdt.common.federation.wire import Purpose, RoundMsg

from .epochs import skip_epoch
from .session_types import Outgoing, Rejected, Work  # (Session in annotations: server/session.py)

log = logging.getLogger("fedsbdt.coordinator")


class RoundPhase:
    name = "round"

    def step(self, s: Session, now: float, out: list[Outgoing]) -> RoundPhase | None:
        return None

    def input_decoding(self) -> tuple[tuple[type, ...], object]:
        """The message types a masked input may have now, and their decoder."""
        return (MaskedInput,), decode_message

    def receive_input(self, s: Session, msg, work: Work) -> None:
        """Validate and record one site's masked input for ``work`` (refused unless collecting its inputs)."""
        raise Rejected(f"no round for {work} is collecting inputs now")

    def receive_round(self, s: Session, msg) -> None:
        """Validate and record a ConsistencySignature or an UnmaskResponse (refused unless collecting them)."""
        raise Rejected(f"no round is collecting {type(msg).__name__} now")

    def refused_by(self, s: Session, site_id: str, round_id: int | None) -> None:
        """A site refused to answer round ``round_id``: if it is this round and the site is awaited, stop
        waiting for it (it is suspended)."""

    def resend(self, s: Session, site_id: str) -> list[Outgoing]:
        return []


@dataclass
class Between(RoundPhase):
    waiting_since: float | None = None
    name = "between-rounds"

    def step(self, s, now, out):
        """Begin the next work item's round, skip an epoch a newer one beats, or wait (at most the quorum
        deadline, then the session fails) for t usable sites."""
        work = s.next_work()
        if work is None:
            return None
        ready = s.coord.ready_epochs()
        if ready:
            current = ready[0]
            eligible = s._eligible(current)
            best = max(ready, key=lambda e: (len(s._eligible(e)), -e))
            if len(s._eligible(best)) > len(eligible) and len(s._eligible(best)) >= s.t:
                skip_epoch(s, current)
                return self
            if len(eligible) >= s.t:
                return self._begin(s, work, current, eligible, now, out)
        if self.waiting_since is None:
            self.waiting_since = now
            usable = sorted({x for e in ready for x in s._eligible(e)})
            log.info(f"waiting for {s.t} usable sites for {work} (usable now: {usable})",
                     extra={"event": "waiting", "usable": usable})
            return self
        if now - self.waiting_since > s.plan.deadlines.quorum:
            s._fail(f"fewer than t = {s.t} sites were available for {s.plan.deadlines.quorum:g} s", out)
            return self
        return None

    def _begin(self, s: Session, work: Work, epoch_id: int, participants: list[str], now: float,
               out: list[Outgoing]) -> RoundPhase:
        if work.purpose == Purpose.EVAL:
            d = s.plan.eval_spec.length
        elif work.purpose == Purpose.INIT_SCORE:
            d = init_vector_len(s.plan.schema)
        else:
            d = s.rounds.vector_len(work.purpose, work.tree, work.level)
        fast = s.plan.fast_round(s._required_survivors(work, len(participants)), len(participants))
        try:
            rnd, start = s.coord.begin_round(d, participants, fast=fast)
        except SecAggError as e:  # pragma: no cover - eligibility is checked above
            s._fail(f"cannot start a round: {e}", out)
            return self
        msg = s._round_start_msg(work, start)
        for x in start.participants:
            out.append((x, msg))
        if log.isEnabledFor(logging.DEBUG):
            k = s.plan.noise_divisor(len(start.participants)) if work.purpose != Purpose.INIT_SCORE else None
            log.debug(f"round {start.round_id} ({work}) started with {list(start.participants)}, noise divisor {k}",
                      extra={"event": "round_started", "round_id": start.round_id, "work": str(work), "at": now,
                             "noise_divisor": k, "fast": fast})
        return CollectingInputs(rnd, work, start, now + s.plan.deadlines.stage)


@dataclass
class RoundInFlight(RoundPhase):
    rnd: object  # CoordinatorRound
    work: Work
    request: object  # the message the awaited sites must answer
    deadline: float
    refused: set[str] = field(default_factory=set)

    def step(self, s, now, out):
        """Close the stage once no connected, awaited site is left to answer (or at the deadline: the silent
        ones are suspended); a ProtocolAbort fails the round (its blamed sites suspended)."""
        awaiting = self.rnd.awaiting()
        if now < self.deadline and any(s.sites[x].connected and x not in self.refused for x in awaiting):
            return None  # (checked lazily: this runs after every message)
        waiting = [x for x in awaiting if s.sites[x].connected and x not in self.refused]
        for x in waiting:  # connected but silent past the deadline
            s._suspend(x, f"missed the {self.name} deadline of round {self.rnd.round_id}")
        if log.isEnabledFor(logging.DEBUG):
            log.debug(f"round {self.rnd.round_id}: closing {self.name}", extra={"event": "stage_closed", "at": now})
        try:
            return self.close(s, now, out)
        except ProtocolAbort as e:
            for x in getattr(e, "blame", ()) or ():
                s._suspend(x, f"blamed in round {self.rnd.round_id}: {e}")
            return s._round_failed(self, str(e), now, out)

    def close(self, s: Session, now: float, out: list[Outgoing]) -> RoundPhase:
        raise NotImplementedError

    def finalize(self, s: Session, now: float, out: list[Outgoing]) -> RoundPhase:
        """The round's sum (the shares, or a fast round's inputs, which carry the seed shares): released."""
        result = self.rnd.finalize()
        for x in result.blamed:
            s._suspend(x, f"revealed shares that fail their commitments in round {result.round_id}")
        s._release(self.work, result, now, out)
        return Between()

    def refused_by(self, s, site_id, round_id):
        if round_id == self.rnd.round_id and site_id in self.rnd.awaiting():
            self.refused.add(site_id)
            s._suspend(site_id, "refused a round request")

    def resend(self, s, site_id):
        if site_id not in self.rnd.awaiting():
            return []
        return [(site_id, RoundMsg(self.request.to_bytes()))]

    def _forward(self, msg) -> None:
        try:
            self.rnd.receive(msg)
        except InvalidMessage as e:
            raise Rejected(str(e)) from None


@dataclass
class CollectingInputs(RoundInFlight):
    name = "collecting-inputs"

    def input_decoding(self):
        if self.rnd.fast:  # the reply carries the seed shares too, decoded in bulk
            return (FastMaskedInput,), self.rnd.decode
        return super().input_decoding()

    def receive_input(self, s, msg, work):
        if (work.purpose, work.tree if work.purpose != Purpose.INIT_SCORE else 0) != \
                (self.work.purpose, self.work.tree):
            return super().receive_input(s, msg, work)
        self._forward(msg)

    def close(self, s, now, out):
        """A fast round is finalized; otherwise U3 goes to the survivors for signing, if enough survived."""
        if self.rnd.fast:
            return self.finalize(s, now, out)
        need = s._required_survivors(self.work, len(self.request.participants))
        got = len(self.rnd.survivors)
        if got < need:  # every honest site would refuse to sign U3: do not ask, retry in a new slot
            p = len(self.request.participants)
            reason = (f"only {got} of {p} participants sent their masked input; their noise shares are "
                      f"split {s.plan.noise_divisor(p)} ways, so at least {need} must survive "
                      f"(dropout_slack = {s.plan.dropout_slack})")
            self.rnd.abort(reason)
            raise ProtocolAbort(reason)
        req = self.rnd.close_inputs()
        msg = RoundMsg(req.to_bytes())  # one event object: the transport converts it once
        for x in req.survivors:
            out.append((x, msg))
        return CollectingSignatures(self.rnd, self.work, req, now + s.plan.deadlines.stage)

    def resend(self, s, site_id):
        if site_id not in self.rnd.awaiting():
            return []
        return [(site_id, s._round_start_msg(self.work, self.request))]


@dataclass
class CollectingSignatures(RoundInFlight):
    name = "collecting-signatures"

    def receive_round(self, s, msg):
        self._forward(msg)

    def close(self, s, now, out):
        """The signed survivor set goes to the signers, who answer with their shares."""
        req = self.rnd.close_consistency()
        msg = RoundMsg(req.to_bytes())
        for x, _ in req.signatures:
            out.append((x, msg))
        return CollectingShares(self.rnd, self.work, req, now + s.plan.deadlines.stage)


@dataclass
class CollectingShares(RoundInFlight):
    name = "collecting-shares"

    def receive_round(self, s, msg):
        self._forward(msg)

    def close(self, s, now, out):
        return self.finalize(s, now, out)
