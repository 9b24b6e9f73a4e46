"""The privacy conformance suite: every registered mode, charged exactly what its sites release (issue 37).

For every mode in the registry (``fedsbdt.common.modes.registered()``: a newly registered mode gets this suite
for free) a small in-process federation runs — cleanly, and with forced round failures that the coordinator
retries — while an **independent observer** watches what the sites actually do, at the functions that sum
records into a vector and the sampler that draws noise (wrapped and called through, never replaced):

* which records each masked input summed (the record mask the summing function was given; its output must be
  the very vector that entered secure aggregation), and from which Poisson subsample draw (rate, population);
* the noise scale actually drawn for each input, and which sites' inputs shared a round.

From these observations alone — the oracle reads neither the gate, the ledger, the mode's declarations nor
the plan's calibration — it computes each record's RDP curve with dp-accounting (``GaussianDpEvent``,
``PoissonSampledDpEvent``, ``ComposedDpEvent``; a discrete Laplace of ε = Δ/b as ``RandomizedResponseDpEvent``,
the tight RDP bound of every ε-DP mechanism, docs/privacy.md "Initial score").  The sensitivities are the
public clip bounds of each release's wire layout (:data:`SENSITIVITY`, written from the papers and
docs/*.md, sharing no code with the modes): a mode without an entry fails the suite until its layout is
described here.  The noise a release is credited with: for tree, level and sketch rounds the honest shares of
every site that sent an input to the round (the plan's c colluders' largest shares removed); for the initial
score and the evaluation a site's own full share (each site's release is ε-DP on its own,
docs/federated-evaluation.md, docs/privacy.md).

The suite then requires, per record, **gate charges = independent count = plan statement**: the lifetime
ledger's rows (plain SQL) charge every record exactly the releases the observer saw it in, kind by kind; the
ledger's RDP curve equals the oracle's at every order (relative 1e-6); and the worst record's ε (Cor. 6 over
integer orders, dp-accounting's conversion) equals the plan's stated ε (and ε_eval) to 1e-6.
``benchmarks/conformance.py`` prints the same numbers as a table (benchmarks/results/conformance.json).
"""
from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedsbdt.common import kernels_numpy, modes
from fedsbdt.common.boosting import LocalData
from fedsbdt.common.config import ConfigError, Hyperparameters, builder_defaults
from fedsbdt.common.fed_eval import SUM_UNITS, EvalSpec
from fedsbdt.common.modes.dpboost import rounds as dpboost_rounds
from fedsbdt.common.modes.sarus.rounds import SarusGrid
from fedsbdt.common.federation.wire import InputReply, Purpose
from fedsbdt.common.modes.greedy import site as greedy_site
from fedsbdt.common.randomness import InsecureTestRandomness

from .conftest import abalone_with_ids
from .test_fed_eval_machines import EvalFed
from .test_state_machines import Fed, fail_rounds_after_inputs

#: RDP orders the curves are compared at and ε is minimised over (integers, as the plan's accountant uses)
ORDERS = list(range(2, 513))
#: the wire purposes' release kinds (the lifetime ledger's ``purpose`` column)
KIND = {Purpose.INIT_SCORE: "init", Purpose.SKETCH: "sketch", Purpose.LEVEL: "level", Purpose.TREE: "tree",
        Purpose.EVAL: "eval"}
#: releases whose every site adds a full share: credited with the site's own share only
OWN_SHARE = {Purpose.INIT_SCORE, Purpose.EVAL}
#: small, fast settings per known mode; any other tree builder runs on FALLBACK
FAST = {"random": dict(trees=3, depth=2, epsilon=1.0),
        "greedy": dict(trees=2, depth=2, epsilon=2.0),
        "dpboost": dict(trees=4, ensemble_trees=2, depth=2, epsilon=4.0, grad_clip=50.0),
        "sarus": dict(trees=2, depth=2, epsilon=3.0)}
FALLBACK = dict(trees=2, depth=2, epsilon=2.0)
ROWS = 150  # 50 training records per site


# --------------------------------------------------------------------------- the oracle's sensitivities


def _leaves_hg(plan, s):
    """S-BDT leaves ``[Hessian sum per leaf | gradient sum per leaf]`` (paper Alg. 5; DPBoost's counts enter as h*
    units): a record changes one leaf's Hessian sum by ≤ h* and its gradient sum by ≤ g* (units)."""
    L, enc = plan.hyperparameters.leaves, plan.encoding
    return [(s[:L].min(), enc.hess.bound_units), (s[L:].min(), enc.grad.bound_units)]


