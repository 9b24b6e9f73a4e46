"""The coordinator's gRPC service: a thin adapter from ``fedsbdt.v1.Federation`` to :class:`Session`.

* An asyncio gRPC server (``grpc.aio``) on one event loop in its own thread
  drives the session: every RPC converts the request, calls the session (a
  synchronous step, run on the loop, so steps never interleave and a step's
  SQLite commit precedes the events it returns), turns the session's
  outgoing ``(site, event)`` pairs into numbered protobuf events in per-site
  outboxes, and answers.  No message is handed between threads.  A
  :class:`Rejected` message becomes ``accepted = false`` with the reason;
  nothing a peer sends can raise out of a handler into the server.
* ``Subscribe`` streams a site's outbox in order.  Events stay in a bounded
  outbox (``server/outbox.py``: the last ``OUTBOX_EVENTS``, at most
  ``OUTBOX_BYTES`` beyond the newest few; a broadcast is encoded once and
  shared by every outbox), so a site whose stream broke resumes with
  ``after_seq``; older history is refused with ``OUT_OF_RANGE`` and the
  site re-joins and catches up with ``GetTrees``.  A Join opens a fresh
  outbox and ends the previous incarnation's stream.  A message is joined
  from its (shared) parts only when written, and messages above
  ``SMALL_WRITE_BYTES`` (an epoch's EpochShares) share a byte budget
  across all streams (:class:`WriteBudget`), so an epoch setup does not put
  n copies of them into gRPC's buffers at once.
* ``Connect`` (what the site daemon uses) is Subscribe + Submit* + Report on
  one bidirectional stream: a reader task per stream applies the site's
  messages in order with the same checks as the unary calls, and the stream
  sends the outbox in batches (everything queued at that moment, e.g. a
  released tree with the next RoundStart) carrying how many site messages
  were processed, so that a site resends unprocessed ones after a break.
* Identity: with TLS, every RPC first checks that the peer certificate's
  common name is on the plan's roster (PERMISSION_DENIED otherwise, before
  anything is read or returned: there is no other identity, no
  administrator certificate).  The name must also equal the claimed site id
  on Join, Subscribe, Submit* and Report; Join must also be signed with the
  site's identity key pinned in the plan; later calls carry the token Join
  returned.
* Resource limits: a certificate holds at most ``STREAMS_PER_IDENTITY`` open
  Subscribe/Connect streams (RESOURCE_EXHAUSTED beyond); a Connect stream
  whose first message does not arrive within ``FIRST_MESSAGE_SECONDS`` is
  cancelled; the server accepts at most ``max_concurrent_rpcs(n)`` calls at
  once (gRPC refuses the rest with RESOURCE_EXHAUSTED, which sites retry).
  So neither a certificate outside the roster nor a roster member can take
  the calls the other sites need.
* A ticker task on the same loop advances the session's clock (deadlines).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import grpc

from fedsbdt.common import testhooks
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg

from .outbox import Outbox, batch_parts, encode_event, event_parts, raw_or
from .session import Rejected, Session
from fedsbdt.common.federation.wire import (
    MAX_MESSAGE_BYTES,
    MAX_TREES_PER_PAGE,
    SERVER_OPTIONS,
    Purpose,
    WireError,
    init_to_proto,
    join_parts,
    tree_to_proto,
    verify_join,
)
from fedsbdt.common.secagg import StorageError

log = logging.getLogger("fedsbdt.coordinator")

TICK_SECONDS = 0.05
#: Open Subscribe/Connect streams per certificate: a site that reconnects after a network fault may open its
#: new stream before the server notices that the old one closed.
STREAMS_PER_IDENTITY = 2
#: A Connect stream that sends no first (subscribe) message within this many seconds is cancelled.
FIRST_MESSAGE_SECONDS = 10.0
#: Calls beyond the roster's streams, for the short unary calls.
UNARY_CALLS = 16
#: A waiting stream re-checks whether its call is still active at least this often (seconds).
RECHECK_SECONDS = 1.0
#: Bytes of large stream messages (an epoch's EpochShares: ≈ 2 MB each at 100 sites) being joined and written
#: at once, over all streams: their copies and gRPC's buffers of them stay below this instead of n times a
#: message (see :class:`WriteBudget`).
WRITE_BUDGET_BYTES = 16 * 1024 * 1024
#: Messages up to this size (round traffic) are written without waiting for the budget.
SMALL_WRITE_BYTES = 256 * 1024
#: A write holds its share of the budget at most this long (seconds): a site that does not read its stream
#: slows the others' large messages by at most this much each, and never stops them.
WRITE_HOLD_SECONDS = 2.0


def max_concurrent_rpcs(n_sites: int) -> int:
    """Calls the server accepts at once: twice every roster identity's stream quota plus the unary calls."""
    return 2 * (STREAMS_PER_IDENTITY * n_sites + UNARY_CALLS)


