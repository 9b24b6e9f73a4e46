"""The transport-free state machines (fedsbdt.server.session.Session, fedsbdt.client.site.SiteMachine) without gRPC.

An in-process transport (inproc.py) delivers events in order and routes
replies as the gRPC service would; a fake clock drives deadlines.
"""
from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsbdt.client.ledger import ledger_path
from fedsbdt.client.policy import SitePolicy
from fedsbdt.client.site import NeedCatchUp, SessionAbort, SiteMachine, SiteOptions, SiteRefusal
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import Dataset
from fedsbdt.common.engine import calibration_for, filter_for, train
from fedsbdt.common.randomness import InsecureTestRandomness
from fedsbdt.common.rdp_filter import UNITS_PER_ROUND
from fedsbdt.common.secagg import RoundStart
from fedsbdt.server.checkpoint import CoordinatorStore
from fedsbdt.common.federation.plan import Deadlines, SiteEntry, make_plan
from fedsbdt.server.session import Rejected, Session
from fedsbdt.common.federation.wire import InputReply, Purpose, Refusal, RoundMsg, RoundStartMsg, TreeMsg

from .conftest import abalone_with_ids, write_splits
from .inproc import Clock, InProcess

SITES = ["hosp-a", "hosp-b", "hosp-c"]
SEED = 11


class Fed:
    """An in-process federation over a small Abalone sample with record ids."""

    def __init__(self, tmp_path, hp: Hyperparameters, n_rows: int = 240, test_noise: bool = False,
                 store: bool = False, data=None, **session):
        self.tmp = tmp_path
        self.max_failed_attempts = session.pop("max_failed_attempts", 3)  # the sites' --max-failed-attempts
        self.schema, raw = data if data is not None else abalone_with_ids(n_rows)
        self.raw = raw
        self.paths = write_splits(raw, SITES, tmp_path / "data")
        self.keys = {s: Ed25519PrivateKey.generate() for s in SITES}
        session.setdefault("deadlines", Deadlines(join=30, stage=10, quorum=10_000, finish=30))
        self.plan = make_plan(self.schema, hp, [SiteEntry(s, self.keys[s].public_key().public_bytes_raw())
                                                for s in SITES], randomness="insecure-test", test_seed=SEED,
                              test_noise=test_noise, max_records_per_site=10_000, **session)
        self.clock = Clock()
        self.store_dir = tmp_path / "coordinator" if store else None
        self.session = self.new_session()
        self.machines = {s: self.machine(s) for s in SITES}
        self.fed = InProcess(self.session, self.machines, self.clock)

    def new_session(self) -> Session:
        store = CoordinatorStore(self.store_dir, self.plan.sha256) if self.store_dir else None
        return Session(self.plan, self.plan.make_randomness(True), self.clock.now, store)

    def machine(self, s: str) -> SiteMachine:
        m = SiteMachine(s, self.keys[s], self.paths[s], self.tmp / f"state-{s}", self.options())
        m.accept_plan(self.plan.canonical_json, self.plan.sha256)
        return m

    def options(self, **opts) -> SiteOptions:
        """A site's options in these tests: pinned to this plan, test randomness and central noise accepted."""
        opts.setdefault("expected_plan_sha256", self.plan.sha256)
        opts.setdefault("allow_insecure_test_randomness", True)
        opts.setdefault("policy", SitePolicy(allow_central_noise=True, max_failed_attempts=self.max_failed_attempts))
        return SiteOptions(**opts)

    def start(self) -> "Fed":
        for s in SITES:
            self.fed.join(s)
        return self

    def restart_site(self, s: str) -> SiteMachine:
        """A new process for site ``s`` on the same state directory, which then joins again."""
        self.machines[s] = self.fed.machines[s] = self.machine(s)
        self.fed.join(s)
        return self.machines[s]

    def central(self):
        ds = Dataset.from_arrays(*self._arrays(), self.schema, ids=self.raw["rid"].to_numpy())
        rnd = InsecureTestRandomness(seed=SEED, noise=False, i_understand_this_is_insecure=True)
        return train(ds, self.plan.hyperparameters, rnd)

    def _arrays(self):
        from fedsbdt.common.data import load

        frames = [load(p, self.schema) for p in self.paths.values()]
        X = np.concatenate([f.X for f in frames])
        y = np.concatenate([f.y for f in frames])
        ids = np.concatenate([f.ids for f in frames])
        order = np.argsort(ids)
        Xs = X[order].astype(object)
        Xs[:, 0] = [self.schema.features[0].levels[int(v)] for v in X[order][:, 0]]
        self.raw = self.raw.sort_values("rid")
        return Xs, y[order]

    def db(self, s: str) -> sqlite3.Connection:
        return sqlite3.connect(ledger_path(self.tmp / f"state-{s}", self.plan.sha256))

    def model(self) -> dict:
        return json.loads(self.session.model_json)