def _level(count_units):
    """Level histograms ``[gradient bins | count bins]`` (docs/greedy.md, docs/sarus.md): a record is in one node
    and, per feature, in one bin: F gradient entries ≤ g* units and F count entries ≤ ``count_units``."""
    def spec(plan, s):
        F, g, half = plan.schema.n_features, plan.encoding.grad.bound_units, s.size // 2
        C = count_units(plan)
        return [(s[:half].min(), math.sqrt(F) * g), (s[half:].min(), math.sqrt(F) * C)]
    return spec


def _sarus_leaves(plan, s):
    """Sarus leaves ``[gradient sum per leaf | count per leaf]`` (counts in units of C = g* units)."""
    L, g = plan.hyperparameters.leaves, plan.encoding.grad.bound_units
    return [(s[:L].min(), g), (s[L:].min(), g)]


def _sketch(plan, s):
    """A Sarus sketch: per numeric feature one fine bin gains C = g* units (docs/sarus.md "Federation")."""
    m = sum(not f.is_categorical for f in plan.schema.features)
    return [(s.min(), math.sqrt(m) * plan.encoding.grad.bound_units)]


def _init(plan, s):
    """The initial score ``[count, clipped label sum]`` (paper Alg. 3): L1 changes 1 and ≤ m* units."""
    assert plan.schema.task != "multiclass", "the oracle knows the binary / regression initial score only"
    return [(s[0], 1.0), (s[1], plan.encoding.label.bound_units)]


def _eval(plan, s):
    """A regression evaluation ``[n(b) per bin | Σ|r| | Σr²]`` (docs/federated-evaluation.md): one count by 1,
    each sum by ≤ Q = SUM_UNITS."""
    assert plan.schema.task == "regression", "the oracle knows the regression evaluation's layout only"
    B = plan.eval_bins
    return [(s[:B].min(), 1.0), (s[B], SUM_UNITS), (s[B + 1], SUM_UNITS)]


#: (mode, purpose) → the touched entries of a worst-case record: [(smallest noise scale there, bound), …]
SENSITIVITY = {
    ("random", Purpose.TREE): _leaves_hg,
    ("greedy", Purpose.LEVEL): _level(lambda plan: 1), ("greedy", Purpose.TREE): _leaves_hg,
    ("dpboost", Purpose.LEVEL): _level(lambda plan: 1), ("dpboost", Purpose.TREE): _leaves_hg,
    ("sarus", Purpose.SKETCH): _sketch, ("sarus", Purpose.LEVEL): _level(lambda p: p.encoding.grad.bound_units),
    ("sarus", Purpose.TREE): _sarus_leaves,
}
ANY_MODE = {Purpose.INIT_SCORE: _init, Purpose.EVAL: _eval}


def touched(mode: str, purpose: Purpose, plan, scales: np.ndarray):
    spec = ANY_MODE.get(purpose) or SENSITIVITY.get((mode, purpose))
    if spec is None:
        pytest.fail(f"the conformance oracle has no sensitivity for mode {mode!r}'s {purpose.name} releases: "
                    "describe their wire layout (which entries one record changes, by how much) in SENSITIVITY")
    return spec(plan, np.asarray(scales, np.float64))


# --------------------------------------------------------------------------- the observer


@dataclass
class Draw:
    site: int  # id() of the randomness object that drew it
    rate: float
    round_id: int
    mask: np.ndarray


@dataclass
class Input:
    """One masked input a site sent, as observed."""

    site: str
    round_id: int
    purpose: Purpose
    tree: int
    level: int | None
    x: np.ndarray
    noise: tuple[str, np.ndarray] | None  # (mechanism, share scales) as drawn; None: no fresh noise drawn
    records: np.ndarray | None  # the records the summing function was given (None: it summed nothing)
    population: np.ndarray | None = None  # a Poisson subsample's population (None: not subsampled)
    draw: Draw | None = None
    replay: bool = False


