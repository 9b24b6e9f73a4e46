"""Hostile peers: fuzzed gRPC calls, mutated and replayed protocol messages, out-of-bound vectors.

* Every RPC of the live gRPC service (in process, a real Session, one site
  joined so that calls carry a valid token half of the time) gets random
  messages built from the generated protobuf classes (Hypothesis, seeded),
  raw bytes that are not protobuf at all, and oversized messages.  The
  coordinator never raises out of a handler (gRPC's UNKNOWN), never hangs
  (every call has a deadline), never stops, never releases anything.
* In a running federation (state machines in process), every honest reply is
  followed by mutated copies (bit flips, truncations, splices), replays of
  earlier rounds' messages and messages from another session; copies naming
  another sender come *before* the honest one.  Every injected message is
  refused and the released model is byte-identical to an undisturbed run.
* A site fed mutated coordinator events (secure-aggregation bytes) never
  raises, never gives a record more than its budget, and never masks two
  different inputs under one round id.
* A site whose contribution exceeds the fixed-point bound is stopped by its own
  range check before anything is charged or sent; a malicious site that skips
  the check can move leaves only within [−β, β] and cannot break the round.
"""
from __future__ import annotations

import dataclasses
import os
import random
import time

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsbdt.common.config import Hyperparameters
from fedsbdt.proto.v1 import federation_pb2 as pb
from fedsbdt.proto.v1 import federation_pb2_grpc as pbg
from fedsbdt.server.service import CoordinatorServer
from fedsbdt.server.session import Rejected, Session
from fedsbdt.common.federation.wire import (
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    InputReply,
    Refusal,
    RoundMsg,
    RoundReply,
    RoundStartMsg,
    SetupMsg,
    SetupReply,
    sign_join,
)

from federation.conftest import abalone_with_ids, make_identities, make_test_plan
from federation.test_state_machines import Fed, tree_hp

SITES = ["site-a", "site-b", "site-c"]

# --------------------------------------------------------------------------- the gRPC service


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    ids = make_identities(root, SITES)
    schema, _ = abalone_with_ids(60)
    plan = make_test_plan(schema, ids, Hyperparameters(trees=3, depth=2, seed=1), randomness="insecure-test")
    session = Session(plan, plan.make_randomness(True), time.monotonic())
    server = CoordinatorServer(session, "127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}", options=list(GRPC_OPTIONS))
    stub = pbg.FederationStub(ch)
    nonce = os.urandom(32)
    token = stub.Join(pb.JoinRequest(plan_sha256=plan.sha256, site_id="site-a", nonce=nonce,
                                     signature=sign_join(ids["site-a"].key, plan.sha256, "site-a", nonce)),
                      timeout=10).token
    try:
        yield {"plan": plan, "server": server, "stub": stub, "channel": ch, "token": token, "ids": ids}
    finally:
        ch.close()
        server.stop(grace=0.5)


METHODS = {m.name: m for m in pb.DESCRIPTOR.services_by_name["Federation"].methods}
UNARY = [name for name, m in METHODS.items() if not m.server_streaming]
#: what a refusal may look like; UNKNOWN (an exception escaped a handler), INTERNAL or DEADLINE_EXCEEDED
#: (a hang) are failures
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE}