def fail_rounds_after_inputs(f: Fed, rounds: int) -> None:
    """Fail ``rounds`` rounds after every site sent its masked input (only hosp-a hears what follows them),
    then let the session finish.  Slow rounds only (plan fast_path = "never"): a fast round that has every
    input is released."""
    left = {"rounds": rounds}

    def intercept(site, ev):
        return not (isinstance(ev, RoundMsg) and left["rounds"] > 0 and site != "hosp-a"
                    and f.session.init is not None)

    f.fed.intercept = intercept
    while left["rounds"] > 0:
        before = f.session.rounds_failed
        f.fed.run(until=lambda: f.session.rounds_failed > before)
        left["rounds"] -= 1
    f.fed.intercept = None
    f.fed.run()


def tree_hp(**kw) -> Hyperparameters:
    base = dict(trees=6, depth=2, seed=5, epsilon=1.0)
    base.update(kw)
    return Hyperparameters(**base)


# --------------------------------------------------------------------------- equality with the engine


@pytest.mark.parametrize("use_filter", [False, True])
def test_federation_equals_the_centralised_engine(tmp_path, use_filter):
    hp = tree_hp(trees=5, extra_trees=3 if use_filter else 0, filter=use_filter)
    f = Fed(tmp_path, hp).start()
    f.fed.run()
    assert f.session.exit_code == 0 and not f.fed.rejected and not f.fed.refusals
    ref = f.central()
    fm = f.model()
    assert fm["init_score"] == ref.model.init_score
    assert len(fm["trees"]) == len(ref.model.trees) == hp.total_rounds
    for t, r in zip(fm["trees"], ref.model.trees):
        assert t["features"] == r.features.tolist()
        assert t["thresholds"] == r.thresholds.tolist()
        assert t["leaves"] == r.leaves.tolist()  # bit-identical: exact integer sums, same leaf formula
    # every site ends with the same model file, and the same per-record ledger as the engine
    files = {m.stage.model_path.read_bytes() for m in f.machines.values()}
    assert files == {f.session.model_json}
    if use_filter:
        central = dict(zip(ref.local.ids.tolist(), ref.local.spent.tolist()))
        for s in SITES:
            for rid, spent in f.db(s).execute("SELECT record_id, spent FROM ledger"):
                assert spent == central[rid]


def test_a_second_plan_in_the_same_state_directory_keeps_the_first_plans_model(tmp_path):
    """A site's model file is named by its plan (issue 36: the next plan overwrote ``STATE/model.json``):
    ``model-<first 16 hex digits of the plan hash>.json``, as its ledger."""
    hp = tree_hp(trees=2)
    first = Fed(tmp_path, hp).start()
    first.fed.run()
    second = Fed(tmp_path, hp.replace(seed=hp.seed + 1)).start()  # the same sites, data and state directories
    second.fed.run()
    assert first.session.exit_code == second.session.exit_code == 0
    assert first.session.model_json != second.session.model_json
    for s in SITES:
        a, b = first.machines[s].stage.model_path, second.machines[s].stage.model_path
        assert a.parent == b.parent == tmp_path / f"state-{s}"
        assert a.read_bytes() == first.session.model_json and b.read_bytes() == second.session.model_json
        assert (a.name, b.name) == (f"model-{first.plan.sha256[:16]}.json", f"model-{second.plan.sha256[:16]}.json")


# --------------------------------------------------------------------------- dropouts and retries


@pytest.mark.parametrize("stage,summed,slack,failed", [
    ("start", ["hosp-a", "hosp-b"], 1, 0),  # s = n − t: two survivors of three still carry σ²
    ("start", ["hosp-a", "hosp-b"], 0, 1),  # s = 0: shares were split 3 ways, so the round is retried by two
    ("consistency", SITES, 0, 0), ("unmask", SITES, 0, 0)])
