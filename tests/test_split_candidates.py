"""Split candidates placed by the schema (``scale = "log"``, ``cuts``) and DP quantile candidates
(``candidate_placement = "quantile"``): validation, where the candidates land, the release's accounting and
noise, and unchanged models when neither is used (docs/data-sources.md#split-candidates)."""
import hashlib
import math

import numpy as np
import pytest
from scipy import stats

from fedsbdt.common.accountant import alpha_grid, default_alpha_max, tree_rdp
from fedsbdt.common.boosting import split_edges
from fedsbdt.common.candidates import (QUANTILE_BINS, exact_histograms, float32_floor, laplace_scale,
                                       noisy_histograms, quantile_cuts)
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import Dataset
from fedsbdt.common.engine import calibration_for, train
from fedsbdt.common.lifetime import central_event
from fedsbdt.common.randomness import SecureRandomness
from fedsbdt.common.schema import Schema, SchemaError
from fedsbdt.common.splits import random_splits

from conftest import insecure

BASE = {"name": "t", "task": "binary", "target": "y"}


def schema(**extra) -> Schema:
    a = {"name": "a", "type": "numeric", "range": [0.0, 500.0], **extra}
    return Schema.from_dict({**BASE, "features": [
        a, {"name": "b", "type": "categorical", "levels": ["x", "y", "z"]},
        {"name": "c", "type": "numeric", "range": [-5.0, 5.0]}]})


