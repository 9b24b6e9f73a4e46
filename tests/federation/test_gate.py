"""The site's one privacy gate (client/gate.py), the lifetime ledger (common/lifetime.py) and modes as plug-ins.

Each test performs one finding of the outside review (issue 22) with the in-process state machines: forced
DPBoost retries, an evaluation-only plan asked for training rounds or given another model, forced failures,
ε_eval within --max-epsilon, and a second plan over the lifetime cap.  Privacy is checked against an
independent oracle: dp-accounting's RDP accountant on the releases each record took part in, reconstructed
from the site database with plain SQL.
"""
from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from fedsbdt.client.policy import SitePolicy
from fedsbdt.client.site import SessionAbort, SiteMachine, SiteRefusal
from fedsbdt.common import lifetime
from fedsbdt.common.config import Hyperparameters, builder_defaults
from fedsbdt.common.federation.wire import Purpose, RoundMsg

from .test_state_machines import SITES, Fed, _round_start

ROOT = Path(__file__).resolve().parents[2]
ORDERS = [1 + x / 20 for x in range(1, 100)] + list(range(6, 64)) + [80, 100, 128, 192, 256, 384, 512]


class GateFed(Fed):
    """Fed whose sites take a policy (``policy``) and fail rounds on demand."""

    def __init__(self, tmp_path, hp, policy: SitePolicy | None = None, policies: dict | None = None, **kw):
        self._policy = policy or SitePolicy(allow_central_noise=True)
        self._policies = policies or {}
        super().__init__(tmp_path, hp, **kw)

    def machine(self, s: str):
        m = SiteMachine(s, self.keys[s], self.paths[s], self.tmp / f"state-{s}",
                        self.options(policy=self._policies.get(s, self._policy)))
        m.accept_plan(self.plan.canonical_json, self.plan.sha256)
        return m

    def options(self, **opts):
        opts.setdefault("policy", self._policy)
        return super().options(**opts)

    def fail_each_stage_once(self, stages: set) -> None:
        """Fail one attempt of each (purpose, tree, level) in ``stages`` after every site sent its input."""
        failed: set = set()

        def current():
            w = getattr(self.session.phase, "work", None)
            if w is None:
                return None
            return (Purpose(w.purpose), w.tree, w.level if w.purpose == Purpose.LEVEL else None)

        def intercept(site, ev):
            key = current()
            drop = isinstance(ev, RoundMsg) and site != "hosp-a" and key in stages and key not in failed
            if drop:
                pending.add(key)
            return not drop

        pending: set = set()
        self.fed.intercept = intercept
        while failed != stages and not self.session.done:
            before = self.session.rounds_failed
            self.fed.run(until=lambda: self.session.rounds_failed > before or self.session.done)
            failed |= pending
            pending.clear()
        self.fed.intercept = None
        self.fed.run()


def dp_epsilon(events: list, delta: float) -> float:
    """ε of a composition of dp-accounting events by its RDP accountant."""
    acc = RdpAccountant(ORDERS)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


def dpboost_reads(f: Fed, site: str) -> tuple[np.ndarray, np.ndarray]:
    """(level releases, leaf releases) each record of ``site`` took part in, read with plain SQL from the site's
    lifetime ledger (the records each release read, as bit masks); every release read only records of its
    tree's part (the stored partition), and the contribution log has one data-carrying row per release."""
    db = f.db(site)
    life = sqlite3.connect(f.tmp / f"state-{site}" / "lifetime.sqlite")
    hp = f.plan.hyperparameters
    T_e = hp.ensemble_trees
    n = f.machines[site].local.n
    levels, leaves = np.zeros(n, np.int64), np.zeros(n, np.int64)
    rows = life.execute("SELECT purpose, tree, mask FROM releases WHERE plan_sha256 = ? AND purpose != 'init'",
                        (f.plan.sha256,)).fetchall()
    assert len(rows) == db.execute("SELECT COUNT(*) FROM contributions WHERE with_data = 1 AND kind != 'init'"
                                   ).fetchone()[0]
    for kind, tree, blob in rows:
        read = np.unpackbits(np.frombuffer(blob, np.uint8), count=n).astype(bool)
        part = db.execute("SELECT value FROM meta WHERE key = ?", (f"dpboost_partition/{tree // T_e}",)).fetchone()
        in_part = np.frombuffer(bytes(part[0])[32:], "<u4").astype(np.int64) == tree % T_e
        assert not (read & ~in_part).any()  # a tree reads only its part
        (levels if kind == "level" else leaves)[read] += 1
    return levels, leaves