class _Abort(Exception):
    """End the call with this status (raised by the checks, turned into ``context.abort`` by :func:`_rpc`)."""

    def __init__(self, code, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


#: What :func:`add_service`'s deserializers return for bytes that are not a valid message of the request type.
UNDECODABLE = object()


def _undecodable_message() -> _Abort:
    return _Abort(grpc.StatusCode.INVALID_ARGUMENT, "cannot deserialize the request: not a valid message of its type")


def _rpc(handler):
    """An RPC handler whose checks raise :class:`_Abort`: the call ends with that status and detail."""

    @functools.wraps(handler)
    async def run(self, request, context):
        try:
            if request is UNDECODABLE:
                raise _undecodable_message()
            return await handler(self, request, context)
        except _Abort as e:
            await context.abort(e.code, e.detail)

    return run


def add_service(service: "FederationService", server) -> None:
    """Register ``service`` on an asyncio ``server`` with the generated stubs' handlers, except that bytes
    which do not parse as the request type reach the handler as :data:`UNDECODABLE` (and end the call with
    INVALID_ARGUMENT) instead of raising in the server's deserializer (which the asyncio server would
    answer with UNKNOWN)."""

    class Capture:
        def add_generic_rpc_handlers(self, handlers) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict) -> None:
            self.name, self.handlers = name, handlers

    def lenient(parse):
        def deserialize(data: bytes):
            try:
                return parse(data)
            except Exception:  # DecodeError, or anything else a hostile byte string provokes
                return UNDECODABLE
        return deserialize

    cap = Capture()
    pbg.add_FederationServicer_to_server(service, cap)
    handlers = {name: h._replace(request_deserializer=lenient(h.request_deserializer),
                                 response_serializer=raw_or(h.response_serializer))
                for name, h in cap.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(cap.name, handlers),))
    server.add_registered_method_handlers(cap.name, handlers)


async def _wait(wake: asyncio.Event, cond) -> None:
    """Until ``cond()`` holds, wait for ``wake`` (set by whoever changes what ``cond`` reads) or at most
    ``RECHECK_SECONDS`` at a time.  Race-free: everything runs on one event loop."""
    loop = asyncio.get_running_loop()
    while not cond():
        wake.clear()
        timer = loop.call_later(RECHECK_SECONDS, wake.set)
        try:
            await wake.wait()
        finally:
            timer.cancel()


def _joined(parts: list) -> bytes:
    """A stream message's bytes; a deferred part whose stored bytes are gone (an epoch used up since the event
    was queued) ends the stream with OUT_OF_RANGE: the site joins again and gets what it still needs."""
    try:
        return join_parts(parts)
    except StorageError as e:
        raise _Abort(grpc.StatusCode.OUT_OF_RANGE, f"{e}; join again") from None


class WriteBudget:
    """Bounds the bytes of large messages being written to the streams at once (on the server's event loop).

    A stream message is joined from its parts only when written, and gRPC's ``write`` completes when the
    transport has taken the bytes (HTTP/2 flow control: about when the site has read them).  A message above
    ``SMALL_WRITE_BYTES`` waits until the messages in flight leave room for it (or none is in flight), then
    holds its size until its write completes or ``WRITE_HOLD_SECONDS`` have passed, whichever is first.  So
    the n EpochShares of an epoch are not all copied into n streams' buffers at once, and a stalled site
    cannot hold the budget.
    """

    def __init__(self, limit: int = WRITE_BUDGET_BYTES, small: int = SMALL_WRITE_BYTES,
                 hold_seconds: float = WRITE_HOLD_SECONDS) -> None:
        self.limit, self.small, self.hold_seconds = limit, small, hold_seconds
        self.used = 0
        self.peak = 0  # most bytes held at once (benchmarks, tests)
        self._waiters: list[asyncio.Future] = []

    async def write(self, context, parts: list[bytes]) -> int:
        """Join ``parts`` and write them to ``context``; returns the message's size."""
        size = sum(len(p) for p in parts)
        if size <= self.small:
            await context.write(_joined(parts))
            return size
        loop = asyncio.get_running_loop()
        while self.used and self.used + size > self.limit:
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self.used += size
        self.peak = max(self.peak, self.used)
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self.used -= size
                waiters, self._waiters = self._waiters, []
                for w in waiters:
                    if not w.done():
                        w.set_result(None)

        task = None
        try:
            task = asyncio.ensure_future(context.write(_joined(parts)))
            del parts
            await asyncio.wait((task,), timeout=self.hold_seconds)
            release()
            await task
        finally:
            release()
            if task is not None and not task.done():
                task.cancel()
        return size


