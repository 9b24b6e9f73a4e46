"""The federated one-run audit (``fedsbdt audit --sites N``, fedsbdt.federated_audit; docs/audit.md).

The canaries sit at one site, the other records are dealt to three sites, and a federation trains through the
real state machines (fedsbdt.inprocess: secure randomness, each site's discrete-Gaussian share, secure
aggregation).  Two training runs, each small (5 000 rows, 30 random trees of depth 8, every record in every
tree, 1000 canaries: more leaves than canaries):

(b) the negative control: the sites' noise shares removed through the test-only switch → ε_lower > the claim;
(c) the real run, through the command line: ε_lower ≤ the claim (99% confidence).

A noise-losing bug at the sites, planted by hand once (every site drops its leaf-noise share in
common/modes/random/site.py), made (c) fail with ε_lower = 4.33 > 1 (docs/audit.md "Federated").
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

from fedsbdt.common.audit import AuditError
from fedsbdt.cli import build_parser, main
from fedsbdt.common.config import ConfigError, Hyperparameters
from fedsbdt.common.data import Dataset, load
from fedsbdt.common.schema import Schema
from fedsbdt.federated_audit import CANARY_SITE, deal, run_federated_audit
from fedsbdt.inprocess import InProcessSetup, write_site_file

FEATURES, ROWS = 16, 5000
POWER_HP = Hyperparameters(epsilon=1.0, trees=30, depth=8, subsample=1.0, cyclical=False, split_candidates=0)


def schema() -> Schema:
    return Schema.from_dict({
        "name": "audit-synth", "task": "regression", "target": "y", "label_range": [-1, 1],
        "columns": [f"x{i}" for i in range(FEATURES)] + ["y"],
        "features": [{"name": f"x{i}", "type": "numeric", "range": [0.0, 1.0]} for i in range(FEATURES)]})


@pytest.fixture(scope="module")
def problem() -> Dataset:
    rng = np.random.default_rng(2)
    X = rng.random((ROWS, FEATURES))
    y = np.clip(np.sin(3 * X[:, 0]) * X[:, 1] + 0.1 * rng.normal(size=ROWS), -1, 1)
    return Dataset.from_arrays(X, y, schema())


def test_records_are_dealt_round_robin_to_at_least_two_sites():
    parts = deal(10, 3)
    assert [p.tolist() for p in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    for bad in (1, 0, True, 2.0):
        with pytest.raises(AuditError, match="at least 2 sites"):
            deal(10, bad)
    with pytest.raises(AuditError, match="cannot be dealt"):
        deal(2, 3)


def test_a_site_file_parses_back_to_the_same_records(tmp_path):
    s = Schema.from_dict({
        "name": "mixed", "task": "binary", "target": "y", "columns": ["a", "c", "y"], "positive": ["Yes"],
        "negative": ["No"],
        "format": {"on_missing": "keep"},
        "features": [{"name": "a", "type": "numeric", "range": [2.0, 5.0]},
                     {"name": "c", "type": "categorical", "levels": ["u", "v", "w"]}]})
    X = np.array([[2.1, "v"], [np.nan, "w"], [4.999999999999, None]], dtype=object)
    ds = Dataset.from_arrays(X, np.array(["Yes", "No", "Yes"], dtype=object), s)
    back = load(write_site_file(ds, tmp_path / "s.parquet"), s)
    assert np.array_equal(back.X, ds.X, equal_nan=True) and np.array_equal(back.y, ds.y)


def test_the_negative_control_without_the_sites_noise_exceeds_the_claim(problem):
    """(b) Every site's leaf-noise share × 0 (the test-only switch, through SiteOptions): the attack reads
    the canaries from the federation's model, ε_lower exceeds the claimed ε; the receipt still claims it."""
    r, model = run_federated_audit(problem, POWER_HP, 3, 1000, 0.95, _noise_factor=0.0)
    assert model.privacy["epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert model.privacy["noise_mode"] == "distributed" and len(model.privacy["parties"]) == 3
    assert (r.mode, r.sites, r.extra["canary_site"], r.rows) == ("federated", 3, CANARY_SITE, ROWS)
    assert sum(r.extra["site_rows"]) == ROWS
    assert r.epsilon_lower > r.epsilon_claimed, r
    assert r.correct / r.guesses > 0.97


def test_the_real_federated_run_stays_below_the_claim(problem, tmp_path, capsys):
    """(c) ``fedsbdt audit --sites 3`` with the sites' real noise: ε_lower ≤ the claimed ε at 99% confidence (a
    correct implementation fails this with probability ≤ 1%; measured ε_lower: 0 in every run so far)."""
    frame = pd.DataFrame(problem.X, columns=[f"x{i}" for i in range(FEATURES)])
    frame["y"] = problem.y
    frame.to_csv(tmp_path / "data.csv", index=False)
    (tmp_path / "schema.toml").write_text(_schema_toml())
    rc = main(["audit", "--data", str(tmp_path / "data.csv"), "--schema", str(tmp_path / "schema.toml"),
               "--sites", "3", "--epsilon", "1", "--trees", "30", "--depth", "8", "--subsample", "1",
               "--confidence", "0.99", "--json", "--quiet"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["mode"], got["sites"], got["canary_site"], got["noise_mode"]) == ("federated", 3, CANARY_SITE,
                                                                                 "distributed")
    assert got["epsilon_claimed"] == pytest.approx(1.0, rel=1e-3) and got["canaries"] == 1000
    assert got["epsilon_lower"] <= got["epsilon_claimed"], got
    assert got["below_claim"] is True


def _schema_toml() -> str:
    cols = ", ".join(f'"x{i}"' for i in range(FEATURES))
    feats = "".join(f'[[features]]\nname = "x{i}"\ntype = "numeric"\nrange = [0.0, 1.0]\n' for i in range(FEATURES))
    return (f'name = "s"\ntask = "regression"\ntarget = "y"\nlabel_range = [-1, 1]\ncolumns = [{cols}, "y"]\n'
            f"{feats}")


@pytest.mark.parametrize("sites", ["1", "0"])
def test_too_few_sites_is_one_line_and_exit_2(tmp_path, capsys, sites):
    (tmp_path / "schema.toml").write_text(_schema_toml())
    rc = main(["audit", "--data", str(tmp_path / "none.csv"), "--schema", str(tmp_path / "schema.toml"),
               "--epsilon", "1", "--sites", sites])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "at least 2 sites" in err and len(err.splitlines()) == 1, err


def test_the_noise_switch_is_no_flag_and_is_validated():
    """The test-only factor is a keyword of run_federated_audit and a SiteOptions field only: no flag of
    ``fedsbdt audit``, ``client`` or ``coordinator`` sets it, and it must lie in [0, 1]."""
    from fedsbdt.client.site import SiteOptions

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for cmd in ("audit", "client", "coordinator", "demo"):
        flags = [o for a in sub.choices[cmd]._actions for o in a.option_strings]
        assert not [f for f in flags if "factor" in f or "audit-noise" in f], (cmd, flags)
    assert "_noise_factor" in run_federated_audit.__code__.co_varnames
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ConfigError):
            SiteOptions(audit_noise_factor=bad)
        with pytest.raises(ConfigError):
            InProcessSetup(noise_factor=bad)


def test_the_scaled_sampler_scales_only_the_gaussian_shares(monkeypatch):
    """ScaledIsolatedSampler: the Gaussian requests a child draws are the scales × factor, Laplace requests
    unchanged; factor 0 draws no Gaussian at all (zeros) and starts no child for them."""
    from fedsbdt.client.audit_noise import ScaledIsolatedSampler, scaled_noise
    from fedsbdt.client.isolated_noise import IsolatedSampler
    from fedsbdt.common.audit import ScaledNoise
    from fedsbdt.common.randomness import SecureRandomness

    seen = []

    def fake_draw(self, requests):
        seen.append([(k, np.asarray(s).copy()) for k, s in requests])
        return [np.ones(np.shape(s), np.int64) for _, s in requests]

    monkeypatch.setattr(IsolatedSampler, "draw", fake_draw)
    s = scaled_noise(IsolatedSampler(SecureRandomness()), 0.25)
    assert isinstance(s, ScaledIsolatedSampler)  # the site keeps its isolated code path
    s.draw([("gaussian", np.full(3, 8.0)), ("laplace", np.full(2, 4.0))])
    assert seen[-1][0][1].tolist() == [2.0] * 3 and seen[-1][1][1].tolist() == [4.0] * 2
    zero = scaled_noise(IsolatedSampler(SecureRandomness()), 0.0)
    seen.clear()
    out = zero.draw([("gaussian", np.full(4, 8.0)), ("laplace", np.full(2, 4.0))])
    assert out[0].tolist() == [0] * 4 and out[1].tolist() == [1] * 2 and [k for k, _ in seen[0]] == ["laplace"]
    assert zero.draw([("gaussian", np.full(2, 8.0))])[0].tolist() == [0, 0] and len(seen) == 1
    assert isinstance(scaled_noise(SecureRandomness(), 0.5), ScaledNoise)