def dpboost_worst_epsilon(f: Fed, site: str) -> float:
    cal = f.plan.calibration()
    levels, leaves = dpboost_reads(f, site)
    worst = 0.0
    for nl, nf in {(int(a), int(b)) for a, b in zip(levels, leaves)}:
        ev = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(cal.sigma_select / math.sqrt(2)), nl),
              dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(cal.sigma / math.sqrt(2)), nf)]
        worst = max(worst, dp_epsilon(ev, cal.delta))
    return worst


def dpboost_hp(**kw) -> Hyperparameters:
    base = dict(tree_builder="dpboost", trees=8, ensemble_trees=2, depth=2, seed=5, epsilon=4.0, grad_clip=50.0)
    base.update(kw)
    return Hyperparameters(**builder_defaults(base))


# --------------------------------------------------------------------------- (a) DPBoost retries


def test_dpboost_retries_of_one_tree_never_exceed_the_plans_epsilon(tmp_path):
    """One failed attempt of each level and of the leaves of tree 0: the records of part 0 are charged every
    attempt, so they sit out a later tree instead of exceeding ε (main: 4.52 at ε = 4 in the review)."""
    hp = dpboost_hp()
    f = GateFed(tmp_path, hp, secagg_fast_path="never").start()
    stages = {(Purpose.LEVEL, 0, 0), (Purpose.LEVEL, 0, 1), (Purpose.TREE, 0, None)}
    f.fail_each_stage_once(stages)
    assert f.session.exit_code == 0 and f.session.rounds_failed == 3
    eps = f.plan.calibration().epsilon
    for s in SITES:
        levels, leaves = dpboost_reads(f, s)
        assert levels.max() == hp.depth * 4 and leaves.max() == 4  # N_e = 4 ensembles: the schedule, not more
        # only the records that are spent sit out: every attempt still carried the others' data
        assert f.db(s).execute("SELECT COUNT(*) FROM contributions WHERE with_data = 0").fetchone()[0] == 0
        n_part0 = (np.frombuffer(bytes(f.db(s).execute("SELECT value FROM meta WHERE key = 'dpboost_partition/0'"
                                                       ).fetchone()[0])[32:], "<u4") == 0).sum()
        assert (levels == hp.depth * 4).sum() >= n_part0  # tree 0's records used their whole schedule
        assert dpboost_worst_epsilon(f, s) <= eps * (1 + 1e-6)
        # the gate's own account (lifetime ledger) agrees with the reconstruction from the contribution log
        gate = f.machines[s].gate
        assert np.array_equal(gate.spent("level"), levels) and np.array_equal(gate.spent("tree"), leaves)


def test_a_coordinator_failing_tree_0_until_the_caps_run_out_gets_no_more_than_epsilon(tmp_path):
    """The review's 15.0 at ε = 4: tree 0's first level failed again and again.  The site charges each attempt to
    the records of part 0; once they are spent the attempts carry no data; with the failure policy off
    (a large --max-failed-attempts) the coordinator still gets no more than ε."""
    hp = dpboost_hp(trees=4, ensemble_trees=2)
    f = GateFed(tmp_path, hp, policy=SitePolicy(allow_central_noise=True, max_failed_attempts=100),
                secagg_fast_path="never").start()
    from .test_state_machines import fail_rounds_after_inputs

    fail_rounds_after_inputs(f, 6)  # level 0 of tree 0 six times: its part's records have N_e·d = 4 levels
    eps = f.plan.calibration().epsilon
    for s in SITES:
        rows = f.db(s).execute("SELECT with_data FROM contributions WHERE kind = 'level' AND tree = 0 AND level = 0"
                               ).fetchall()
        assert len(rows) == 7 and sum(r[0] for r in rows) == 4  # 4 carried data, then zeros (not charged)
        assert dpboost_worst_epsilon(f, s) <= eps * (1 + 1e-6)


