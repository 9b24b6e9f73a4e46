"""Private tuning (common/tuning.py): Papernot & Steinke Thm. 2 against independent oracles, the exact trial
sampler, the held-out split, and ``fedsbdt tune`` end to end (docs/auto.md)."""
from __future__ import annotations

import json
import math
import secrets

import mpmath as mp
import numpy as np
import pytest

from fedsbdt.common.tuning import (candidates, fresh_split_key, holdout_mask, record_scores, sample_trials, tnb_mean,
                                   trial_rdp, tuning_epsilon, tuning_rdp)

ORDERS = np.arange(2, 200)


def gaussian_curve(mu: float) -> np.ndarray:
    return ORDERS * mu**2 / 2


def oracle_theorem2(orders, rdp, gamma, eta):
    """P&S Thm. 2 evaluated with mpmath at every order: E[K] by summing k·P[K = k] of the TNB pmf itself (not
    its closed form), the minimum over λ̂ by a scan; then RDP's monotonicity in the order."""
    mp.mp.dps = 40
    g, e = mp.mpf(gamma), mp.mpf(eta)
    norm = g ** (-e) - 1
    mean, prod, k, total = mp.mpf(0), mp.mpf(1), 0, mp.mpf(0)
    while True:  # P[K=k] = (1−γ)^k/(γ^−η − 1) · Π_{l<k} (l+η)/(l+1)
        prod = prod * (k + e) / (k + 1)
        k += 1
        term = (1 - g) ** k / norm * prod
        total += term
        mean += k * term
        if term < mp.mpf(10) ** -35 and k > 10:
            break
    assert abs(total - 1) < 1e-25  # the pmf sums to one
    c = min((1 + e) * ((1 - mp.mpf(1) / int(lh)) * mp.mpf(float(r)) + mp.log(1 / g) / int(lh))
            for lh, r in zip(orders, rdp))
    bound = [mp.mpf(float(r)) + c + mp.log(mean) / (int(lam) - 1) for lam, r in zip(orders, rdp)]
    return np.array([float(min(bound[i:])) for i in range(len(bound))])


@pytest.mark.parametrize("mu,gamma,eta", [(0.3, 0.25, 1.0), (1.0, 0.1, 1.0), (0.05, 0.5, 1.0), (0.5, 0.2, 0.5)])
def test_theorem2_matches_an_mpmath_evaluation_with_the_mean_summed_from_the_pmf(mu, gamma, eta):
    rdp = gaussian_curve(mu)
    np.testing.assert_allclose(tuning_rdp(ORDERS, rdp, gamma, eta), oracle_theorem2(ORDERS, rdp, gamma, eta),
                               rtol=1e-9)


def test_theorem2_matches_dp_accounting_repeat_and_select():
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_repeat_and_select

    for mu, mean in ((0.3, 4), (2.0, 10), (0.01, 2)):
        rdp = gaussian_curve(mu)
        theirs = _compute_rdp_repeat_and_select(ORDERS, rdp, mean, 1.0)
        np.testing.assert_allclose(tuning_rdp(ORDERS, rdp, 1 / mean), theirs, rtol=1e-9)


def test_the_bound_holds_for_an_exact_repeat_and_select_computation():
    """Brute force over the trial distribution: Q outputs a score in {0..m}; the best of K ~ geometric trials has
    CDF f(F(t)) with f the PGF; its exact Rényi divergence must not exceed Thm. 2's bound at any order."""
    mp.mp.dps = 50
    m, gamma = 12, mp.mpf(1) / 4
    t = np.arange(m + 1)
    P = np.exp(-0.5 * ((t - 5.0) / 2.0) ** 2)
    Q = np.exp(-0.5 * ((t - 5.6) / 2.0) ** 2)
    P, Q = [mp.matrix([mp.mpf(float(x)) for x in v / v.sum()]) for v in (P, Q)]

    def rdp_exact(A, B, lam):
        return float(mp.log(sum(A[i] ** lam * B[i] ** (1 - lam) for i in range(len(A)))) / (lam - 1))

    def best_of_k(D):  # output distribution of the max over K iid draws: CDF f(F(t)), f(x) = γx/(1 − (1−γ)x)
        F, cdf = mp.mpf(0), []
        for i in range(len(D)):
            F += D[i]
            cdf.append(gamma * F / (1 - (1 - gamma) * F))
        return [cdf[0]] + [cdf[i] - cdf[i - 1] for i in range(1, len(cdf))]

    orders = np.arange(2, 40)
    for A, B in ((P, Q), (Q, P)):
        base = np.array([rdp_exact(A, B, int(l)) for l in orders])
        bound = tuning_rdp(orders, base, float(gamma))
        SA, SB = best_of_k(A), best_of_k(B)
        for i, lam in enumerate(orders):
            assert rdp_exact(SA, SB, int(lam)) <= bound[i] + 1e-12