def test_a_site_dropping_at_any_stage_leaves_a_valid_round(tmp_path, stage, summed, slack, failed):
    slow = {"secagg_fast_path": "never"} if stage != "start" else {}  # a fast round has no later stages
    f = Fed(tmp_path, tree_hp(trees=5), dropout_slack=slack, **slow).start()
    f.fed.run(until=lambda: len(f.session.trees) == 2)
    seen = {"n": 0}

    def intercept(site, ev):
        if site != "hosp-c":
            return True
        if stage == "start" and isinstance(ev, RoundStartMsg):
            f.fed.crash("hosp-c")
            return False
        if isinstance(ev, RoundMsg):
            seen["n"] += 1
            if (stage == "consistency" and seen["n"] == 1) or (stage == "unmask" and seen["n"] == 2):
                f.fed.crash("hosp-c")
                return False
        return True

    f.fed.intercept = intercept
    f.fed.run(until=lambda: len(f.session.trees) == 3)
    assert list(f.session.trees[2].sites) == summed  # who was summed is the public record
    assert f.session.rounds_failed == failed
    f.fed.intercept = None
    f.fed.run()
    assert f.session.exit_code == 0
    assert [t.sites for t in f.session.trees[3:]] == [("hosp-a", "hosp-b")] * 2
    for s in ("hosp-a", "hosp-b"):
        assert f.machines[s].stage.model_path.read_bytes() == f.session.model_json


def test_fewer_than_t_survivors_abort_and_the_round_is_retried_in_a_new_slot(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=4), secagg_fast_path="never").start()  # sites die after their inputs
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    failed_round = {}

    def intercept(site, ev):  # two sites die after sending their masked inputs for tree 1
        if site in ("hosp-b", "hosp-c") and isinstance(ev, RoundMsg):
            failed_round["id"] = f.session.phase.rnd.round_id
            f.fed.crash(site)
            return False
        return True

    f.fed.intercept = intercept
    f.fed.run(until=lambda: f.session.rounds_failed == 1)
    f.fed.intercept = None
    assert len(f.session.trees) == 1  # nothing released
    for s in ("hosp-b", "hosp-c"):
        f.restart_site(s)
    f.fed.run()
    assert f.session.exit_code == 0
    assert f.session.trees[1].round_id > failed_round["id"]  # a new slot: round ids are never reused
    assert f.session.rounds_failed == 1
    # the failed attempt cost every site that sent a masked input one of its accounted contributions
    for s in SITES:
        n = f.db(s).execute("SELECT SUM(with_data) FROM contributions WHERE kind = 'tree'").fetchone()[0]
        assert n <= f.plan.hyperparameters.accounted_rounds
    assert f.db("hosp-b").execute("SELECT COUNT(*) FROM contributions WHERE tree = 1").fetchone()[0] == 2


def test_initial_score_is_contributed_once_a_retry_resends_the_same_vector(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=2), test_noise=True)  # deterministic test noise, so shares are nonzero
    f.start()

    def intercept(site, ev):
        if site in ("hosp-b", "hosp-c") and isinstance(ev, RoundMsg) and f.session.init is None:
            f.fed.crash(site)
            return False
        return True

    f.fed.intercept = intercept
    f.fed.run(until=lambda: f.session.rounds_failed == 1)
    f.fed.intercept = None
    stored = {s: f.db(s).execute("SELECT value FROM meta WHERE key IN ('init_x', 'init_noise') ORDER BY key")
              .fetchall() for s in SITES}
    f.restart_site("hosp-b")  # the retry runs with hosp-a and hosp-b, which both sent before
    f.fed.run(until=lambda: f.session.init is not None)
    f.restart_site("hosp-c")
    f.fed.run()
    assert f.session.exit_code == 0
    assert f.session.init.sites == ("hosp-a", "hosp-b")
    total = np.zeros(2, np.int64)
    for s in SITES:
        rows = f.db(s).execute("SELECT value FROM meta WHERE key IN ('init_x', 'init_noise') ORDER BY key").fetchall()
        assert rows == stored[s]  # the committed vector and noise share never change
        n_init = f.db(s).execute("SELECT COUNT(*) FROM contributions WHERE kind = 'init'").fetchone()[0]
        assert n_init == (2 if s in f.session.init.sites else 1)  # resent: the same noisy vector both times
        if s in f.session.init.sites:
            noise, x = (np.frombuffer(v[0], "<i8") for v in rows)
            assert np.any(noise != 0)
            total += x + noise
    from fedsbdt.common.boosting import init_score

    assert f.session.init.score == init_score(total, "regression", f.plan.encoding)