def test_federated_dpboost_charges_its_levels_as_the_gaussians_its_sites_draw(tmp_path):
    """Issue 37, finding 1: `fedsbdt plan --tree-builder dpboost` keeps selection = "exponential" (the central
    builder's setting) while the sites release Gaussian level histograms; main's gate charged every level as
    an exponential-mechanism event of ε = 0, so a record's charges composed to ε 2.74 for a plan of ε 4.0.
    Oracle: dp-accounting on the schedule of one record (N_e·depth levels and N_e leaf releases) at the noise
    multipliers of the full noise the sites draw (per-entry std from the plan's draw, sensitivities from the
    public clip bounds: F gradient entries ≤ g* and F counts ≤ 1 per level, h* and g* per leaf)."""
    from fedsbdt.client.gate import Gate
    from fedsbdt.common.accountant import default_alpha_max, event_epsilon_rdp
    from fedsbdt.common.boosting import leaf_noise_scales
    from fedsbdt.common.federation.plan import SiteEntry, make_plan
    from fedsbdt.common.modes import training_mode
    from fedsbdt.common.schema import Schema

    given = dict(tree_builder="dpboost", epsilon=4.0, trees=4, ensemble_trees=2, depth=2, seed=5)
    hp = Hyperparameters(**builder_defaults(given))
    hp = training_mode(hp).federated_hyperparameters(hp, set(given))  # what `fedsbdt plan` pins
    assert hp.selection == "exponential"
    plan = make_plan(Schema.load(ROOT / "examples" / "abalone" / "schema.toml"), hp,
                     [SiteEntry(s, bytes([i + 1]) * 32) for i, s in enumerate(SITES)], randomness="insecure-test")
    enc = plan.encoding
    level = plan.level_share_scales(0, 0, 1)  # the full level noise the sites draw (one share of one)
    F = plan.greedy_grid.layout(0, 0).features.size
    z_level = 1 / math.sqrt(F * (enc.grad.bound_units / level[0]) ** 2 + F * (1 / level[-1]) ** 2)
    leaf = leaf_noise_scales(hp, enc, plan.calibration().sigma)
    L = hp.leaves
    z_leaf = 1 / math.sqrt((enc.hess.bound_units / leaf[0]) ** 2 + (enc.grad.bound_units / leaf[L]) ** 2)
    n_e = 2  # 4 trees in ensembles of 2: a record is in one tree of each
    oracle = dp_epsilon([dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z_level), n_e * hp.depth),
                         dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z_leaf), n_e)], hp.delta)
    gate = Gate(plan, SitePolicy(), None, tmp_path, "hosp-a")
    charged = event_epsilon_rdp(gate.training_event(), hp.delta, default_alpha_max(hp.epsilon, hp.delta))[0]
    assert oracle == pytest.approx(plan.stated_epsilon, rel=1e-6)
    assert charged == pytest.approx(oracle, rel=1e-6), f"gate ε {charged:.6g}, plan ε {plan.stated_epsilon:.6g}"


# --------------------------------------------------------------------------- (c) failures