def test_tnb_mean_closed_form_and_trial_sampler_is_geometric():
    assert tnb_mean(0.25, 1.0) == pytest.approx(4.0)
    assert tnb_mean(0.2, 0.0) == pytest.approx((5 - 1) / math.log(5))
    from scipy.stats import chisquare

    draws = np.array([sample_trials(4) for _ in range(20_000)])
    ks = np.arange(1, 13)
    obs = [int(np.sum(draws == k)) for k in ks] + [int(np.sum(draws > 12))]
    pmf = [0.25 * 0.75 ** (k - 1) for k in ks] + [0.75**12]
    assert chisquare(obs, np.array(pmf) * len(draws)).pvalue > 1e-4
    draws_ = iter([2, 1, 0])
    assert sample_trials(3, randbelow=lambda n: next(draws_)) == 3  # stops at the first draw of 0


def test_trial_rdp_is_the_pointwise_max_and_total_grows_with_the_trial_budget():
    a, b = gaussian_curve(0.2), gaussian_curve(0.4)
    np.testing.assert_array_equal(trial_rdp(ORDERS, [a, b], 1e9), b)
    e1, _ = tuning_epsilon(ORDERS, a, 0.25, 1e-6)
    e2, _ = tuning_epsilon(ORDERS, b, 0.25, 1e-6)
    assert 0 < e1 < e2


def test_holdout_depends_only_on_each_record_id_and_the_key():
    ids = np.random.default_rng(2).choice(2**62, size=10_000, replace=False).astype(np.int64) - 2**61
    key = fresh_split_key()
    assert len(key) == 32 and key != fresh_split_key()  # a fresh secret per run
    m = holdout_mask(ids, key)
    assert 0.18 < m.mean() < 0.22
    np.testing.assert_array_equal(holdout_mask(ids[::3], key), m[::3])  # other records do not move a record
    np.testing.assert_array_equal(holdout_mask(ids[::-1], key), m[::-1])  # nor does their order
    assert not np.array_equal(holdout_mask(ids, fresh_split_key()), m)
    with pytest.raises(ValueError, match="split key"):
        holdout_mask(ids, b"short")


def test_scores_lie_in_the_unit_interval():
    y = np.array([0.0, 1.0, 1.0])
    s = record_scores("binary", y, np.array([0.0, 0.0, 0.5]))
    np.testing.assert_allclose(s, [1.0, 0.0, 0.75])
    s = record_scores("multiclass", np.array([0, 2]), np.array([[1, 0, 0], [1, 0, 0.0]]))
    np.testing.assert_allclose(s, [1.0, 0.0])
    s = record_scores("regression", np.array([0.0, 0.0]), np.array([5.0, 100.0]), (0.0, 10.0))
    np.testing.assert_allclose(s, [0.75, 0.0])


def test_candidates_centre_first_and_distinct():
    c = candidates(dict(trees=100, depth=6, subsample=0.3, learning_rate=0.1, cyclical=False))
    assert c[0]["trees"] == 100 and len(c) == len({json.dumps(x, sort_keys=True) for x in c}) >= 8