def test_without_the_filter_no_site_sends_data_in_more_rounds_than_accounted(tmp_path):
    hp = tree_hp(trees=2)
    f = Fed(tmp_path, hp, secagg_fast_path="never").start()  # rounds that fail after every input was sent
    fail_rounds_after_inputs(f, 3)  # the first three tree rounds
    assert f.session.exit_code == 0 and len(f.session.trees) == 2
    for s in SITES:
        rows = f.db(s).execute("SELECT with_data FROM contributions WHERE kind = 'tree' ORDER BY round_id").fetchall()
        sent = [r[0] for r in rows]
        assert sum(sent) <= hp.accounted_rounds  # failed rounds count
        assert len(sent) > hp.accounted_rounds and sent[-1] == 0  # later rounds carried no data


def test_with_the_filter_no_record_exceeds_its_budget_despite_retries(tmp_path):
    """Every attempt of a tree round is charged to the per-record ledger, failed ones included: the
    database holds exactly the sum of every attempt's charges (recorded as the production path computes
    them), the failed attempts charged something, and no record exceeds its budget."""
    hp = tree_hp(trees=3, extra_trees=3, filter=True, subsample=1.0)
    f = Fed(tmp_path, hp, secagg_fast_path="never")  # rounds that fail after every input was sent
    charges: dict[str, list[np.ndarray]] = {}
    for s, m in f.machines.items():
        contribution = m.local.contribution

        def recording(*a, contribution=contribution, s=s, m=m, **k):
            c = contribution(*a, **k)
            charges.setdefault(s, []).append(c.new_spent - m.local.spent)  # this attempt's cost per record
            return c

        m.local.contribution = recording
    f.start()
    for s, m in f.machines.items():
        charges[s] = []  # forget the discarded warm-up contribution of accept_plan (never charged)
    fail_rounds_after_inputs(f, 2)
    assert f.session.exit_code == 0
    budget = filter_for(hp, calibration_for(hp)).budget_units
    assert budget == hp.trees * UNITS_PER_ROUND
    assert f.session.rounds_failed == 2
    for s in SITES:
        m = f.machines[s]
        ledger = f.db(s).execute("SELECT record_id, spent FROM ledger ORDER BY record_id").fetchall()
        spent = dict(ledger)
        attempts = f.db(s).execute("SELECT COUNT(*) FROM contributions WHERE kind = 'tree' AND with_data = 1"
                                   ).fetchone()[0]
        assert attempts == len(charges[s]) > len(f.session.trees)  # the failed attempts carried data too
        total = np.sum(charges[s], axis=0)
        assert [spent[int(i)] for i in m.local.ids] == total.tolist()  # every attempt's charge is in the ledger
        assert np.sum(charges[s][0]) > 0 and np.sum(charges[s][1]) > 0  # the two failed attempts cost something
        assert max(spent.values()) <= budget
        assert max(spent.values()) > 0


# --------------------------------------------------------------------------- site-side privacy rules


def _round_start(f: Fed, site: str, participants, tree: int, offset: int = 1) -> RoundStartMsg:
    """A structurally valid RoundStart for the site's current epoch and a fresh round slot."""
    ep = f.session.coord.epoch(min(f.session.coord.ready_epochs()))
    wm = f.machines[site].secagg._wm.max_round or 0
    r = wm + offset
    assert ep.announce.first_round <= r <= ep.announce.last_round
    start = RoundStart(f.session.coord.config.digest, ep.epoch, r, 2 * f.plan.hyperparameters.leaves,
                       tuple(sorted(participants)))
    return RoundStartMsg(Purpose.TREE, tree, start.to_bytes())


def _counts(f: Fed, s: str):
    db = f.db(s)
    return (db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0],
            db.execute("SELECT SUM(spent) FROM ledger").fetchone()[0],
            db.execute("SELECT COUNT(*) FROM secagg WHERE key LIKE 'round/%'").fetchone()[0])


