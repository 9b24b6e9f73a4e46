"""The plan (bulletin board), the envelope types and the committed gRPC stubs."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.common.config import Hyperparameters
from fedsbdt.common.schema import Schema
from fedsbdt.common.federation.plan import Plan, PlanError, SiteEntry, make_plan
from fedsbdt.common.federation.wire import (
    AbortedMsg,
    EvalRelease,
    FinishedMsg,
    InitScoreMsg,
    Purpose,
    RoundMsg,
    RoundStartMsg,
    SetupMsg,
    TreeMsg,
    WireError,
    estimated_largest_message,
    event_from_proto,
    event_to_proto,
    sign_join,
    verify_join,
)

from .conftest import EXAMPLES, ROOT

SCHEMA = Schema.load(EXAMPLES / "abalone" / "schema.toml")


def entries(n: int) -> list[SiteEntry]:
    return [SiteEntry(f"site-{i}", Ed25519PrivateKey.generate().public_key().public_bytes_raw()) for i in range(n)]


def plan(n=3, **kw) -> Plan:
    hp = kw.pop("hp", Hyperparameters(trees=20, depth=3, seed=42))
    return make_plan(SCHEMA, hp, entries(n), **kw)


# --------------------------------------------------------------------------- plan


def test_plan_round_trips_through_toml_and_its_hash_ignores_formatting(tmp_path):
    p = plan(3, epoch_rounds=16)
    path = tmp_path / "plan.toml"
    p.save(path)
    q = Plan.load(path)
    assert q.sha256 == p.sha256 and q.canonical_json == p.canonical_json
    # reorder the roster and add comments: same plan, same hash
    text = path.read_text()
    head, *sites = text.split("\n[[sites]]")
    shuffled = head + "\n# the roster, in another order\n" + "".join("\n[[sites]]" + s for s in reversed(sites))
    assert Plan.from_toml(shuffled).sha256 == p.sha256
    # any change of substance changes it
    assert Plan.from_toml(text.replace("threshold = 2", "threshold = 3")).sha256 != p.sha256
    assert Plan.from_canonical_json(p.canonical_json).sha256 == p.sha256
    with pytest.raises(PlanError, match="canonical"):
        Plan.from_canonical_json(json.dumps(json.loads(p.canonical_json), indent=1).encode())


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["session"].update(threshold=1), "2t > n"),
    (lambda d: d["hyperparameters"].pop("seed"), "seed is required"),
    (lambda d: d["sites"][0].update(identity_key="abcd"), "64 hex digits"),
    (lambda d: d["sites"].append(dict(d["sites"][0])), "twice"),
    (lambda d: d["session"].update(noise="local"), "distributed, central"),
    (lambda d: d.update(extra={}), "unknown section"),
    (lambda d: d["session"].update(epoch_rounds=5000), "epoch_rounds"),
    (lambda d: d["privacy"].pop("sigma"), "exactly sigma and epsilon"),
    (lambda d: d["hyperparameters"].update(depth=13), "depth"),
    (lambda d: d["session"].update(randomness="numpy"), "randomness"),
    (lambda d: d["session"].update(sampler="numpy"), "session.sampler"),
    (lambda d: d["deadlines"].update(stage=-1), "deadlines.stage"),
])
def test_plan_refuses_malformed_or_unsafe_content(edit, needle):
    d = json.loads(plan(3).canonical_json)
    edit(d)
    with pytest.raises(PlanError, match=needle):
        Plan.from_dict(d)


def test_every_party_recomputes_the_privacy_statement():
    p = plan(3)
    cal = p.verify_privacy()
    assert cal.sigma == p.stated_sigma
    d = json.loads(p.canonical_json)
    d["privacy"]["epsilon"] = 0.5  # a plan claiming less privacy loss than its noise buys
    with pytest.raises(PlanError, match="states ε"):
        Plan.from_dict(d).verify_privacy()
    d = json.loads(p.canonical_json)
    d["hyperparameters"]["trees"] = 400  # more trees for the same σ: the statement no longer holds
    with pytest.raises(PlanError, match="states σ"):
        Plan.from_dict(d).verify_privacy()


def test_test_only_randomness_needs_an_explicit_opt_in():
    p = plan(3, randomness="insecure-test", test_seed=3, test_noise=False)
    with pytest.raises(PlanError, match="test-only randomness"):
        p.make_randomness()
    assert p.make_randomness(allow_insecure=True).insecure
    assert plan(3).make_randomness().describe() == plan(3).randomness_description()


def test_the_plan_names_the_exact_sampler_every_party_uses():
    p = plan(3)
    assert p.sampler == "ours" and "sampler" not in json.loads(p.canonical_json)["session"]  # default: unchanged hash
    q = Plan.from_toml(plan(3, sampler="opendp").to_toml())
    assert q.sampler == "opendp" and q.sha256 != p.sha256
    assert q.make_randomness().sampler == "opendp"
    assert q.randomness_description() == q.make_randomness().describe() == "opendp-exact+aes-ctr-drbg"


def test_distributed_noise_shares_sum_to_at_least_the_calibrated_variance():
    from fedsbdt.common.boosting import leaf_noise_scales

    p = plan(5, assumed_colluders=1, threshold=4)
    leaf, init = p.noise_scales()
    full = leaf_noise_scales(p.hyperparameters, p.encoding, p.verify_privacy().sigma)
    honest = p.threshold - p.assumed_colluders  # shares the coordinator cannot subtract
    assert np.allclose(honest * leaf**2, full**2)
    assert init is not None and np.all(init > 0)
    central = plan(3, noise="central")
    assert central.noise_scales() == (None, None)


@pytest.mark.parametrize("n,t,expected_c", [(2, None, 1), (3, None, 0), (4, None, 1), (5, None, 0), (6, None, 1),
                                              (5, 4, 2), (6, 5, 3), (7, 7, 6)])
def test_the_default_c_is_the_largest_the_threshold_admits_and_the_guarantee_says_so(n, t, expected_c):
    """Issue 10, attack 2: c + 1 colluders can open a site exactly when 2t = n + c + 1; the default c makes
    that the case, so the declared c is the true collusion bound and the plan states it."""
    p = plan(n, threshold=t)
    assert p.assumed_colluders == expected_c == 2 * p.threshold - n - 1
    assert p.threshold - p.assumed_colluders >= 1  # the noise divisor stays ≥ 1
    assert f"at most c = {expected_c} of the {n} sites collude" in p.guarantee
    q = plan(n, threshold=t, dropout_slack=n - p.threshold)
    if q.dropout_slack >= 1:
        assert f"With {expected_c + 1} colluder{'s' if expected_c else ''} it does not hold" in q.guarantee
    explicit = plan(5, assumed_colluders=0, threshold=4)  # an explicit c is kept
    assert explicit.assumed_colluders == 0


def test_plan_command_states_the_guarantee(tmp_path, capsys):
    from fedsbdt.cli import main

    keys = []
    for i in range(4):
        k = Ed25519PrivateKey.generate().public_key().public_bytes_raw().hex()
        keys += ["--site", f"site-{i}={k}"]
    out = tmp_path / "plan.toml"
    rc = main(["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), "--settings", "paper", *keys,
               "--out", str(out),
               "--dropout-slack", "1", "--json"])
    assert rc == 0
    p = Plan.load(out)
    assert (p.threshold, p.assumed_colluders) == (3, 1)
    assert "at most c = 1 of the 4 sites" in p.guarantee and "With 2 colluders it does not hold" in p.guarantee
    printed = json.loads(capsys.readouterr().out)
    assert printed["guarantee"] == p.guarantee and printed["assumed_colluders"] == 1


@pytest.mark.parametrize("n,t,c,s,expected", [
    # k_r = max(t, p − s) − c for p = t … n (design: the coordinator announces it, every site recomputes it)
    (3, 2, 0, 0, {2: 2, 3: 3}),
    (3, 2, 0, 1, {2: 2, 3: 2}),  # s = n − t: the old fixed divisor t − c
    (5, 4, 2, 0, {4: 2, 5: 3}),
    (5, 4, 2, 1, {4: 2, 5: 2}),
    (7, 4, 0, 2, {4: 4, 5: 4, 6: 4, 7: 5}),
    (7, 5, 1, 0, {5: 4, 6: 5, 7: 6}),
    (7, 5, 1, 2, {5: 4, 6: 4, 7: 4}),
])
def test_noise_divisor_follows_the_dropout_slack(n, t, c, s, expected):
    p = plan(n, threshold=t, assumed_colluders=c, dropout_slack=s)
    assert {q: p.noise_divisor(q) for q in range(t, n + 1)} == expected
    for q in range(t, n + 1):
        k = p.noise_divisor(q)
        assert p.min_survivors(q) == k + c
        assert t - c <= k <= q - c  # never fewer shares than before, never more than the honest participants
        # with no dropout (U3 = P_r) the honest shares carry at least σ², exactly σ² when s = 0
        assert (q - c) >= k and ((q - c) == k) == (s == 0 or q == t)
    with pytest.raises(PlanError):
        p.noise_divisor(t - 1)


def test_dropout_slack_is_validated_and_part_of_the_plan_hash(tmp_path):
    p0, p1 = plan(3), None
    d = json.loads(p0.canonical_json)
    assert d["session"]["dropout_slack"] == 0  # the default, stated explicitly in the canonical form
    d["session"]["dropout_slack"] = 1
    p1 = Plan.from_dict(d)
    assert p1.dropout_slack == 1 and p1.sha256 != p0.sha256
    path = tmp_path / "plan.toml"
    p1.save(path)
    assert "dropout_slack = 1" in path.read_text() and Plan.load(path).sha256 == p1.sha256
    for bad in (2, -1, 1.0, True, "1"):
        d["session"]["dropout_slack"] = bad
        with pytest.raises(PlanError, match="dropout_slack"):
            Plan.from_dict(d)
    # the largest share (t − c ways) is what secure aggregation range-checks
    assert np.allclose(p1.noise_scales()[0], p1.leaf_share_scales(p1.noise_shares))
    assert np.all(p1.leaf_share_scales(3) < p1.leaf_share_scales(2))


def test_message_size_estimate_bounds_real_messages_and_refuses_oversized_plans():
    from fedsbdt.common.secagg.loopback import LoopbackFederation
    from fedsbdt.common.secagg import SessionConfig, SiteIdentity

    keys = {f"s{i}": Ed25519PrivateKey.generate() for i in range(5)}
    cfg = SessionConfig(b"size-test", 3, tuple(SiteIdentity(s, k.public_key().public_bytes_raw())
                                                for s, k in keys.items()), max_epoch_rounds=8)
    fed = LoopbackFederation(cfg, keys)
    fed.run_epoch(8)
    d = 2 * 2**4
    fed.run_round({s: np.ones(d, np.int64) for s in keys}, d)
    largest = max(len(h.data) for h in fed.transcript)
    est = estimated_largest_message(5, 8, 4)
    assert largest <= est <= 4 * largest + 10_000
    with pytest.raises(PlanError, match="lower epoch_rounds"):
        plan(400, epoch_rounds=256)


# --------------------------------------------------------------------------- wire


def test_every_event_round_trips_through_protobuf():
    t = TreeMsg(3, 17, ("a", "b"), np.array([0, 2, 1], np.int32), np.array([0.5, 1.25, -3.0]),
                np.array([0.1, -0.2, 0.3, 1e-300]))
    events = [SetupMsg(b"\x01\x02"), RoundStartMsg(Purpose.TREE, 4, b"rs"), RoundMsg(b"\x00"),
              InitScoreMsg(-0.25, 0, ("a", "b", "c")), InitScoreMsg(0.0, None, ()), t,
              FinishedMsg("ab" * 32, 10), AbortedMsg("no quorum"),
              # with the released evaluation (the noisy sum, negative entries included) or why there is none
              FinishedMsg("cd" * 32, 4, EvalRelease((3, -2, 0, 1 << 40), ("a", "c"), 9)),
              FinishedMsg("ef" * 32, 4, EvalRelease(failed="evaluation failed 20 times"))]
    for i, ev in enumerate(events):
        pb = event_to_proto(ev, i + 1)
        back = event_from_proto(type(pb).FromString(pb.SerializeToString()))
        assert back == ev and pb.seq == i + 1


@pytest.mark.parametrize("mutate,needle", [
    (lambda m: m.tree.leaves.append(1.0), "complete tree"),
    (lambda m: m.tree.leaves.__setitem__(0, float("nan")), "non-finite"),
    (lambda m: (m.tree.ClearField("sites"), m.tree.sites.extend(["b", "a"])), "sorted"),
    (lambda m: (m.tree.ClearField("sites"), m.tree.sites.extend(["no spaces"])), "valid site id"),
])
def test_malformed_events_are_refused(mutate, needle):
    t = TreeMsg(0, 1, ("a", "b"), np.zeros(3, np.int32), np.zeros(3), np.zeros(4))
    m = event_to_proto(t, 1)
    mutate(m)
    with pytest.raises(WireError, match=needle):
        event_from_proto(m)
    from fedsbdt.proto.v1 import federation_pb2 as pb

    with pytest.raises(WireError):
        event_from_proto(pb.Event(seq=1))  # no kind


def test_join_signature_binds_plan_site_and_nonce():
    k = Ed25519PrivateKey.generate()
    pub = k.public_key().public_bytes_raw()
    nonce = bytes(range(32))
    sig = sign_join(k, "aa" * 32, "site-1", nonce)
    assert verify_join(pub, "aa" * 32, "site-1", nonce, sig)
    assert not verify_join(pub, "bb" * 32, "site-1", nonce, sig)
    assert not verify_join(pub, "aa" * 32, "site-2", nonce, sig)
    assert not verify_join(pub, "aa" * 32, "site-1", bytes(32), sig)


# --------------------------------------------------------------------------- committed stubs


def _without_version_stamps(text: str) -> str:
    """Generated code minus the generator's version stamps (which name the grpcio-tools release, not the proto)."""
    import re

    text = re.sub(r"# Protobuf Python Version: .*\n", "", text)
    text = re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n", "", text)
    return re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "GRPC_GENERATED_VERSION = ''", text)