@dataclass
class Observer:
    """Wraps the samplers and summing functions (calling through) and every site's masked input."""

    monkeypatch: object
    draws: dict = field(default_factory=dict)  # id(array) -> (mechanism, scales, array)
    samples: list = field(default_factory=list)  # Draw
    pending: list = field(default_factory=list)  # (records, output, sampled array or None, population or None)
    inputs: list = field(default_factory=list)
    sites: dict = field(default_factory=dict)  # site -> SiteMachine

    def install(self) -> "Observer":
        mp, obs = self.monkeypatch, self

        def sampler(name, mech):
            orig = getattr(InsecureTestRandomness, name)

            def draw(rnd, scales):
                out = orig(rnd, scales)
                obs.draws[id(out)] = (mech, np.array(scales, np.float64, copy=True), out)
                return out
            mp.setattr(InsecureTestRandomness, name, draw)

        sampler("discrete_gaussian", "gaussian")
        sampler("discrete_laplace", "laplace")
        orig_sub = InsecureTestRandomness.subsample

        def subsample(rnd, p, ids, round_id):
            out = orig_sub(rnd, p, ids, round_id)
            obs.samples.append(Draw(id(rnd), float(p), int(round_id), np.asarray(out, bool).copy()))
            obs.draws[id(out)] = ("sample", obs.samples[-1], out)
            return out
        mp.setattr(InsecureTestRandomness, "subsample", subsample)

        def summing(owner, name, read):
            """Wrap ``owner.name``; ``read(args, out)`` gives (records summed, vector, sampled array, population)."""
            orig = getattr(owner, name)

            def wrapped(*args, **kw):
                out = orig(*args, **kw)
                obs.pending.append(read(args, kw, out))
                return out
            mp.setattr(owner, name, wrapped)

        def round_sums(a, kw, out):  # (leaf, pred, y, task, scale, g, h, sampled, available, leaves, filter, grads)
            sampled, available = a[7], a[8]
            assert a[10] is None, "the suite runs without the individual filter"
            population = np.ones(len(sampled), bool) if available is None else np.asarray(available, bool)
            return np.asarray(sampled, bool) & population, out[0], sampled, population

        summing(kernels_numpy, "round_sums", round_sums)
        summing(LocalData, "init_sums", lambda a, kw, out: (np.asarray(a[0].arrival) <= 0, out, None, None))
        summing(greedy_site, "level_sums", lambda a, kw, out: (np.asarray(a[3], bool), out, None, None))
        summing(dpboost_rounds, "leaf_sums", lambda a, kw, out: (np.asarray(a[2], bool), out, None, None))
        summing(SarusGrid, "sketch_vector", lambda a, kw, out: (np.asarray(a[2], bool), out, "sarus", None))
        summing(SarusGrid, "level_vector", lambda a, kw, out: (np.asarray(a[4], bool), out, "sarus", None))
        summing(SarusGrid, "leaf_vector", lambda a, kw, out: (np.asarray(a[3], bool), out, "sarus", None))
        summing(EvalSpec, "histogram", lambda a, kw, out: (np.ones(len(a[1]), bool), out, None, None))
        return self

    def watch(self, machines: dict) -> None:
        """Wrap every site's round handler and masked input (instance attributes: the mode's rounds call them)."""
        for sid, m in machines.items():
            self.sites[sid] = m
            self.pending.clear()  # the warm-up's contribution (nothing sent)
            handle, masked_input = m.handle, m.masked_input

            def on_handle(ev, _h=handle):
                self.pending.clear()
                return _h(ev)

            def on_input(ev, start, x, noise=None, record=None, _m=masked_input, _s=sid):
                replies = _m(ev, start, x, noise, record)
                if x is not None and isinstance(replies[0], InputReply):
                    self.observe(_s, ev, start, x, noise)
                self.pending.clear()
                return replies
            m.handle, m.masked_input = on_handle, on_input

    def observe(self, sid: str, ev, start, x, noise) -> None:
        x = np.asarray(x, np.int64).copy()
        drawn = None
        if noise is not None and id(noise) in self.draws and self.draws[id(noise)][2] is noise:
            drawn = self.draws[id(noise)][:2]
        inp = Input(sid, int(start.round_id), Purpose(ev.purpose), int(ev.tree),
                    ev.level if ev.purpose == Purpose.LEVEL else None, x, drawn, None)
        if not self.pending:
            earlier = [i for i in self.inputs if i.site == sid and i.purpose == inp.purpose and i.tree == inp.tree]
            if drawn is None and x.any() and any(np.array_equal(i.x, x) for i in earlier):
                inp.replay = True  # the stored vector (and its stored noise) of an earlier attempt, resent
            elif x.any():
                pytest.fail(f"{sid} sent a data-carrying {inp.purpose.name} input (round {inp.round_id}) that no "
                            "observed summing function computed: add the mode's summing function to the observer")
            self.inputs.append(inp)
            return
        records, out, sampled, population = self.pending[-1]
        assert np.array_equal(np.asarray(out, np.int64), x), "the observed sum is not the vector that was sent"
        inp.records = np.asarray(records, bool).copy()
        rnd = id(self.sites[sid].randomness)
        if isinstance(sampled, np.ndarray) and id(sampled) in self.draws:
            inp.draw, inp.population = self.draws[id(sampled)][1], population.copy()
        elif sampled == "sarus":  # the tree's subsample, drawn once and reloaded from the site's database
            cand = [d for d in self.samples if d.site == rnd and d.round_id == inp.tree
                    and not (inp.records & ~d.mask).any()]
            assert cand, f"{sid}: a Sarus input of tree {inp.tree} whose records come from no observed subsample"
            inp.draw = cand[0]
            inp.population = self.sites[sid].local.arrival <= inp.tree
        if inp.draw is not None and inp.draw.rate >= 1.0:  # a "subsample" of rate 1 is every record
            inp.draw = inp.population = None
        self.inputs.append(inp)


