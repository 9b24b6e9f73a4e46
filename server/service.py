"""The coordinator's gRPC service: a thin adapter from ``fedsbdt.v1.Federation`` to :class:`Session`.

* Every RPC takes one lock, converts the request, calls the session, turns
  the session's outgoing ``(site, event)`` pairs into numbered protobuf
  events in per-site outboxes, and answers.  A :class:`Rejected` message
  becomes ``accepted = false`` with the reason; nothing a peer sends can
  raise out of a handler into the server.
* ``Subscribe`` streams a site's outbox in order.  Events stay in a bounded
  outbox (the last ``OUTBOX_EVENTS``), so a site whose stream broke resumes
  with ``after_seq``; older history is refused with ``OUT_OF_RANGE`` and the
  site re-joins and catches up with ``GetTrees``.  A Join opens a fresh
  outbox and ends the previous incarnation's stream.
* ``Connect`` (what the site daemon uses) is Subscribe + Submit* + Report on
  one bidirectional stream: a reader thread per stream applies the site's
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
* Resource limits (a worker thread serves each call, and a stream holds it
  while open): a certificate holds at most ``STREAMS_PER_IDENTITY`` open
  Subscribe/Connect streams (RESOURCE_EXHAUSTED beyond); a Connect stream
  whose first message does not arrive within ``FIRST_MESSAGE_SECONDS`` is
  cancelled; the pool has ``STREAMS_PER_IDENTITY·n + UNARY_WORKERS`` threads
  and the server accepts at most twice that many calls at once (gRPC refuses
  the rest with RESOURCE_EXHAUSTED, which sites retry).  So neither a
  certificate outside the roster nor a roster member can take the threads
  the other sites need.
* A ticker thread advances the session's clock (deadlines).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from common import testhooks
from fedsbdt.v1 import federation_pb2 as pb
from fedsbdt.v1 import federation_pb2_grpc as pbg

from .session import Rejected, Session
from common.federation.wire import (
    MAX_MESSAGE_BYTES,
    MAX_TREES_PER_PAGE,
    SERVER_OPTIONS,
    Purpose,
    WireError,
    event_to_proto,
    init_to_proto,
    tree_to_proto,
    verify_join,
)

log = logging.getLogger("fedsbdt.coordinator")

OUTBOX_EVENTS = 4096
TICK_SECONDS = 0.05
#: Open Subscribe/Connect streams per certificate: a site that reconnects after a network fault may open its
#: new stream before the server notices that the old one closed.
STREAMS_PER_IDENTITY = 2
#: A Connect stream that sends no first (subscribe) message within this many seconds is cancelled.
FIRST_MESSAGE_SECONDS = 10.0
#: Worker threads beyond the roster's streams, for the short unary calls.
UNARY_WORKERS = 16


def worker_threads(n_sites: int) -> int:
    """The server's thread pool: every roster identity's stream quota plus room for the unary calls."""
    return STREAMS_PER_IDENTITY * n_sites + UNARY_WORKERS


@dataclass
class Outbox:
    token: bytes
    ready: threading.Condition  # shares the service lock; notified when this outbox changes
    events: deque = field(default_factory=lambda: deque(maxlen=OUTBOX_EVENTS))
    next_seq: int = 1
    superseded: bool = False

    @property
    def floor(self) -> int:
        """Lowest sequence number still held (events below it were dropped)."""
        return self.events[0].seq if self.events else self.next_seq

    def after(self, seq: int) -> list:
        """The held events with a sequence number above ``seq``, in order (O(result): seqs are contiguous)."""
        k = min(self.next_seq - 1 - seq, len(self.events))
        return list(itertools.islice(reversed(self.events), max(k, 0)))[::-1]


class FederationService(pbg.FederationServicer):
    """gRPC servicer over one :class:`Session` (all session calls under one lock)."""

    def __init__(self, session: Session, tls: bool, clock=time.monotonic,
                 first_message_seconds: float = FIRST_MESSAGE_SECONDS) -> None:
        self.session = session
        self.tls = tls
        self.clock = clock
        self.first_message_seconds = first_message_seconds
        self.identity_streams: dict[str, int] = {}  # open Subscribe/Connect streams per certificate name
        self.lock = threading.RLock()  # every session call and outbox change holds it
        self.outboxes: dict[str, Outbox] = {}
        self.stopping = False
        self.fatal: BaseException | None = None
        self.on_fatal = lambda: None
        self.bytes_in = 0
        self.bytes_out = 0
        # open Subscribe streams per (site, token): a site that re-subscribes after a network fault may
        # have its new stream open before the server notices the old one closed
        self.streams: dict[tuple[str, bytes], int] = {}

    # ------------------------------------------------------------------ plumbing

    def dispatch(self, outs) -> None:
        """Append the session's outgoing events to the outboxes (caller holds ``lock``)."""
        testhooks.coordinator_dispatch(outs, len(self.session.trees), "before")  # TEST-ONLY kill point (off)
        cache: dict[int, object] = {}
        touched = set()
        for site, ev in outs:
            box = self.outboxes.get(site)
            if box is None:
                continue
            if id(ev) in cache:  # one conversion per broadcast event
                msg = pb.Event()
                msg.CopyFrom(cache[id(ev)])
                msg.seq = box.next_seq
            else:
                msg = cache[id(ev)] = event_to_proto(ev, box.next_seq)
            box.events.append(msg)
            box.next_seq += 1
            touched.add(site)
        for site in touched:
            self.outboxes[site].ready.notify_all()
        testhooks.coordinator_dispatch(outs, len(self.session.trees), "after")

    def tick(self) -> None:
        with self.lock:
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
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"the TLS client certificate is issued to {name!r}, which is not in the plan's roster")
        return name

    def _open_stream(self, context, name: str | None) -> bool:
        """Count a new Subscribe/Connect stream against its certificate's quota (RESOURCE_EXHAUSTED beyond
        ``STREAMS_PER_IDENTITY``); the slot is given back when the call ends.  False if it already ended."""
        if name is None:
            return True  # without TLS there is no identity to count against (the server's call limit holds)
        with self.lock:
            held = self.identity_streams.get(name, 0)
            if held >= STREAMS_PER_IDENTITY:
                log.warning(f"refused a stream for {name!r}: it holds {held} open streams already",
                            extra={"event": "stream_quota", "certificate": name})
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the certificate {name!r} already holds {held} open streams (the limit per site)")
            self.identity_streams[name] = held + 1
        released = threading.Event()

        def release() -> None:
            with self.lock:
                if released.is_set():
                    return
                released.set()
                left = self.identity_streams.get(name, 1) - 1
                if left > 0:
                    self.identity_streams[name] = left
                else:
                    self.identity_streams.pop(name, None)

        if not context.add_callback(release):
            release()
            return False
        return True

    def _first_message(self, request_iterator, context, name: str | None):
        """The first message of a Connect stream, or None if the stream ended or sent nothing in time."""
        lock, state = threading.Lock(), {"received": False, "expired": False}

        def expire() -> None:
            with lock:
                if state["received"]:
                    return
                state["expired"] = True
            log.warning(f"cancelled a Connect stream ({name!r}) that sent nothing for "
                        f"{self.first_message_seconds:g} s", extra={"event": "idle_stream", "certificate": name})
            context.cancel()

        timer = threading.Timer(self.first_message_seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            first = next(request_iterator)
        except (StopIteration, grpc.RpcError):  # the site went away, or expire() cancelled the call
            first = None
        finally:
            timer.cancel()
        with lock:
            state["received"] = True
            return None if state["expired"] else first

    def _check_peer(self, context, site_id: str) -> None:
        if not self.tls:
            return
        name = self._peer_name(context)
        if name != site_id:
            log.warning(f"refused a call for site {site_id!r} over a TLS certificate for {name!r}",
                        extra={"event": "identity_mismatch", "site": site_id, "certificate": name})
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"the TLS client certificate is issued to {name!r}, not to site {site_id!r}")

    def _auth(self, context, site_id: str, token: bytes):
        self._check_peer(context, site_id)
        try:
            return self.session.authenticate(site_id, bytes(token))
        except Rejected as e:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))

    # ------------------------------------------------------------------ public

    def GetPlan(self, request, context):
        self._admit(context)
        p = self.session.plan
        return pb.GetPlanResponse(plan=p.canonical_json, plan_sha256=p.sha256)

    def GetStatus(self, request, context):
        self._admit(context)
        with self.lock:
            s = self.session.status()
        return pb.GetStatusResponse(
            stage=s["stage"], plan_sha256=s["plan_sha256"], trees_released=s["trees_released"],
            trees_total=s["trees_total"], rounds_failed=s["rounds_failed"], model_sha256=s["model_sha256"],
            detail=s["detail"], sites=[pb.SiteStatus(**x) for x in s["sites"]])

    def GetTrees(self, request, context):
        self._admit(context)
        limit = min(request.max_trees or MAX_TREES_PER_PAGE, MAX_TREES_PER_PAGE)
        with self.lock:
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

    def Join(self, request, context):
        self._admit(context)
        site = request.site_id
        self._check_peer(context, site)
        plan = self.session.plan
        key = plan.identity_key(site)
        if key is None:
            log.warning(f"refused join of unknown site {site!r}", extra={"event": "join_refused", "site": site})
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"site {site!r} is not in the plan's roster")
        if request.plan_sha256 != plan.sha256:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"plan hash mismatch: the coordinator runs plan {plan.sha256}, the site has "
                          f"{request.plan_sha256}")
        if not verify_join(key, plan.sha256, site, bytes(request.nonce), bytes(request.signature)):
            log.warning(f"refused join of {site!r}: bad identity signature", extra={"event": "join_refused"})
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          f"the join is not signed with the identity key the plan pins for {site!r}")
        with self.lock:
            if not self._session_call(lambda: self.session.fresh_join_nonce(site, bytes(request.nonce))):
                log.warning(f"refused a replayed join of {site!r}", extra={"event": "join_refused", "site": site})
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              f"this signed join of {site!r} was used before (a replayed request); every join "
                              "needs a fresh nonce")
            try:
                token, outs = self._session_call(
                    lambda: self.session.join(site, int(request.trees_applied), self.clock()))
            except Rejected as e:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
            old = self.outboxes.get(site)
            if old is not None:
                old.superseded = True
                old.ready.notify_all()
            self.outboxes[site] = Outbox(token, threading.Condition(self.lock))
            self.dispatch(outs)
            released = len(self.session.trees)
        return pb.JoinResponse(token=token, incarnation=self.incarnation, trees_released=released)

    incarnation = b""

    def Subscribe(self, request, context):
        if not self._open_stream(context, self._admit(context)):
            return
        site, token = request.site_id, bytes(request.token)
        with self.lock:
            self._auth(context, site, token)
            box = self.outboxes.get(site)
            if box is None or box.token != token:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "this subscription belongs to an earlier join")
            after = int(request.after_seq)
            if after + 1 < box.floor:
                context.abort(grpc.StatusCode.OUT_OF_RANGE,
                              f"events after {after} are no longer held (oldest is {box.floor}); join again")
            if not context.add_callback(lambda: self._stream_closed(site, token)):
                return  # the call already ended (the site went away before its stream started)
            self.streams[(site, token)] = self.streams.get((site, token), 0) + 1
            self.dispatch(self._session_call(lambda: self.session.subscribed(site, token, self.clock())))
        last = after
        while True:
            with self.lock:
                while (not self.stopping and not box.superseded and context.is_active()
                       and (not box.events or box.events[-1].seq <= last)):
                    box.ready.wait(timeout=1.0)
                ending = self.stopping or box.superseded or not context.is_active()
                pending = box.after(last) if (self.stopping or not ending) else []
            for e in pending:
                self.bytes_out += e.ByteSize()
                yield e
                last = e.seq
            if ending:
                return

    def _stream_closed(self, site: str, token: bytes) -> None:
        with self.lock:
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
        """The session step of one site message as a callable for :meth:`_session_call` (caller holds
        ``lock``): ``setup``, ``input`` and ``round`` submissions and ``report``s, the same for the unary
        calls and the Connect stream.  Rejected for an unknown round purpose or report kind."""
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
        with self.lock:
            self._auth(context, request.site_id, request.token)
            try:
                outs = self._session_call(self._step(kind, request.site_id, request))
            except (Rejected, WireError) as e:
                return pb.SubmitResponse(accepted=False, detail=str(e))
            self.dispatch(outs)
        return pb.SubmitResponse(accepted=True)

    def SubmitSetup(self, request, context):
        return self._submit(context, "setup", request)

    def SubmitMaskedInput(self, request, context):
        resp = self._submit(context, "input", request)
        if resp.accepted:
            testhooks.coordinator_input(int(request.tree))  # TEST-ONLY kill point (off by default)
        return resp

    def SubmitRound(self, request, context):
        return self._submit(context, "round", request)

    def Report(self, request, context):
        self._admit(context)
        with self.lock:
            self._auth(context, request.site_id, request.token)
            try:
                step = self._step("report", request.site_id, request)
            except Rejected as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            self.dispatch(self._session_call(step))
        return pb.ReportResponse()

    # ------------------------------------------------------------------ the bidirectional stream

    def Connect(self, request_iterator, context):
        """Subscribe + Submit* + Report on one stream; see the module docstring and the proto."""
        name = self._admit(context)  # before waiting for anything the peer sends
        if not self._open_stream(context, name):
            return
        first = self._first_message(request_iterator, context, name)
        if first is None:
            return
        if first.WhichOneof("kind") != "subscribe":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a Connect stream starts with a subscribe message")
        site, token = first.subscribe.site_id, bytes(first.subscribe.token)
        with self.lock:
            self._auth(context, site, token)
            box = self.outboxes.get(site)
            if box is None or box.token != token:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "this subscription belongs to an earlier join")
            after = int(first.subscribe.after_seq)
            if after + 1 < box.floor:
                context.abort(grpc.StatusCode.OUT_OF_RANGE,
                              f"events after {after} are no longer held (oldest is {box.floor}); join again")
            if not context.add_callback(lambda: self._stream_closed(site, token)):
                return  # the call already ended
            self.streams[(site, token)] = self.streams.get((site, token), 0) + 1
            self.dispatch(self._session_call(lambda: self.session.subscribed(site, token, self.clock())))
        conn = _Connection()
        threading.Thread(target=self._read_connection, args=(request_iterator, site, token, box, conn),
                         name=f"connect-{site}", daemon=True).start()
        last, told = after, 0
        while True:
            with self.lock:
                while (not self.stopping and not box.superseded and context.is_active() and conn.failure is None
                       and (not box.events or box.events[-1].seq <= last) and not conn.rejected
                       and not (conn.urgent and conn.processed > told)):
                    box.ready.wait(timeout=1.0)
                failure = conn.failure
                ending = self.stopping or box.superseded or not context.is_active() or failure is not None
                pending = box.after(last) if (self.stopping or not ending) else []
                rejected, conn.rejected, conn.urgent = conn.rejected, [], False
                processed = conn.processed
            if failure is not None:
                context.abort(*failure)
            if pending or rejected or processed > told:
                for batch in _batches(pending, processed, rejected):
                    self.bytes_out += batch.ByteSize()
                    yield batch
                if pending:
                    last = pending[-1].seq
                told = processed
            if ending:
                return

    def _read_connection(self, requests, site: str, token: bytes, box: "Outbox", conn: "_Connection") -> None:
        """Apply a Connect stream's site messages in order (its own thread; ends with the stream)."""
        try:
            for m in requests:
                self.bytes_in += m.ByteSize()
                tree = None
                with self.lock:
                    if box.superseded or self.stopping:
                        return
                    try:
                        urgent, tree = self._site_message(site, token, m)
                    except (Rejected, WireError) as e:
                        conn.rejected.append(str(e)[:2000])
                        urgent = True
                    except _StreamFailure as e:
                        conn.failure = (e.code, e.detail)
                        box.ready.notify_all()
                        return
                    conn.processed += 1
                    if urgent:  # a report or a refusal: tell the site now; other messages are counted in the
                        conn.urgent = True  # next batch of events (a reply is always followed by one)
                        box.ready.notify_all()
                if tree is not None:
                    testhooks.coordinator_input(tree)  # TEST-ONLY kill point (off by default)
        except Exception:  # the stream ended (cancelled, broken) or the session stopped on a fatal error
            with self.lock:
                box.ready.notify_all()

    def _site_message(self, site: str, token: bytes, m) -> tuple[bool, int | None]:
        """One SiteMessage, exactly as the unary call of the same name (caller holds ``lock``).

        Returns (urgent: the site waits for its acknowledgement, the tree of an accepted masked input)."""
        kind = m.WhichOneof("kind")
        if kind is None or kind == "subscribe":
            raise _StreamFailure(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"unexpected {kind or 'empty'} message on a Connect stream")
        sub = getattr(m, kind)
        if sub.site_id != site:
            raise _StreamFailure(grpc.StatusCode.PERMISSION_DENIED,
                                 f"a message for site {sub.site_id!r} on the stream of site {site!r}")
        if bytes(sub.token) != token:
            raise _StreamFailure(grpc.StatusCode.UNAUTHENTICATED, "a message with another session token")
        try:
            self.session.authenticate(site, token)
        except Rejected as e:
            raise _StreamFailure(grpc.StatusCode.UNAUTHENTICATED, str(e)) from None
        self.dispatch(self._session_call(self._step(kind, site, sub)))
        return kind == "report", (int(sub.tree) if kind == "input" else None)

    def stop_streams(self) -> None:
        with self.lock:
            self.stopping = True
            for box in self.outboxes.values():
                box.ready.notify_all()


