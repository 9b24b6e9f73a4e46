"""Fast secure-aggregation rounds in the federation (plan ``[secure_aggregation] fast_path``).

A fast round is one RoundStart and one reply per site (the masked input with the site's self-mask seed
shares); the coordinator finalizes when every participant has answered and fails the round otherwise
(docs/federation.md §10 "Messages merged", docs/secagg.md §6).  Driven through the transport-free state
machines (Session, SiteMachine) with the in-process transport.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from fedsbdt.common.federation.plan import Plan, PlanError
from fedsbdt.common.federation.wire import InputReply, Purpose, Refusal, RoundMsg, RoundReply, RoundStartMsg
from fedsbdt.common.secagg import RoundStart, decode_message

from .conftest import EXAMPLES
from .test_greedy_federation import greedy_hp
from .test_state_machines import SITES, Fed, _counts, tree_hp


def trees(f: Fed) -> list:
    return [(t["features"], t["thresholds"], t["leaves"]) for t in f.model()["trees"]]


class MessageLog:
    """Every secure-aggregation message the session sends (events) and receives (replies), by round id."""

    def __init__(self, f: Fed) -> None:
        self.out: dict[int, Counter] = {}
        self.purpose: dict[int, Purpose] = {}
        self.starts: dict[int, RoundStart] = {}
        deliver, route = f.fed.deliver, f.fed.route

        def logged_deliver(outs):
            outs = list(outs)
            for _, ev in outs:
                if isinstance(ev, RoundStartMsg):
                    start = decode_message(ev.secagg)
                    r = start.round_id
                    self.purpose[r], self.starts[r] = ev.purpose, start
                    self._count(r, "RoundStart")
                elif isinstance(ev, RoundMsg):
                    msg = decode_message(ev.secagg)
                    self._count(msg.round_id, type(msg).__name__)
            deliver(outs)

        def logged_route(site, reply):
            if isinstance(reply, (InputReply, RoundReply)):
                msg = decode_message(reply.secagg)
                self._count(msg.round_id, "input" if isinstance(reply, InputReply) else type(msg).__name__)
            route(site, reply)

        f.fed.deliver, f.fed.route = logged_deliver, logged_route

    def _count(self, r: int, kind: str) -> None:
        self.out.setdefault(r, Counter())[kind] += 1


def federation(tmp_path, hp, **session) -> tuple[Fed, MessageLog]:
    f = Fed(tmp_path, hp, **session)
    return f, MessageLog(f)


# --------------------------------------------------------------------------- the same model, fewer messages


@pytest.mark.parametrize("builder", ["random", "greedy"])
def test_fast_and_slow_rounds_release_the_same_model(tmp_path, builder):
    """Noise off: every released sum is exact, so fast rounds ("auto") must give the slow rounds' ("never")
    trees bit for bit; in "auto" every tree (and level) round is fast, the initial score (t < |P_r|) slow."""
    hp = tree_hp(trees=4) if builder == "random" else greedy_hp(trees=2, depth=2)
    slow, slow_log = federation(tmp_path / "slow", hp, secagg_fast_path="never")
    fast, fast_log = federation(tmp_path / "fast", hp)
    for f in (slow, fast):
        f.start().fed.run()
        assert f.session.exit_code == 0 and not f.fed.rejected and not f.fed.refusals
    assert trees(fast) == trees(slow) and len(trees(fast)) == hp.total_rounds
    assert fast.model()["init_score"] == slow.model()["init_score"]
    n = len(SITES)
    full = Counter({"RoundStart": n, "input": n, "ConsistencyRequest": n, "ConsistencySignature": n,
                    "UnmaskRequest": n, "UnmaskResponse": n})
    assert all(c == full for c in slow_log.out.values())  # 6n messages per round
    for r, c in fast_log.out.items():
        if fast_log.purpose[r] == Purpose.INIT_SCORE:
            assert c == full  # it needs only t of the 3 inputs: "auto" keeps it slow
        else:
            assert c == Counter({"RoundStart": n, "input": n})  # 2n, no consistency or unmask exchange
    kinds = {Purpose.TREE} if builder == "random" else {Purpose.TREE, Purpose.LEVEL}
    assert set(fast_log.purpose.values()) == kinds | {Purpose.INIT_SCORE}
    for f in (slow, fast):
        for m in f.machines.values():
            assert m.stage.model_path.read_bytes() == f.session.model_json


def test_always_makes_the_initial_score_round_fast_too(tmp_path):
    f, log = federation(tmp_path, tree_hp(trees=2), secagg_fast_path="always")
    f.start().fed.run()
    assert f.session.exit_code == 0 and not f.fed.refusals
    assert log.out and all(c == Counter({"RoundStart": 3, "input": 3}) for c in log.out.values())
    assert Purpose.INIT_SCORE in log.purpose.values()


# --------------------------------------------------------------------------- a missing input


def silence_the_next_round_start(f: Fed, site: str) -> dict:
    """``site`` stays connected but never sees the next RoundStart; the returned dict gets its round id."""
    dropped: dict = {}

    def intercept(s, ev):
        if s == site and isinstance(ev, RoundStartMsg) and not dropped:
            dropped["round"] = decode_message(ev.secagg).round_id
            return False
        return True

    f.fed.intercept = intercept
    return dropped


def test_a_silent_site_fails_the_fast_round_which_is_retried_without_it(tmp_path):
    """hosp-c stays connected but never answers tree 1's RoundStart: at the stage deadline the fast round
    fails (nothing released), hosp-c is suspended, and the retry with hosp-a and hosp-b completes.  The
    failed attempt was charged to the sites that sent their input, exactly like a failed slow round."""
    f, log = federation(tmp_path, tree_hp(trees=3))
    f.start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    dropped = silence_the_next_round_start(f, "hosp-c")
    f.fed.run(until=lambda: f.session.rounds_failed == 1)
    assert len(f.session.trees) == 1  # nothing released from the failed round
    assert f.session.sites["hosp-c"].suspended_from_epoch is not None
    assert "missed the collecting-inputs deadline" in f.session.sites["hosp-c"].note
    assert log.out[dropped["round"]] == Counter({"RoundStart": 3, "input": 2})
    f.fed.run(until=lambda: len(f.session.trees) == 2)
    assert f.session.trees[1].sites == ("hosp-a", "hosp-b")  # the retry, also fast (2 of 2 must survive)
    assert log.out[f.session.trees[1].round_id] == Counter({"RoundStart": 2, "input": 2})
    f.fed.intercept = None
    f.fed.run()
    assert f.session.exit_code == 0 and f.session.rounds_failed == 1
    r = dropped["round"]
    for s in ("hosp-a", "hosp-b"):  # charged for the failed attempt, as for any failed round
        assert f.db(s).execute("SELECT COUNT(*) FROM contributions WHERE round_id = ?", (r,)).fetchone()[0] == 1
        assert f.db(s).execute("SELECT COUNT(*) FROM contributions WHERE tree = 1").fetchone()[0] == 2
    assert f.db("hosp-c").execute("SELECT COUNT(*) FROM contributions WHERE round_id = ?", (r,)).fetchone()[0] == 0
    for m in f.machines.values():
        assert m.stage.model_path.read_bytes() == f.session.model_json


def test_always_fails_a_round_the_slow_path_would_have_survived(tmp_path):
    """The initial score needs only t = 2 of 3 inputs, but under "always" its round is fast: hosp-c's silence
    fails it (nothing released), and the retry without hosp-c releases the score."""
    f, log = federation(tmp_path, tree_hp(trees=2), secagg_fast_path="always")
    dropped = silence_the_next_round_start(f, "hosp-c")
    f.start().fed.run(until=lambda: f.session.init is not None)
    assert f.session.rounds_failed == 1 and f.session.init.round_id != dropped["round"]
    assert f.session.init.sites == ("hosp-a", "hosp-b")
    assert log.out[dropped["round"]] == Counter({"RoundStart": 3, "input": 2})
    f.fed.intercept = None
    f.fed.run()
    assert f.session.exit_code == 0


def test_a_site_refuses_consistency_and_unmask_requests_for_a_fast_round(tmp_path):
    """The coordinator may not take the slow path too after a fast start: the site that sent its seed shares
    signs no survivor set and reveals nothing more for that round (docs/secagg.md §6)."""
    from fedsbdt.common.secagg import ConsistencyRequest

    f, log = federation(tmp_path, tree_hp(trees=2))
    f.start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    start = [s for r, s in log.starts.items() if log.purpose[r] == Purpose.TREE][0]
    assert log.out[start.round_id] == Counter({"RoundStart": 3, "input": 3})  # released from the fast replies
    m = f.machines["hosp-a"]
    for survivors in (SITES, ["hosp-a", "hosp-b"]):
        req = ConsistencyRequest(start.session_digest, start.epoch, start.round_id, tuple(survivors))
        out = m.handle(RoundMsg(req.to_bytes()))
        assert len(out) == 1 and isinstance(out[0], Refusal), out
    signed = f"round/{start.round_id:020d}/signed"
    assert f.db("hosp-a").execute("SELECT COUNT(*) FROM secagg WHERE key = ?", (signed,)).fetchone()[0] == 0


def test_a_site_restarted_mid_fast_round_resends_its_stored_reply_without_a_second_charge(tmp_path):
    """hosp-c commits its fast reply for tree 2 and dies before the bytes leave; it restarts while the round
    still waits for hosp-b, gets the open RoundStart again and resends the identical reply from its secure-
    aggregation record, charged once; the round completes as it is."""
    f, log = federation(tmp_path, tree_hp(trees=4, filter=True, extra_trees=1))
    f.start()
    f.fed.run(until=lambda: len(f.session.trees) == 2)
    route = f.fed.route
    seen: dict = {}

    def lossy(site, reply):
        if site == "hosp-c" and isinstance(reply, InputReply) and "lost" not in seen:
            seen["lost"] = reply.secagg
            seen["counts"] = _counts(f, "hosp-c")
            return
        if site == "hosp-c" and isinstance(reply, InputReply) and reply.secagg == seen.get("lost"):
            seen["resent"] = _counts(f, "hosp-c")
        route(site, reply)

    def hold(site, ev):  # hosp-b answers late, so the round is still open when hosp-c is back
        if site == "hosp-b" and isinstance(ev, RoundStartMsg) and "held" not in seen:
            seen["held"] = ev
            return False
        return True

    f.fed.route, f.fed.intercept = lossy, hold
    f.fed.run(until=lambda: "lost" in seen and "held" in seen)
    r = decode_message(seen["lost"]).round_id
    assert f.session.phase.rnd.fast and f.session.phase.rnd.round_id == r
    m = f.restart_site("hosp-c")  # a new process joins; the coordinator re-sends the open (fast) RoundStart
    f.fed.run(until=lambda: "resent" in seen)
    assert seen["resent"] == seen["counts"]  # the byte-identical reply, nothing charged or logged again
    f.fed.intercept = None
    f.fed.queues["hosp-b"].append(seen["held"])
    f.fed.run(until=lambda: len(f.session.trees) == 3)
    assert f.session.trees[2].round_id == r and f.session.trees[2].sites == tuple(SITES)
    assert f.session.rounds_failed == 0
    assert log.out[r] == Counter({"RoundStart": 4, "input": 3})  # one RoundStart re-sent to the new process
    f.fed.run()
    assert f.session.exit_code == 0
    assert f.db("hosp-c").execute("SELECT COUNT(*) FROM contributions WHERE round_id = ?", (r,)).fetchone()[0] == 1
    assert m.stage.model_path.read_bytes() == f.session.model_json


def test_a_site_whose_plan_says_never_refuses_a_fast_round_and_is_charged_nothing(tmp_path, monkeypatch):
    f, log = federation(tmp_path, tree_hp(trees=3, filter=True), secagg_fast_path="never")
    monkeypatch.setattr(Plan, "fast_round", lambda self, need, p: True)  # a coordinator that ignores the plan
    f.start()
    f.fed.run(until=lambda: f.session.rounds_failed >= 1)
    assert log.starts and all(s.fast for s in log.starts.values())
    assert {s for s, _ in f.fed.refusals} == set(SITES)
    assert all("fast rounds are disabled" in d for _, d in f.fed.refusals), f.fed.refusals
    assert f.session.init is None and not f.session.trees  # nothing released
    for s in SITES:
        contributions, spent, _ = _counts(f, s)
        assert contributions == 0 and not spent  # no input logged, no record charged


# --------------------------------------------------------------------------- the plan option


def _plan(**kw):
    from .test_plan_and_wire import plan

    return plan(3, **kw)


def test_fast_path_is_validated_and_serialised_only_when_not_the_default(tmp_path):
    p = _plan()
    assert p.secagg_fast_path == "auto"
    d = json.loads(p.canonical_json)
    assert "secure_aggregation" not in d  # an existing plan keeps its canonical form, so its hash
    for mode in ("always", "never"):
        q = Plan.from_dict(d | {"secure_aggregation": {"fast_path": mode}})
        assert q.secagg_fast_path == mode and q.sha256 != p.sha256
        q.save(tmp_path / f"{mode}.toml")
        assert f'fast_path = "{mode}"' in (tmp_path / f"{mode}.toml").read_text()
        assert Plan.load(tmp_path / f"{mode}.toml").sha256 == q.sha256
    explicit = Plan.from_dict(d | {"secure_aggregation": {"fast_path": "auto"}})
    assert explicit.sha256 == p.sha256  # stating the default changes nothing
    for bad in ("fast", "", 1, True, None):
        with pytest.raises(PlanError, match="fast_path"):
            Plan.from_dict(d | {"secure_aggregation": {"fast_path": bad}})
    with pytest.raises(PlanError, match="unknown key"):
        Plan.from_dict(d | {"secure_aggregation": {"fastpath": "never"}})
    assert "fast path" not in p.guarantee and "fast path" not in Plan.from_dict(
        d | {"secure_aggregation": {"fast_path": "never"}}).guarantee
    assert "fast path" in Plan.from_dict(d | {"secure_aggregation": {"fast_path": "always"}}).guarantee


def test_fast_path_on_the_sparse_graph_is_fast_only_and_follows_the_rule():
    from .test_plan_and_wire import plan

    d = json.loads(plan(8, secagg_graph="sparse", secagg_neighbours=4).canonical_json)
    assert set(d["secure_aggregation"]) == {"graph", "neighbours"}  # sparse plans keep their form too
    fast_only = Plan.from_dict(d | {"secure_aggregation": d["secure_aggregation"] | {"fast_path": "always"}})
    assert fast_only.secagg_config().fast_only and fast_only.fast_round(6, 8)  # every round (docs/secagg.md §10)
    never_fast = Plan.from_dict(d)  # "auto" on the sparse graph: no fast round (mixing the paths is unsafe there)
    assert not never_fast.fast_round(8, 8) and not never_fast.secagg_config().fast_only
    p = plan(3)
    assert p.fast_round(3, 3) and not p.fast_round(2, 3)
    always = Plan.from_dict(json.loads(p.canonical_json) | {"secure_aggregation": {"fast_path": "always"}})
    never = Plan.from_dict(json.loads(p.canonical_json) | {"secure_aggregation": {"fast_path": "never"}})
    assert always.fast_round(2, 3) and not never.fast_round(3, 3)


def test_fedsbdt_plan_writes_the_fast_path_option(tmp_path, capsys):
    from fedsbdt.cli import main

    keys = [bytes([i + 1]) * 32 for i in range(8)]

    def base(n):
        return ["plan", "--schema", str(EXAMPLES / "abalone" / "schema.toml"), "--settings", "paper",
                "--trees", "5", "--seed", "1",
                "--json", *[a for i, k in enumerate(keys[:n]) for a in ("--site", f"s{i}={k.hex()}")]]

    assert main([*base(3), "--out", str(tmp_path / "a.toml")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["secagg_fast_path"] == "auto" and "fast_path" not in (tmp_path / "a.toml").read_text()
    assert main([*base(3), "--out", str(tmp_path / "n.toml"), "--secagg-fast-path", "never"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["secagg_fast_path"] == "never" and Plan.load(tmp_path / "n.toml").secagg_fast_path == "never"
    assert out["plan_sha256"] != Plan.load(tmp_path / "a.toml").sha256
    assert main([*base(8), "--out", str(tmp_path / "s.toml"), "--secagg-graph", "sparse", "--neighbours", "4",
                 "--secagg-fast-path", "always"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "fast-only" in out["guarantee"] and Plan.load(tmp_path / "s.toml").secagg_config().fast_only
    with pytest.raises(SystemExit) as e:
        main([*base(3), "--out", str(tmp_path / "x.toml"), "--secagg-fast-path", "sometimes"])
    assert e.value.code == 2


# --------------------------------------------------------------------------- real processes


@pytest.mark.parametrize("fast_path", ["auto", "never"])
def test_three_site_processes_train_the_central_model_on_either_path(tmp_path, ca_dir, cluster_factory, fast_path):
    """``fedsbdt coordinator`` and three ``fedsbdt client`` processes over gRPC with mutual TLS: fast tree rounds
    (the default) and slow ones ("never") both release the centralised engine's model; the sites' secure-
    aggregation records show which path the last round took (a slow round leaves a signed survivor set; a site
    keeps the records of its latest round only)."""
    import sqlite3

    from fedsbdt.client.ledger import ledger_path
    from fedsbdt.common.config import Hyperparameters

    from .conftest import SITES as PROC_SITES, abalone_with_ids, assert_same_trees, central_training, \
        models_identical, tls_session_files

    schema, raw = abalone_with_ids(300)
    hp = Hyperparameters(trees=4, depth=2, seed=13, epsilon=1.0)
    files = tls_session_files(tmp_path, ca_dir, schema, raw, hp, randomness="insecure-test", test_seed=3,
                              test_noise=False, **({} if fast_path == "auto" else {"secagg_fast_path": fast_path}))
    cluster_factory(tmp_path / "plan.toml").run(files.data, "--allow-insecure-test-randomness")
    model = json.loads(models_identical(tmp_path, PROC_SITES))
    assert [r["sites"] for r in model["training"]["rounds"]] == [PROC_SITES] * hp.total_rounds
    _, res = central_training(tmp_path, schema, raw, hp, seed=3)
    assert model["init_score"] == res.model.init_score
    assert_same_trees(model, res.model)
    for s in PROC_SITES:
        db = sqlite3.connect(ledger_path(tmp_path / s, files.plan.sha256))
        count = {k: db.execute("SELECT COUNT(*) FROM secagg WHERE key LIKE ?", (f"round/%/{k}",)).fetchone()[0]
                 for k in ("input", "signed")}
        assert count == {"input": 1, "signed": 0 if fast_path == "auto" else 1}, (s, count)