def test_a_site_leaves_after_the_policys_failed_attempts_and_says_why(tmp_path, caplog):
    hp = Hyperparameters(trees=4, depth=2, seed=5, epsilon=1.0)
    f = GateFed(tmp_path, hp, policies={"hosp-a": SitePolicy(allow_central_noise=True, max_failed_attempts=1)},
                secagg_fast_path="never").start()  # the others keep the default, 3
    from .test_state_machines import fail_rounds_after_inputs

    with pytest.raises(SessionAbort, match=r"leaving the session: the coordinator failed the tree round of tree 0 2 "
                                           r"times after this site had answered it .*--max-failed-attempts 1"):
        fail_rounds_after_inputs(f, 2)
    m = f.machines["hosp-a"]
    assert m.stage.name == "aborted" and m.finished
    assert f.db("hosp-a").execute("SELECT COUNT(*) FROM contributions WHERE kind = 'tree'").fetchone()[0] == 2
    # the others go on without it; the coordinator's summary does not claim it
    f.fed.intercept = None
    f.fed.crash("hosp-a")
    f.fed.run()
    assert f.session.exit_code == 0 and len(f.session.trees) == hp.total_rounds
    assert f.session.trees_with_data() == {"hosp-a": 0, "hosp-b": 4, "hosp-c": 4}
    assert f.session.data_summary().startswith("trained 4 trees, each released from a sum over at least t = 2 sites; "
                                               "trees per site: hosp-a 0 (none), hosp-b 4, hosp-c 4 (2 of the 3 "
                                               "sites took part in all of them); 3 round(s) failed")


def fail_every_tree(f: Fed, times: int, until=lambda: False) -> None:
    """A hostile coordinator: every attempt of a tree round up to the ``times``-th fails after every site sent its
    masked input (only hosp-a hears what follows), the next one is released — within any per-round limit of
    ``times`` or more.  Runs until the session ends or ``until()``."""
    def intercept(site, ev):
        w = getattr(f.session.phase, "work", None)
        if not isinstance(ev, RoundMsg) or site == "hosp-a" or w is None or w.purpose != Purpose.TREE:
            return True
        return f.machines["hosp-a"].ledger.attempts_any("tree", w.tree) > times  # this attempt's number

    f.fed.intercept = intercept
    f.fed.run(until=until)


def test_a_coordinator_failing_every_tree_the_per_round_limit_is_stopped_by_the_session_limit(tmp_path):
    """Issue 37 finding 6: every tree failed exactly --max-failed-attempts (3) times, then released.  Per round this
    is within the limit; before, every site said "Done" after 24 failed attempts and spent its budget on trees 0–1.
    The session limit (default for 8 trees: 3, the per-round limit) stops each site when tree 1 is asked for a
    second time: 4 failed attempts in all, each site leaves with one line naming what the coordinator did."""
    hp = Hyperparameters(trees=8, depth=2, seed=5, epsilon=1.0)
    f = GateFed(tmp_path, hp, secagg_fast_path="never").start()
    assert SitePolicy().session_failure_limit(f.plan) == 3
    left = []
    for _ in SITES:
        with pytest.raises(SessionAbort) as e:
            fail_every_tree(f, 3)
        site = next(s for s in SITES if s not in left and f.machines[s].stage.name == "aborted")
        assert str(e.value) == ("leaving the session: the coordinator failed 4 rounds of this session after this "
                                "site had answered them (it released nothing) and asks for the tree round of tree 1 "
                                "again; each retry that carries data spends privacy budget, so this site stops at "
                                "--max-failed-attempts-per-session 3")
        left.append(site)
        f.fed.crash(site)
    for s in SITES:  # nothing sent after the limit: tree 0 four times, tree 1 once
        rows = f.db(s).execute("SELECT tree, COUNT(*) FROM contributions WHERE kind = 'tree' GROUP BY tree").fetchall()
        assert rows == [(0, 4), (1, 1)]
        assert f.machines[s].ledger.failed_attempts() == 3  # (tree 1's attempt is known failed once it is asked again)


def test_the_session_failure_count_survives_a_restart(tmp_path):
    """The count is the site's ledger's (every masked input after the first of its stage), so a site restarted
    between failures leaves at the same point as one that was not: trees 0 and 1 failed once each, every site
    restarted, tree 2 failed once → the third failure is one more than --max-failed-attempts-per-session 2."""
    hp = Hyperparameters(trees=6, depth=2, seed=5, epsilon=1.0)
    f = GateFed(tmp_path, hp, policy=SitePolicy(allow_central_noise=True, max_failed_attempts_per_session=2),
                secagg_fast_path="never").start()
    fail_every_tree(f, 1, until=lambda: len(f.session.trees) >= 2)
    assert f.session.rounds_failed == 2
    for s in SITES:
        f.restart_site(s)  # a new process on the same state directory
    with pytest.raises(SessionAbort, match=r"^leaving the session: the coordinator failed 3 rounds of this session "
                                           r".* the tree round of tree 2 again; .*--max-failed-attempts-per-session 2$"):
        fail_every_tree(f, 1)