def test_generated_stubs_are_current(tmp_path):
    proto_root = ROOT / "protos"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_root}", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", "fedsbdt/proto/v1/federation.proto"],
                   check=True, cwd=proto_root)
    for name in ("federation_pb2.py", "federation_pb2_grpc.py", "federation_pb2.pyi"):
        fresh = (tmp_path / "fedsbdt" / "proto" / "v1" / name).read_text()
        committed = (proto_root / "fedsbdt" / "proto" / "v1" / name).read_text()
        assert _without_version_stamps(fresh) == _without_version_stamps(committed), \
            f"protos/fedsbdt/proto/v1/{name} is stale: regenerate it (see docs/federation.md)"
    # and the service is the versioned one the code uses
    from fedsbdt.proto.v1 import federation_pb2

    svc = federation_pb2.DESCRIPTOR.services_by_name["Federation"]
    assert svc.full_name == "fedsbdt.v1.Federation"
    assert {m.name for m in svc.methods} == {"GetPlan", "Join", "Subscribe", "SubmitSetup", "SubmitMaskedInput",
                                             "SubmitRound", "GetTrees", "GetStatus", "Report", "Connect"}


def test_the_stub_check_notices_a_changed_proto(tmp_path):
    """The check above can fail: a one-field change to the proto changes the generated code."""
    src = (ROOT / "protos" / "fedsbdt" / "proto" / "v1" / "federation.proto").read_text()
    (tmp_path / "fedsbdt" / "proto" / "v1").mkdir(parents=True)
    (tmp_path / "fedsbdt" / "proto" / "v1" / "federation.proto").write_text(
        src.replace("message ReportResponse {}", "message ReportResponse { uint32 extra = 1; }"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                    "fedsbdt/proto/v1/federation.proto"], check=True, cwd=tmp_path)
    fresh = (tmp_path / "fedsbdt" / "proto" / "v1" / "federation_pb2.py").read_text()
    committed = (ROOT / "protos" / "fedsbdt" / "proto" / "v1" / "federation_pb2.py").read_text()
    assert _without_version_stamps(fresh) != _without_version_stamps(committed)