class _StreamFailure(Exception):
    """A Connect stream carried something that ends it (wrong identity, token, message order)."""

    def __init__(self, code, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


@dataclass
class _Connection:
    """Shared between a Connect stream's writer (the handler) and its reader thread, under the service lock."""

    processed: int = 0  # site messages applied (after the subscribe message)
    rejected: list = field(default_factory=list)  # details of refused submissions, not yet sent
    urgent: bool = False  # the site waits for the count (a report)
    failure: tuple | None = None  # (status code, detail): end the stream


def _batches(events: list, processed: int, rejected: list):
    """EventBatch messages for ``events`` (in order, each well below the message size limit); the last one
    carries ``processed`` and ``rejected``."""
    batch, size = pb.EventBatch(), 0
    for e in events:
        n = e.ByteSize() if len(events) > 1 else 0  # a single event always fits (wire.py size bound)
        if batch.events and size + n > MAX_MESSAGE_BYTES // 4:
            yield batch
            batch, size = pb.EventBatch(), 0
        batch.events.append(e)
        size += n
    batch.processed = processed
    batch.rejected.extend(rejected)
    yield batch


class CoordinatorServer:
    """A running gRPC server for one session, with its ticker thread."""

    def __init__(self, session: Session, listen: str, credentials=None) -> None:
        import os

        self.session = session
        self.service = FederationService(session, tls=credentials is not None)
        self.service.incarnation = os.urandom(16)
        workers = worker_threads(session.plan.n)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
                                  options=list(SERVER_OPTIONS), maximum_concurrent_rpcs=2 * workers)
        pbg.add_FederationServicer_to_server(self.service, self.server)
        if credentials is not None:
            self.port = self.server.add_secure_port(listen, credentials)
        else:
            self.port = self.server.add_insecure_port(listen)
        if not self.port:
            raise OSError(f"cannot listen on {listen}")
        host = listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        self._stop = threading.Event()
        self.service.on_fatal = self._stop.set
        self._ticker = threading.Thread(target=self._tick_loop, name="session-ticker", daemon=True)

    def start(self) -> None:
        self.server.start()
        self._ticker.start()

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
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
        self.service.stop_streams()
        self.server.stop(grace).wait()