# --------------------------------------------------------------------------- dp-accounting


def _relation(ev) -> str:
    return "replace" if "RandomizedResponse" in repr(ev) else "add_remove"


_CURVES: dict = {}


def rdp_curve(ev) -> np.ndarray:
    """dp-accounting's RDP curve of ``ev`` at :data:`ORDERS` (an empty composition: zeros)."""
    key = repr(ev)
    if key not in _CURVES:
        rel = (dp_accounting.NeighboringRelation.REPLACE_ONE if _relation(ev) == "replace"
               else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        acc = RdpAccountant(ORDERS, rel)
        acc.compose(ev)
        _CURVES[key] = np.asarray(acc._rdp, np.float64).copy()  # the curve itself (no public getter)
    return _CURVES[key]


def pure(eps: float):
    """An ε-DP release, charged the RDP of binary randomized response (tight over all ε-DP mechanisms)."""
    return dp_accounting.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(eps)), 2)


def from_ledger(d: dict):
    """A lifetime-ledger event (its JSON) as a dp-accounting event (written here, not the ledger's parser)."""
    t = d["type"]
    if t == "gaussian":
        return dp_accounting.GaussianDpEvent(d["noise_multiplier"])
    if t == "poisson":
        return dp_accounting.PoissonSampledDpEvent(d["rate"], from_ledger(d["event"]))
    if t == "laplace":
        return pure(d["epsilon"])
    if t == "exponential":
        if d["epsilon"] == 0:
            return dp_accounting.NoOpDpEvent()
        pytest.fail(f"an exponential-mechanism charge ({d}) in a federation, where no party holds exact gains")
    if t == "composed":
        if not d["events"]:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.SelfComposedDpEvent(dp_accounting.ComposedDpEvent([from_ledger(e) for e in d["events"]]),
                                                 d["count"])
    pytest.fail(f"the ledger charged an event the oracle cannot read: {d}")


def epsilon(curve: np.ndarray, delta: float) -> float:
    return float(compute_epsilon(ORDERS, curve, delta)[0])


# --------------------------------------------------------------------------- the oracle


@dataclass
class Account:
    """One site's records: per record and kind the releases they were in, and their RDP curves."""

    n: int
    counts: dict  # kind -> int array (n,)
    curves: np.ndarray  # (n, |ORDERS|)

    def worst(self, delta: float) -> float:
        return max((epsilon(c, delta) for c in np.unique(self.curves, axis=0)), default=0.0)