def test_the_budget_warning_is_given_once_per_round_not_once_per_failed_attempt(tmp_path, caplog):
    """Finding 6's second half: with the session limit off, the same coordinator spends every record's 8 tree
    releases on trees 0–1 (4 attempts each); trees 2–7 carry no data from any site.  The operator is told once per
    such tree (was: once per attempt, 24 times), and the receipt lists the same trees."""
    hp = Hyperparameters(trees=8, depth=2, seed=5, epsilon=1.0)
    f = GateFed(tmp_path, hp, policy=SitePolicy(allow_central_noise=True, max_failed_attempts_per_session=100),
                secagg_fast_path="never").start()
    with caplog.at_level(logging.WARNING, logger="fedsbdt.site"):
        fail_every_tree(f, 3)
    assert f.session.exit_code == 0 and f.session.rounds_failed == 24
    for s in SITES:
        told = [(r.kind, r.tree) for r in caplog.records
                if getattr(r, "event", None) in ("budget_exhausted", "records_spent") and r.site == s]
        assert told == [("tree", t) for t in range(2, 8)], told
        assert f.machines[s].receipt()["trees_without_data"] == list(range(2, 8))


def test_the_default_failure_policy_is_small():
    assert SitePolicy().max_failed_attempts == 3
    with pytest.raises(Exception, match="max-failed-attempts"):
        SitePolicy(max_failed_attempts=-1)
    with pytest.raises(Exception, match="max-failed-attempts-per-session"):
        SitePolicy(max_failed_attempts_per_session=-1)
    # the session's limit: a tenth of the plan's trees, at least the per-round limit; an explicit value wins
    from fedsbdt.common.federation.plan import make_plan

    for trees, want in ((8, 3), (30, 3), (31, 4), (100, 10), (1000, 100)):
        plan = make_plan(*_tiny_plan_args(trees))
        assert SitePolicy().session_failure_limit(plan) == want, trees
        assert SitePolicy(max_failed_attempts=5).session_failure_limit(plan) == max(5, want)
        assert SitePolicy(max_failed_attempts_per_session=0).session_failure_limit(plan) == 0


def _tiny_plan_args(trees: int):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedsbdt.common.federation.plan import SiteEntry

    from .conftest import abalone_with_ids

    schema, _ = abalone_with_ids(30)
    sites = [SiteEntry(s, Ed25519PrivateKey.generate().public_key().public_bytes_raw()) for s in SITES]
    return schema, Hyperparameters(trees=trees, depth=2, seed=1, epsilon=1.0), sites


def test_summaries_say_how_many_trees_carried_data_from_which_site(tmp_path):
    hp = Hyperparameters(trees=3, depth=2, seed=5, epsilon=1.0)
    f = GateFed(tmp_path, hp, secagg_fast_path="never").start()
    from .test_state_machines import fail_rounds_after_inputs

    fail_rounds_after_inputs(f, 1)  # one failed attempt: every site's last tree carries no data
    assert f.session.exit_code == 0
    data = f.session.trees_with_data()
    assert data == {s: len(f.session.trees) for s in SITES}  # every site was in every released sum
    summary = f.session.data_summary()  # every site was in every sum, but not every sum carried its data
    assert summary.startswith("trained 3 trees, each released from a sum over at least t = 2 sites; trees per "
                              "site: hosp-a 3, hosp-b 3, hosp-c 3 (every site took part in all of them)") and \
        summary.endswith("; 1 round(s) failed, and each one a site had answered spent one of the releases this plan "
                         "schedules for its records, so up to 1 of the last trees may carry no data from such a site "
                         "(its receipt lists them)"), summary
    for s in SITES:
        receipt = f.machines[s].receipt()
        assert receipt["trees"] == 3 and receipt["trees_with_data"] == 2 and receipt["failed_attempts"] == 1
        assert receipt["trees_without_data"] == [2]


