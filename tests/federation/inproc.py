"""An in-process transport for the federation state machines (no gRPC, no threads, a fake clock).

It delivers every event as the service would — per site, in order — and
routes every reply to the session method the gRPC servicer would call.
Tests use it to exercise :class:`fedsbdt.server.session.Session` and
:class:`fedsbdt.client.site.SiteMachine` deterministically, including dropouts
(a site stops taking part: its stream is closed and nothing more is
delivered to it) and restarts (a fresh SiteMachine on the same state dir).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fedsbdt.client.site import SiteMachine
from fedsbdt.inprocess import join_site, route_reply, site_replies
from fedsbdt.server.session import Rejected, Session


@dataclass
class Clock:
    now: float = 1000.0

    def advance(self, dt: float) -> float:
        self.now += dt
        return self.now


@dataclass
class InProcess:
    session: Session
    machines: dict[str, SiteMachine]
    clock: Clock
    queues: dict[str, deque] = field(default_factory=dict)
    tokens: dict[str, bytes] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    refusals: list[tuple[str, str]] = field(default_factory=list)
    down: set[str] = field(default_factory=set)
    #: optional hook(site, event) -> bool: False drops the event (simulates a crash before handling it)
    intercept: object = None

    def deliver(self, outs) -> None:
        for sid, ev in outs:
            if sid in self.queues:
                self.queues[sid].append(ev)

    def join(self, sid: str) -> None:
        self.queues[sid] = deque()
        self.tokens[sid] = join_site(self.session, sid, self.machines[sid], self.clock.now, self.deliver)
        self.down.discard(sid)

    def crash(self, sid: str) -> None:
        """The site process dies: its stream closes and its queue is lost."""
        self.down.add(sid)
        self.queues.pop(sid, None)
        self.deliver(self.session.unsubscribed(sid, self.tokens[sid], self.clock.now))

    def route(self, sid: str, reply) -> None:
        try:
            self.deliver(route_reply(self.session, sid, reply, self.clock.now, self.refusals))
        except Rejected as e:
            self.rejected.append((sid, str(e)))

    def step(self) -> bool:
        """Deliver one event to each site with a non-empty queue; False when nothing was pending."""
        busy = False
        for sid in sorted(self.queues):
            q = self.queues.get(sid)
            if not q:
                continue
            busy = True
            ev = q.popleft()
            if self.intercept is not None and not self.intercept(sid, ev):
                continue
            for r in site_replies(self.session, self.machines[sid], ev):
                self.route(sid, r)
        return busy

    def run(self, until=lambda: False, max_steps: int = 200_000, tick: float = 1.0) -> None:
        for _ in range(max_steps):
            if self.session.done or until():
                return
            if not self.step():
                self.deliver(self.session.tick(self.clock.advance(tick)))
        raise AssertionError("the in-process federation did not settle")