def oracle(plan, mode: str, obs: Observer, sid: str, role: str) -> Account:
    """Each record's releases and RDP from the observer's inputs alone."""
    m = obs.sites[sid]
    n = m.local.n if role == "train" else m.held_out.n
    mine = [i for i in obs.inputs if i.site == sid and not i.replay and i.records is not None
            and (i.purpose == Purpose.EVAL) == (role == "eval")]
    counts = {k: np.zeros(n, np.int64) for k in KIND.values()}
    curves = np.zeros((n, len(ORDERS)))
    groups: dict[int, tuple[Draw, np.ndarray, list]] = {}
    for i in mine:
        scales = credited(plan, obs, i)
        t = touched(mode, i.purpose, plan, scales)
        members = i.records if i.draw is None else i.population
        counts[KIND[i.purpose]] += members
        if i.noise[0] == "laplace":
            ev = dp_accounting.ComposedDpEvent([pure(bound / s) for s, bound in t])
        else:
            ev = dp_accounting.GaussianDpEvent(1.0 / math.sqrt(sum((bound / s) ** 2 for s, bound in t)))
        if i.draw is None:
            curves[members] += rdp_curve(ev)
        else:  # releases on one Poisson subsample compose inside it
            groups.setdefault(id(i.draw), (i.draw, members, []))[2].append(ev)
    for draw, members, evs in groups.values():
        curves[members] += rdp_curve(dp_accounting.PoissonSampledDpEvent(draw.rate, dp_accounting.ComposedDpEvent(evs)))
    return Account(n, counts, curves)


def credited(plan, obs: Observer, inp: Input) -> np.ndarray:
    """The full noise scale per entry that protects ``inp``: its own share (initial score, evaluation), or the
    honest shares of every input of its round (variances add; the c largest other shares are the colluders')."""
    assert inp.noise is not None, f"{inp.site} sent data in round {inp.round_id} without drawing noise"
    if inp.purpose in OWN_SHARE:
        return inp.noise[1]
    shares = [i.noise[1] for i in obs.inputs if i.round_id == inp.round_id and i.noise is not None]
    senders = {i.site for i in obs.inputs if i.round_id == inp.round_id}
    assert len(senders) == plan.n, "the oracle credits a round's shares only when every site sent its input"
    var = np.sort(np.stack([s**2 for s in shares]), axis=0)
    others = var.shape[0] - 1
    return np.sqrt(var[: var.shape[0] - min(plan.assumed_colluders, others)].sum(axis=0))


def ledger(plan, state_dir, role: str, n: int) -> Account:
    """What the gate charged, read from the site's lifetime ledger with plain SQL."""
    db = sqlite3.connect(state_dir / "lifetime.sqlite")
    counts = {k: np.zeros(n, np.int64) for k in KIND.values()}
    curves = np.zeros((n, len(ORDERS)))
    # the plan's releases of this role (the held-out file's are the evaluation's), each over its record set in
    # load order (one set per role: the site's training file and its held-out file)
    sets = set()
    for purpose, blob, event, dataset, records in db.execute(
            "SELECT r.purpose, r.mask, r.event, r.dataset, d.records FROM releases r JOIN datasets d "
            "ON d.key = r.dataset WHERE r.plan_sha256 = ?", (plan.sha256,)):
        if (purpose == "eval") != (role == "eval"):
            continue
        sets.add(dataset)
        assert records == n and len(sets) == 1, (role, records, n, sets)
        mask = np.ones(n, bool) if blob is None else np.unpackbits(np.frombuffer(blob, np.uint8), count=n).astype(bool)
        counts[purpose][mask] += 1
        curves[mask] += rdp_curve(from_ledger(json.loads(event)))
    db.close()
    return Account(n, counts, curves)


# --------------------------------------------------------------------------- federations


def training_hp(name: str) -> Hyperparameters | None:
    """Fast hyperparameters for a tree builder (None: ``name`` is not one)."""
    given = {"tree_builder": name, "seed": 5, **FAST.get(name, FALLBACK)}
    try:
        hp = Hyperparameters(**builder_defaults(given))
    except ConfigError:
        return None
    return modes.training_mode(hp).federated_hyperparameters(hp, set(given))  # what `fedsbdt plan` pins