# --------------------------------------------------------------------------- (b) evaluation-only plans


def _eval_only(tmp_path):
    from .test_fed_eval_machines import EvalFed
    from fedsbdt.common.data import load
    from fedsbdt.common.engine import train
    from fedsbdt.common.randomness import InsecureTestRandomness
    from .conftest import abalone_with_ids

    hp = Hyperparameters(trees=3, depth=2, seed=5, epsilon=1.0)
    schema, raw = abalone_with_ids(900)
    train_file = tmp_path / "train.csv"
    raw.iloc[:300].to_csv(train_file, index=False)
    rnd = InsecureTestRandomness(seed=1, noise=False, i_understand_this_is_insecure=True)
    model = train(load(train_file, schema), hp, rnd).model
    return EvalFed(tmp_path / "fed", hp=hp, eval_epsilon=0.5, test_noise=False, model=model), model


@pytest.mark.parametrize("purpose", [Purpose.TREE, Purpose.INIT_SCORE, Purpose.LEVEL, Purpose.SKETCH])
def test_an_evaluation_only_plan_refuses_every_training_round(tmp_path, purpose):
    g, _ = _eval_only(tmp_path)
    g.start().fed.run(until=lambda: bool(g.session.coord.ready_epochs()))
    m = g.machines["hosp-a"]
    ev = _round_start(g, "hosp-a", SITES, 0)
    ev = type(ev)(purpose, 0, ev.secagg, 0)
    before = g.db("hosp-a").execute("SELECT COUNT(*) FROM secagg WHERE key LIKE 'round/%'").fetchone()[0]
    out = m.handle(ev)
    assert len(out) == 1 and "not in this plan's schedule (mode evaluation: EVAL)" in out[0].detail
    db = g.db("hosp-a")
    assert db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM secagg WHERE key LIKE 'round/%'").fetchone()[0] == before
    assert not any(m.ledger.all_spent().values())


def test_a_substituted_model_is_refused_before_the_evaluation_and_at_finished(tmp_path, monkeypatch):
    """A coordinator releases another model's trees (same public splits, other leaves) in an evaluation-only
    plan: every site refuses before it computes its evaluation input, and at Finished."""
    from fedsbdt.common.federation import release
    from fedsbdt.common.federation.wire import FinishedMsg
    from fedsbdt.common.model import Tree
    from fedsbdt.server.session import Session

    g, model = _eval_only(tmp_path)
    other = model.__class__(model.schema, model.hyperparameters, model.init_score, list(model.trees))
    t0 = other.trees[0]
    other.trees[0] = Tree(t0.features, t0.thresholds, np.asarray(t0.leaves) + 0.25, t0.default_left)
    with pytest.raises(ValueError, match="not the ones the plan pins"):  # the honest coordinator's own check
        release.released_from_model(g.plan, other, g.plan.eval_model_sha256)
    monkeypatch.setattr(release, "model_content_sha256", lambda m: g.plan.eval_model_content_sha256)
    released = release.released_from_model(g.plan, other, g.plan.eval_model_sha256)  # a lying coordinator
    monkeypatch.undo()
    g.session = g.fed.session = Session(g.plan, g.plan.make_randomness(True), g.clock.now, released=released)
    computed = []
    monkeypatch.setattr("fedsbdt.client.site.eval_input", lambda *a, **k: computed.append(a))
    with pytest.raises(SessionAbort, match="another model than the plan pins"):
        g.start().fed.run()
    assert not computed and g.machines["hosp-a"].ledger.eval_vector() is None
    m = g.machines["hosp-b"]  # applied the substituted trees at join; the coordinator now says Finished
    assert len(m.trees) == 3 and not m.finished
    sha = release.model_sha256(release.build_model(g.plan, m.init, m.trees))
    with pytest.raises(SessionAbort, match="another model than the plan pins"):
        m.handle(FinishedMsg(sha, len(m.trees)))
    assert not any((tmp_path / "fed" / "state-hosp-b").glob("model*.json"))