def data(s: Schema | None = None, n: int = 400, seed: int = 5) -> Dataset:
    """Skewed ``a`` (log-normal, most records below 30 of a public range up to 500), categorical ``b``,
    uniform ``c``."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.lognormal(2, 1, n).clip(0, 500), rng.integers(0, 3, n), rng.uniform(-5, 5, n)])
    y = (np.log1p(X[:, 0]) + 0.5 * (X[:, 1] == 1) + rng.normal(0, 0.5, n) > 2.5).astype(float)
    return Dataset.from_arrays(X, y, s or schema(), ids=np.arange(n))


# --------------------------------------------------------------------------- the schema


@pytest.mark.parametrize("extra,needle", [
    ({"scale": "sqrt"}, "scale must be 'linear' or 'log', got 'sqrt'"),
    ({"scale": 2}, "scale must be 'linear' or 'log'"),
    ({"cuts": []}, "cuts must be a non-empty list of numbers"),
    ({"cuts": [1, "2"]}, "cuts must be a non-empty list of numbers"),
    ({"cuts": [1, True]}, "cuts must be a non-empty list of numbers"),
    ({"cuts": [1.0, math.nan]}, "cuts must be finite numbers"),
    ({"cuts": [1.0, math.inf]}, "cuts must be finite numbers"),
    ({"cuts": [3, 2]}, "cuts must be strictly increasing"),
    ({"cuts": [2, 2]}, "cuts must be strictly increasing"),
    ({"cuts": [-1, 2]}, "cuts must lie inside the range [0, 500]"),
    ({"cuts": [2, 501]}, "cuts must lie inside the range [0, 500]"),
    ({"cuts": list(range(1, 257))}, "at most 255 cuts, got 256"),
    ({"cuts": [1, 2], "scale": "linear"}, "give either scale or cuts"),
])
def test_bad_placements_are_refused_in_one_line(extra, needle):
    with pytest.raises(SchemaError) as e:
        schema(**extra)
    assert needle in str(e.value) and "\n" not in str(e.value) and "feature 'a'" in str(e.value)


def test_placements_are_for_numeric_features_and_kept_in_the_digest_only_when_declared():
    with pytest.raises(SchemaError, match="unknown key 'cuts'"):
        Schema.from_dict({**BASE, "features": [{"name": "b", "type": "categorical", "levels": ["x"], "cuts": [1]}]})
    plain, log, cut = schema(), schema(scale="log"), schema(cuts=[1, 10, 100])
    assert schema(scale="linear").digest() == plain.digest()  # the default, not written
    assert "scale" not in str(plain.to_dict()) and "cuts" not in str(plain.to_dict())
    assert len({plain.digest(), log.digest(), cut.digest()}) == 3  # the plan's schema carries them
    for s in (log, cut):  # and they survive the plan's round trip
        assert Schema.from_dict(s.to_dict()) == s
    # a feature group shares its placement
    g = Schema.from_dict({**BASE, "features": [{"names": ["p", "q"], "type": "numeric", "range": [0, 9],
                                                "cuts": [1, 2]}]})
    assert [f.cuts for f in g.features] == [(1.0, 2.0), (1.0, 2.0)]


def test_train_refuses_a_bad_placement_with_one_line_and_writes_nothing(tmp_path, capsys):
    from fedsbdt.cli import main

    (tmp_path / "s.toml").write_text('name = "t"\ntask = "binary"\ntarget = "y"\n[[features]]\nname = "a"\n'
                                     'type = "numeric"\nrange = [0, 1]\ncuts = [0.5, 0.2]\n')
    (tmp_path / "d.csv").write_text("a,y\n0.1,0\n0.7,1\n")
    out = tmp_path / "m.json"
    assert main(["train", "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml"), "--out",
                 str(out), "--epsilon", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuts must be strictly increasing" in err[0] and not out.exists()


# --------------------------------------------------------------------------- where the candidates land


def test_declared_cuts_are_the_only_thresholds_of_their_feature_and_each_is_drawn():
    s = schema(cuts=[1, 5, 20, 100.1])
    want = {1.0, 5.0, 20.0, float(np.float32(100.1)) if float(np.float32(100.1)) <= 100.1 else
            float(np.nextafter(np.float32(100.1), np.float32(0)))}
    seen = set()
    for r in range(200):
        sp = random_splits(s, 3, 7, r, False, 32)
        t = sp.thresholds[sp.features == 0]
        assert set(t.tolist()) <= want
        seen |= set(t.tolist())
        assert np.all(sp.thresholds[sp.features == 2] == random_splits(schema(), 3, 7, r, False, 32).thresholds[
            sp.features == 2])  # other features keep their equidistant candidates
    assert seen == want
    assert max(want) <= 100.1 and np.float32(max(want)) == max(want)  # float32, rounded down (as the grid)


def test_log_scale_candidates_follow_eq_c1():
    s = schema(scale="log")
    n = 16
    oracle = [-1 + 501 ** (i / (n + 1)) for i in range(1, n + 1)]  # lo − 1 + (hi − lo + 1)^(i/(N+1))
    edges = split_edges(s, n)[0]
    assert len(edges) == n
    for t, g in zip(edges, oracle):  # the largest float32 not above the exact point
        assert np.float32(t) == t and t <= g < float(np.nextafter(np.float32(t), np.float32(np.inf)))
    used = set()
    for r in range(100):
        sp = random_splits(s, 3, 1, r, False, n)
        used |= set(sp.thresholds[sp.features == 0].tolist())
    assert used == set(edges.tolist())
    # N = 0: log-uniform thresholds; half of them below the range's log midpoint √501 − 1 ≈ 21.4
    t = np.concatenate([(lambda sp: sp.thresholds[sp.features == 0])(random_splits(s, 4, 2, r, False, 0))
                        for r in range(300)])
    assert np.all((t >= 0) & (t <= 500)) and abs(np.mean(t < math.sqrt(501) - 1) - 0.5) < 0.06


def test_placed_candidates_are_coded_so_training_takes_the_byte_path_and_uses_them():
    s = schema(cuts=[2, 4, 8, 16, 32, 64])
    ds = data(s)
    hp = Hyperparameters(epsilon=2.0, trees=10, depth=3, subsample=0.5, seed=3, cyclical=False)
    m = train(ds, hp, insecure(1)).model
    thr = np.concatenate([t.thresholds[t.features == 0] for t in m.trees])
    assert thr.size and set(thr.tolist()) <= {2.0, 4.0, 8.0, 16.0, 32.0, 64.0}
    from fedsbdt.common.boosting import LocalData

    local = LocalData(ds.X, ds.y, ds.ids, "binary", hp, is_categorical=np.array([False, True, False]),
                      edges=split_edges(s, hp.split_candidates))
    for t in m.trees[:3]:  # every tree is codable on the placed edges: the one-byte walk is used, not the float one
        from fedsbdt.common import kernels

        assert kernels.code_bounds(t.features, t.thresholds, local.is_cat, local._packed) is not None


@pytest.mark.parametrize("builder", ["greedy", "dpboost", "sarus"])
def test_the_other_builders_choose_among_the_declared_cuts(builder):
    cuts = {2.0, 4.0, 8.0, 16.0, 32.0, 64.0}
    hp = Hyperparameters.from_dict({"tree_builder": builder, "epsilon": 4.0, "trees": 4, "seed": 1, "depth": 3})
    m = train(data(schema(cuts=sorted(cuts)), n=1000), hp, insecure(1)).model
    thr = np.concatenate([t.thresholds[t.features == 0] for t in m.trees])
    assert thr.size and set(thr.tolist()) <= cuts


#: SHA-256 of the trees of :func:`_digest`'s models, computed by the code before this change (commit e1a2afc)
GOLDEN = {(False, 0): "afe13ece080d5a204a16cbca84aa6aceb335b91cb641cb7a78d27a9f9761c9da",
          (False, 32): "77cff662c41f26f4fdf4404f636e79f48161f2c35adfcb4d87d51356cd9f46e8",
          (True, 0): "c915149a58b21708b191b91e6bd98ed5e3cef4a6e4a1d27a82e2ba81d2e1e897",
          (True, 32): "5f72b4bea1dac43e613cc42e7fa4473f7ed7d900b522a2a8898c84db2673c515"}


def _digest(ds, cyclical, cands, **hp):
    hp = Hyperparameters(epsilon=2.0, trees=15, depth=3, subsample=0.5, seed=11, cyclical=cyclical,
                         split_candidates=cands, **hp)
    m = train(ds, hp, insecure(3)).model
    h = hashlib.sha256(np.float64(m.init_score).tobytes())
    for t in m.trees:
        for a in (t.features, t.thresholds, t.leaves):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest(), m


@pytest.mark.parametrize("cyclical,cands", sorted(GOLDEN))
def test_models_are_bit_for_bit_unchanged_without_placements(cyclical, cands):
    got, m = _digest(data(), cyclical, cands)
    assert got == GOLDEN[cyclical, cands]
    assert "candidate_placement" not in m.hyperparameters.to_dict() and "eps_candidates" not in m.privacy
    assert "candidates" not in m.training
    explicit, _ = _digest(data(schema(scale="linear")), cyclical, cands, candidate_placement="schema")
    assert explicit == got


# --------------------------------------------------------------------------- DP quantile candidates


def test_quantile_hyperparameters_are_validated():
    with pytest.raises(ConfigError, match="candidate_placement = 'median': must be 'schema' or 'quantile'"):
        Hyperparameters(candidate_placement="median")
    for share in (0.0, 1.0, -0.1, True):
        with pytest.raises(ConfigError, match="candidate_share"):
            Hyperparameters(candidate_placement="quantile", candidate_share=share)
    with pytest.raises(ConfigError, match="for random trees"):
        Hyperparameters(candidate_placement="quantile", tree_builder="greedy", subsample=1.0)
    with pytest.raises(ConfigError, match="split_candidates in 1..255"):
        Hyperparameters(candidate_placement="quantile", split_candidates=0)
    with pytest.raises(ConfigError, match="leaving nothing for the trees"):
        Hyperparameters(candidate_placement="quantile", candidate_share=0.9, init_share=0.1)
    hp = Hyperparameters(candidate_placement="quantile", candidate_share=0.2, epsilon=2.0)
    assert hp.eps_candidates == pytest.approx(0.4) and Hyperparameters.from_dict(hp.to_dict()) == hp


def _rr_rdp(alpha, eps):
    """Independent oracle: RDP of randomized response, log((e^{αε} + e^{−(α−1)ε})/(1 + e^ε))/(α − 1)."""
    return math.log((math.exp(alpha * eps) + math.exp(-(alpha - 1) * eps)) / (1 + math.exp(eps))) / (alpha - 1)


@pytest.mark.parametrize("eps,share", [(1.0, 0.1), (4.0, 0.05)])
def test_the_quantile_release_is_charged_exactly_in_the_receipt(eps, share):
    hp = Hyperparameters(epsilon=eps, trees=20, depth=3, subsample=0.2, seed=1, candidate_placement="quantile",
                         candidate_share=share)
    res = train(data(), hp, insecure(2))
    p, cal = res.model.privacy, calibration_for(hp)
    assert p["eps_candidates"] == pytest.approx(share * eps) and p["epsilon"] == cal.epsilon
    assert "quantile split candidates" in p["guarantee"]
    # the receipt's ε, recomputed from σ: T subsampled-Gaussian trees + three pure releases (Cor. 6 over the grid)
    alphas = alpha_grid(default_alpha_max(eps, hp.delta))
    rho = hp.trees * tree_rdp(hp.subsample, p["sigma"], alphas) + np.array(
        [_rr_rdp(a, p["eps_init"]) + _rr_rdp(a, p["eps_ds"]) + _rr_rdp(a, share * eps) for a in alphas])
    oracle = np.min(rho + np.log((alphas - 1) / alphas) - (math.log(hp.delta) + np.log(alphas)) / (alphas - 1))
    assert p["epsilon"] == pytest.approx(oracle, rel=1e-9) and p["epsilon"] <= eps
    # spending on candidates leaves less for the trees: more leaf noise than without them
    assert p["sigma"] > calibration_for(hp.replace(candidate_placement="schema")).sigma
    # the lifetime ledger charges the same events (not the looser (ε, δ) fallback)
    ev = central_event(hp, cal)
    assert not isinstance(ev, dict)
    # what was released is in the model: the candidates of every numeric feature, and its scale m/ε_c
    c = res.model.training["candidates"]
    assert set(c["features"]) == {"a", "c"} and c["scale"] == pytest.approx(2 / (share * eps))
    assert all(len(v) == hp.split_candidates for v in c["features"].values())


def test_quantile_candidates_are_used_by_the_trees():
    hp = Hyperparameters(epsilon=4.0, trees=30, depth=3, subsample=0.5, seed=1, cyclical=False,
                         candidate_placement="quantile")
    res = train(data(n=3000), hp, insecure(4))
    cands = res.model.training["candidates"]["features"]
    for j, name in ((0, "a"), (2, "c")):
        thr = np.concatenate([t.thresholds[t.features == j] for t in res.model.trees])
        assert thr.size and set(thr.tolist()) <= set(cands[name])
    # the skewed feature's candidates sit where its records are (most below 30 of 500), not equidistant
    assert np.median(cands["a"]) < 30


def test_histograms_have_l1_sensitivity_m_and_ignore_missing_values():
    s = schema()
    X = data(s).X
    h = exact_histograms(X, s)
    assert h.shape == (2, QUANTILE_BINS) and np.all(h.sum(axis=1) == len(X))
    for i in (0, 17, 399):  # removing any one record changes each numeric feature's histogram by one count
        assert np.abs(h - exact_histograms(np.delete(X, i, axis=0), s)).sum() == 2
    X2 = X.copy()
    X2[0, 0] = np.nan
    assert exact_histograms(X2, s)[0].sum() == len(X) - 1
    assert laplace_scale(2, 0.5) == 4.0


def test_quantile_cuts_post_processing():
    # no information: the equidistant grid
    t = quantile_cuts(np.zeros(64), 0.0, 10.0, 9)
    assert np.allclose(t, np.arange(1, 10), atol=1e-5)
    # negative noise is clipped, not subtracted; every bin weighs at least the prior
    assert np.allclose(quantile_cuts(np.r_[np.full(32, -50), np.zeros(32)], 0.0, 10.0, 9), t)
    # overwhelming counts: the data's quantiles (all mass in bins 0–7 of 64 on [0, 64]: uniform on [0, 8])
    c = np.zeros(64)
    c[:8] = 1e9
    assert np.allclose(quantile_cuts(c, 0.0, 64.0, 7), np.arange(1, 8), atol=1e-4)
    out = quantile_cuts(np.random.default_rng(0).integers(-5, 50, 64), -3.0, 7.0, 32)
    assert np.all(np.diff(out) >= 0) and out[0] >= -3 and out[-1] <= 7 and np.all(np.float32(out) == out)
    assert np.all(float32_floor([0.1, -0.1, 1e40]) <= [0.1, -0.1, 1e40])
    with pytest.raises(ValueError):
        quantile_cuts(c, 0, 1, 3, prior=0)


def test_the_release_noise_is_discrete_laplace_of_scale_m_over_eps():
    """The noisy counts minus the exact ones, from the run's exact sampler, against the discrete Laplace pmf
    P(k) = tanh(1/(2b))·e^{−|k|/b} (chi-square goodness of fit)."""
    s = schema()
    X = data(s).X
    eps = 1.0  # two numeric features: b = 2
    exact = exact_histograms(X, s)
    rnd = SecureRandomness()
    draws = []
    for _ in range(100):
        noisy, b = noisy_histograms(X, s, eps, rnd)
        draws.append((noisy - exact).ravel())
    k = np.concatenate(draws)
    assert b == 2.0
    edges = np.arange(-8, 9)
    pmf = np.tanh(1 / (2 * b)) * np.exp(-np.abs(edges) / b)
    observed = [np.sum(k < -8)] + [np.sum(k == e) for e in edges] + [np.sum(k > 8)]
    tail = (1 - pmf.sum()) / 2
    expected = np.array([tail, *pmf, tail]) * k.size
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    assert abs(np.var(k) - 2 * math.exp(-1 / b) / (1 - math.exp(-1 / b)) ** 2) < 0.8  # var ≈ 7.8, SE ≈ 0.17
    with pytest.raises(ValueError, match="positive"):
        noisy_histograms(X, s, 0.0, rnd)


def test_a_federation_refuses_quantile_candidates(tmp_path, capsys):
    from fedsbdt.cli import main

    sites = [a for i in range(3) for a in ("--site", f"s{i}={bytes([i + 1]).hex() * 32}")]
    out = tmp_path / "p.toml"
    argv = ["plan", "--schema", str(__import__("conftest").EXAMPLES / "abalone" / "schema.toml"), *sites,
            "--rows", "500", "--epsilon", "1", "--out", str(out)]
    assert main(argv + ["--candidate-placement", "quantile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is for `fedsbdt train`" in err[0] and not out.exists()
    assert main(argv) == 0 and out.exists()