def federation(name: str, scenario: str, tmp_path):
    """A started federation for mode ``name`` and its (mode, roles) — training plans also evaluate the model."""
    schema, raw = abalone_with_ids(900)
    held_out = raw.iloc[ROWS:ROWS + 90]
    hp = training_hp(name)
    if hp is not None:
        f = EvalFed(tmp_path, hp=hp, eval_epsilon=0.5, held_out_rows=held_out, n_rows=ROWS, test_noise=True,
                    secagg_fast_path="never")
        roles = ("train", "eval")
    else:  # an evaluation-only plan of a model trained centrally
        from fedsbdt.common.data import load
        from fedsbdt.common.engine import train

        base = Hyperparameters(trees=2, depth=2, seed=5, epsilon=1.0)
        raw.iloc[:ROWS].to_csv(tmp_path / "train.csv", index=False)
        rnd = InsecureTestRandomness(seed=1, noise=False, i_understand_this_is_insecure=True)
        model = train(load(tmp_path / "train.csv", schema), base, rnd).model
        f = EvalFed(tmp_path / "fed", hp=base, eval_epsilon=0.5, held_out_rows=held_out, model=model,
                    test_noise=True, secagg_fast_path="never")
        roles = ("eval",)
    plan_mode = modes.mode_for(f.plan).name
    if plan_mode != name:
        pytest.fail(f"the conformance suite cannot build a plan for mode {name!r} (built one for {plan_mode!r})")
    return f, roles


def run(f: Fed, scenario: str) -> None:
    f.start()
    if scenario == "failures":  # two rounds fail after every site sent its input; the coordinator retries them
        fail_rounds_after_inputs(f, 2)
        assert f.session.rounds_failed == 2
    else:
        f.fed.run()
    assert f.session.exit_code == 0, f.session.stage


@dataclass
class Row:
    mode: str
    scenario: str
    role: str
    releases_observed: int  # data-carrying inputs the observer saw (all sites)
    rows_charged: int  # lifetime-ledger rows (all sites)
    oracle_epsilon: float  # worst record, dp-accounting on the observations
    gate_epsilon: float  # worst record, the lifetime ledger's rows
    plan_epsilon: float  # what the plan states (ε, or ε_eval)


def measure(name: str, scenario: str, tmp_path, monkeypatch) -> tuple[list[Row], list[str]]:
    """Run mode ``name`` in ``scenario`` under the observer: the table's rows, and every way in which the gate's
    charges, the independent count and the plan's statement disagree (empty: conformant)."""
    obs = Observer(monkeypatch).install()
    f, roles = federation(name, scenario, tmp_path)
    obs.watch(f.machines)
    run(f, scenario)
    plan, out, problems = f.plan, [], []
    for role in roles:
        stated, delta = ((plan.stated_epsilon, plan.hyperparameters.delta) if role == "train" else
                         (plan.eval_spec.epsilon, plan.eval_spec.delta))
        worst_oracle = worst_gate = 0.0
        observed = charged = 0
        for sid in f.machines:
            want = oracle(plan, name, obs, sid, role)
            got = ledger(plan, f.tmp / f"state-{sid}", role, want.n)
            for kind in KIND.values():
                bad = np.flatnonzero(want.counts[kind] != got.counts[kind])
                if bad.size:
                    problems.append(f"{name}/{scenario} {sid}: record {bad[0]} was in {want.counts[kind][bad[0]]} "
                                    f"{kind} releases, the gate charged {got.counts[kind][bad[0]]}")
            worst_oracle, worst_gate = max(worst_oracle, want.worst(delta)), max(worst_gate, got.worst(delta))
            if not np.allclose(got.curves, want.curves, rtol=1e-6, atol=1e-12):
                i = int(np.argmax((np.abs(got.curves - want.curves) / np.maximum(want.curves, 1e-300)).max(axis=1)))
                problems.append(f"{name}/{scenario} {sid}: record {i} is charged ε {epsilon(got.curves[i], delta):.6g} "
                                f"by the gate, ε {epsilon(want.curves[i], delta):.6g} by what its site released "
                                f"(plan ε {stated:.6g})")
            observed += sum(1 for x in obs.inputs if x.site == sid and x.records is not None and not x.replay
                            and (x.purpose == Purpose.EVAL) == (role == "eval"))
            sql = sqlite3.connect(f.tmp / f"state-{sid}" / "lifetime.sqlite")
            charged += sql.execute("SELECT COUNT(*) FROM releases r JOIN datasets d ON r.dataset = d.key WHERE "
                                   "d.source = ? AND r.plan_sha256 = ?", (role, plan.sha256)).fetchone()[0]
            sql.close()
        if not math.isclose(worst_oracle, stated, rel_tol=1e-6):
            problems.append(f"{name}/{scenario} {role}: the worst record's ε is {worst_oracle:.6g} by what the sites "
                            f"released, the plan states {stated:.6g}")
        out.append(Row(name, scenario, role, observed, charged, worst_oracle, worst_gate, float(stated)))
    return out, problems