def test_site_refuses_round_starts_it_must_not_answer(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=6, filter=True, extra_trees=1)).start()
    f.fed.run(until=lambda: f.machines["hosp-a"].trees_applied == 3)
    m = f.machines["hosp-a"]
    assert m.trees_applied == 3
    before = _counts(f, "hosp-a")
    # a tree it has not caught up to: it must fetch the released trees first
    with pytest.raises(NeedCatchUp):
        m.handle(_round_start(f, "hosp-a", SITES, tree=5))
    # a tree that is already released: never contribute to it again
    out = m.handle(_round_start(f, "hosp-a", SITES, tree=1))
    assert isinstance(out[0], Refusal) and "already released" in out[0].detail
    # a participant set without this site, or smaller than t (secure aggregation refuses and records it)
    out = m.handle(_round_start(f, "hosp-a", ["hosp-b", "hosp-c"], tree=3))
    assert isinstance(out[0], Refusal) and "does not include this site" in out[0].detail
    out = m.handle(_round_start(f, "hosp-a", ["hosp-a"], tree=3, offset=2))
    assert isinstance(out[0], Refusal) and "threshold" in out[0].detail
    assert _counts(f, "hosp-a")[:2] == before[:2]  # nothing charged, nothing logged as sent


def test_ledger_and_secagg_input_are_durable_before_the_masked_vector_leaves(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=3, filter=True, extra_trees=1)).start()
    checked = []
    route = f.fed.route

    def route_and_check(site, reply):
        if isinstance(reply, InputReply):
            from fedsbdt.common.secagg import decode_message

            r = decode_message(reply.secagg).round_id
            db = f.db(site)  # a separate connection sees only committed data
            kind = db.execute("SELECT kind FROM contributions WHERE round_id = ?", (r,)).fetchone()
            rec = db.execute("SELECT COUNT(*) FROM secagg WHERE key = ?", (f"round/{r:020d}/input",)).fetchone()
            checked.append((site, r, kind, rec[0]))
        route(site, reply)

    f.fed.route = route_and_check
    f.fed.run()
    assert f.session.exit_code == 0
    assert len(checked) >= 3 * 4
    assert all(kind is not None and rec == 1 for _, _, kind, rec in checked)


def test_a_failed_commit_sends_nothing_and_a_restart_recomputes(tmp_path, monkeypatch):
    f = Fed(tmp_path, tree_hp(trees=3, filter=True, extra_trees=1)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    m = f.machines["hosp-b"]
    before = _counts(f, "hosp-b")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(m.ledger, "log_contribution", boom)
    f.fed.intercept = lambda site, ev: True
    with pytest.raises(OSError):
        f.fed.run(until=lambda: False, max_steps=50)
    assert _counts(f, "hosp-b") == before  # rolled back: no ledger charge, no secagg "input sent" record
    monkeypatch.undo()
    f.fed.crash("hosp-b")
    f.restart_site("hosp-b")
    f.fed.run()
    assert f.session.exit_code == 0


def test_a_restarted_site_resends_its_stored_masked_input_without_a_second_charge(tmp_path):
    from fedsbdt.common.secagg import decode_message

    f = Fed(tmp_path, tree_hp(trees=4, filter=True, extra_trees=1)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 2)
    route = f.fed.route
    seen: dict = {}

    def lossy(site, reply):  # hosp-c dies after committing its masked input, before the bytes leave
        if site == "hosp-c" and isinstance(reply, InputReply) and "lost" not in seen:
            seen["lost"] = reply.secagg
            seen["spent"] = _counts(f, "hosp-c")[1]
            return
        if site == "hosp-c" and isinstance(reply, InputReply) and reply.secagg == seen.get("lost"):
            seen["resent"] = _counts(f, "hosp-c")  # when the same bytes go out again
        route(site, reply)

    f.fed.route = lossy
    f.fed.run(until=lambda: "lost" in seen)
    r = decode_message(seen["lost"]).round_id
    m = f.restart_site("hosp-c")  # a new process joins; the coordinator re-sends the open RoundStart
    f.fed.run()
    assert f.session.exit_code == 0
    assert "resent" in seen  # byte-identical masked input, answered from the secagg record
    assert seen["resent"][1] == seen["spent"]  # ... without charging the ledger again
    rows = f.db("hosp-c").execute("SELECT COUNT(*) FROM contributions WHERE round_id = ?", (r,)).fetchone()[0]
    assert rows == 1
    assert m.stage.model_path.read_bytes() == f.session.model_json


def test_sites_catch_a_coordinator_that_lies_about_trees(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=3)).start()
    f.fed.run(until=lambda: f.machines["hosp-a"].trees_applied == 1 and f.machines["hosp-b"].trees_applied == 1)
    m = f.machines["hosp-a"]
    good = f.session.trees[0]
    nxt = TreeMsg(1, 99, ("hosp-a",), good.features, good.thresholds, good.leaves)  # tree 0's splits as tree 1
    with pytest.raises(SessionAbort, match="public random splits"):
        m.handle(nxt)
    m2 = f.machines["hosp-b"]
    sp = m2.rounds.splits(1)
    big = TreeMsg(1, 99, ("hosp-a",), sp.features, sp.thresholds, np.full(good.leaves.size, 1e6))
    with pytest.raises(SessionAbort, match="leaf values"):
        m2.handle(big)