# --------------------------------------------------------------------------- (d) ε_eval within --max-epsilon


def test_eval_epsilon_counts_within_max_epsilon_and_max_eval_epsilon_has_a_default(tmp_path):
    from .test_fed_eval_machines import EvalFed
    from fedsbdt.client.site import SiteMachine, SiteOptions

    g = EvalFed(tmp_path, hp=Hyperparameters(trees=2, depth=2, seed=5, epsilon=1.0), eval_epsilon=0.5)
    assert SiteOptions().max_eval_epsilon == 1.0
    for opts, match in (({"max_epsilon": 1.2}, r"ε = 1 \+ ε_eval = 0.5 = 1.5 exceeds .*--max-epsilon 1.2"),
                        ({"max_eval_epsilon": 0.4}, "--max-eval-epsilon 0.4")):
        m = SiteMachine("hosp-a", g.keys["hosp-a"], g.paths["hosp-a"], tmp_path / "x",
                        g.options(eval_data=g.eval_paths["hosp-a"], **opts))
        with pytest.raises(SiteRefusal, match=match):
            m.accept_plan(g.plan.canonical_json, g.plan.sha256)
    from fedsbdt.common.federation.plan import SiteEntry, make_plan

    plan2 = make_plan(g.schema, g.plan.hyperparameters, [SiteEntry(s, g.keys[s].public_key().public_bytes_raw())
                                                         for s in SITES], randomness="insecure-test", test_seed=1,
                      max_records_per_site=10_000, eval_epsilon=1.5)
    m = SiteMachine("hosp-a", g.keys["hosp-a"], g.paths["hosp-a"], tmp_path / "y",
                    g.options(eval_data=g.eval_paths["hosp-a"], expected_plan_sha256=plan2.sha256))
    with pytest.raises(SiteRefusal, match="--max-eval-epsilon 1;"):  # the default
        m.accept_plan(plan2.canonical_json, plan2.sha256)


# --------------------------------------------------------------------------- (e) the lifetime ledger


def random_events_dp(plan, n_trees: int) -> list:
    cal, hp = plan.calibration(), plan.hyperparameters
    ev = [dp_accounting.LaplaceDpEvent(1 / e) for e in (cal.eps_init, cal.eps_ds) if e > 0]
    tree = dp_accounting.PoissonSampledDpEvent(hp.subsample, dp_accounting.GaussianDpEvent(cal.sigma / math.sqrt(2)))
    return ev + [dp_accounting.SelfComposedDpEvent(tree, n_trees)]


def test_a_second_plan_over_the_lifetime_cap_is_refused_and_the_total_matches_dp_accounting(tmp_path):
    hp = Hyperparameters(trees=2, depth=2, seed=5, epsilon=1.0, init_share=0.0)
    # the lifetime at the plans' own δ here, so that one plan's lifetime ε is the plan's ε
    policy = SitePolicy(allow_central_noise=True, lifetime_epsilon=1.1, lifetime_delta=hp.delta)
    f = GateFed(tmp_path, hp, policy=policy).start()
    f.fed.run()
    assert f.session.exit_code == 0
    lt = lifetime.LifetimeLedger(tmp_path / "state-hosp-a")
    (ds,) = lt.datasets()
    assert ds["population"] == "default" and ds["keyed"]
    total = lt.lifetime(delta=hp.delta)  # the site's one account
    rel = lt.releases()
    assert [r["purpose"] for r in rel] == ["tree", "tree"] and all(r["plan_sha256"] == f.plan.sha256 for r in rel)
    oracle = dp_epsilon(random_events_dp(f.plan, 2), hp.delta)
    assert total.epsilon == pytest.approx(oracle, rel=0.02) and total.epsilon >= oracle * (1 - 1e-9)
    assert total.epsilon <= f.plan.calibration().epsilon * (1 + 1e-9)
    # a second plan on the same file (another seed: another plan hash) would bring the records past 1.1 (two plans of ε = 1 compose to about 1.13)
    hp2 = hp.replace(seed=6)
    f2 = GateFed(tmp_path / "second", hp2, policy=policy)
    from fedsbdt.client.site import SiteMachine

    m = SiteMachine("hosp-a", f2.keys["hosp-a"], f.paths["hosp-a"], tmp_path / "state-hosp-a",
                    f2.options(policy=policy))
    with pytest.raises(SiteRefusal, match=r"lifetime ε of this site's records \(population default\) to 1\.12\d+ at "
                                          r"--lifetime-delta 5e-08 \(now 1: .*--lifetime-epsilon 1.1"):
        m.accept_plan(f2.plan.canonical_json, f2.plan.sha256)
    assert len(lifetime.LifetimeLedger(tmp_path / "state-hosp-a").releases()) == 2  # nothing charged
    # with a larger cap it joins, and the lifetime composes both plans (dp-accounting: 4 trees)
    m = SiteMachine("hosp-a", f2.keys["hosp-a"], f.paths["hosp-a"], tmp_path / "state-hosp-a",
                    f2.options(policy=SitePolicy(allow_central_noise=True, lifetime_epsilon=3.0)))
    m.accept_plan(f2.plan.canonical_json, f2.plan.sha256)
    m.gate.charge("tree", None, 0, None, 1)
    m.gate.charge("tree", None, 1, None, 2)
    lt = lifetime.LifetimeLedger(tmp_path / "state-hosp-a")
    both = lt.lifetime(delta=hp.delta).epsilon
    assert both == pytest.approx(dp_epsilon(random_events_dp(f.plan, 4), hp.delta), rel=0.02)