def test_tune_cli_receipt_covers_all_trials_and_refuses_a_tiny_budget(tmp_path, capsys):
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data")
    out = tmp_path / "m.json"
    argv = ["tune", "--data", str(data), "--schema", str(schema), "--out", str(out), "--rows", "400", "--quiet"]
    assert main([*argv, "--epsilon", "1e-5"]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too small for private tuning" in err
    assert main([*argv, "--epsilon", "2", "--trials-mean", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)  # exactly one JSON object
    model = json.loads(out.read_text())
    assert res["epsilon"] == model["privacy"]["epsilon"] and res["tuning"] == model["training"]["tuning"]
    t = model["training"]["tuning"]
    assert model["privacy"]["epsilon"] <= 2 and t["epsilon_tuning"] <= 2
    assert t["epsilon_trial"] < t["epsilon_tuning"]  # one trial is cheaper than the whole tuning
    assert t["trials_distribution"] == {"name": "truncated negative binomial", "shape": 1.0, "gamma": 0.5, "mean": 2}
    assert t["settings"] in t["candidates"] and "'pid'" in t["holdout"]
    hp = model["hyperparameters"]
    assert {k: hp[k] for k in t["settings"]} == t["settings"]


# --------------------------------------------------------------------------- what fedsbdt tune releases (issue 37)

FORBIDDEN = {"trials", "trials_run", "winner", "winner_noisy_score_sum", "holdout_seed", "seconds", "elapsed"}


def write_task(folder, n: int = 400, id_column: bool = True):
    """A small binary task: a CSV with a stable id column (shuffled large integers, not row numbers) and its
    schema, with or without ``id_column``.  Returns (data path, schema path)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    x = rng.uniform(0, 1, (n, 3))
    y = (x[:, 0] + x[:, 1] * x[:, 2] + 0.3 * rng.normal(size=n) > 0.8).astype(int)
    ids = rng.choice(10**9, size=n, replace=False) + 10**6
    rows = ["pid,a,b,c,y"] + [f"{i},{u:.6f},{v:.6f},{w:.6f},{t}" for i, (u, v, w), t in zip(ids, x, y)]
    (folder / "d.csv").write_text("\n".join(rows) + "\n")
    features = "".join(f'\n[[features]]\nname = "{c}"\ntype = "numeric"\nrange = [0, 1]\n' for c in "abc")
    (folder / "s.toml").write_text('name = "small"\ntask = "binary"\ntarget = "y"\n'
                                   + ('id_column = "pid"\n' if id_column else "")
                                   + '\n[format]\nheader = true\nseparator = ","\n' + features)
    return folder / "d.csv", folder / "s.toml"


def keys_anywhere(obj) -> set[str]:
    """Every key of every dict in a parsed JSON document."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in keys_anywhere(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in keys_anywhere(v)}
    return set()


def test_tune_releases_the_winner_and_the_receipt_but_not_the_number_of_trials(tmp_path, capsys, monkeypatch):
    """Papernot & Steinke's Thm. 2 covers the best trial with K hidden: the model file, --json, the text output and
    the log (debug level) must hold no K, no trial list, no score and no winner index.  K is forced to 1 and to 3:
    everything tune writes must be the same except what belongs to the winning model itself."""
    import re

    from fedsbdt.common import tuning
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data")
    real = tuning.sample_trials

    def run(k: int, json_out: bool):
        folder = tmp_path / f"k{k}-{'json' if json_out else 'text'}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        monkeypatch.setattr(tuning, "sample_trials", lambda mean, randbelow=None: k)
        argv = ["--log-level", "debug", "tune", "--data", str(data), "--schema", str(schema), "--epsilon", "1",
                "--rows", "400", "--trials-mean", "2", "--out", "m.json"] + (["--json"] if json_out else [])
        assert main(argv) == 0
        cap = capsys.readouterr()
        return cap.out, cap.err, json.loads((folder / "m.json").read_text())

    winner_line = re.compile(r"T=\d+ depth=\d+ γ=\S+ η=\S+ (not )?cyclical")
    texts = {}
    for k in (1, 3):
        out, err, text_model = run(k, json_out=False)
        for text in (out, err):
            assert not re.search(r"\btrials? \d|\d+ trials|winner|round \d|score =", text), text
        texts[k] = (winner_line.sub("SETTINGS", out), err.count("\n"))
        out, err, model = run(k, json_out=True)
        res = json.loads(out)  # exactly one JSON object
        assert not re.search(r"\btrials? \d|\d+ trials|winner|round \d|score =", err), err
        for doc in (res, model, text_model):
            assert not keys_anywhere(doc) & FORBIDDEN, keys_anywhere(doc) & FORBIDDEN
        t = model["training"]["tuning"]
        assert res["tuning"] == t and res["settings"] == t["settings"]
        assert {key: model["hyperparameters"][key] for key in t["settings"]} == t["settings"]
        assert t["settings"] in t["candidates"]  # the candidate space is public by construction
        assert t["trials_distribution"]["mean"] == 2 and t["trials_distribution"]["shape"] == 1
        texts[k, "json"] = ({key: v for key, v in res.items() if key != "settings"} | {"tuning": None},
                            {key: v for key, v in t.items() if key != "settings"},
                            {key: model["privacy"][key] for key in ("epsilon", "delta", "guarantee")})
    assert texts[1] == texts[3]  # the text output and the number of log lines do not depend on K
    assert texts[1, "json"] == texts[3, "json"]


def test_tune_without_an_id_column_exits_2_with_one_line(tmp_path, capsys):
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path, id_column=False)
    out = tmp_path / "m.json"
    rc = main(["tune", "--data", str(data), "--schema", str(schema), "--epsilon", "1", "--rows", "400",
               "--trials-mean", "2", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "id_column" in err and err.startswith("fedsbdt tune: error:")
    assert not out.exists()


class _Captured(Exception):
    pass


@pytest.mark.parametrize("which", ["id column", "bundled abalone"])
def test_deleting_one_row_moves_no_other_record_between_training_and_held_out(tmp_path, capsys, monkeypatch, which):
    """Run ``fedsbdt tune`` on a file and on the same file without one row, with the same split key in both runs
    (the key is drawn independently of the data, so the two runs may be coupled on it), and stop it where the
    trials would start: every other record must be on the same side in both.  With an id column the split is a
    keyed hash of each record's id; the bundled Abalone example has none, so tune must refuse it (its row numbers
    would move about a third of the records when one row is deleted)."""
    from pathlib import Path

    from fedsbdt.common import tuning
    from fedsbdt.cli import main

    if which == "id column":
        data, schema = write_task(tmp_path / "data", n=1000)
        header, lines = 1, data.read_text().splitlines()
    else:
        ex = Path(__file__).resolve().parents[1] / "examples" / "abalone"
        data, schema = ex / "abalone.data", ex / "schema.toml"
        header, lines = 0, data.read_text().splitlines()
    fewer = tmp_path / "fewer.csv"
    gone = header + 3  # an early row: with row numbers, every later record's number moves
    fewer.write_text("\n".join(lines[:gone] + lines[gone + 1:]) + "\n")

    real_tune_on, key = tuning.tune_on, []

    def same_key(ds, centre, plan, randomness, k, *rest, **kw):
        key.append(k)
        return real_tune_on(ds, centre, plan, randomness, key[0], *rest, **kw)

    def capture(train_ds, holdout_ds, *a, **kw):
        raise _Captured({tuple(r) for r in np.column_stack([train_ds.X, train_ds.y])},
                        {tuple(r) for r in np.column_stack([holdout_ds.X, holdout_ds.y])})

    monkeypatch.setattr(tuning, "tune_on", same_key)
    monkeypatch.setattr(tuning, "run_tuning", capture)

    def sides(path):
        argv = ["tune", "--data", str(path), "--schema", str(schema), "--epsilon", "4", "--rows", "4000",
                "--out", str(tmp_path / "m.json"), "--quiet"]
        try:
            rc = main(argv)
        except _Captured as c:
            return c.args
        err = capsys.readouterr().err
        assert rc == 2 and "id_column" in err, err  # refused: there is no split to compare
        return None

    a, b = sides(data), sides(fewer)
    if which == "id column":
        assert a is not None and b is not None and 0.15 < len(a[1]) / 1000 < 0.25
    if a is None or b is None:
        return
    (train_a, held_a), (train_b, held_b) = a, b
    moved = (train_a & held_b) | (held_a & train_b)
    assert len(moved) == 0, f"{len(moved)} of {len(train_b | held_b)} other records moved between training and held-out"
    assert len((train_a | held_a) - (train_b | held_b)) == 1  # only the deleted record is missing


def test_quiet_tune_prints_the_result_in_one_line(tmp_path, capsys):
    """``--quiet`` (issue 36): one line for the result, not every trial's settings."""
    from fedsbdt.cli import main

    data, schema = write_task(tmp_path / "data")
    out = tmp_path / "m.json"
    assert main(["tune", "--data", str(data), "--schema", str(schema), "--out", str(out),
                 "--rows", "400", "--quiet", "--epsilon", "2", "--trials-mean", "2"]) == 0
    printed = capsys.readouterr()
    (line,) = printed.out.splitlines()
    assert line.startswith("tuned privately: ") and line.endswith(f"-DP; model written to {out}") and printed.err == ""