def test_garbage_from_a_site_is_rejected_and_changes_nothing(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=3)).start()
    f.fed.run(until=lambda: len(f.session.trees) == 1)
    s, now = f.session, f.clock.now
    rng = np.random.default_rng(0)
    for data in (b"", b"FSA", rng.bytes(50), rng.bytes(5000)):
        for call in (lambda d: s.submit_setup("hosp-a", d, now), lambda d: s.submit_round("hosp-a", d, now),
                     lambda d: s.submit_input("hosp-a", Purpose.TREE, 1, d, now)):
            with pytest.raises(Rejected):
                call(data)
    with pytest.raises(Rejected, match="not in the plan's roster"):
        s.join("mallory", 0, now)
    with pytest.raises(Rejected, match="session token"):
        s.authenticate("hosp-a", b"\x00" * 32)
    f.fed.run()
    assert s.exit_code == 0


def test_coordinator_restart_resumes_at_the_next_tree(tmp_path):
    f = Fed(tmp_path, tree_hp(trees=6), store=True).start()
    f.fed.run(until=lambda: len(f.session.trees) == 3)
    trees_before = [t.leaves.tolist() for t in f.session.trees]
    # the coordinator process dies: a new one is built from the same state directory
    f.session.checkpoint.close()
    f.session = f.fed.session = f.new_session()
    assert [t.leaves.tolist() for t in f.session.trees] == trees_before
    for s in SITES:
        f.fed.join(s)
    f.fed.run()
    assert f.session.exit_code == 0
    ref = f.central()  # noise off, all sites throughout: the resumed run is still the engine's model
    assert [t["leaves"] for t in f.model()["trees"]] == [t.leaves.tolist() for t in ref.model.trees]
    assert (f.store_dir / "model.json").read_bytes() == f.session.model_json


def test_a_restarted_coordinator_routes_the_ready_epochs_shares_again(tmp_path):
    """The coordinator dies right after an epoch is ready, before one site got its EpochShares: the restarted
    coordinator builds that epoch's routing from its storage and sends them when the site joins again."""
    from fedsbdt.common.federation.wire import SetupParts

    f = Fed(tmp_path, tree_hp(trees=4), store=True).start()
    lost = []

    def drop_c_shares(site, ev):
        if site == "hosp-c" and isinstance(ev, SetupParts) and not lost:
            lost.append(ev)  # never reaches hosp-c: the coordinator process dies now
            return False
        return True

    f.fed.intercept = drop_c_shares
    f.fed.run(until=lambda: bool(lost))
    assert f.session.coord.ready_epochs()  # the epoch was ready (and stored) when the shares went out
    f.fed.intercept = None
    f.session.checkpoint.close()
    f.session = f.fed.session = f.new_session()
    for s in SITES:
        f.fed.join(s)
    f.fed.run()
    assert f.session.exit_code == 0
    ref = f.central()  # noise off, every site in every tree: hosp-c got its shares from the restored routing
    assert [t["leaves"] for t in f.model()["trees"]] == [t.leaves.tolist() for t in ref.model.trees]


# --------------------------------------------------------------------------- what a site refuses up front


def _machine(f: Fed, site="hosp-a", **opts):
    return SiteMachine(site, f.keys.get(site, Ed25519PrivateKey.generate()), f.paths.get(site, f.paths["hosp-a"]),
                       f.tmp / f"fresh-{site}", f.options(**opts))