MODE_NAMES = sorted(modes.registered())
SCENARIOS = ("clean", "failures")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", MODE_NAMES)
def test_every_mode_charges_each_record_exactly_what_its_sites_release(name, scenario, tmp_path, monkeypatch):
    rows, problems = measure(name, scenario, tmp_path, monkeypatch)
    for row in rows:
        print(f"\n{row.mode:10s} {row.scenario:8s} {row.role:5s} observed {row.releases_observed:3d} charged "
              f"{row.rows_charged:3d}  ε independent {row.oracle_epsilon:.9f} gate {row.gate_epsilon:.9f} "
              f"plan {row.plan_epsilon:.9f}")
    assert not problems, "\n".join(problems[:6])


def test_the_suite_covers_every_registered_mode():
    assert set(MODE_NAMES) >= {"random", "greedy", "dpboost", "sarus", "evaluation"}


# --------------------------------------------------------------------------- the declarations themselves


def test_release_declarations_are_validated():
    from fedsbdt.common.modes.releases import Noise, Release, ReleaseError, Touch

    class Unit(Noise):
        def scales(self, shares=1, **where):
            return np.full(2, 3.0 / math.sqrt(shares))

        def touched(self):
            return (Touch(3.0, 1.0), Touch(3.0, 1.0))

    for bad in (dict(scale=0.0, bound=1.0), dict(scale=1.0, bound=-1.0), dict(scale=math.inf, bound=1.0),
                dict(scale=True, bound=1.0)):
        with pytest.raises(ReleaseError):
            Touch(**bad)
    with pytest.raises(ReleaseError, match="unknown release kind"):
        Release("leaves", Unit())
    with pytest.raises(ReleaseError, match="rate"):
        Release("tree", Unit(), rate=1.5)
    with pytest.raises(ReleaseError, match="charged with"):
        Release("level", Unit(), rate=0.5, charged_with="sketch")
    r = Release("tree", Unit(), rate=0.25)
    assert r.event.rate == 0.25 and r.event.event.noise_multiplier == pytest.approx(3.0 / math.sqrt(2.0))
    assert Release("level", Unit(), charged_with="sketch").event is None


def test_a_plan_whose_releases_cost_other_than_it_states_is_refused(monkeypatch):
    """Finding 1's error in today's vocabulary — a DPBoost mode whose levels are declared free (charged with the
    leaves) — cannot make a plan: its statement (ε 4) is not what its releases cost (ε 2.74)."""
    from fedsbdt.common.federation.plan import PlanError, SiteEntry, make_plan
    from fedsbdt.common.modes.greedy import GreedyTrees
    from fedsbdt.common.modes.releases import Release

    declared = GreedyTrees.tree_releases

    def free_levels(self, plan):
        out = declared(self, plan)
        return out | {"level": Release("level", out["level"].noise, charged_with="tree")}

    monkeypatch.setattr(GreedyTrees, "tree_releases", free_levels)
    schema, _ = abalone_with_ids(10)
    with pytest.raises(PlanError, match=r"states ε = 3\.9999.* cost 2\.7427"):
        make_plan(schema, training_hp("dpboost"), [SiteEntry(s, bytes([i + 1]) * 32) for i, s in
                                                   enumerate(["a", "b", "c"])], randomness="insecure-test")


def test_the_parties_take_noise_scales_only_from_the_plans_declarations():
    """Sites (client/, the modes' site rounds), the coordinator's rounds and the session draw noise at the scales of
    ``plan.releases`` (or the plan's methods that read it), never from a noise-scale function of their own: the
    event the gate charges is computed from those declarations (common/modes/releases.py)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    raw = re.compile(r"(?<!plan\.)\b(leaf_noise_scales|level_noise_scales|sketch_noise_scales?|init_noise_scales|"
                     r"noise_scales)\s*\(")
    found = {}
    for path in [*(root / "client").rglob("*.py"), *(root / "server").rglob("*.py"),
                 *(root / "common" / "modes").glob("*.py")]:
        if path.name == "releases.py":
            continue
        hits = [m.group(0) for m in raw.finditer(path.read_text()) if not path.read_text()[:m.start()].endswith("def ")]
        if hits:
            found[str(path.relative_to(root))] = hits
    assert found == {}, found