class FederationService(pbg.FederationServicer):
    """gRPC servicer over one :class:`Session`; every handler runs on the server's event loop."""

    def __init__(self, session: Session, tls: bool, clock=time.monotonic,
                 first_message_seconds: float = FIRST_MESSAGE_SECONDS) -> None:
        self.session = session
        self.tls = tls
        self.clock = clock
        self.first_message_seconds = first_message_seconds
        self.identity_streams: dict[str, int] = {}  # open Subscribe/Connect streams per certificate name
        self.outboxes: dict[str, Outbox] = {}
        self.stopping = False
        self.fatal: BaseException | None = None
        self.on_fatal = lambda: None
        self.bytes_in = 0
        self.bytes_out = 0
        # open Subscribe streams per (site, token): a site that re-subscribes after a network fault may
        # have its new stream open before the server notices the old one closed
        self.streams: dict[tuple[str, bytes], int] = {}
        self.observers: list = []  # called on the loop after every session step (server/status.py)
        self.write_budget = WriteBudget()

    # ------------------------------------------------------------------ plumbing

    def dispatch(self, outs) -> None:
        """Append the session's outgoing events to the outboxes and wake the streams that follow them."""
        testhooks.coordinator_dispatch(outs, len(self.session.trees), "before")  # TEST-ONLY kill point (off)
        cache: dict[int, object] = {}  # outs holds every event, so ids are not reused during this call
        touched = set()
        for site, ev in outs:
            box = self.outboxes.get(site)
            if box is None:
                continue
            body = cache.get(id(ev))
            if body is None:  # one encoding per broadcast event, shared by the outboxes
                body = cache[id(ev)] = encode_event(ev)
            box.append(body)
            touched.add(site)
        for site in touched:
            self.outboxes[site].notify()
        for observe in self.observers:
            observe()
        testhooks.coordinator_dispatch(outs, len(self.session.trees), "after")

    def tick(self) -> None:
        self.dispatch(self._session_call(lambda: self.session.tick(self.clock())))

    def _session_call(self, fn):
        """Run a session step; an unexpected error (a bug, a failing disk) stops the coordinator (fail-stop:
        its durable state is consistent, a restart resumes) instead of serving from a state that may not be."""
        try:
            return fn()
        except (Rejected, WireError):
            raise
        except Exception as e:
            log.exception("internal error in the session; stopping", extra={"event": "fatal"})
            if self.fatal is None:
                self.fatal = e
                self.on_fatal()
            raise

    def _peer_name(self, context) -> str | None:
        if not self.tls:
            return None
        names = context.auth_context().get("x509_common_name") or []
        return names[0].decode("utf-8", "replace") if names else ""

    def _admit(self, context) -> str | None:
        """First step of every RPC: with TLS, the caller's certificate name must be on the plan's roster.

        Aborts with PERMISSION_DENIED otherwise, before the call reads or returns anything; returns the
        name (None without TLS, where there is no identity to check)."""
        if not self.tls:
            return None
        name = self._peer_name(context)
        if self.session.plan.identity_key(name) is None:
            log.warning(f"refused a call over a TLS certificate for {name!r}, which is not in the roster",
                        extra={"event": "not_on_roster", "certificate": name})
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED,
                         f"the TLS client certificate is issued to {name!r}, which is not in the plan's roster")
        return name

    @staticmethod
    def _on_close(context, fn) -> bool:
        """Run ``fn()`` when the call ends; False (and ``fn`` not registered) if it already ended."""
        if context.done():
            return False
        context.add_done_callback(lambda _ctx: fn())
        return True

    def _open_stream(self, context, name: str | None) -> bool:
        """Count a new Subscribe/Connect stream against its certificate's quota (RESOURCE_EXHAUSTED beyond
        ``STREAMS_PER_IDENTITY``); the slot is given back when the call ends.  False if it already ended."""
        if name is None:
            return True  # without TLS there is no identity to count against (the server's call limit holds)
        held = self.identity_streams.get(name, 0)
        if held >= STREAMS_PER_IDENTITY:
            log.warning(f"refused a stream for {name!r}: it holds {held} open streams already",
                        extra={"event": "stream_quota", "certificate": name})
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"the certificate {name!r} already holds {held} open streams (the limit per site)")
        self.identity_streams[name] = held + 1

        def release() -> None:
            left = self.identity_streams.get(name, 1) - 1
            if left > 0:
                self.identity_streams[name] = left
            else:
                self.identity_streams.pop(name, None)

        if not self._on_close(context, release):
            release()
            return False
        return True

    async def _first_message(self, context, name: str | None):
        """The first message of a Connect stream, or None if the stream ended; cancels the call if nothing
        came in time."""
        try:
            first = await asyncio.wait_for(context.read(), self.first_message_seconds)
        except asyncio.TimeoutError:
            log.warning(f"cancelled a Connect stream ({name!r}) that sent nothing for "
                        f"{self.first_message_seconds:g} s", extra={"event": "idle_stream", "certificate": name})
            raise _Abort(grpc.StatusCode.CANCELLED, "no first message in time") from None
        except Exception:  # the site went away
            return None
        if first is UNDECODABLE:
            raise _undecodable_message()
        return None if first is grpc.aio.EOF else first

    def _check_peer(self, context, site_id: str) -> None:
        if not self.tls:
            return
        name = self._peer_name(context)
        if name != site_id:
            log.warning(f"refused a call for site {site_id!r} over a TLS certificate for {name!r}",
                        extra={"event": "identity_mismatch", "site": site_id, "certificate": name})
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED,
                         f"the TLS client certificate is issued to {name!r}, not to site {site_id!r}")

    def _auth(self, context, site_id: str, token: bytes):
        self._check_peer(context, site_id)
        try:
            return self.session.authenticate(site_id, bytes(token))
        except Rejected as e:
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None

    # ------------------------------------------------------------------ public

    @_rpc
    async def GetPlan(self, request, context):
        self._admit(context)
        p = self.session.plan
        return pb.GetPlanResponse(plan=p.canonical_json, plan_sha256=p.sha256)

    @_rpc
    async def GetStatus(self, request, context):
        self._admit(context)
        s = self.session.status()
        return pb.GetStatusResponse(
            stage=s["stage"], plan_sha256=s["plan_sha256"], trees_released=s["trees_released"],
            trees_total=s["trees_total"], rounds_failed=s["rounds_failed"], model_sha256=s["model_sha256"],
            detail=s["detail"], sites=[pb.SiteStatus(**x) for x in s["sites"]])

    @_rpc
    async def GetTrees(self, request, context):
        self._admit(context)
        limit = min(request.max_trees or MAX_TREES_PER_PAGE, MAX_TREES_PER_PAGE)
        init, has_init, trees = self.session.catch_up(int(request.from_index), limit)
        released, total = len(self.session.trees), self.session.total_trees
        sha = getattr(self.session.stage, "model_sha256", "") or ""
        resp = pb.GetTreesResponse(has_init_score=has_init and init is not None, trees_released=released,
                                   trees_total=total, model_sha256=sha)
        if has_init and init is not None:
            resp.init_score.CopyFrom(init_to_proto(init))
        size = 0
        for t in trees:
            m = tree_to_proto(t)
            size += m.ByteSize() + 8
            if size > MAX_MESSAGE_BYTES // 2 and len(resp.trees):
                break
            resp.trees.append(m)
        return resp

    # ------------------------------------------------------------------ join and subscription

    @_rpc
    async def Join(self, request, context):
        self._admit(context)
        site = request.site_id
        self._check_peer(context, site)
        plan = self.session.plan
        key = plan.identity_key(site)
        if key is None:
            log.warning(f"refused join of unknown site {site!r}", extra={"event": "join_refused", "site": site})
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED, f"site {site!r} is not in the plan's roster")
        if request.plan_sha256 != plan.sha256:
            raise _Abort(grpc.StatusCode.FAILED_PRECONDITION,
                         f"plan hash mismatch: the coordinator runs plan {plan.sha256}, the site has "
                         f"{request.plan_sha256}")
        if not verify_join(key, plan.sha256, site, bytes(request.nonce), bytes(request.signature)):
            log.warning(f"refused join of {site!r}: bad identity signature", extra={"event": "join_refused"})
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED,
                         f"the join is not signed with the identity key the plan pins for {site!r}")
        if not self._session_call(lambda: self.session.fresh_join_nonce(site, bytes(request.nonce))):
            log.warning(f"refused a replayed join of {site!r}", extra={"event": "join_refused", "site": site})
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED,
                         f"this signed join of {site!r} was used before (a replayed request); every join "
                         "needs a fresh nonce")
        try:
            token, outs = self._session_call(
                lambda: self.session.join(site, int(request.trees_applied), self.clock()))
        except Rejected as e:
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None
        old = self.outboxes.get(site)
        if old is not None:
            old.superseded = True
            old.notify()
        self.outboxes[site] = Outbox(token)
        self.dispatch(outs)
        released = len(self.session.trees)
        return pb.JoinResponse(token=token, incarnation=self.incarnation, trees_released=released)

    incarnation = b""

    def _subscribe(self, context, site: str, token: bytes, after: int) -> Outbox | None:
        """The checks and the session step of a Subscribe (or a Connect's first message): the site's outbox,
        or None if the call already ended."""
        self._auth(context, site, token)
        box = self.outboxes.get(site)
        if box is None or box.token != token:
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED, "this subscription belongs to an earlier join")
        if after + 1 < box.floor:
            raise _Abort(grpc.StatusCode.OUT_OF_RANGE,
                         f"events after {after} are no longer held (oldest is {box.floor}); join again")
        if not self._on_close(context, lambda: self._stream_closed(site, token)):
            return None  # the call already ended (the site went away before its stream started)
        self.streams[(site, token)] = self.streams.get((site, token), 0) + 1
        self.dispatch(self._session_call(lambda: self.session.subscribed(site, token, self.clock())))
        return box

    @_rpc
    async def Subscribe(self, request, context):
        if not self._open_stream(context, self._admit(context)):
            return
        site, token, after = request.site_id, bytes(request.token), int(request.after_seq)
        box = self._subscribe(context, site, token, after)
        if box is None:
            return
        wake = asyncio.Event()
        box.waiters.add(wake)
        try:
            last = after
            while True:
                await _wait(wake, lambda: (self.stopping or box.superseded or context.done()
                                           or box.last_seq > last))
                ending = self.stopping or box.superseded or context.done()
                pending = box.after(last) if (self.stopping or not ending) else []
                for e in pending:
                    # added after the write: ``self.bytes_out += await …`` reads the counter before awaiting
                    # and loses what the other streams add meanwhile
                    n = await self.write_budget.write(context, event_parts(e))
                    self.bytes_out += n
                    last = e.seq
                if ending:
                    return
        finally:
            box.waiters.discard(wake)

    def _stream_closed(self, site: str, token: bytes) -> None:
        left = self.streams.get((site, token), 1) - 1
        if left > 0:  # a newer stream of the same join is still open: the site is still connected
            self.streams[(site, token)] = left
            return
        self.streams.pop((site, token), None)
        try:
            self.dispatch(self._session_call(lambda: self.session.unsubscribed(site, token, self.clock())))
        except Exception:
            pass  # already logged; the coordinator is stopping

    # ------------------------------------------------------------------ submissions

    def _step(self, kind: str, site: str, m):
        """The session step of one site message as a callable for :meth:`_session_call`: ``setup``,
        ``input`` and ``round`` submissions and ``report``s, the same for the unary calls and the Connect
        stream.  Rejected for an unknown round purpose or report kind."""
        s, now = self.session, self.clock()
        if kind == "setup":
            return lambda: s.submit_setup(site, bytes(m.secagg), now)
        if kind == "round":
            return lambda: s.submit_round(site, bytes(m.secagg), now)
        if kind == "input":
            try:
                purpose = Purpose(int(m.purpose))
            except ValueError:
                raise Rejected(f"unknown round purpose {m.purpose}") from None
            return lambda: s.submit_input(site, purpose, int(m.tree), bytes(m.secagg), now)
        if m.kind == pb.REPORT_PROGRESS:
            return lambda: s.report_progress(site, int(m.trees_applied), now)
        if m.kind == pb.REPORT_REFUSED:
            return lambda: s.report_refusal(site, m.detail[:2000], now, int(m.round_id) or None)
        if m.kind == pb.REPORT_FINISHED:
            return lambda: s.report_finished(site, m.model_sha256[:64], now)
        raise Rejected(f"unknown report kind {m.kind}")

    def _submit(self, context, kind: str, request) -> pb.SubmitResponse:
        self._admit(context)
        self.bytes_in += request.ByteSize()
        self._auth(context, request.site_id, request.token)
        try:
            outs = self._session_call(self._step(kind, request.site_id, request))
        except (Rejected, WireError) as e:
            return pb.SubmitResponse(accepted=False, detail=str(e))
        self.dispatch(outs)
        return pb.SubmitResponse(accepted=True)

    @_rpc
    async def SubmitSetup(self, request, context):
        return self._submit(context, "setup", request)

    @_rpc
    async def SubmitMaskedInput(self, request, context):
        resp = self._submit(context, "input", request)
        if resp.accepted:
            testhooks.coordinator_input(int(request.tree))  # TEST-ONLY kill point (off by default)
        return resp

    @_rpc
    async def SubmitRound(self, request, context):
        return self._submit(context, "round", request)

    @_rpc
    async def Report(self, request, context):
        self._admit(context)
        self._auth(context, request.site_id, request.token)
        try:
            step = self._step("report", request.site_id, request)
        except Rejected as e:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        self.dispatch(self._session_call(step))
        return pb.ReportResponse()

    # ------------------------------------------------------------------ the bidirectional stream

    @_rpc
    async def Connect(self, request_iterator, context):
        """Subscribe + Submit* + Report on one stream; see the module docstring and the proto."""
        name = self._admit(context)  # before waiting for anything the peer sends
        if not self._open_stream(context, name):
            return
        first = await self._first_message(context, name)
        if first is None:
            return
        if first.WhichOneof("kind") != "subscribe":
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "a Connect stream starts with a subscribe message")
        site, token, after = first.subscribe.site_id, bytes(first.subscribe.token), int(first.subscribe.after_seq)
        box = self._subscribe(context, site, token, after)
        if box is None:
            return
        conn = _Connection()
        box.waiters.add(conn.wake)
        reader = asyncio.ensure_future(self._read_connection(context, site, token, box, conn))
        try:
            last, told = after, 0
            while True:
                await _wait(conn.wake, lambda: (
                    self.stopping or box.superseded or context.done() or conn.failure is not None
                    or box.last_seq > last or conn.rejected
                    or (conn.urgent and conn.processed > told)))
                failure = conn.failure
                ending = self.stopping or box.superseded or context.done() or failure is not None
                pending = box.after(last) if (self.stopping or not ending) else []
                rejected, conn.rejected, conn.urgent = conn.rejected, [], False
                processed = conn.processed
                if failure is not None:
                    raise _Abort(*failure)
                if pending or rejected or processed > told:
                    for batch in batch_parts(pending, processed, rejected):
                        n = await self.write_budget.write(context, batch)
                        self.bytes_out += n  # after the write (see Subscribe)
                    if pending:
                        last = pending[-1].seq
                    told = processed
                if ending:
                    return
        finally:
            box.waiters.discard(conn.wake)
            reader.cancel()

    async def _read_connection(self, context, site: str, token: bytes, box: Outbox, conn: "_Connection") -> None:
        """Apply a Connect stream's site messages in order (a task beside the handler; ends with the stream)."""
        try:
            while True:
                m = await context.read()
                if m is grpc.aio.EOF:
                    return
                if m is UNDECODABLE:
                    e = _undecodable_message()
                    conn.failure = (e.code, e.detail)
                    conn.wake.set()
                    return
                self.bytes_in += m.ByteSize()
                if box.superseded or self.stopping:
                    return
                tree = None
                try:
                    urgent, tree = self._site_message(site, token, m)
                except (Rejected, WireError) as e:
                    conn.rejected.append(str(e)[:2000])
                    urgent = True
                except _Abort as e:
                    conn.failure = (e.code, e.detail)
                    conn.wake.set()
                    return
                conn.processed += 1
                if urgent:  # a report or a refusal: tell the site now; other messages are counted in the
                    conn.urgent = True  # next batch of events (a reply is always followed by one)
                    conn.wake.set()
                if tree is not None:
                    testhooks.coordinator_input(tree)  # TEST-ONLY kill point (off by default)
                # let go of the message before waiting for the next: a site sends nothing after its ShareKeys
                # until the epoch is ready, and n ShareKeys (≈ 1.7 MB each at 100 sites) held by n idle
                # readers were one more copy of the whole setup
                m = None
        except Exception:  # the stream ended (cancelled, broken) or the session stopped on a fatal error
            conn.wake.set()

    def _site_message(self, site: str, token: bytes, m) -> tuple[bool, int | None]:
        """One SiteMessage, exactly as the unary call of the same name.

        Returns (urgent: the site waits for its acknowledgement, the tree of an accepted masked input)."""
        kind = m.WhichOneof("kind")
        if kind is None or kind == "subscribe":
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind or 'empty'} message on a Connect stream")
        sub = getattr(m, kind)
        if sub.site_id != site:
            raise _Abort(grpc.StatusCode.PERMISSION_DENIED,
                         f"a message for site {sub.site_id!r} on the stream of site {site!r}")
        if bytes(sub.token) != token:
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED, "a message with another session token")
        try:
            self.session.authenticate(site, token)
        except Rejected as e:
            raise _Abort(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
        self.dispatch(self._session_call(self._step(kind, site, sub)))
        return kind == "report", (int(sub.tree) if kind == "input" else None)

    def stop_streams(self) -> None:
        self.stopping = True
        for box in self.outboxes.values():
            box.notify()


@dataclass
class _Connection:
    """Shared between a Connect stream's writer (the handler) and its reader task."""

    processed: int = 0  # site messages applied (after the subscribe message)
    rejected: list = field(default_factory=list)  # details of refused submissions, not yet sent
    urgent: bool = False  # the site waits for the count (a report)
    failure: tuple | None = None  # (status code, detail): end the stream
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # set when any of the above or the outbox changes


class CoordinatorServer:
    """A running gRPC server for one session: an asyncio gRPC server and the session's ticker on one event
    loop in a thread of their own, behind a blocking interface (start, wait, stop)."""

    def __init__(self, session: Session, listen: str, credentials=None) -> None:
        self.session = session
        self.service = FederationService(session, tls=credentials is not None)
        self.service.incarnation = os.urandom(16)
        self._stop = threading.Event()
        self.service.on_fatal = self._stop.set
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._thread.start()
        self._ticker: asyncio.Future | None = None
        try:
            self.server, self.port = self._run(self._listen(listen, credentials))
        except BaseException:
            self._close_loop()
            raise
        host = listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"

    def _run(self, coro, timeout: float | None = None):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _listen(self, listen: str, credentials):
        server = grpc.aio.server(options=list(SERVER_OPTIONS),
                                 maximum_concurrent_rpcs=max_concurrent_rpcs(self.session.plan.n))
        add_service(self.service, server)
        if credentials is not None:
            port = server.add_secure_port(listen, credentials)
        else:
            port = server.add_insecure_port(listen)
        if not port:
            raise OSError(f"cannot listen on {listen}")
        return server, port

    def start(self) -> None:
        async def start():
            await self.server.start()
            self._ticker = asyncio.ensure_future(self._tick_loop())

        self._run(start())

    async def _tick_loop(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(TICK_SECONDS)
            try:
                self.service.tick()
            except Exception:  # logged by the service, which also stops the server
                pass
            if self.session.done:
                self._stop.set()

    @property
    def fatal(self) -> BaseException | None:
        return self.service.fatal

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the session is finished or failed; True if it is."""
        return self._stop.wait(timeout)

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        if self._loop.is_closed():
            return

        async def stop():
            if self._ticker is not None:
                self._ticker.cancel()
            self.service.stop_streams()
            await self.server.stop(grace)

        try:
            self._run(stop())
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