def test_site_refusals_before_joining(tmp_path):
    from fedsbdt.common.schema import Schema

    f = Fed(tmp_path, tree_hp())
    plan, data = f.plan.canonical_json, f.plan.sha256
    with pytest.raises(SiteRefusal, match="plan hash mismatch"):
        _machine(f, expected_plan_sha256="0" * 64).accept_plan(plan, data)
    with pytest.raises(SiteRefusal, match="does not match the hash it announces"):
        _machine(f).accept_plan(plan, "1" * 64)
    with pytest.raises(SiteRefusal, match="exceeds this site's limit"):
        _machine(f, max_epsilon=0.5).accept_plan(plan, data)
    with pytest.raises(SiteRefusal, match="not in the plan's roster"):
        _machine(f, site="mallory").accept_plan(plan, data)
    impostor = SiteMachine("hosp-a", Ed25519PrivateKey.generate(), f.paths["hosp-a"], tmp_path / "imp",
                           f.options())
    with pytest.raises(SiteRefusal, match="identity key"):
        impostor.accept_plan(plan, data)
    other = Schema.load(f.tmp.parents[0] / "x.toml") if False else Schema.from_dict(
        {**f.schema.to_dict(), "label_range": [0, 40]})
    with pytest.raises(SiteRefusal, match="schema mismatch"):
        _machine(f, local_schema=other).accept_plan(plan, data)
    with pytest.raises(SiteRefusal, match="test-only randomness"):
        _machine(f, allow_insecure_test_randomness=False).accept_plan(plan, data)
    # a plan whose stated noise does not match its hyperparameters (served consistently hashed)
    d = json.loads(plan)
    d["privacy"]["sigma"] *= 0.5
    from fedsbdt.common.federation.plan import Plan

    lying = Plan.from_dict(d).canonical_json
    import hashlib

    lying_sha = hashlib.sha256(lying).hexdigest()
    with pytest.raises(SiteRefusal, match="states σ"):  # even pinned (the site was told this hash)
        _machine(f, expected_plan_sha256=lying_sha).accept_plan(lying, lying_sha)
    bad = f.tmp / "bad.csv"
    bad.write_text("rid,Sex,Length,Diameter,Height,Whole_weight,Shucked_weight,Viscera_weight,Shell_weight,Rings\n"
                   "1,X,0.4,0.3,0.1,0.5,0.2,0.1,0.15,9\n")
    m = SiteMachine("hosp-a", f.keys["hosp-a"], bad, tmp_path / "badstate", f.options())
    with pytest.raises(SiteRefusal, match="unknown category 'X'"):
        m.accept_plan(plan, data)


def test_site_policy_refusals_write_nothing(tmp_path):
    """No pinned plan, central noise without the opt-in, or a roster / threshold / declared c below the site's
    minimum: refused in accept_plan before the site's database is created (and nothing else happens)."""
    f = Fed(tmp_path, tree_hp())  # n = 3, t = 2, c = 0, distributed noise
    central = make_plan(f.schema, tree_hp(), list(f.plan.sites), randomness="insecure-test", noise="central",
                        max_records_per_site=10_000)
    cases = [
        (f.plan, dict(expected_plan_sha256=None), "no plan was pinned out of band"),
        (central, dict(expected_plan_sha256=central.sha256, policy=SitePolicy()), "pass --allow-central-noise"),
        (f.plan, dict(policy=SitePolicy(min_sites=4)), "has 3 sites (hosp-a, hosp-b, hosp-c), fewer than this "
                                                       "site's --min-sites 4"),
        (f.plan, dict(policy=SitePolicy(min_threshold=3)), "threshold t = 2 is below this site's --min-threshold 3"),
        (f.plan, dict(policy=SitePolicy(min_colluders=1)), "c = 0 colluding sites, fewer than this site's "
                                                           "--min-colluders 1"),
    ]
    for plan, opts, msg in cases:
        m = _machine(f, **opts)
        with pytest.raises(SiteRefusal, match=re.escape(msg)):
            m.accept_plan(plan.canonical_json, plan.sha256)
        assert m.plan is None and not m.finished
        assert not (f.tmp / "fresh-hosp-a").exists(), msg  # no ledger, no state directory
    assert _machine(f, policy=SitePolicy(min_sites=3, min_threshold=2, min_colluders=0)).accept_plan(
        f.plan.canonical_json, f.plan.sha256) == f.plan  # the boundary values are accepted
    with pytest.raises(ConfigError, match="--min-sites must be an integer ≥ 2"):
        SitePolicy(min_sites=1)


