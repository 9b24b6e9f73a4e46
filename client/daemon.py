"""The site daemon: a gRPC client loop around :class:`fedsbdt.client.site.SiteMachine`.

    GetPlan ─▶ accept_plan (all of the site's checks) ─▶ Join (signed) ─▶ GetTrees (catch up)
        ─▶ Report(progress) ─▶ Connect ─▶ for each event: handle ─▶ replies on the same stream / Report
                  ▲                                                       │
                  └──── stream broke: resume with after_seq, or re-join ──┘

``Connect`` is one bidirectional stream: events arrive in batches, and the
site's protocol replies (epoch keys, masked inputs, signatures, shares) go
out on it instead of one unary call each.  A reply stays in a resend list
until a batch says the coordinator processed it; after a broken stream the
site resends those (the coordinator's handling of a protocol reply is
idempotent: a repeat is refused as not expected).  Reports (refusals, the
final model hash) stay unary calls.

Every call has a deadline.  Transient failures (coordinator restarting,
network) are retried with bounded exponential backoff for at most
``reconnect_timeout`` seconds without contact; a site that cannot reach the
coordinator for longer exits non-zero (restarting it resumes from its
database).  Refusals by the coordinator (unknown site, wrong certificate,
other plan) are final and reported in one sentence.
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import grpc

from fedsbdt.common import testhooks
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.common.federation.pki import TlsFiles, channel_credentials, tls_probe
from fedsbdt.common.federation.wire import (
    GRPC_OPTIONS,
    MAX_TREES_PER_PAGE,
    Done,
    InputReply,
    Refusal,
    RoundReply,
    SetupReply,
    WireError,
    event_from_proto,
    init_from_proto,
    tree_from_proto,
)

from .site import NeedCatchUp, SessionAbort, SiteDone, SiteMachine, SiteRefusal

log = logging.getLogger("fedsbdt.site")

TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN,
             grpc.StatusCode.INTERNAL}
REJOIN = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OUT_OF_RANGE}


class DaemonError(RuntimeError):
    """The site cannot continue (the message says why in one sentence)."""


@dataclass(frozen=True)
class DaemonOptions:
    rpc_timeout: float = 30.0  # deadline of every unary call
    reconnect_timeout: float = 300.0  # give up after this long without reaching the coordinator
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    tls_failures_fatal: int = 3  # consecutive UNAVAILABLE failures before a diagnostic TLS handshake
    #: hashes of plans this site has finished (a tuning plan's earlier trials): while the coordinator still serves
    #: one of them, the site waits for the next (up to ``reconnect_timeout``) instead of refusing
    earlier_plans: frozenset = frozenset()


def reachability(target: str, timeout: float = 2.0) -> str:
    """What every address of ``host:port`` answers to a plain TCP connection, in one line (gRPC names only the
    last address it tried: for ``localhost`` often ``[::1]``, hiding what 127.0.0.1 said)."""
    import socket

    host, sep, port = target.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        return f"{target!r} is not host:port"
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as e:
        return f"the host name {host!r} does not resolve ({e})"
    seen, out = set(), []
    for family, kind, proto, _, addr in infos:
        shown = f"[{addr[0]}]:{addr[1]}" if family == socket.AF_INET6 else f"{addr[0]}:{addr[1]}"
        if shown in seen:
            continue
        seen.add(shown)
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(addr)
            answer = "accepts TCP connections"
        except ConnectionRefusedError:
            answer = "connection refused"
        except TimeoutError:
            answer = f"no answer within {timeout:g} s"
        except OSError as e:
            answer = (e.strerror or str(e)).lower()
        out.append(f"{shown}: {answer}")
    return f"{host} resolves to {len(out)} address{'es' if len(out) > 1 else ''} ({'; '.join(out)})"


class Daemon:
    def __init__(self, machine: SiteMachine, target: str, tls: TlsFiles | None = None,
                 options: DaemonOptions = DaemonOptions()) -> None:
        self.m = machine
        self.target = target
        self.options = options
        self.tls_files = tls
        self.tls = tls is not None
        opts = list(GRPC_OPTIONS)
        if tls is not None:
            self.channel = grpc.secure_channel(target, channel_credentials(tls), options=opts)
        else:
            self.channel = grpc.insecure_channel(target, options=opts)
        self.stub = pbg.FederationStub(self.channel)
        self.token: bytes | None = None
        self.last_seq = 0
        self._down_since: float | None = None
        self._backoff = options.backoff_initial
        self._tls_failures = 0
        self._reached = False  # any call answered by the coordinator in this process
        self._sleep = threading.Event()
        self.bytes_sent = 0
        self.bytes_received = 0
        self._outq: queue.SimpleQueue | None = None  # the open Connect stream's outgoing messages
        self._unsent: deque = deque()  # (SiteMessage, reply, trees applied) not yet counted as processed
        self._unsent_token: bytes | None = None  # the join the resend list belongs to
        self._counted = 0  # site messages of the open stream the coordinator reported as processed

    # ------------------------------------------------------------------ errors and retries

    def _fatal_status(self, e: grpc.RpcError, doing: str) -> DaemonError:
        return DaemonError(f"the coordinator at {self.target} refused {doing}: {e.details()}")

    def _transient(self, e: grpc.RpcError, doing: str) -> None:
        """Back off after a transient failure; raise DaemonError once the coordinator is gone for too long."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        if self.tls and e.code() == grpc.StatusCode.UNAVAILABLE:
            # gRPC reports a refused certificate like any lost connection ("Socket closed", and only the
            # last address tried): every few failures, a plain TLS handshake tells the two apart.
            self._tls_failures += 1
            if self._tls_failures >= self.options.tls_failures_fatal:
                self._tls_failures = 0
                diagnosis = tls_probe(self.target, self.tls_files)
                if diagnosis is not None:
                    raise DaemonError(f"cannot connect to the coordinator at {self.target}: {diagnosis}")
        if now - self._down_since > self.options.reconnect_timeout and not self._reached:
            raise DaemonError(f"never reached the coordinator at {self.target} in {self.options.reconnect_timeout:g} s "
                              f"while {doing}: {reachability(self.target)}; is the coordinator running and listening "
                              "there (its --listen, this site's --coordinator)? Restart the client to try again")
        if now - self._down_since > self.options.reconnect_timeout:
            raise DaemonError(f"lost the coordinator at {self.target} for more than "
                              f"{self.options.reconnect_timeout:g} s while {doing} (last error: {e.code().name}: "
                              f"{e.details()}); restart the client to resume")
        log.info(f"{self.m.site_id}: {doing} failed ({e.code().name}: {e.details()}); retrying in "
                 f"{self._backoff:.1f} s", extra={"event": "retry", "site": self.m.site_id, "code": e.code().name})
        self._sleep.wait(self._backoff)
        self._backoff = min(self._backoff * 2, self.options.backoff_max)

    def _contact(self) -> None:
        self._reached = True
        self._down_since = None
        self._backoff = self.options.backoff_initial
        self._tls_failures = 0

    def _call(self, doing: str, fn, request):
        """A unary call with a deadline, retried while the failure is transient."""
        while True:
            try:
                resp = fn(request, timeout=self.options.rpc_timeout)
                self._contact()
                self.bytes_sent += request.ByteSize()
                self.bytes_received += resp.ByteSize()
                return resp
            except grpc.RpcError as e:
                if e.code() in TRANSIENT:
                    self._transient(e, doing)
                    continue
                raise

    # ------------------------------------------------------------------ the loop

    def run(self) -> SiteDone:
        """Take part until the model is verified; returns the final stage or raises DaemonError/SessionAbort."""
        plan = self._fetch_plan()
        if self.m.plan is None:
            self.m.accept_plan(bytes(plan.plan), plan.plan_sha256)  # SiteRefusal: the site does not take part
        else:  # accepted before connecting (--plan FILE): the coordinator must serve that very plan
            served = hashlib.sha256(bytes(plan.plan)).hexdigest()
            if served != self.m.plan.sha256 or plan.plan_sha256 != served:
                raise SiteRefusal(f"plan hash mismatch: the coordinator serves plan {served}, but this site was "
                                  f"given {self.m.plan.sha256} out of band; refusing to take part")
        try:
            while not self.m.finished:
                try:
                    if self.token is None:
                        self._join()
                    self._follow()
                except grpc.RpcError as e:
                    code = e.code()
                    if code in REJOIN:
                        log.info(f"{self.m.site_id}: re-joining ({code.name}: {e.details()})",
                                 extra={"event": "rejoin", "site": self.m.site_id})
                        self.token = None
                    elif code in TRANSIENT:
                        self._transient(e, "following the session")
                    else:
                        raise self._fatal_status(e, "this site") from None
        finally:
            self.channel.close()
        stage = self.m.stage
        if isinstance(stage, SiteDone):
            return stage
        raise SessionAbort(getattr(stage, "reason", "the session ended without a model"))

    def _fetch_plan(self):
        """The served plan; while it is one this site has finished (:attr:`DaemonOptions.earlier_plans`), ask
        again each second until ``reconnect_timeout``."""
        since = time.monotonic()
        while True:
            try:
                plan = self._call("fetching the plan", self.stub.GetPlan, pb.GetPlanRequest())
            except grpc.RpcError as e:
                raise self._fatal_status(e, "to serve its plan") from None
            if plan.plan_sha256 not in self.options.earlier_plans:
                return plan
            log.info(f"{self.m.site_id}: the coordinator still serves the finished plan {plan.plan_sha256[:16]}…; "
                     "waiting for the next", extra={"event": "waiting_for_plan", "site": self.m.site_id})
            if time.monotonic() - since > self.options.reconnect_timeout:
                raise DaemonError(f"the coordinator at {self.target} still serves the finished plan "
                                  f"{plan.plan_sha256} after {self.options.reconnect_timeout:g} s; restart the client "
                                  "to resume")
            self._sleep.wait(1.0)

    def _join(self) -> None:
        nonce, sig = self.m.join_material()
        req = pb.JoinRequest(plan_sha256=self.m.plan.sha256, site_id=self.m.site_id, nonce=nonce, signature=sig,
                             trees_applied=self.m.trees_applied)
        resp = self._call("joining", self.stub.Join, req)
        self.token, self.last_seq = bytes(resp.token), 0
        log.info(f"{self.m.site_id}: joined (coordinator has released {resp.trees_released} trees, "
                 f"this site has {self.m.trees_applied})", extra={"event": "joined", "site": self.m.site_id})
        self._catch_up(resp.trees_released)
        self._report(pb.REPORT_PROGRESS)

    def _catch_up(self, target: int | None = None) -> None:
        """Fetch and apply released trees (and the initial score) until this site has all of them."""
        while True:
            resp = self._call("catching up", self.stub.GetTrees,
                              pb.GetTreesRequest(from_index=self.m.trees_applied, max_trees=MAX_TREES_PER_PAGE))
            init = init_from_proto(resp.init_score) if resp.has_init_score else None
            trees = [tree_from_proto(t) for t in resp.trees]
            before = self.m.trees_applied
            self.m.apply_catch_up(init, resp.has_init_score, trees)
            if self.m.trees_applied >= resp.trees_released or self.m.trees_applied == before:
                if self.m.trees_applied > before:
                    log.info(f"{self.m.site_id}: caught up to tree {self.m.trees_applied}",
                             extra={"event": "caught_up", "site": self.m.site_id, "trees": self.m.trees_applied})
                return

    def _follow(self) -> None:
        """Connect: events in batches, replies on the same stream (resent after a break until processed)."""
        q: queue.SimpleQueue = queue.SimpleQueue()
        q.put(pb.SiteMessage(subscribe=pb.SubscribeRequest(site_id=self.m.site_id, token=self.token,
                                                           after_seq=self.last_seq)))
        if self._unsent_token != self.token:
            self._unsent.clear()  # after a re-join the coordinator re-sends its open requests instead
        for msg, _, _ in self._unsent:
            q.put(msg)

        def requests():
            while True:
                m = q.get()
                if m is None:
                    return
                yield m

        stream = self.stub.Connect(requests())
        self._outq, self._counted = q, 0
        try:
            for batch in stream:
                self._contact()
                self.bytes_received += batch.ByteSize()
                self._processed(batch)
                for msg in batch.events:
                    self._event(msg)
                    if self.m.finished:
                        return
        finally:
            self._outq = None
            q.put(None)  # ends the request generator (gRPC's sending thread)
            stream.cancel()

    def _processed(self, batch) -> None:
        """The coordinator processed the first ``batch.processed`` messages of this stream."""
        for detail in batch.rejected:
            log.info(f"{self.m.site_id}: the coordinator did not accept a message: {detail}",
                     extra={"event": "not_accepted", "site": self.m.site_id})
        while self._counted < batch.processed and self._unsent:
            _, reply, trees = self._unsent.popleft()
            self._counted += 1
            testhooks.site_reply(reply, trees, "after")

    def _event(self, msg) -> None:
        """Handle one event and send the replies (already persisted by the state machine)."""
        try:
            ev = event_from_proto(msg)
        except WireError as e:
            self._send(Refusal(f"malformed event {msg.seq}: {e}"))
            self.last_seq = msg.seq
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug(f"{self.m.site_id}: event {msg.seq} {type(ev).__name__}",
                      extra={"event": "event_received", "seq": msg.seq, "at": time.monotonic()})
        try:
            replies = self.m.handle(ev)
        except NeedCatchUp:
            self._catch_up()
            try:
                replies = self.m.handle(ev)
            except NeedCatchUp as e:
                replies = [Refusal(f"cannot catch up: {e}")]
        testhooks.site_event(ev)  # TEST-ONLY kill point (no-op unless FEDSBDT_TEST_KILL_AT is set)
        for r in replies:
            self._send(r)
        if replies and log.isEnabledFor(logging.DEBUG):
            log.debug(f"{self.m.site_id}: answered event {msg.seq}",
                      extra={"event": "event_answered", "seq": msg.seq, "at": time.monotonic()})
        self.last_seq = msg.seq

    def _report(self, kind, detail: str = "", sha: str = "", round_id: int = 0) -> None:
        self._call("reporting", self.stub.Report,
                   pb.ReportRequest(site_id=self.m.site_id, token=self.token, kind=kind, round_id=round_id,
                                    trees_applied=self.m.trees_applied, detail=detail[:2000], model_sha256=sha))

    def _send(self, r) -> None:
        site, token = self.m.site_id, self.token
        testhooks.site_reply(r, self.m.trees_applied, "before")  # TEST-ONLY kill point (off by default)
        if isinstance(r, (SetupReply, InputReply, RoundReply)):  # on the open Connect stream
            if isinstance(r, SetupReply):
                msg = pb.SiteMessage(setup=pb.SecAggSubmission(site_id=site, token=token, secagg=r.secagg))
            elif isinstance(r, InputReply):
                msg = pb.SiteMessage(input=pb.MaskedInputSubmission(site_id=site, token=token, purpose=int(r.purpose),
                                                                    tree=r.tree, secagg=r.secagg))
            else:
                msg = pb.SiteMessage(round=pb.SecAggSubmission(site_id=site, token=token, secagg=r.secagg))
            self._unsent.append((msg, r, self.m.trees_applied))  # until the coordinator counts it as processed
            self._unsent_token = token
            self.bytes_sent += msg.ByteSize()
            self._outq.put(msg)  # the "after" kill point fires when the coordinator counts it (_processed)
        elif isinstance(r, Refusal):
            log.warning(f"{site}: refused: {r.detail}", extra={"event": "refused", "site": site})
            self._report(pb.REPORT_REFUSED, detail=r.detail, round_id=r.round_id or 0)
        elif isinstance(r, Done):
            self._report(pb.REPORT_FINISHED, sha=r.model_sha256)
        else:  # pragma: no cover
            raise TypeError(type(r).__name__)