def test_the_ledger_command_lists_every_release_and_the_lifetime(tmp_path):
    from fedsbdt.cli import main

    lt = lifetime.LifetimeLedger(tmp_path)
    key = lt.record_set("default", lifetime.RecordSource("d.csv", "ab" * 32, np.arange(10), keyed=True))
    lt.charge(key, "tree", {"type": "gaussian", "noise_multiplier": 2.0}, 1e-6, np.arange(10) < 4, "p" * 64, 0, None, 7)
    lt.charge(key, "train", {"type": "approx", "epsilon": 0.5, "delta": 1e-7}, 1e-7)
    lt.close()
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ledger", "--state", str(tmp_path), "--json", "--releases"]) == 0
    d = json.loads(out.getvalue())
    (acct,) = d["populations"]
    assert [r["purpose"] for r in acct["releases"]] == ["tree", "train"]
    assert acct["releases"][0]["records"] == 4 and acct["releases"][0]["plan_sha256"] == "p" * 64
    assert acct["lifetime"]["delta"] == 1e-6 == d["lifetime_delta"]  # the lifetime δ, whatever the releases'
    # the (ε, δ) release spends its δ from the lifetime δ: the Gaussian converted at 1e-6 − 1e-7, plus its ε
    g = dp_epsilon([dp_accounting.GaussianDpEvent(2.0)], 1e-6 - 1e-7)
    assert acct["lifetime"]["epsilon"] == pytest.approx(g + 0.5, rel=0.02)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ledger", "--state", str(tmp_path), "--releases"]) == 0
    text = out.getvalue()
    assert "lifetime" in text and "tree 0" in text and "4 records" in text
    assert main(["ledger", "--state", str(tmp_path / "nothing")]) == 2


# --------------------------------------------------------------------------- the architecture


#: any identifier, word or path that names a tree builder (greedy_levels, sarus_site, dpboost_rounds, --tree-builder, …)
BUILDERS = re.compile(r"[a-z_]*(greedy|dpboost|sarus|tree_builder|treebuilder|tree-builder)[a-z_]*", re.IGNORECASE)


def test_client_and_server_name_no_tree_builder():
    """Modes are plug-ins (common/modes): no file under client/ or server/ names a tree builder — not in code,
    comments, strings or SQL (main had 96 under client/ and 49 under server/)."""
    counts = {}
    for d in ("client", "server"):
        for p in sorted((ROOT / d).rglob("*.py")):
            n = len(BUILDERS.findall(p.read_text()))
            if n:
                counts[str(p.relative_to(ROOT))] = n
    assert counts == {}, counts