# --------------------------------------------------------------------------- noise modes


def test_central_mode_adds_the_full_noise_at_the_coordinator_only(tmp_path):
    """Sites add nothing; the coordinator adds the engine's noise: with the deterministic test source (same
    seed) the federated model is the engine's noisy model, draw for draw."""
    hp = tree_hp(trees=4)
    f = Fed(tmp_path, hp, test_noise=True, noise="central")
    for m in f.machines.values():
        assert m.noise is None and m.init_scales is None
    f.start()
    f.fed.run()
    assert f.session.exit_code == 0
    ds = Dataset.from_arrays(*f._arrays(), f.schema, ids=f.raw["rid"].to_numpy())
    ref = train(ds, hp, InsecureTestRandomness(seed=SEED, noise=True, i_understand_this_is_insecure=True)).model
    fm = f.model()
    assert fm["privacy"]["noise_mode"] == "central"
    assert fm["init_score"] == ref.init_score
    assert [t["leaves"] for t in fm["trees"]] == [t.leaves.tolist() for t in ref.trees]


def test_distributed_mode_each_site_adds_its_share_and_the_sum_is_exact(tmp_path):
    """The released leaves are exactly leaf_values(Σ_sites (leaf sums + noise share)): secure aggregation
    sums exactly and every site added its own share of the scale the plan states."""
    from fedsbdt.common.boosting import leaf_values

    hp = tree_hp(trees=3)
    f = Fed(tmp_path, hp, test_noise=True)
    per_round: dict[int, np.ndarray] = {}
    for s, m in f.machines.items():
        assert np.allclose(m.leaf_scales, f.plan.noise_scales()[0])
        take, contribution = m.noise.take, m.local.contribution

        def take_and_record(k, take=take, s=s):
            v = take(k)
            assert k == 3  # s = 0, every site in every round: the noise is split n = 3 ways
            per_round.setdefault(("noise", s), []).append(v)
            return v

        def contrib_and_record(*a, contribution=contribution, s=s, **k):
            c = contribution(*a, **k)
            per_round.setdefault(("sums", s), []).append(c.sums.copy())
            return c

        m.noise.take = take_and_record
        m.local.contribution = contrib_and_record
    f.start()
    f.fed.run()
    assert f.session.exit_code == 0
    for k, tree in enumerate(f.session.trees):
        total = sum(per_round[("sums", s)][k] + per_round[("noise", s)][k] for s in SITES)
        assert np.array_equal(leaf_values(total, hp, f.plan.encoding), tree.leaves)
        assert all(np.any(per_round[("noise", s)][k] != 0) for s in SITES)


def test_a_state_directory_belongs_to_one_plan(tmp_path):
    from fedsbdt.server.checkpoint import CheckpointError

    f = Fed(tmp_path, tree_hp(trees=2), store=True).start()
    f.fed.run()
    other = Fed(tmp_path / "other", tree_hp(trees=3))
    with pytest.raises(CheckpointError, match="belongs to plan"):
        CoordinatorStore(f.store_dir, other.plan.sha256).load()


def test_the_coordinator_page_shows_a_taking_part_site_caught_up_while_it_runs(tmp_path):
    """Issue 36 item 3: every site read "caught up: no" while running (a site reports its tree count only when it
    joins).  A connected site that held every tree released before it joined receives the later ones with its
    rounds: caught up, holding every released tree; one that left is not."""
    from fedsbdt.server.status import CoordinatorMonitor

    f = Fed(tmp_path, Hyperparameters(trees=6, depth=2, seed=3, epsilon=1.0)).start()
    f.fed.run(until=lambda: len(f.session.trees) >= 3)
    f.fed.crash(SITES[2])
    mon = CoordinatorMonitor(f.session)
    mon._take_snapshot(0.0)
    rows = {r["site_id"]: r for r in mon.current()["sites"]}
    released = len(f.session.trees)
    assert released >= 3
    for s in SITES[:2]:
        assert rows[s]["caught_up"] and rows[s]["trees_applied"] == released, rows[s]
    assert not rows[SITES[2]]["caught_up"] and not rows[SITES[2]]["connected"], rows[SITES[2]]
