"""The individual Rényi filter never lets a record exceed ρ(α̂) and lets small records keep training."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedsbdt.common import kernels
from fedsbdt.common.accountant import calibrate, subsampled_rdp
from fedsbdt.common.rdp_filter import UNITS_PER_ROUND, filter_table

G_UNITS, H_UNITS = 524288, 26214  # g* = 0.5, h* = 0.025 at 2^20


@pytest.fixture(scope="module")
def table():
    cal = calibrate(0.5, 5e-8, 0.1, 20)
    return filter_table(cal.alpha, cal.sigma, 0.1, 0.2, 20), cal


def exact_cost(table, g, h):
    c = 0.2 * (h / H_UNITS) ** 2 + 0.8 * (g / G_UNITS) ** 2
    return subsampled_rdp(table.alpha, table.gamma, c / table.sigma**2)


def test_table_rounds_up_and_is_monotone_in_both_gradient_and_hessian(table):
    t, cal = table
    u = t.cost_units
    assert u[-1, -1] == UNITS_PER_ROUND
    assert (np.diff(u, axis=0) >= 0).all() and (np.diff(u, axis=1) >= 0).all()
    # the Hessian matters: the reference code's lookup ignored it
    assert u[-1, 0] > u[0, 0] and u[-1, 5] > u[0, 5]
    assert t.budget_units * t.unit_rdp == pytest.approx(cal.rho, rel=1e-9)
    rng = np.random.default_rng(1)
    for _ in range(500):
        g, h = int(rng.integers(0, G_UNITS + 1)), int(rng.integers(0, H_UNITS + 1))
        _, new = kernels.filter_step(np.array([g]), np.array([h]), G_UNITS, H_UNITS, u, np.array([0]),
                                     t.budget_units, np.array([True]))
        assert new[0] * t.unit_rdp >= exact_cost(t, g, h) * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-G_UNITS, G_UNITS), st.integers(0, H_UNITS)), min_size=1, max_size=8),
       st.integers(1, 80), st.integers(0, 2**32))
def test_no_record_ever_exceeds_its_budget(table, pattern, rounds, seed):
    """Adversarial gradients: any sequence of (g, h) per round keeps every ledger ≤ ρ(α̂)."""
    t, cal = table
    rng = np.random.default_rng(seed)
    n = 16
    spent = np.zeros(n, np.int64)
    exact = np.zeros(n)
    for r in range(rounds):
        gh = np.array([pattern[(r + i) % len(pattern)] for i in range(n)])
        g = gh[:, 0] * (rng.random(n) < 0.9)
        h = gh[:, 1]
        active, new = kernels.filter_step(g, h, G_UNITS, H_UNITS, t.cost_units, spent, t.budget_units,
                                          np.ones(n, bool))
        assert (new[~active] == spent[~active]).all()
        for i in np.flatnonzero(active):
            exact[i] += exact_cost(t, int(g[i]), int(h[i]))
        spent = new
        assert (spent <= t.budget_units).all()
        assert (exact <= cal.rho * (1 + 1e-9)).all()


def test_worst_case_records_train_exactly_t_regular_rounds_and_small_ones_continue(table):
    t, cal = table
    n = 4
    g = np.array([G_UNITS, G_UNITS // 4, G_UNITS // 20, 0])
    h = np.array([H_UNITS, H_UNITS, H_UNITS // 10, 0])
    spent = np.zeros(n, np.int64)
    participated = np.zeros(n, int)
    for _ in range(20 + 200):  # T_regular = 20 plus 200 extra rounds
        active, spent = kernels.filter_step(g, h, G_UNITS, H_UNITS, t.cost_units, spent, t.budget_units,
                                            np.ones(n, bool))
        participated += active
    assert participated[0] == 20
    assert participated[1] > 20 and participated[2] > participated[1]
    assert participated[3] == 220  # zero sensitivity costs nothing


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=24), st.integers(0, 40),
       st.sampled_from([1.0, 0.5]))
def test_the_production_round_path_never_lets_a_record_exceed_its_budget(labels, extra, gamma):
    """The same property through the production path (LocalData.contribution → kernels.round_sums, as the
    engine and every site run it), not filter_step: adversarial labels (so gradients up to ±g*), many extra
    rounds.  The released leaf sums must contain exactly the records the ledger charged — each adds h* to
    its leaf's Hessian sum — and every record's exact RDP (its true g, h, not the rounded-up grid) stays
    within ρ(α̂)."""
    from fedsbdt.common.boosting import Encoding, LocalData
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.engine import calibration_for, filter_for
    from fedsbdt.common.randomness import InsecureTestRandomness
    from fedsbdt.common.splits import Splits

    hp = Hyperparameters(trees=4, extra_trees=extra, filter=True, subsample=gamma, depth=1, seed=1,
                         init_share=0.0, grad_clip=0.5, epsilon=1.0)
    cal = calibration_for(hp)
    table = filter_for(hp, cal)
    n = len(labels)
    X = np.arange(n, dtype=np.float64).reshape(n, 1)
    local = LocalData(X, np.array(labels), np.arange(n), "regression", hp, (-1.0, 1.0))
    enc = Encoding.for_task(hp, "regression")
    G, H = enc.grad.bound_units, enc.hess.bound_units
    splits = Splits(np.array([0], np.int32), np.array([n / 2.0]))
    rnd = InsecureTestRandomness(seed=7, noise=False, i_understand_this_is_insecure=True)
    gq, hq = kernels.grad_hess_units(local.pred, local.y, kernels.REGRESSION, enc.scale, G, H)
    base = (hp.r1 * (hq / H) ** 2 + (1 - hp.r1) * (gq / G) ** 2) / cal.sigma ** 2
    cost = subsampled_rdp(cal.alpha, gamma, base)
    exact = np.zeros(n)
    rounds_in = np.zeros(n, int)
    for r in range(hp.trees + extra):
        old = local.spent.copy()
        c = local.contribution(splits, r, rnd, table)
        charged = c.new_spent > old
        assert c.active == int(charged.sum())
        sampled = np.asarray(rnd.subsample(gamma, local.ids, r), bool)
        # the sums hold exactly the charged records that the subsample picked (a record's charge does not
        # depend on the sample: a_γ already accounts for it)
        assert int(c.sums[: hp.leaves].sum()) == H * int((charged & sampled).sum())
        assert int(c.sums[hp.leaves:].sum()) == int(gq[charged & sampled].sum())
        exact[charged] += cost[charged]
        rounds_in += charged
        local.commit(c)
        assert (local.spent <= table.budget_units).all()
    assert (exact <= cal.rho * (1 + 1e-9)).all()
    worst = np.abs(gq) == G
    assert (rounds_in[worst] == hp.trees).all()  # a worst-case record trains exactly T_regular rounds


@pytest.mark.parametrize("g_units, h_units, grid", [(G_UNITS, H_UNITS, 64), (524288, 104858, 64),
                                                    (999_983, 65_537, 255), (7, 3, 64)])
def test_every_gradient_and_hessian_lands_in_the_exact_ceiling_cell(g_units, h_units, grid):
    """The kernels round |g|, h up to the grid without integer division: check every value against ⌈k·K/units⌉."""
    # cell (kh, kg) costs kh·(K+1) + kg + 1, so the charge names the cell
    cells = (np.arange(grid + 1)[:, None] * (grid + 1) + np.arange(grid + 1)[None, :] + 1).astype(np.int64)
    g = np.arange(-g_units, g_units + 1, dtype=np.int64)
    h = np.resize(np.arange(h_units + 1, dtype=np.int64), g.size)
    h[: h_units + 1] = np.arange(h_units + 1)  # every Hessian value at least once
    want = cells[-(-h * grid // h_units), -(-np.abs(g) * grid // g_units)]
    _, charged = kernels.filter_step(g, h, g_units, h_units, cells, np.zeros(g.size, np.int64), 2**62,
                                     np.ones(g.size, bool))
    np.testing.assert_array_equal(charged, want)