def field_strategy(f, valid: dict, depth: int = 0):
    """A strategy for one protobuf field: random values, plus the valid site id / token / plan hash."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if f.type == F.TYPE_STRING:
        base = st.text(max_size=80)
        if f.name == "site_id":
            base = st.one_of(base, st.sampled_from(SITES))
        elif f.name == "plan_sha256":
            base = st.one_of(base, st.just(valid["plan_sha256"]))
    elif f.type == F.TYPE_BYTES:
        base = st.binary(max_size=3000)
        if f.name == "token":
            base = st.one_of(base, st.just(valid["token"]))
        elif f.name == "secagg":
            base = st.one_of(base, st.binary(min_size=5, max_size=400).map(lambda b: b"FSA\x01" + b))
    elif f.type == F.TYPE_BOOL:
        base = st.booleans()
    elif f.type == F.TYPE_ENUM:
        base = st.integers(-5, 10)
    elif f.type in (F.TYPE_UINT32, F.TYPE_FIXED32):
        base = st.integers(0, 2**32 - 1)
    elif f.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        base = st.integers(0, 2**64 - 1)
    elif f.type in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        base = st.integers(-2**31, 2**31 - 1)
    elif f.type in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        base = st.integers(-2**63, 2**63 - 1)
    elif f.type == F.TYPE_DOUBLE:
        base = st.floats(allow_nan=True, allow_infinity=True)
    elif f.type == F.TYPE_MESSAGE and depth < 2:  # e.g. the oneof members of a Connect stream's SiteMessage
        base = message_strategy(getattr(pb, f.message_type.name), valid, depth + 1)
    else:
        return st.nothing()
    if f.is_repeated:
        return st.lists(base, max_size=5)
    return base


def message_strategy(cls, valid: dict, depth: int = 0):
    fields = {f.name: field_strategy(f, valid, depth) for f in cls.DESCRIPTOR.fields}
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


def call_strategy(valid: dict):
    """(method name, request); a client-streaming method (Connect) gets a list of 1-4 requests."""
    def request(m):
        one = message_strategy(getattr(pb, m.input_type.name), valid)
        return st.lists(one, min_size=1, max_size=4) if m.client_streaming else one

    return st.one_of(*[st.tuples(st.just(name), request(m)) for name, m in METHODS.items()])


def invoke(live, name: str, req):
    fn = getattr(live["stub"], name)
    if METHODS[name].server_streaming:
        first = req[0] if METHODS[name].client_streaming else req
        it = fn(iter(req) if METHODS[name].client_streaming else req, timeout=0.5)
        try:
            next(it, None)
        except grpc.RpcError as e:
            # an accepted subscription has nothing to say yet: its deadline passes (that is not a hang)
            sub = first.subscribe if METHODS[name].client_streaming else first
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and bytes(sub.token) == live["token"]:
                return
            raise
        finally:
            it.cancel()
        return
    fn(req, timeout=5)


@pytest.fixture(scope="module")
def valid(live):
    return {"token": live["token"], "plan_sha256": live["plan"].sha256}


def test_every_rpc_survives_random_protobuf_messages(live, valid):
    seen: dict[str, int] = {}

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(call=call_strategy(valid))
    def run(call):
        name, req = call
        seen[name] = seen.get(name, 0) + 1
        try:
            invoke(live, name, req)
        except grpc.RpcError as e:
            assert e.code() in REFUSALS, (name, e.code(), e.details(), req)

    run()
    assert set(seen) == set(METHODS), seen  # every handler was exercised
    check_still_serving(live)


def test_bytes_that_are_not_protobuf_and_oversized_messages_are_refused(live):
    ch = live["channel"]
    rng = random.Random(7)
    for name in UNARY:
        raw = ch.unary_unary(f"/fedsbdt.v1.Federation/{name}", request_serializer=None, response_deserializer=None)
        for n in (1, 7, 64, 1000):
            try:
                raw(bytes(rng.randrange(256) for _ in range(n)), timeout=5)
            except grpc.RpcError as e:  # undecodable: refused by gRPC before any handler runs
                assert e.code() in REFUSALS | {grpc.StatusCode.INTERNAL}, (name, e.code())
                if e.code() == grpc.StatusCode.INTERNAL:
                    assert "deserializ" in e.details().lower(), e.details()
    big = pb.SecAggSubmission(site_id="site-a", token=live["token"], secagg=b"\0" * (MAX_MESSAGE_BYTES + 10))
    with pytest.raises(grpc.RpcError) as e:
        live["stub"].SubmitSetup(big, timeout=20)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    check_still_serving(live)


def check_still_serving(live) -> None:
    st_ = live["stub"].GetStatus(pb.GetStatusRequest(), timeout=5)
    assert st_.stage == "gathering" and st_.trees_released == 0  # nothing released, the session is intact
    assert live["server"].fatal is None
    assert live["stub"].GetTrees(pb.GetTreesRequest(), timeout=5).trees_released == 0


# --------------------------------------------------------------------------- mutated and replayed messages


def mutations(data: bytes, rng: random.Random, k: int = 6) -> list[bytes]:
    out = []
    for _ in range(k):
        b = bytearray(data)
        kind = rng.randrange(5)
        if kind == 0 and len(b) > 1:
            del b[rng.randrange(1, len(b)):]  # truncated
        elif kind == 1:
            for _ in range(rng.randrange(1, 4)):  # bit flips
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif kind == 2:
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))  # trailing garbage
        elif kind == 3 and len(b) > 8:
            i = rng.randrange(len(b) - 4)  # a slice replaced
            b[i:i + 4] = bytes(rng.randrange(256) for _ in range(4))
        else:
            b[rng.randrange(len(b))] = rng.randrange(256)
        if bytes(b) != data:
            out.append(bytes(b))
    return out


def capture(tmp_path, hp, **kw) -> tuple[Fed, list[tuple[str, object]]]:
    """An undisturbed in-process run and every reply each site sent, in order."""
    f = Fed(tmp_path, hp, **kw).start()
    sent: list[tuple[str, object]] = []
    route = f.fed.route

    def record(site, reply):
        sent.append((site, reply))
        route(site, reply)

    f.fed.route = record
    f.fed.run()
    assert f.session.exit_code == 0
    return f, sent


def submit(session, site: str, reply, now: float):
    if isinstance(reply, SetupReply):
        return session.submit_setup(site, reply.secagg, now)
    if isinstance(reply, InputReply):
        return session.submit_input(site, reply.purpose, reply.tree, reply.secagg, now)
    if isinstance(reply, RoundReply):
        return session.submit_round(site, reply.secagg, now)
    return None


def test_mutated_replayed_and_foreign_messages_are_refused_and_change_nothing(tmp_path):
    hp = tree_hp(trees=4, filter=True, extra_trees=1)
    ref, ref_sent = capture(tmp_path / "ref", hp)
    # messages of another session (another plan: another public seed, hence another session digest)
    _, foreign = capture(tmp_path / "other", tree_hp(trees=2, seed=99))
    f = Fed(tmp_path / "fuzz", hp).start()
    rng = random.Random(20261122)
    history: list[tuple[str, object]] = []
    stats = {"injected": 0, "identical_accepted": 0}
    route = f.fed.route

    def inject(site, reply, data) -> None:
        stats["injected"] += 1
        forged = dataclasses.replace(reply, secagg=data)
        outs = None
        try:
            outs = submit(f.session, site, forged, f.clock.now)
        except Rejected:
            return
        # accepted: only an exact copy of something this site already sent may be (idempotent)
        assert any(s == site and getattr(r, "secagg", None) == data for s, r in history + [(site, reply)]), \
            f"a forged message from {site} was accepted"
        stats["identical_accepted"] += 1
        f.fed.deliver(outs or [])

    def fuzzing_route(site, reply):
        secagg = getattr(reply, "secagg", None)
        if secagg is not None:
            for other in SITES:  # the honest bytes, claimed by another site first
                if other != site:
                    inject(other, reply, secagg)
        route(site, reply)
        if secagg is not None:
            for data in mutations(secagg, rng):
                inject(site, reply, data)
            for s, old in rng.sample(history, min(3, len(history))):  # replays of earlier messages
                if getattr(old, "secagg", None) is not None:
                    inject(s, old, old.secagg)
            for s, old in rng.sample(foreign, 2):  # and of another session's
                if getattr(old, "secagg", None) is not None and type(old) is type(reply):
                    inject(site, reply, old.secagg)
        history.append((site, reply))

    f.fed.route = fuzzing_route
    f.fed.run()
    assert f.session.exit_code == 0
    assert stats["injected"] > 300, stats
    # the same model as the undisturbed run (each run has its own identity keys, hence its own plan hash)
    assert without_plan_hash(f.session.model_json) == without_plan_hash(ref.session.model_json)
    for s in ("hosp-a", "hosp-b", "hosp-c"):
        assert f.machines[s].stage.model_path.read_bytes() == f.session.model_json


def without_plan_hash(model_json: bytes) -> dict:
    import json

    d = json.loads(model_json)
    d["training"].pop("plan_sha256")
    return d


def test_a_site_fed_mutated_coordinator_events_stays_within_its_budget(tmp_path):
    from fedsbdt.client.site import NeedCatchUp, SessionAbort

    hp = tree_hp(trees=6, filter=True, extra_trees=2)
    f = Fed(tmp_path, hp).start()
    m = f.machines["hosp-a"]
    rng = random.Random(5)
    inputs: dict[int, bytes] = {}
    stats = {"events": 0, "answered": 0}
    orig = m.handle

    def remember(replies):
        from fedsbdt.common.secagg import decode_message

        for r in replies:
            if isinstance(r, InputReply):
                msg = decode_message(r.secagg)
                assert inputs.setdefault(msg.round_id, r.secagg) == r.secagg, \
                    f"two different masked inputs for round {msg.round_id}"
        return replies

    def fuzzed(ev):
        replies = remember(orig(ev))
        if isinstance(ev, (SetupMsg, RoundStartMsg, RoundMsg)):
            for data in mutations(ev.secagg, rng, k=4):
                stats["events"] += 1
                try:
                    extra = remember(orig(dataclasses.replace(ev, secagg=data)))
                except NeedCatchUp:
                    continue
                except SessionAbort as e:  # pragma: no cover - a mutated secagg message is never a "lie"
                    raise AssertionError(f"the site gave up on a mutated event: {e}") from None
                stats["answered"] += sum(not isinstance(r, Refusal) for r in extra)  # not sent anywhere
        return replies

    m.handle = fuzzed
    f.fed.run()
    assert f.session.exit_code == 0  # hosp-b and hosp-c carry rounds hosp-a abandoned
    assert stats["events"] > 50
    budget = f.machines["hosp-b"].table.budget_units
    spent = [r[0] for r in f.db("hosp-a").execute("SELECT spent FROM ledger")]
    assert max(spent) <= budget
    assert f.machines["hosp-a"].stage.model_path.read_bytes() == f.session.model_json


# --------------------------------------------------------------------------- vectors outside the bound


def test_a_site_whose_vector_exceeds_the_fixed_point_bound_is_stopped_by_its_own_check(tmp_path, monkeypatch):
    f = Fed(tmp_path, tree_hp(trees=3, filter=True)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    m = f.machines["hosp-c"]
    bound = f.plan.max_abs_input()
    real = m.local.contribution

    def too_big(*a, **k):
        c = real(*a, **k)
        c.sums[0] = bound + 1  # a bug (or a tampered data path) puts an impossible sum in the vector
        return c

    monkeypatch.setattr(m.local, "contribution", too_big)
    db = f.db("hosp-c")
    before = (db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0],
              db.execute("SELECT SUM(spent) FROM ledger").fetchone()[0])
    route, sent = f.fed.route, []

    def watch(site, reply):
        if site == "hosp-c":
            sent.append(reply)
        route(site, reply)

    f.fed.route = watch
    f.fed.run(until=lambda: any(isinstance(r, Refusal) for r in sent))
    refusal = next(r for r in sent if isinstance(r, Refusal))
    assert "input" in refusal.detail and str(bound) in refusal.detail.replace(",", "")
    assert not any(isinstance(r, InputReply) for r in sent)  # nothing left the site
    db = f.db("hosp-c")
    after = (db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0],
             db.execute("SELECT SUM(spent) FROM ledger").fetchone()[0])
    assert after == before  # and nothing was charged
    monkeypatch.undo()
    f.fed.run()
    assert f.session.exit_code == 0


def test_a_malicious_site_that_skips_its_check_moves_leaves_only_within_beta(tmp_path, monkeypatch):
    """Secure aggregation cannot validate inputs: a site that bypasses its own range check can put any
    int64 vector into the sum.  The round still completes, the released leaves stay finite and within
    [−β, β] (the coordinator's clamp), and the honest sites' ledgers and models are unaffected."""
    hp = tree_hp(trees=3)
    f = Fed(tmp_path, hp).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    m = f.machines["hosp-c"]
    ctx = m.secagg.ctx  # the malicious site's own software: no range check on its input
    monkeypatch.setattr(m.secagg, "ctx", dataclasses.replace(ctx, config=dataclasses.replace(ctx.config,
                                                                                             max_abs_input=None)))
    real = m.local.contribution
    rng = np.random.default_rng(0)

    calls = []

    def hostile(*a, **k):
        c = real(*a, **k)
        c.sums[:] = rng.integers(-2**62, 2**62, size=c.sums.size)  # anything, including wrap-around sums
        calls.append(int(np.abs(c.sums).max()))
        return c

    monkeypatch.setattr(m.local, "contribution", hostile)
    f.fed.run()
    assert f.session.exit_code == 0 and f.session.rounds_failed == 0
    assert len(calls) == 2 and min(calls) > f.plan.max_abs_input()  # it really sent out-of-bound vectors
    for t in f.session.trees[1:]:
        assert "hosp-c" in t.sites
        assert np.isfinite(t.leaves).all() and np.abs(t.leaves).max() <= hp.leaf_clip
    for s in ("hosp-a", "hosp-b"):
        assert f.machines[s].stage.model_path.read_bytes() == f.session.model_json