def test_fedsbdt_plan_sets_every_deadline(tmp_path, capsys):
    from fedsbdt.cli import main
    from fedsbdt.common.federation.plan import Plan

    from .conftest import EXAMPLES

    keys = [bytes([i + 1]) * 32 for i in range(3)]
    base = ["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), "--settings", "paper",
            "--trees", "5", "--seed", "1",
            *[a for i, k in enumerate(keys) for a in ("--site", f"s{i}={k.hex()}")]]
    assert main([*base, "--out", str(tmp_path / "p.toml"), "--join-deadline", "5", "--stage-deadline", "3",
                 "--quorum-deadline", "42", "--finish-deadline", "7"]) == 0
    d = Plan.load(tmp_path / "p.toml").deadlines
    assert (d.join, d.stage, d.quorum, d.finish) == (5.0, 3.0, 42.0, 7.0)
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "q.toml"), "--finish-deadline", "0"]) == 2
    assert "deadlines.finish" in capsys.readouterr().err and not (tmp_path / "q.toml").exists()


# --------------------------------------------------------------------------- coordinator checkpoint transactions


def test_checkpoint_transactions_begin_at_the_first_write_and_roll_back_on_error(tmp_path):
    from fedsbdt.server.checkpoint import CoordinatorStore

    store = CoordinatorStore(tmp_path / "c", "ab" * 32)
    store.load()
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    with store.transaction():  # a step that writes nothing (most site messages): no SQLite transaction
        with store.transaction():
            assert store.storage.get("coordinator/meta") is None
    assert not any(s.startswith(("BEGIN", "COMMIT")) for s in statements)
    statements.clear()
    with store.transaction():  # two writes in nested blocks: one transaction, committed once at the end
        store.storage.put("coordinator/meta", b"m1")
        with store.transaction():
            store.storage.put("coordinator/epoch/1", b"e1")
        assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == ["BEGIN IMMEDIATE"]
    assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == ["BEGIN IMMEDIATE", "COMMIT"]
    with pytest.raises(RuntimeError):
        with store.transaction():  # a failing step: its writes are rolled back, earlier commits stay
            store.storage.put("coordinator/meta", b"m2")
            store.storage.delete("coordinator/epoch/1")
            raise RuntimeError("step failed")
    store.close()
    again = CoordinatorStore(tmp_path / "c", "ab" * 32)
    assert again.storage.get("coordinator/meta") == b"m1" and again.storage.get("coordinator/epoch/1") == b"e1"
    assert again.remember_join_nonce("s", b"n") and not again.remember_join_nonce("s", b"n")
